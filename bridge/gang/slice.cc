#include "bridge/gang/slice.h"

#include <memory>

#include "absl/strings/str_cat.h"

namespace duet {
namespace gang {

std::vector<placement::SliceCandidate> SliceCandidates(
    const LedgerSnapshot& snap, const placement::PodRequest& member,
    const std::function<placement::NodeLoad(const NodeView&)>& load,
    const std::function<std::string(const std::string& node)>& unusable) {
  std::vector<placement::SliceCandidate> out;
  for (const std::shared_ptr<const NodeView>& view : snap.nodes) {
    std::optional<placement::TpuSliceHost> slice = placement::TpuSliceOf(*view);
    if (!slice.has_value()) continue;
    placement::SliceCandidate c;
    c.node = view->spec.name;
    c.slice = *std::move(slice);
    uint32_t held = 0;
    for (const DeviceState& d : view->devices) {
      if (d.spec.kind == DeviceKind::kTpu && !d.uses.empty()) ++held;
    }
    std::string why;
    if (view->spec.state != NodeState::kReady) {
      c.busy = absl::StrCat("node is ", NodeStateName(view->spec.state));
    } else if (held > 0) {
      c.busy = absl::StrCat(held, " of its ", c.slice.chips, " TPU chips held");
    } else if (std::string u = unusable ? unusable(c.node) : ""; !u.empty()) {
      c.busy = absl::StrCat("Slurm: ", u);
    } else if (!placement::Fits(*view, load ? load(*view) : placement::NodeLoad{}, member, &why)) {
      c.busy = absl::StrCat("no room for a member: ", why);
    }
    out.push_back(std::move(c));
  }
  return out;
}

std::optional<placement::GangPick> PickGangSlice(
    const LedgerSnapshot& snap, const GangSpec& spec,
    const std::function<placement::NodeLoad(const NodeView&)>& load,
    const std::function<std::string(const std::string& node)>& unusable, std::string* reason) {
  if (spec.member.kind != DeviceKind::kTpu) {
    if (reason != nullptr) {
      *reason = absl::StrCat("the members select TPU slice ", spec.tpu_topology, " but ask ",
                             DeviceKindName(spec.member.kind), " devices, not TPU chips");
    }
    return std::nullopt;
  }
  return placement::PickTpuSlice(SliceCandidates(snap, spec.member, load, unusable),
                                 spec.tpu_topology, spec.tpu_accelerator, spec.min_member,
                                 spec.member.count, reason);
}

}  // namespace gang
}  // namespace duet
