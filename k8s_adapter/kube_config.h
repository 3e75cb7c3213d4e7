#pragma once

// Where the Kubernetes API is and how to authenticate to it: in-cluster (the
// pod's service account), or a server, token and CA named explicitly. Reading
// kubeconfig files (YAML) is duet::kube_config's
// (k8s_adapter/kubeconfig/kubeconfig_file.h), which duet-node does not link.

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

}  // namespace k8s
}  // namespace duet
