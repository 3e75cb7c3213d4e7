#pragma once

// duet-node's way to the Kubernetes API: in-cluster by default (the pod's
// service account), or a server named on the command line from outside a
// cluster (--kube-server, --kube-token-file, --kube-ca-file). duet-node reads
// no kubeconfig files: it links no YAML parser.

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "k8s_adapter/kube_config.h"

namespace duet {
namespace node {

struct KubeFlags {
  std::string server;      // --kube-server: https://host[:port]
  std::string token_file;  // --kube-token-file: a bearer token, re-read as it rotates
  std::string ca_file;     // --kube-ca-file: PEM CA of the server (none: system roots)
  bool disabled = false;   // --no-kubernetes
};

// INVALID_ARGUMENT naming the flags when they do not go together:
// --kube-token-file or --kube-ca-file without --kube-server, --kube-server
// without --kube-token-file, a --kube-server that is not https:// (the token
// would travel in clear), any of them with --no-kubernetes.
absl::Status ValidateKubeFlags(const KubeFlags& f);

// The API config the flags ask for (after ValidateKubeFlags): nullopt with
// --no-kubernetes; the named server when --kube-server is set, its files read
// now (INVALID_ARGUMENT naming the flag when one cannot be read or the token
// is empty); otherwise k8s::InClusterConfig(sa_dir), whose error is returned
// as is (the caller runs without the API then).
absl::StatusOr<std::optional<k8s::KubeConfig>> KubeConfigFromFlags(
    const KubeFlags& f, const std::string& sa_dir = k8s::kServiceAccountDir);

}  // namespace node
}  // namespace duet
