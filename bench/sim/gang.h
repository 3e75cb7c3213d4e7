#pragma once

// Gang arrivals for duet-sim (issue 27, item 4; docs/gangs.md). Off unless
// --gangs is given, so every figure without it is unchanged.
//
//  GangMix        which arrivals become gangs: a share of the Kubernetes
//                 world's multi-GPU arrivals, each the first member of a gang
//                 of MIN..MAX copies of itself (the same request), the other
//                 members arriving every GAP arrivals after it.
//  AddGangs       rewrites an arrival stream (MakeArrivals') with gangs.
//  SimTopology    the synthetic topology of the simulated nodes: cliques,
//                 sub-blocks and blocks of fixed sizes, by node index.
//
// Pure functions over values; no I/O, no locks.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bridge/placement/topology.h"

namespace duet::sim {

struct Trace;
struct Arrival;

struct GangMix {
  // Share of eligible arrivals (multi-GPU, whole devices, Kubernetes world)
  // that start a gang, in (0, 1].
  double share = 0;
  uint32_t min_size = 2;
  uint32_t max_size = 8;
  // Member j of a gang arrives j x gap arrivals after member 0 (1: the gang's
  // members are consecutive arrivals).
  uint32_t gap = 1;
};

// "SHARE,MIN-MAX[,GAP]", e.g. "0.5,2-8". INVALID_ARGUMENT naming the part
// that is wrong (share outside (0, 1], 2 <= MIN <= MAX <= 64, GAP >= 1).
absl::StatusOr<GangMix> ParseGangMix(absl::string_view text);

// The stream with gangs, for `seed` (its own SplitMix64 stream, so the base
// order is MakeArrivals' for the same seed). Walks `base` in order; an
// eligible arrival starts a gang with probability `mix.share`, of a size drawn
// uniformly in [min_size, max_size]; its members 1..size-1 are copies of the
// same pod, each inserted when its turn comes (before the next base arrival).
// Gang ids are 1, 2, ... in order of their first member. The stream ends when
// the GPU milli requested reach `max_arrival` x capacity, after the members of
// every gang already started (a gang is never cut short).
std::vector<Arrival> AddGangs(const Trace& trace, const std::vector<Arrival>& base,
                              const GangMix& mix, uint64_t seed, double max_arrival);

// Nodes (by their index in the loaded node list) grouped into cliques of
// `clique` nodes, sub-blocks of `subblock` nodes and blocks of `block` nodes;
// each level nests in the next (clique | subblock | block).
struct SimTopology {
  uint32_t clique = 4;
  uint32_t subblock = 16;
  uint32_t block = 64;
};

// "CLIQUE,SUBBLOCK,BLOCK" (nodes each), e.g. "4,16,64"; each must divide the
// next. INVALID_ARGUMENT otherwise.
absl::StatusOr<SimTopology> ParseSimTopology(absl::string_view text);

// Node `index`'s place: block "bN", sub-block "bN/sM", clique "cK", host
// `name`.
placement::NodeTopology TopologyOfIndex(const SimTopology& topology, uint32_t index,
                                        const std::string& name);

// How tightly nodes `indices` (non-empty) sit in `topology`.
placement::DomainLevel LevelOf(const SimTopology& topology, const std::vector<uint32_t>& indices);

}  // namespace duet::sim
