#pragma once

// Scoring from a node's fit data prepared ahead of the request.
//
// Scorer::Raw reads a NodeView: its state, CPU and memory, and each device's
// kind, model and free milli-units, in a device table allocated apart from
// the view. A caller that scores thousands of nodes per request (the
// extender's prioritize) pays a pointer chase and a cache miss per node for
// that. Instead it can keep, per node, the summary Summarize would build at
// zero load (PrepareNode), refreshed whenever the node changes, in one
// contiguous table of its own, and score from that (PreparedRaw).
//
// Internal to duet::placement's callers that keep such a table; the summary
// type is placement's internal NodeFree.
//
// Thread-safety: pure functions; a prepared summary is immutable once made.

#include <optional>

#include "bridge/ledger/types.h"
#include "bridge/placement/node_free.h"
#include "bridge/placement/placement.h"
#include "bridge/placement/request.h"

namespace duet::placement {

// internal::Summarize(view, NodeLoad{}): the node's free devices, CPU and
// memory with no load applied. Its device models point into `view`, which
// must outlive it.
internal::NodeFree PrepareNode(const NodeView& view);

// scorer.Raw(view, load, request) for the view `prepared` was made from,
// with `domain_packing` standing for scorer.domains()->NodePacking(view's
// name) (ignored unless the policy is kDuet and the scorer has domains):
// the same value to the last bit, and nullopt exactly where Raw's is.
std::optional<double> PreparedRaw(const Scorer& scorer, const internal::NodeFree& prepared,
                                  const NodeLoad& load, const PodRequest& request,
                                  double domain_packing);

}  // namespace duet::placement
