// Fuzzes k8s::EffectivePodRequest (and the per-container and per-value
// readers under it) with arbitrary bytes read as JSON. Checks: nothing throws
// (the header promises it), every refusal is INVALID_ARGUMENT, and an
// accepted pod's amounts are never negative (QuantityMilli refuses negative
// values, and sums and maxima of non-negative amounts stay so).

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "absl/status/status.h"
#include "k8s_adapter/common/pod_request.h"
#include "nlohmann/json.hpp"

namespace {

void CheckRefusal(const absl::Status& s) {
  if (!s.ok() && s.code() != absl::StatusCode::kInvalidArgument) std::abort();
}

void CheckList(const duet::k8s::ResourceList& list) {
  for (const auto& [name, amount] : list) {
    if (amount < 0) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json pod =
      nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (pod.is_discarded()) return 0;
  const absl::StatusOr<duet::k8s::ResourceList> req = duet::k8s::EffectivePodRequest(pod);
  CheckRefusal(req.status());
  if (req.ok()) CheckList(*req);
  // The same bytes as one container and as one quantity value.
  const absl::StatusOr<duet::k8s::ResourceList> c = duet::k8s::ContainerRequest(pod, "c");
  CheckRefusal(c.status());
  if (c.ok()) CheckList(*c);
  const absl::StatusOr<int64_t> v = duet::k8s::QuantityMilli(pod, "v");
  CheckRefusal(v.status());
  if (v.ok() && *v < 0) std::abort();
  (void)duet::k8s::StringField(pod, "name", "metadata");
  return 0;
}
