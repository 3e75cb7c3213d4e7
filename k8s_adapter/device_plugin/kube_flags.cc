#include "k8s_adapter/device_plugin/kube_flags.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/file.h"

namespace duet {
namespace node {

absl::Status ValidateKubeFlags(const KubeFlags& f) {
  if (f.disabled && (!f.server.empty() || !f.token_file.empty() || !f.ca_file.empty())) {
    return absl::InvalidArgumentError(
        "--no-kubernetes: cannot be given with --kube-server, --kube-token-file or --kube-ca-file");
  }
  if (f.server.empty()) {
    if (!f.token_file.empty() || !f.ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--kube-token-file, --kube-ca-file: need --kube-server (without it duet-node uses the "
          "in-cluster service account)");
    }
    return absl::OkStatus();
  }
  const absl::string_view host = absl::StripPrefix(f.server, "https://");
  if (host.size() == f.server.size() || host.empty() || host.front() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("--kube-server: must be https://host[:port], got \"", f.server,
                     "\" (the token is never sent in clear)"));
  }
  if (f.token_file.empty()) {
    return absl::InvalidArgumentError(
        "--kube-server: needs --kube-token-file (a bearer token for the API server)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<k8s::KubeConfig>> KubeConfigFromFlags(const KubeFlags& f,
                                                                   const std::string& sa_dir) {
  if (f.disabled) return std::nullopt;
  if (f.server.empty()) {
    absl::StatusOr<k8s::KubeConfig> c = k8s::InClusterConfig(sa_dir);
    if (!c.ok()) return c.status();
    return std::optional<k8s::KubeConfig>(*std::move(c));
  }
  k8s::KubeConfig c;
  c.server = f.server;
  c.token_file = f.token_file;
  absl::StatusOr<std::string> token =
      ReadFileToString(f.token_file, absl::StatusCode::kInvalidArgument, "--kube-token-file");
  if (!token.ok()) return token.status();
  c.token = std::string(absl::StripAsciiWhitespace(*token));
  if (c.token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kube-token-file: ", f.token_file, " is empty"));
  }
  if (!f.ca_file.empty()) {
    absl::StatusOr<std::string> ca =
        ReadFileToString(f.ca_file, absl::StatusCode::kInvalidArgument, "--kube-ca-file");
    if (!ca.ok()) return ca.status();
    c.ca_file = f.ca_file;
  }
  return std::optional<k8s::KubeConfig>(std::move(c));
}

}  // namespace node
}  // namespace duet
