#pragma once

// Kubernetes resource quantities (k8s.io/apimachinery resource.Quantity), as
// the API server writes them into Nodes and Pods:
//
//   <quantity> ::= <sign>? <number> <suffix>
//   <number>   ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
//   <suffix>   ::= "" | n | u | m | k | M | G | T | P | E     (powers of 1000)
//               |  Ki | Mi | Gi | Ti | Pi | Ei                 (powers of 1024)
//               |  (e | E) <sign>? <digits>                    (powers of 10)
//
// The published grammar lists m..E; Kubernetes' parser also accepts n (1e-9)
// and u (1e-6), and so does this one. No whitespace, no other suffix.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace duet {
namespace k8s {

// The quantity `q` in milli-units ("250m" -> 250, "2" -> 2000, "1Ki" ->
// 1024000), computed exactly (no floating point) and rounded away from zero
// to a whole milli-unit, as Kubernetes rounds ("0.1m" -> 1, "1n" -> 1).
// INVALID_ARGUMENT, quoting `q`, when it is not a quantity, has more than 19
// significant digits, or its milli-value lies outside int64.
absl::StatusOr<int64_t> ParseQuantityMilli(absl::string_view q);

}  // namespace k8s
}  // namespace duet
