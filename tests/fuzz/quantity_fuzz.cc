// Fuzzes k8s::ParseQuantityMilli with arbitrary bytes as a quantity string.
// Checks, beyond "no crash, no sanitizer report": every refusal is
// INVALID_ARGUMENT; an explicit '+' changes nothing; and negating an accepted
// unsigned quantity negates its value (rounding is away from zero, so it is
// symmetric) unless the negative side is refused for range.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "k8s_adapter/common/quantity.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string q(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<int64_t> got = duet::k8s::ParseQuantityMilli(q);
  if (!got.ok()) {
    if (got.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  if (q.empty() || q[0] == '+' || q[0] == '-') return 0;
  const absl::StatusOr<int64_t> plus = duet::k8s::ParseQuantityMilli("+" + q);
  if (!plus.ok() || *plus != *got) std::abort();
  const absl::StatusOr<int64_t> minus = duet::k8s::ParseQuantityMilli("-" + q);
  if (minus.ok() && *minus != -*got) std::abort();
  return 0;
}
