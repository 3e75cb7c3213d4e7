#include "bridge/dra/slice_lends.h"

#include <algorithm>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "bridge/placement/tpu_slice.h"

namespace duet {
namespace dra {

std::string SingleTpuLendRefusal(const NodeView& view) {
  std::optional<placement::TpuSliceHost> slice = placement::TpuSliceOf(view);
  if (!slice.has_value()) return "";
  return placement::SliceRefusal(view.spec.name, *slice);
}

absl::StatusOr<placement::PodRequest> TpuGangMember(
    const LedgerSnapshot& snap, const gang::GangSpec& spec, int64_t chips, bool all,
    const std::function<bool(const std::string& node)>& lends) {
  if (spec.tpu_topology.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gang ", spec.key.ToString(),
        " asks TPUs but its members select no multi-host slice "
        "(no cloud.google.com/gke-tpu-topology in their node selector)"));
  }
  placement::PodRequest member;
  member.kind = DeviceKind::kTpu;
  if (!all) {
    if (chips <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("gang ", spec.key.ToString(), ": a member asks no TPU chip"));
    }
    member.count = static_cast<uint32_t>(std::min<int64_t>(chips, 1024));
    return member;
  }
  // Every chip of a node: as many as one host of such a slice has.
  std::optional<placement::TpuSliceHost> first;
  for (const std::shared_ptr<const NodeView>& view : snap.nodes) {
    if (lends && !lends(view->spec.name)) continue;
    std::optional<placement::TpuSliceHost> s = placement::TpuSliceOf(*view);
    if (!s.has_value() || s->topology != spec.tpu_topology) continue;
    if (!spec.tpu_accelerator.empty() && s->accelerator != spec.tpu_accelerator) continue;
    if (!first.has_value() || s->pool < first->pool) first = std::move(s);
  }
  if (!first.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "no multi-host TPU slice of topology ", spec.tpu_topology,
        spec.tpu_accelerator.empty() ? "" : absl::StrCat(" (", spec.tpu_accelerator, ")"),
        " is in the lending pools"));
  }
  member.count = first->chips;
  return member;
}

}  // namespace dra
}  // namespace duet
