#pragma once

// Multi-host TPU slices in the DRA lending mode (docs/gangs.md 5 and 6;
// docs/dra.md, "Gangs"): the lending mode keeps the extender's promise that
// Kubernetes holds chips of a multi-host slice only through a gang that took
// the whole slice.
//
//  SingleTpuLendRefusal  why a single pod's TPU lend may not go to a node:
//                        the node is a host of a multi-host slice
//                        (placement::TpuSliceOf), "TPU_SLICE_WHOLE: ...";
//                        empty for a single-host TPU node (lent per host).
//  TpuGangMember         what each member of a TPU gang asks, for the
//                        lending mode's GangRegistry: every chip of one host
//                        of the slice its node selector names
//                        (GangSpec::tpu_topology), so that the registry
//                        reserves every host of one free slice pool
//                        (gang::PickGangSlice) in one Slurm job.
//
// Pure over the snapshot and the callback; thread-safe as they are.

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "bridge/gang/gang.h"
#include "bridge/ledger/ledger.h"
#include "bridge/placement/placement.h"

namespace duet {
namespace dra {

// "" when a single (non-gang) pod asking TPU hosts may be lent `view`'s
// chips; else placement::SliceRefusal for the node's slice (it names the
// node, the slice's pool, topology and host count).
std::string SingleTpuLendRefusal(const NodeView& view);

// The member request of a gang whose members ask TPUs of the lending driver:
// `chips` ExactCount chips each, or (`all`) every chip of a node.
//  - FAILED_PRECONDITION when `spec.tpu_topology` is empty: a TPU gang that
//    selects no slice is no slice gang (the caller lends for its pods one
//    by one, never on a slice's host).
//  - INVALID_ARGUMENT when it asks no chip (`chips` <= 0 and not `all`).
//  - With `all`: the chips of one host of a slice of that topology (and
//    tpu_accelerator, when set) among `snap`'s nodes that `lends` accepts
//    (null: every node), the first by pool name; NOT_FOUND naming the
//    topology when there is none.
// An ExactCount other than a host's chips is returned as asked: the
// registry's PickGangSlice refuses it with the reason.
absl::StatusOr<placement::PodRequest> TpuGangMember(
    const LedgerSnapshot& snap, const gang::GangSpec& spec, int64_t chips, bool all,
    const std::function<bool(const std::string& node)>& lends);

}  // namespace dra
}  // namespace duet
