#pragma once

// Where the Kubernetes API is and how to authenticate to it: in-cluster (the
// pod's service account) or a kubeconfig file (development).

#include <string>

#include "absl/status/statusor.h"

namespace duet {
namespace k8s {

inline constexpr char kServiceAccountDir[] = "/var/run/secrets/kubernetes.io/serviceaccount";

struct KubeConfig {
  // "https://host:port" (or http:// for the test fake). Required.
  std::string server;
  // Bearer token. `token_file` wins when set and is re-read periodically
  // (projected service-account tokens rotate).
  std::string token;
  std::string token_file;
  // PEM CA bundle: a file, or the PEM text itself (kubeconfig's
  // certificate-authority-data, decoded). Neither: the system store.
  std::string ca_file;
  std::string ca_pem;
  // PEM client certificate and key, as files or as text.
  std::string client_cert_file;
  std::string client_cert_pem;
  std::string client_key_file;
  std::string client_key_pem;
  bool insecure_skip_tls_verify = false;
  // The namespace the bridge runs in (in-cluster: the service account's), used
  // for its Lease and Events. Empty in a kubeconfig without one.
  std::string namespace_;
};

// The in-cluster config: KUBERNETES_SERVICE_HOST/PORT, and token, ca.crt and
// namespace from `sa_dir`. FAILED_PRECONDITION when not in a cluster (no
// host/port variables), NOT_FOUND naming a missing file.
absl::StatusOr<KubeConfig> InClusterConfig(const std::string& sa_dir = kServiceAccountDir);

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
