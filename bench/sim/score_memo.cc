#include "bench/sim/score_memo.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "bench/sim/rng.h"

namespace duet::sim {
namespace {

std::string Describe(const std::optional<placement::NodeChoice>& c) {
  if (!c.has_value()) return "no node";
  std::string devices;
  for (const HeldDevice& d : c->placement.devices) {
    absl::StrAppend(&devices, devices.empty() ? "" : ",", d.index, ":", d.milli);
  }
  return absl::StrCat("node ", c->node, " raw ", c->placement.raw, " score ", c->placement.score,
                      " devices [", devices, "]");
}

bool Same(const std::optional<placement::NodeChoice>& a,
          const std::optional<placement::NodeChoice>& b) {
  if (a.has_value() != b.has_value()) return false;
  if (!a.has_value()) return true;
  if (a->node != b->node || a->placement.raw != b->placement.raw ||
      a->placement.score != b->placement.score ||
      a->placement.devices.size() != b->placement.devices.size()) {
    return false;
  }
  for (size_t k = 0; k < a->placement.devices.size(); ++k) {
    const HeldDevice& x = a->placement.devices[k];
    const HeldDevice& y = b->placement.devices[k];
    if (x.kind != y.kind || x.index != y.index || x.milli != y.milli) return false;
  }
  return true;
}

}  // namespace

ScoreMemo::ScoreMemo(size_t nodes, size_t shapes)
    : nodes_(nodes), version_(nodes, 0), entries_(nodes * shapes) {}

std::optional<double> ScoreMemo::Raw(size_t i, const NodeView& view,
                                     const placement::NodeLoad& load,
                                     const placement::PodRequest& request, uint32_t shape,
                                     const placement::Scorer& scorer) {
  ++lookups_;
  Entry& e = entries_[size_t{shape} * nodes_ + i];
  if (e.epoch == epoch_ && (e.stamp >> 1) == version_[i]) {
    ++hits_;
    return (e.stamp & 1) != 0 ? std::optional<double>(e.raw) : std::nullopt;
  }
  // Scorer::Raw is SelectNode's per-node answer: the same fit verdict and
  // EvaluateFree's raw plus the domain term, in the same arithmetic.
  const std::optional<double> raw = scorer.Raw(view, load, request);
  e.epoch = epoch_;
  e.stamp = (version_[i] << 1) | (raw.has_value() ? 1 : 0);
  e.raw = raw.value_or(0);
  return raw;
}

absl::StatusOr<std::optional<placement::NodeChoice>> ScoreMemo::Select(
    absl::Span<const std::shared_ptr<const NodeView>> nodes,
    absl::Span<const placement::NodeLoad> loads, const placement::PodRequest& request,
    uint32_t shape, const placement::Scorer& scorer,
    std::shared_ptr<const placement::Workload> workload_owner, const std::vector<uint32_t>* only,
    uint64_t* tie_state, bool check) {
  if (nodes.size() != nodes_ || loads.size() != nodes_ ||
      size_t{shape} * nodes_ >= entries_.size()) {
    return absl::InternalError(absl::StrCat("score memo for ", nodes_, " nodes asked about ",
                                            nodes.size(), " nodes, shape ", shape));
  }
  // Domain packing depends on every node's state, not on this one's alone:
  // nothing to remember.
  if (scorer.domains() != nullptr) {
    return placement::SelectNode(nodes, loads, request, scorer, only, tie_state);
  }
  // Only kDuet and kFgd read the workload (placement.h, Scorer): for the
  // others a new snapshot changes no answer.
  const bool reads_workload =
      scorer.policy() == placement::Policy::kDuet || scorer.policy() == placement::Policy::kFgd;
  const placement::Workload* workload = reads_workload ? scorer.workload() : nullptr;
  if (!policy_.has_value() || *policy_ != scorer.policy() || workload_ != workload) {
    ++epoch_;
    ++epochs_;
    policy_ = scorer.policy();
    workload_ = workload;
    workload_owner_ = reads_workload ? std::move(workload_owner) : nullptr;
  }
  // The copy SelectNode gets in a check draws the same ties from the same state.
  uint64_t check_state = tie_state != nullptr ? *tie_state : 0;

  // SelectNode's loop: the highest raw, ties to the node seen first or, with
  // `tie_state`, to a tied node drawn by reservoir sampling from it.
  std::optional<size_t> best;
  double best_raw = 0;
  uint64_t ties = 0;
  auto consider = [&](size_t i) {
    if (nodes[i] == nullptr) return;
    const std::optional<double> raw = Raw(i, *nodes[i], loads[i], request, shape, scorer);
    if (!raw.has_value()) return;
    ++fits_;
    if (best.has_value() && *raw < best_raw) return;
    if (best.has_value() && *raw == best_raw) {
      if (tie_state == nullptr || SplitMix64(tie_state) % ++ties != 0) return;
    } else {
      ties = 1;
    }
    best = i;
    best_raw = *raw;
  };
  if (only != nullptr) {
    for (uint32_t i : *only) {
      if (i < nodes.size()) consider(i);
    }
  } else {
    for (size_t i = 0; i < nodes.size(); ++i) consider(i);
  }

  std::optional<placement::NodeChoice> choice;
  if (best.has_value()) {
    // The winner's devices, as SelectNode picks them (the same evaluation).
    std::optional<placement::Placement> p = scorer.Evaluate(*nodes[*best], loads[*best], request);
    if (!p.has_value() || p->raw != best_raw) {
      return absl::InternalError(absl::StrCat("score memo: node ", *best, " scored ", best_raw,
                                              " but evaluates to ",
                                              p.has_value() ? absl::StrCat(p->raw) : "no fit"));
    }
    choice = placement::NodeChoice{*best, std::move(*p)};
  }
  if (check) {
    const std::optional<placement::NodeChoice> direct = placement::SelectNode(
        nodes, loads, request, scorer, only, tie_state != nullptr ? &check_state : nullptr);
    if (!Same(choice, direct) || (tie_state != nullptr && check_state != *tie_state)) {
      return absl::InternalError(
          absl::StrCat("score memo chose ", Describe(choice), ", SelectNode ", Describe(direct)));
    }
  }
  return choice;
}

}  // namespace duet::sim
