#include "k8s_adapter/kube_config.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/file.h"

namespace duet {
namespace k8s {

absl::StatusOr<KubeConfig> InClusterConfig(const std::string& sa_dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || port == nullptr || *host == '\0' || *port == '\0') {
    return absl::FailedPreconditionError(
        "not running in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set");
  }
  KubeConfig c;
  std::string h = host;
  if (h.find(':') != std::string::npos) h = absl::StrCat("[", h, "]");  // IPv6
  c.server = absl::StrCat("https://", h, ":", port);
  c.token_file = sa_dir + "/token";
  absl::StatusOr<std::string> token = ReadFileToString(c.token_file);
  if (!token.ok()) return token.status();
  c.token = std::string(absl::StripAsciiWhitespace(*token));
  c.ca_file = sa_dir + "/ca.crt";
  if (!ReadFileToString(c.ca_file).ok()) return absl::NotFoundError(absl::StrCat("cannot read ", c.ca_file));
  absl::StatusOr<std::string> ns = ReadFileToString(sa_dir + "/namespace");
  if (ns.ok()) c.namespace_ = std::string(absl::StripAsciiWhitespace(*ns));
  return c;
}

}  // namespace k8s
}  // namespace duet
