// Fuzzes the kubeconfig reader (k8s_adapter/kubeconfig/kubeconfig_file.h)
// with arbitrary bytes as the kubeconfig YAML; relative paths resolve against
// a directory that does not exist. Checks: ParseKubeconfig never crashes or lets a
// yaml-cpp exception escape, and what it accepts names a server.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "k8s_adapter/kubeconfig/kubeconfig_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<duet::k8s::KubeConfig> c =
      duet::k8s::ParseKubeconfig(yaml, "/nonexistent/duet-kube-config-fuzz");
  if (c.ok() && c->server.empty()) std::abort();
  return 0;
}
