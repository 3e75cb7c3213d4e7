#pragma once

// Placement and scoring: which node, and which devices on it, a pod should
// get. Pure functions over the ledger's read views (NodeView, a
// LedgerSnapshot's nodes) plus the caller's per-node CPU/memory load.
//
// One implementation serves three callers:
//  - the scheduler extender: `Fits` is its filter (the reason string becomes
//    the failed-node message), `Score` its prioritize (0..kMaxScore; the
//    extender scales to its 0..10 range), `Evaluate(...).devices` the devices
//    its bind asks the ledger to hold;
//  - Slurm weight feedback: `SlurmWeight` per node (Slurm takes the lowest
//    weight first, so fuller nodes get lower weights under packing policies);
//  - the placement simulator (bench/sim), which replays production traces
//    through these same functions and a real Ledger.
//
// Thread-safety: everything here is const and may be called concurrently; a
// Scorer is immutable after construction.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "bridge/ledger/types.h"
#include "bridge/placement/request.h"
#include "bridge/placement/workload.h"

namespace duet::placement {

class DomainUsage;  // bridge/placement/topology.h

inline constexpr int kMaxScore = 100;
// Slurm node weights that SlurmWeight returns lie in [1, kMaxSlurmWeight].
inline constexpr uint32_t kMaxSlurmWeight = 10000;

enum class Policy : uint8_t {
  // duet's packing policy: fragmentation-aware (against the workload) with
  // packing as the tie-break, and a term against devices stranded by a lack
  // of CPU (a node's free CPU short of what its free devices would need at
  // the workload's CPU per device); the default.
  kDuet,
  // Kubernetes' default spread: the node left with the largest free fraction
  // of devices, CPU and memory (NodeResourcesFit LeastAllocated, with the
  // device resource scored too).
  kLeastAllocated,
  // Packing by fraction: the node left with the smallest free fraction.
  kMostAllocated,
  // The node left with the fewest free device milli-units (then CPU).
  kBestFit,
  // Fragmentation Gradient Descent (Weng et al., ATC'23): the node (and, for
  // a shared pod, the device) whose fragmentation against the workload grows
  // least, scored as the paper's simulator scores it: the integer
  // floor(100 * sigmoid(-growth in devices)), so nearly equal growths tie
  // (broken as the caller breaks ties), and a shared pod takes the first
  // device with the best such score.
  kFgd,
};

// The policy registry: every policy placement can score with, under its
// name (`placement.policy` in duet-bridge's config, duet-sim's --policy). The
// one list that both placement and config validation read: a policy added to
// Policy is added here, and is then accepted everywhere.
struct PolicyEntry {
  Policy policy;
  // The name PolicyName gives and ParsePolicy accepts.
  const char* name;
  // Another accepted name, or null.
  const char* alias;
};
// In the order they are documented; the first is the default.
absl::Span<const PolicyEntry> RegisteredPolicies();
// "duet, spread, most-allocated, best-fit or fgd": the names, for messages.
std::string PolicyNamesText();

// "duet", "spread", "most-allocated", "best-fit", "fgd".
const char* PolicyName(Policy policy);
// Accepts the registered names and aliases ("least-allocated" for
// kLeastAllocated); INVALID_ARGUMENT naming the accepted ones otherwise.
absl::StatusOr<Policy> ParsePolicy(absl::string_view name);

// Filter: true when `request` can be placed on the node now: node ready,
// enough devices of the kind and an accepted model with room for the
// per-device share (whole-device requests need fully free devices), and
// enough CPU and memory beyond `load`. When false and `reason` is non-null,
// sets it to a short message ("node n1: 2 of 8 gpu devices have 1000m free,
// 4 requested").
bool Fits(const NodeView& view, const NodeLoad& load, const PodRequest& request,
          std::string* reason = nullptr);

// A placement on one node.
struct Placement {
  // What to hold in the ledger, sorted by (kind, index); milli per device is
  // the request's. Empty for a request with no devices.
  std::vector<HeldDevice> devices;
  // Policy-specific preference; higher is better. Comparable only between
  // nodes for the same request and the same Scorer (the simulator and the
  // extender's top choice use it to avoid ties that rounding would make).
  double raw = 0;
  // `raw` mapped onto 0..kMaxScore.
  int score = 0;
};

// A policy with what it needs to score. Immutable; cheap to copy.
class Scorer {
 public:
  // `workload` is used by kFgd and kDuet to measure fragmentation; without
  // one (null or empty), each request is measured against its own shape.
  // Not owned; must outlive the Scorer.
  // `domains`, when non-null, adds kDuet's small preference for nodes whose
  // clique, sub-block and block are already partly used (DomainPacking,
  // docs/gangs.md 4) to `Placement::raw`; other policies ignore it. Not
  // owned; must outlive the Scorer.
  explicit Scorer(Policy policy, const Workload* workload = nullptr,
                  const DomainUsage* domains = nullptr);

