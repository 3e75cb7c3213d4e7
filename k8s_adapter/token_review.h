#pragma once

// TokenReview (authentication.k8s.io/v1): asks the API server who a bearer
// token belongs to. For ServiceAccount tokens bound to a pod the answer also
// names the pod and, on Kubernetes 1.30 and later (ServiceAccountTokenPodNodeInfo),
// the node the pod runs on (status.user.extra
// authentication.kubernetes.io/node-name).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "k8s_adapter/kube_client.h"

namespace duet {
namespace k8s {

inline constexpr char kExtraNodeName[] = "authentication.kubernetes.io/node-name";
inline constexpr char kExtraPodName[] = "authentication.kubernetes.io/pod-name";
inline constexpr char kExtraPodUid[] = "authentication.kubernetes.io/pod-uid";

struct ReviewedToken {
  // False: the API server does not accept the token for these audiences
  // (unknown, expired, revoked, bound object gone, wrong audience); `error`
  // says why when it said.
  bool authenticated = false;
  std::string error;
  std::string username;
  std::vector<std::string> groups;
  // From status.user.extra; "" when absent.
  std::string node_name;
  std::string pod_name;
  std::string pod_uid;
  // status.audiences: the requested audiences the token is for.
  std::vector<std::string> audiences;
};

// POSTs a TokenReview for `token` with spec.audiences `audiences`. An
// answer with authenticated true but none of `audiences` in
// status.audiences counts as not authenticated. Errors: the KubeClient's
// (UNAVAILABLE, PERMISSION_DENIED when the caller may not create
// tokenreviews, ...), INVALID_ARGUMENT for a reply that is not a
// TokenReview. Thread-safe as `client` is.
absl::StatusOr<ReviewedToken> ReviewToken(KubeClient* client, const std::string& token,
                                          const std::vector<std::string>& audiences);

}  // namespace k8s
}  // namespace duet
