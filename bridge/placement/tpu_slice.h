#pragma once

// Multi-host TPU slices (docs/gangs.md 5). Pure functions over ledger
// values: no I/O, no locks.
//
// GKE makes one node pool per multi-host TPU slice, atomically: every node
// of the pool carries the slice's cloud.google.com/gke-tpu-topology (e.g.
// "4x4", the chips of the whole slice) and gke-tpu-accelerator, and has
// capacity google.com/tpu = the chips of one host. So a node is a host of a
// multi-host slice when its topology names more chips than the node has;
// the slice has topology chips / host chips hosts, and the slice is the
// node's pool.
//
//  TpuSliceOf     a node's slice (pool, topology, accelerator, chips per
//                 host, hosts), or none for a node that is no host of a
//                 multi-host slice (no TPUs, a single-host topology).
//  PickTpuSlice   the slice a gang takes whole: every host of one slice
//                 pool, one member per host, every chip of each; a slice
//                 with any chip held by anyone, or a host missing, not
//                 ready or without room for a member, is no candidate.
//  SliceRefusal   why a single (non-gang) TPU pod is refused on a slice
//                 host: a slice is taken whole, by a gang or by Slurm.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bridge/ledger/types.h"
#include "bridge/placement/topology.h"

namespace duet::placement {

// A node's part in a multi-host TPU slice.
struct TpuSliceHost {
  std::string pool;         // the slice: GKE makes one node pool per slice
  std::string topology;     // the slice's chips, "4x4" or "2x2x4"
  std::string accelerator;  // the TPU model (gke-tpu-accelerator)
  uint32_t chips = 0;       // TPU chips on this host
  uint32_t hosts = 0;       // hosts in the slice (topology chips / chips), >= 2
};

// The chips a topology names: the product of its dimensions ("4x4" -> 16,
// "2x2x4" -> 16). INVALID_ARGUMENT for anything else ("", "4x", "0x4",
// "axb", a product over 1<<20).
absl::StatusOr<uint32_t> TpuTopologyChips(absl::string_view topology);

// The node's slice: its TPU devices' topology (the inventory's, from the
// node's gke-tpu-topology label) names more chips than the node has, a
// whole multiple of them, and the node has a pool. nullopt otherwise.
std::optional<TpuSliceHost> TpuSliceOf(const NodeSpec& spec);
// The same for a ledger view, whose devices live in view.devices.
std::optional<TpuSliceHost> TpuSliceOf(const NodeView& view);

// One host of a slice, as the caller measured it now.
struct SliceCandidate {
  std::string node;
  TpuSliceHost slice;
  // Empty when a member can be placed here now; else why not ("not ready",
  // "2 of 4 TPU chips held", "Slurm: drained", "no room for a member: ...").
  std::string busy;
};

// The slice for a gang of `members` members of `member_chips` chips each
// whose node selector asks `topology` (and `accelerator`, unless empty):
// the slice pools of that topology and accelerator whose every host is a
// candidate with `busy` empty, and whose host count (counted over the
// slice's nodes the caller passed) is its `hosts`; the first by pool name.
// Each member takes one host, so the gang must have exactly `hosts` members
// asking exactly `chips` chips. nullopt, with `reason` (when non-null)
// saying why (no slice of that shape, a member count or size that differs
// from the slice's, each slice's first obstacle). The pick's nodes are
// sorted by name, per_node 1, level kPool. Deterministic.
std::optional<GangPick> PickTpuSlice(const std::vector<SliceCandidate>& hosts,
                                     const std::string& topology, const std::string& accelerator,
                                     uint32_t members, uint32_t member_chips,
                                     std::string* reason = nullptr);

// The filter's reason for refusing a single TPU pod (one that is no gang
// member) on a host of `slice`: "TPU_SLICE_WHOLE: ...".
std::string SliceRefusal(const std::string& node, const TpuSliceHost& slice);

}  // namespace duet::placement
