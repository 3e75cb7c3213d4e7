#pragma once

// Kubeconfig files (YAML), for development: duet::kube_config, apart from the
// generic client duet::kube so that duet-node links no YAML parser. duet-bridge
// links it (kubernetes.kubeconfig); duet-node takes --kube-server,
// --kube-token-file and --kube-ca-file instead.

#include <string>

#include "absl/status/statusor.h"
#include "k8s_adapter/kube_config.h"

namespace duet {
namespace k8s {

// Parses kubeconfig YAML. `context` empty: current-context. Relative file
// paths are resolved against `base_dir`. Supports token, tokenFile, client
// certificate/key (file or -data), certificate-authority (file or -data),
// insecure-skip-tls-verify. exec and auth-provider plugins are
// UNIMPLEMENTED. Errors (INVALID_ARGUMENT) name the key path.
absl::StatusOr<KubeConfig> ParseKubeconfig(const std::string& yaml_text, const std::string& base_dir,
                                           const std::string& context = "");
// Reads `path` (NOT_FOUND if missing) and parses it.
absl::StatusOr<KubeConfig> LoadKubeconfig(const std::string& path, const std::string& context = "");

// What duet-bridge uses: `kubeconfig` empty → InClusterConfig(), otherwise
// LoadKubeconfig(kubeconfig, context).
absl::StatusOr<KubeConfig> ResolveKubeConfig(const std::string& kubeconfig,
                                             const std::string& context = "");

}  // namespace k8s
}  // namespace duet
