#pragma once

// Replays a GPU trace against a model cluster through a real duet::Ledger and
// the product's placement library (bridge/placement), the way the FGD paper's
// experiment does: pods arrive in a seeded random order, inflated with copies
// until their GPU requests reach a multiple of the cluster's capacity; each
// gets one placement attempt and never leaves.
//
// The cluster is shared by two worlds. A mapping sends each pod, by QoS
// class, to "Kubernetes" (the extender's filter + prioritize: SelectNode) or
// to "Slurm" (nodes in Slurm weight order, first fit within; duet feeds the
// weights from the ledger after every change).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bench/sim/gang.h"
#include "bench/sim/trace.h"
#include "bridge/ledger/types.h"
#include "bridge/placement/placement.h"
#include "bridge/placement/topology.h"
#include "bridge/placement/workload.h"
#include "bridge/placement/workload_model.h"

namespace duet::sim {

enum class World : uint8_t { kKubernetes, kSlurm };

// Which world each pod goes to. `all-k8s` and `all-slurm` send every pod to
// one world whatever its QoS, a blank or absent one included (the pod list
// may have no qos column: openb_pod_list_multigpu50.csv). `default` and
// `k8s=...` split by QoS: the named classes to Kubernetes, every other
// non-blank class to Slurm; a pod with no QoS goes where `no_qos` says, and
// where that is unset (`default`, and `k8s=...` without `none`) the mapping
// names no world for it and MakeArrivals refuses the pod list.
struct Mapping {
  std::string name;
  // Set: every pod goes to this world (all-k8s, all-slurm).
  std::optional<World> every_pod;
  // Otherwise: these classes go to Kubernetes, any other non-blank one to Slurm.
  std::vector<std::string> kubernetes_qos;
  // Otherwise: where a pod with a blank QoS goes; unset: nowhere (refused).
  std::optional<World> no_qos;

