#pragma once

// AdmissionReviews (admission.k8s.io/v1) of writes to
// resource.k8s.io resourceclaims/status, as kube-apiserver sends them to
// duet's validating webhook (docs/dra.md "Admission"), and the answers.
//
// Accepted: apiVersion admission.k8s.io/v1, kind AdmissionReview, a request
// with a uid, resource {group resource.k8s.io, version v1 | v1beta2 |
// v1beta1, resource resourceclaims}, subResource status, operation UPDATE,
// and object (and oldObject, which may be null) a ResourceClaim. From them:
//   claim        object.metadata {uid, namespace, name}
//   new/old      status.allocation.devices.results[] {driver, pool, device,
//                request, adminAccess} of object / oldObject (the same fields
//                in every served version)
//   node         status.allocation.nodeSelector: the one value of
//                nodeSelectorTerms[].matchFields[] {key metadata.name,
//                operator In} ("" when there is none or they name several)
//   pods         the uids of object.status.reservedFor[] entries of resource
//                pods (core group) and of object.metadata.ownerReferences[]
//                of kind Pod (v1), each once (the gang fence, docs/dra.md
//                "Gangs")
//   dry_run      request.dryRun
// Anything else (another kind, resource, subresource or operation; a result
// without driver, pool or device; fields of the wrong type) is
// INVALID_ARGUMENT naming the field.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bridge/dra/dra_device.h"
#include "nlohmann/json.hpp"

namespace duet {
namespace k8s_dra {

struct ParsedReview {
  std::string api_version;  // of the review ("admission.k8s.io/v1")
  std::string uid;          // request.uid, which the answer must carry
  dra::AdmissionAsk ask;
};

absl::StatusOr<ParsedReview> ParseAdmissionReview(const nlohmann::json& review);
// The same from a request body (INVALID_ARGUMENT when it is not JSON, or
// nested deeper than 64 levels, checked before parsing).
absl::StatusOr<ParsedReview> ParseAdmissionReviewBody(absl::string_view body);

// The AdmissionReview answer: the same apiVersion, response.uid = `uid`,
// allowed; when refused, status {code 403, reason, message}.
nlohmann::json AdmissionResponse(const std::string& api_version, const std::string& uid,
                                 const dra::AdmissionVerdict& verdict);

}  // namespace k8s_dra
}  // namespace duet
