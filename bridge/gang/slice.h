#pragma once

// A gang's multi-host TPU slice (docs/gangs.md 5): the GangRegistry's
// Reserve for a gang whose members select a slice (GangSpec::tpu_topology).
//
//  SliceCandidates  every host of every multi-host slice in the snapshot,
//                   with why a member cannot go there now: the node is not
//                   ready, Slurm will not run work on it (`unusable`), any
//                   of its TPU chips is held by anyone (a Slurm job, a pod,
//                   another gang), or one member does not fit (CPU, memory).
//  PickGangSlice    placement::PickTpuSlice over them.
//
// Pure over the snapshot and the callbacks; thread-safe as they are.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "bridge/gang/gang.h"
#include "bridge/ledger/ledger.h"
#include "bridge/placement/placement.h"
#include "bridge/placement/tpu_slice.h"

namespace duet {
namespace gang {

// `load` and `unusable` as GangRegistryOptions' (null: zero load, always
// usable).
std::vector<placement::SliceCandidate> SliceCandidates(
    const LedgerSnapshot& snap, const placement::PodRequest& member,
    const std::function<placement::NodeLoad(const NodeView&)>& load,
    const std::function<std::string(const std::string& node)>& unusable);

// The slice for `spec` (spec.tpu_topology non-empty): nullopt with `reason`
// when none is free whole or the gang's shape is not a slice's.
std::optional<placement::GangPick> PickGangSlice(
    const LedgerSnapshot& snap, const GangSpec& spec,
    const std::function<placement::NodeLoad(const NodeView&)>& load,
    const std::function<std::string(const std::string& node)>& unusable, std::string* reason);

}  // namespace gang
}  // namespace duet
