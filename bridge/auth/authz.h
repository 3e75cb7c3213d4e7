#pragma once

// Who may make duet-bridge's mutating gRPC calls (Hold, Release, PlacePod)
// for pod and placeholder owners, under auth.mode token (docs/config.md,
// "auth"). Slurm-owned Hold/Release are not decided here: they carry their
// own credential (slurm.credential, bridge/slurm).
//
// A call is decided in this order:
//   1. Over grpc.unix_socket: allowed (the socket's file permissions are the
//      check; it is local to the bridge's pod).
//   2. It must carry `authorization: Bearer TOKEN` metadata, over TLS unless
//      auth.allow_plaintext_tokens; else UNAUTHENTICATED.
//   3. The API server reviews the token (TokenReview, spec.audiences =
//      auth.audiences); not authenticated: UNAUTHENTICATED. The answer is
//      reused for auth.cache_ttl (at most auth.cache_size tokens; keyed by
//      the token's SHA-256). An API server that cannot be asked: UNAVAILABLE,
//      nothing cached.
//   4. An operator (auth.operator_users / operator_groups): allowed.
//   5. duet-node's ServiceAccount (auth.node_service_account): its token must
//      be bound to a pod on a node (extra authentication.kubernetes.io/
//      node-name, else pod-name + pod-uid and that pod's spec.nodeName). It
//      may act only on that node, and only for pods bound to it; Release also
//      for a pod Kubernetes no longer has (its holding is on the caller's
//      node). Else PERMISSION_DENIED.
//   6. Anyone else: PERMISSION_DENIED.
// Every refusal carries reason NOT_AUTHENTICATED or NOT_PERMITTED with
// metadata `why` (the label of duet_grpc_auth_refusals_total) and is
// reported to Options::on_refusal. A refused call changes nothing.
//
// Thread-safety: thread-safe; `mu_` guards the cache only (no I/O under it).

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "bridge/config/config.h"
#include "bridge/ledger/types.h"
#include "k8s_adapter/kube_client.h"

namespace grpc {
class ServerContextBase;
}

namespace duet {
namespace auth {

// What the transport says about a call.
struct CallerInfo {
  // The bearer token without "Bearer "; "" when the call has none.
  std::string bearer;
  // Arrived over a unix socket.
  bool local = false;
  // Arrived over TLS.
  bool tls = false;
};

// The caller of a gRPC call as the server sees it.
CallerInfo CallerFromContext(const grpc::ServerContextBase& ctx);

// Where Kubernetes has a pod. `found` false: no such pod (deleted, or its
// name now has another UID); `node` "" while it is not bound.
struct PodBinding {
  bool found = false;
  std::string node;
};
using PodBindingFn = std::function<absl::StatusOr<PodBinding>(const Owner& owner)>;

// The PodBindingFn of duet-bridge: `view` first (the pod watch; it answers
// nullopt for a pod it has not seen; may be null), then a GET of the pod by
// the owner's namespace/name whose metadata.uid must be the owner's.
// NOT_FOUND from the API server is `found` false; other errors as they are.
PodBindingFn PodBindingFrom(std::function<std::optional<PodBinding>(const std::string& uid)> view,
                            k8s::KubeClient* kube);

class CallAuthorizer {
 public:
  struct Options {
    // auth.* (mode token); validated (ValidateConfig).
    AuthConfig config;
    const Clock* clock = Clock::Real();
    // Called once per refusal with the method and the why.
    std::function<void(const std::string& method, const std::string& why)> on_refusal;
  };
  // `kube` (the TokenReview and pod lookups) must outlive this object.
  CallAuthorizer(k8s::KubeClient* kube, PodBindingFn pod_binding, Options options);

  // OK when `caller` may make `method` for `owner` on `node`. When OK and
  // `who` is set, *who is the caller for the audit log: "local(unix socket)",
  // or "user=NAME" of its token (with " operator" or " node=NODE").
  absl::Status Check(const CallerInfo& caller, const std::string& method, const std::string& node,
                     const Owner& owner, std::string* who = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  // Tokens remembered now (tests).
  size_t cached() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Who a token belongs to, as far as this decision goes.
  struct Identity {
    bool authenticated = false;
    std::string error;  // why not authenticated
    std::string username;
    std::vector<std::string> groups;
    // The node its pod runs on (duet-node's tokens); "" when not bound.
    std::string node;
  };
  struct Entry {
    Identity identity;
    absl::Time expires;
  };
  absl::StatusOr<Identity> Identify(const std::string& token) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<Identity> Review(const std::string& token);
  bool IsOperator(const Identity& id) const;
  absl::Status Refuse(const std::string& method, absl::Status status, const std::string& why,
                      const std::string& node) const;

  k8s::KubeClient* const kube_;
  const PodBindingFn pod_binding_;
  const Options options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> cache_ ABSL_GUARDED_BY(mu_);
};

}  // namespace auth
}  // namespace duet
