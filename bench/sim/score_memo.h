#pragma once

// duet-sim's memo of the extender's per-node answers (issue 28: a replay's
// decision within 2x best-fit's).
//
// A replay asks placement::SelectNode the same question many times: between
// two arrivals of one pod shape only the nodes that the placements in
// between changed (one per arrival) answer differently, as long as the
// workload the scorer measures against stays the same snapshot (online, the
// model publishes a new one only when its weights move by `min_change`).
// ScoreMemo keeps, per (node, request shape), what Scorer::Raw said, stamped
// with the node's version and the scorer's epoch, and answers SelectNode's
// question from it: the same node, the same raw score, the same devices (the
// winner's are chosen by Scorer::Evaluate, as SelectNode chooses them), the
// same tie draw. Nothing is re-scored by the simulator: every value comes
// from the placement library; only unchanged nodes are not asked again.
//
// The caller keeps it exact: NodeChanged(i) whenever node i's view or load
// changes, and Select with the Scorer in use (a scorer with another policy,
// workload or domain usage starts a new epoch). `check` in Select compares
// every answer with SelectNode itself (duet-sim --check-score-memo).
//
// Thread-safety: none; one per replay.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "bridge/ledger/types.h"
#include "bridge/placement/placement.h"
#include "bridge/placement/workload.h"

namespace duet::sim {

class ScoreMemo {
 public:
  // `nodes` nodes, requests numbered 0 .. `shapes` - 1 by the caller (equal
  // PodRequests must get equal numbers, and different ones different).
  ScoreMemo(size_t nodes, size_t shapes);

  // Node i's view or load changed: what it answered before no longer holds.
  // (A version wraps after 2^31 changes of one node, far beyond any replay.)
  void NodeChanged(size_t i) { version_[i] = (version_[i] + 1) & 0x7fffffffu; }

  // placement::SelectNode(nodes, loads, request, scorer, only, tie_state),
  // remembering each node's answer. `shape` is `request`'s number.
  // `workload_owner` owns scorer.workload() when the caller may replace it
  // (the online model's snapshot): held until the next epoch, so that a new
  // snapshot can never reuse the old one's address unseen; may be null when
  // the workload outlives the memo. With `check`, SelectNode is asked too and
  // any difference (node, raw, score, devices) is INTERNAL.
  absl::StatusOr<std::optional<placement::NodeChoice>> Select(
      absl::Span<const std::shared_ptr<const NodeView>> nodes,
      absl::Span<const placement::NodeLoad> loads, const placement::PodRequest& request,
      uint32_t shape, const placement::Scorer& scorer,
      std::shared_ptr<const placement::Workload> workload_owner, const std::vector<uint32_t>* only,
      uint64_t* tie_state, bool check);

  // Per-node answers asked so far, and how many came from the memo.
  uint64_t lookups() const { return lookups_; }
  uint64_t hits() const { return hits_; }
  // Of the answers, those where the request fits (the nodes the policy scores).
  uint64_t fits() const { return fits_; }
  // Epochs begun: the scorer's policy or (where the policy reads it) workload changed.
  uint64_t epochs() const { return epochs_; }

 private:
  // 16 bytes, so that one shape's row over 1,213 nodes stays small.
  struct Entry {
    double raw = 0;
    uint32_t epoch = 0;  // 0: never filled
    uint32_t stamp = 0;  // the node's version * 2, + 1 where the request fits
  };
  // The node's raw score for `shape`, or nullopt where it does not fit.
  std::optional<double> Raw(size_t i, const NodeView& view, const placement::NodeLoad& load,
                            const placement::PodRequest& request, uint32_t shape,
                            const placement::Scorer& scorer);

  size_t nodes_;
  std::vector<uint32_t> version_;  // per node
  std::vector<Entry> entries_;     // [shape * nodes_ + node]
  uint32_t epoch_ = 0;
  // What the current epoch scores with.
  std::optional<placement::Policy> policy_;
  const placement::Workload* workload_ = nullptr;
  const placement::DomainUsage* domains_ = nullptr;
  std::shared_ptr<const placement::Workload> workload_owner_;
  uint64_t lookups_ = 0;
  uint64_t hits_ = 0;
  uint64_t fits_ = 0;
  uint64_t epochs_ = 0;
};

}  // namespace duet::sim