  // The world of a pod with this QoS ("" when the pod list has no qos column
  // or the field is blank); nullopt when the mapping names none.
  std::optional<World> WorldOf(absl::string_view qos) const;
  // "LS,Guaranteed->Kubernetes; BE,Burstable->Slurm" style, for results.
  std::string Describe() const;
};

// "default" (LS, Guaranteed -> Kubernetes; BE, Burstable and any other
// non-blank QoS -> Slurm; no QoS: refused), "all-k8s", "all-slurm" (every pod,
// whatever its QoS), or "k8s=QOS[+QOS...]" (those to Kubernetes, the other
// non-blank ones to Slurm; `none` in the list sends pods without a QoS to
// Kubernetes, otherwise they are refused).
absl::StatusOr<Mapping> ParseMapping(absl::string_view text);

// How gang members (Arrival::gang != 0) are placed. Gang members are
// Kubernetes pods.
enum class GangPolicy : uint8_t {
  // Each member alone, through the extender (SelectNode), as it arrives; the
  // gang is placed when its last member is. Members placed hold their devices
  // while the others wait, for good if one never fits.
  kPerPod,
  // duet (docs/gangs.md 2): at a member's arrival, a gang not yet reserved is
  // reserved whole or not at all: placement::PickGangNodes over the nodes
  // where members fit (same count per node, one pool, tightest domain, fewest
  // nodes, least stranded); every slot held at once in the ledger
  // (Owner::Placeholder of the gang's job); each member takes the next slot
  // as it arrives (Ledger::Rebind to its Owner::Pod).
  kAllOrNothing,
  // kAllOrNothing with the topology hidden from PickGangNodes (every domain
  // empty): the fewest nodes and least stranded only.
  kAllOrNothingFlat,
};
const char* GangPolicyName(GangPolicy policy);  // per-pod, duet, duet-flat
absl::StatusOr<GangPolicy> ParseGangPolicy(absl::string_view name);

// One policy under test.
struct PolicySpec {
  std::string name;
  // Shared cluster: `policy` scores for the extender and sets the Slurm
  // weights. Static partition: nodes split between the worlds in proportion
  // to their GPU demand, no sharing; Kubernetes places with `policy` inside
  // its part, Slurm first-fit in node order (equal weights) unless
  // `static_slurm_weights`, then in `policy`'s weight order.
  placement::Policy policy = placement::Policy::kDuet;
  bool static_partition = false;
  bool static_slurm_weights = false;
  // Set: the Kubernetes side places with this policy instead of `policy`.
  std::optional<placement::Policy> kubernetes_policy;
  // Static partition, online workload: each part scores against the model
  // learned from its own world's arrivals, not from both worlds'.
  bool workload_per_part = false;
  // For gang members; ignored when the arrivals have none.
  GangPolicy gang = GangPolicy::kPerPod;
};

// duet, spread, most-allocated, best-fit, fgd (shared cluster); static (the
// status quo: partitioned, Kubernetes spread, Slurm first fit in node order);
// static-duet (partitioned, duet's policy on both sides). To explain
// static-duet: static-k8s:POLICY (POLICY in the Kubernetes part only,
// Slurm as in static), static-duet-slurm (duet's weights in the Slurm part
// only, Kubernetes spread) and static-duet-own (static-duet, each part scored
// against the workload of its own world).
absl::StatusOr<PolicySpec> ParsePolicySpec(absl::string_view name);

struct Trace {
  std::vector<NodeSpec> nodes;
  std::vector<TracePod> pods;  // the originals, in file order
};

// Reads both files, streaming. With `node_stride` > 1 keeps every n-th node
// only (the --quick cluster).
absl::StatusOr<Trace> LoadTrace(const std::string& nodes_path, const std::string& pods_path,
                                size_t node_stride = 1);

struct Arrival {
  uint32_t pod = 0;  // index into Trace::pods
  World world = World::kKubernetes;
  // A gang member (AddGangs): the gang's id (1, 2, ...), its size and this
  // member's number (0 .. gang_size - 1). 0: a pod on its own.
  uint32_t gang = 0;
  uint32_t gang_size = 0;
  uint32_t member = 0;
};

// The arrival order for `seed`: the originals sorted by name and shuffled,
// then copies drawn uniformly with replacement until the GPU milli requested
// reach `max_arrival` x the cluster's GPU capacity. Deterministic for a seed
// on every platform (no std:: distributions). Each arrival's world is
// `mapping.WorldOf(qos)`; INVALID_ARGUMENT, naming the first such pod, when
// the mapping names no world for a pod of the trace (no QoS under `default`).
absl::StatusOr<std::vector<Arrival>> MakeArrivals(const Trace& trace, const Mapping& mapping, uint64_t seed,
                                  double max_arrival);

struct ReplayOptions {
  double max_arrival = 1.3;
  double step = 0.05;
  // Where the fragmentation-aware policies get their workload from. Online
  // (the product's configuration): a placement::WorkloadModel that has seen
  // the arrivals so far, this one included, as the bridge would have (each
  // arrival observed at t0 + its index in seconds). Oracle: the `workload`
  // argument, the shapes of the whole trace known in advance (the FGD paper's
  // setting).
  bool online_workload = true;
  // The online model: half-life in arrivals (0: no decay), shapes exported
  // and their coverage, and the weight shift that publishes a new snapshot
  // (min_change), as WorkloadModelOptions.
  double half_life_arrivals = 0;
  size_t max_shapes = 128;
  double coverage = 0.95;
  double min_change = placement::WorkloadModelOptions().min_change;
  // Online: every node's Slurm weight is recomputed against the current
  // model every this many arrivals (the bridge's periodic weight feedback);
  // the node a placement changed is recomputed at once either way.
  size_t weight_refresh = 100;
  // Kubernetes pods: equally scored nodes are drawn at random (seeded by
  // `tie_seed`), as kube-scheduler draws among equal totals; false: the first
  // node wins (duet-sim's default: on the Alibaba trace random ties leave
  // duet unchanged and lower our FGD, bench/sim/RESULTS.md).
  bool random_ties = false;
  uint64_t tie_seed = 0;
  // Per-decision timing (adds two clock reads per pod).
  bool time_decisions = true;
  // Kubernetes decisions through a ScoreMemo (bench/sim/score_memo.h): each
  // node's answer for a pod shape is kept until the node or the workload
  // snapshot changes. The same decisions either way; false asks SelectNode
  // for every node every time (the extender's cost per decision). Ignored
  // (no memo) when nodes x distinct requests exceed 2^24 (256 MiB of answers).
  bool score_memo = true;
  // With score_memo: every decision also asked of SelectNode, and a
  // difference fails the replay (INTERNAL). Doubles the cost; for tests.
  bool check_score_memo = false;
  // Gangs: the nodes' synthetic topology (by node index in Trace::nodes).
  SimTopology topology;
  // Copy the ledger's holdings at the end into ReplayResult::holdings (tests).
  bool keep_holdings = false;
};

struct Row {
  double arrived_target = 0;  // the step, as a fraction of capacity
  double arrived = 0;         // GPU milli requested so far / capacity
  double allocated = 0;       // GPU milli allocated / capacity
  double idle_gpus = 0;       // capacity - allocated, in GPUs
  double fragmented_gpus = 0; // fragmentation against the workload, in GPUs
  uint64_t pods_arrived = 0;
  uint64_t pods_failed = 0;
  uint64_t gpu_pods_failed = 0;
};

// Gangs at the end of a replay (all zero without gang arrivals). Trace time
// is the arrival index: a gang's wait runs from its first member's arrival to
// the arrival at which its last member is placed.
struct GangStats {
  uint64_t gangs = 0;
  uint64_t members = 0;
  // Every member placed.
  uint64_t placed = 0;
  // Some members placed (holding devices), not all: waiting for good, as
  // nothing ever leaves the cluster.
  uint64_t waiting = 0;
  // Nothing held.
  uint64_t never_placed = 0;
  // Members placed, in all.
  uint64_t members_placed = 0;
  // Placed gangs' waits, in arrivals.
  double mean_wait = 0;
  double p99_wait = 0;
  // GPUs held by the members of waiting gangs (idle: their gang never runs).
  double idle_held_gpus = 0;
  // GPUs held for gangs that do not run yet, summed over arrivals: each hold
  // (a member's under per-pod, a slot's under duet) from the arrival that
  // made it to the one that completed its gang (or the stream's end).
  double idle_gpu_arrivals = 0;
  // Placed gangs by how tightly their nodes sit (the simulated topology,
  // whatever the policy saw), indexed by placement::DomainLevel.
  uint64_t placed_at_level[5] = {0, 0, 0, 0, 0};
};

struct ReplayResult {
  std::string policy;
  std::vector<Row> rows;  // one per step reached
  uint64_t decisions = 0;
  // ReplayOptions::score_memo: per-node answers asked, and how many the memo gave.
  uint64_t score_memo_lookups = 0;
  uint64_t score_memo_hits = 0;
  uint64_t score_memo_fits = 0;    // answers where the request fits
  uint64_t score_memo_epochs = 0;  // memo restarts (a new workload snapshot)
  double median_decision_us = 0;
  double p99_decision_us = 0;
  double wall_seconds = 0;
  uint64_t kubernetes_gpus = 0;  // static partition: GPUs in each part
  uint64_t slurm_gpus = 0;
  // At the end: GPUs allocated in each part (static partition; in GPUs), and
  // GPUs left idle on nodes whose CPUs are at least 90% requested (CPU, not
  // GPU share, is what keeps them idle).
  double kubernetes_allocated_gpus = 0;
  double slurm_allocated_gpus = 0;
  double idle_gpus_cpu_full = 0;
  // Where the arrivals went, as the replay handled them (issue 28: a mapping
  // that printed "all -> Kubernetes" sent a pod list without QoS to Slurm):
  // arrivals decided by the extender (SelectNode) and by Slurm's first fit,
  // and the ledger's holdings at the end by holder class. A placement with no
  // device (a CPU-only pod) holds nothing, and a failed one nothing either.
  uint64_t kubernetes_arrivals = 0;
  uint64_t slurm_arrivals = 0;
  uint64_t pod_holdings = 0;
  uint64_t slurm_holdings = 0;
  GangStats gangs;
  // The ledger's holdings at the end, with ReplayOptions::keep_holdings.
  std::vector<Holding> holdings;
};

// Replays `arrivals` for one policy on a fresh Ledger. `workload` is the
// oracle: the policies' input when !options.online_workload, and always the
// yardstick of Row::fragmented_gpus (so both modes report the same measure). INTERNAL if the ledger
// refuses a placement the library chose (a bug in one of them).
absl::StatusOr<ReplayResult> Replay(const Trace& trace, const std::vector<Arrival>& arrivals,
                                    const placement::Workload& workload, const PolicySpec& spec,
                                    const ReplayOptions& options);

}  // namespace duet::sim