  Policy policy() const { return policy_; }
  const Workload* workload() const { return workload_; }
  const DomainUsage* domains() const { return domains_; }

  // The domain-packing term Evaluate adds to `raw` for `view` (0 unless
  // kDuet with domains).
  double DomainTerm(const NodeView& view) const;

  // Filter + score + device choice for one node. nullopt (and `reason` set
  // when non-null) when the request does not fit.
  std::optional<Placement> Evaluate(const NodeView& view, const NodeLoad& load,
                                    const PodRequest& request, std::string* reason = nullptr) const;
  // Evaluate's `raw` alone (nullopt where the request does not fit), without
  // choosing devices: what the extender's prioritize needs for every node.
  std::optional<double> Raw(const NodeView& view, const NodeLoad& load,
                            const PodRequest& request) const;

  // The node's Slurm weight under this policy, in [1, kMaxSlurmWeight]; Slurm
  // tries lower weights first and takes the first node that fits.
  // Independent of any one job. kDuet and kBestFit: 1 + the node's free GPU
  // milli-units, so Slurm's first fit becomes a best fit (the node with the
  // least room that still takes the job; full nodes first, where CPU-only
  // jobs cost no device). Other policies: their preference for the
  // workload's shapes (weight from the mean of the shapes' scores on this
  // node; a node that fits no shape gets kMaxSlurmWeight).
  uint32_t SlurmWeight(const NodeView& view, const NodeLoad& load) const;

 private:
  Policy policy_;
  const Workload* workload_;
  const DomainUsage* domains_;
};

// Prioritize: 0..kMaxScore, higher is better; 0 also when it does not fit.
int Score(const NodeView& view, const NodeLoad& load, const PodRequest& request,
          const Scorer& scorer);

// Same as scorer.SlurmWeight(view, load).
uint32_t SlurmWeight(const NodeView& view, const NodeLoad& load, const Scorer& scorer);

// The extender's filter + prioritize over many nodes.
struct NodeChoice {
  // Index into the `nodes` span.
  size_t node = 0;
  Placement placement;
};

// The node with the highest raw score among `nodes` (or among the indices in
// `only`, when non-null) where `request` fits. Ties go to the node seen first
// (the lower index when `only` is sorted), or, with `tie_state` non-null, to
// one of the tied nodes drawn uniformly at random from that state (advanced),
// as kube-scheduler picks among equally scored nodes.
// `loads` is parallel to `nodes`. Null views are skipped. nullopt when no node
// fits.
std::optional<NodeChoice> SelectNode(absl::Span<const std::shared_ptr<const NodeView>> nodes,
                                     absl::Span<const NodeLoad> loads, const PodRequest& request,
                                     const Scorer& scorer,
                                     const std::vector<uint32_t>* only = nullptr,
                                     uint64_t* tie_state = nullptr);

}  // namespace duet::placement
