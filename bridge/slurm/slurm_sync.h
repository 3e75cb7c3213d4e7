#pragma once

// SlurmSync: keeps Slurm in step with the ledger, and the ledger with Slurm.
//
// Each pass (RunOnce, or every `period` after Start):
//  1. Ping slurmctld. If it does not answer, or is of a Slurm release this
//     build cannot talk to (FAILED_PRECONDITION), the pass stops: degraded()
//     turns true, the ledger keeps serving as it is, nothing is released or
//     granted.
//  2. Nodes (ledger -> Slurm dynamic nodes). Every ledger node becomes a Slurm
//     node of the same name (CPUs, RealMemory, Gres by kind and model,
//     Features from pool, accelerator, zone and topology block, plus the
//     marker feature "duet"). Cordoned / not-ready / gone -> DRAIN with a
//     reason starting "duet: "; ready -> RESUME, but only of duet's own
//     drains (an admin's drain is never undone). A node that left the ledger
//     (or is GONE) is drained, then deleted once no job is on it. A node whose
//     GRES changed is drained, then deleted and recreated once empty.
//  3. Jobs (Slurm -> ledger; invariant I4 for the Slurm half). Every live job
//     on a ledger node is recorded with the device indices from its GRES
//     detail: placeholders (comment "duet-pod uid=...") as Placeholder owners,
//     other jobs as SlurmJob owners (which covers steps that never reported).
//     Ledger holdings of Slurm jobs, steps and placeholders whose job is no
//     longer live are released (only those granted before the job list was
//     read, minus `release_grace`) -- except placeholders whose pod is not
//     known to be gone (`pod_liveness`): such a placeholder was lost in Slurm
//     (an admin's scancel, a node that went down, slurmctld losing it) while
//     its pod still uses the devices. The ledger keeps the pod's devices held
//     (the SPANK fence keeps refusing them to Slurm steps) and each pass tries
//     Placeholders::Repair (a new placeholder for exactly those devices) once
//     the node is usable in Slurm; the loss and its outcome are reported once
//     per placeholder (`on_placeholder_lost`, stats). Live placeholders whose
//     pod is gone are cancelled and released.
//     Lend jobs (comment "duet-lend node=NODE", the DRA lending mode) are
//     recorded as Lend owners, never as Slurm jobs; one whose devices a claim
//     holds (Claim{job}) is present. A Lend holding whose job is gone is
//     released like a job's; a Claim holding whose lend job is gone is kept
//     (Kubernetes still uses the device), logged once and counted
//     (stats.claims_without_lend_job); the lend job is never re-made here.
//     Gang jobs (job name "duet-gang:KEY", docs/gangs.md) are never recorded
//     as Slurm jobs: the ledger's GangSlot{J} and Placeholder{J} holdings of a
//     live gang job J stand for it (on every node of J). A live gang job the
//     ledger has nothing of (a ledger that lost it) is imported, once older
//     than `release_grace`, as GangSlot owners: per node, its devices in
//     index order split among the node's slots (from the comment's
//     "slots=N"). Once J is gone its GangSlot holdings are released like a
//     job's, and each member's Placeholder{J} is lost like a placeholder
//     (kept while its pod may run, repaired as a single-pod placeholder).
//     With node_mode kAdopt (slurm.nodes: adopt) a slurmd registers its own
//     dynamic node (`slurmd -Z --conf-server ...`, as Slinky's NodeSet pods
//     do) and duet never creates, deletes or recreates a Slurm node: each
//     ledger node maps to the Slurm node named SlurmNameFor(spec). duet
//     adds its features to slurmd's (never removes one), drains/resumes as
//     above, and drains a node whose registered GPU/TPU counts differ from
//     the ledger's ("duet: GRES mismatch: ..."), resuming it once they
//     agree. A ledger node with no registered Slurm node yet, or whose Slurm
//     name differs from its own (see SlurmNameFor), is reported once (log,
//     stats gauge) and marked unusable in `loads`; nothing is made for it.
//  4. Weights: each node's Weight comes from the placement policy (SlurmWeightFor)
//     (fuller nodes get lower weights, so Slurm packs), sent only on change.
//
// Thread-safety: RunOnce may be called from any thread; passes are
// serialised by `run_mu_`. degraded() and stats() are lock-free / cheap.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "bridge/ledger/ledger.h"
#include "bridge/placement/placement.h"
#include "bridge/slurm/placeholders.h"
#include "bridge/slurm/pod_evictions.h"
#include "bridge/slurm/slurm_client.h"
#include "bridge/slurm/stale_holders.h"
#include "bridge/config/slurm_sync_settings.h"

namespace duet {

// CPU and memory that Slurm jobs (placeholders included) hold per node, as of
// the last sync pass that reached slurmctld, plus what placeholders made
// since then add (Add). The scheduler extender's filter subtracts it from a
// node's capacity. Kept as it is while Slurm is unreachable (the last known
// load). Thread-safe.
class SlurmNodeLoads {
 public:
  // Takes the nodes' alloc_cpus / alloc_memory_mib and forgets every Add.
  // `reservations` (Slurm's advance reservations as of the same pass) make
  // their nodes unusable: a placeholder names no reservation and has no end,
  // so Slurm starts none on a node reserved now or from any later time
  // ("reserved in Slurm: reservation R (users U) from S to E").
  void Replace(const std::vector<SlurmNodeInfo>& nodes,
               const std::vector<SlurmReservationInfo>& reservations = {},
               absl::Time now = absl::Now()) ABSL_LOCKS_EXCLUDED(mu_);
  // A placeholder made on `node` after the last Replace.
  void Add(const std::string& node, const placement::NodeLoad& load) ABSL_LOCKS_EXCLUDED(mu_);
  // Zero for a node Slurm did not report.
  placement::NodeLoad Get(const std::string& node) const ABSL_LOCKS_EXCLUDED(mu_);
  // Why Slurm will not run a placeholder on `node` ("drained in Slurm
  // (maint)", "down in Slurm (reason)", "not responding in Slurm", "reboot
  // requested in Slurm", "reserved in Slurm: ..."), as of the last Replace;
  // empty when it will or when Slurm did not report the node. A node with no
  // slurmd yet (FUTURE) is not counted: duet creates nodes ahead of their
  // slurmd.
  std::string Unusable(const std::string& node) const ABSL_LOCKS_EXCLUDED(mu_);
  // Marks `node` unusable until the next Replace (adopt mode: no slurmd
  // registered, or unmapped): Unusable() returns `why`, State() returns
  // {state, why}.
  void MarkUnusable(const std::string& node, const std::string& state, const std::string& why)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Slurm's state of `node` ("IDLE", "MIXED+DRAIN", ...) and its reason;
  // empty when Slurm did not report the node.
  std::pair<std::string, std::string> State(const std::string& node) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, placement::NodeLoad> loads_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::pair<std::string, std::string>> states_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> unusable_ ABSL_GUARDED_BY(mu_);
  // unusable_.size(), read without the lock on the filter's hot path.
  std::atomic<size_t> unusable_count_{0};
};

// Why a lost placeholder could not be re-made (metric label in
// RepairFailureName): its node is unusable in Slurm; Slurm had no room for,
// or chose other indices than, devices no other owner holds in the ledger
// (it counts them in use with no job the ledger knows, as after some
// slurmctld restarts); another owner holds them in the ledger; slurmctld
// did not answer; anything else.
enum class RepairFailure {
  kNodeUnusable,
  kSlurmDevicesBusy,
  kLedgerConflict,
  kSlurmUnavailable,
  kOther,
};
const char* RepairFailureName(RepairFailure f);

// A placeholder whose Slurm job vanished while its pod still runs.
struct PlaceholderLoss {
  std::string node;
  PlaceholderPod pod;
  uint32_t lost_job_id = 0;
  std::vector<HeldDevice> devices;
  // Repaired: the new placeholder jobs; else why not (the devices stay
  // fenced in the ledger until a later pass repairs it or the pod ends).
  bool repaired = false;
  std::vector<uint32_t> new_job_ids;
  std::string detail;
  // When not repaired: why (detail has Slurm's or the ledger's words).
  RepairFailure failure = RepairFailure::kOther;
};

// slurm.nodes: who makes the Slurm node of a ledger node.
enum class SlurmNodeMode {
  kCreate,  // duet creates/updates/deletes it (slurmd started against it)
  kAdopt,   // its slurmd registers it (-Z); duet never creates or deletes one
};

// Parses "create" / "adopt"; INVALID_ARGUMENT otherwise.
absl::StatusOr<SlurmNodeMode> ParseSlurmNodeMode(const std::string& s);

// Node annotation that names a node's Slurm node in a Slinky NodeSet
// (DaemonSet mode). The Kubernetes inventory keeps it in NodeSpec.labels.
inline constexpr char kSlinkyHostnameOverride[] = "nodeset.slinky.slurm.net/hostname-override";

// The Slurm node name a slurmd in a Slinky NodeSet pod registers for this
// Kubernetes node: the hostname-override annotation when set, else the
// node name up to its first dot.
std::string SlurmNameFor(const NodeSpec& spec);

// What the sync is told: the configured settings (SlurmSyncSettings:
// sync_period, manage_nodes, manage_weights, import_jobs, node_addr_label,
// managed_feature, release_grace; the `slurm` config section) and what
// duet-bridge wires in.
struct SlurmSyncOptions : SlurmSyncSettings {
  // With manage_nodes: create and delete Slurm nodes for the ledger's nodes
  // (kCreate) or adopt slurmd's (kAdopt; see the top) (slurm.nodes).
  SlurmNodeMode node_mode = SlurmNodeMode::kCreate;
  // The placement policy the weights follow (placement.policy), and the
  // workload it scores against (the learned one in duet-bridge; null: none).
  placement::Policy policy = placement::Policy::kDuet;
  placement::WorkloadFn workload;
  // Told of every live Slurm job each pass reads that is not a pod's
  // placeholder (the learned workload counts it once). Called from the sync
  // thread; must not block. Null: none.
  std::function<void(const SlurmJobInfo& job)> on_live_job;
  // What Kubernetes says about a placeholder's pod (the pod watch). Null:
  // nothing is known (kUnknown): placeholders are then cancelled only when
  // their pod releases, and a lost one is always kept and repaired.
  PodLivenessFn pod_liveness;
  // The namespace and name of the pod with this uid, as the pod watch last
  // saw it; nullopt when unknown. A lost placeholder that neither the sync
  // nor Slurm's job list remembers (slurmctld lost it right after the bind)
  // is re-made under the pod's name through it. Null: none.
  std::function<std::optional<PlaceholderPod>(const std::string& pod_uid)> pod_name;
  // Told once per lost placeholder, after the pass that first saw it lost
  // (repaired or fenced), and again when a fenced one is repaired. Called
  // from the sync thread; must not block (duet-bridge posts Events). Null: none.
  std::function<void(const PlaceholderLoss& loss)> on_placeholder_lost;
  // Told after duet drained a node in Slurm because of its inventory state
  // (drained=true, `reason` is duet's drain reason) or resumed one of its own
  // drains (drained=false, `reason` is the old reason). Called from the sync
  // thread; must not block (duet-bridge posts a Kubernetes Event). Null: none.
  std::function<void(const std::string& node, bool drained, const std::string& reason)> on_drain;
  // Refreshed from every pass that reads Slurm's nodes. Null: none. Not owned.
  SlurmNodeLoads* loads = nullptr;
  // slurm.preemption: evict-pods: a lost placeholder that Slurm preempted
  // has its pod evicted through it instead of being re-made, and evictions
  // of pods that have left are forgotten each pass. Null: protect (a
  // preempted placeholder is lost like any other). Not owned.
  PodEvictions* evictions = nullptr;
};

struct SlurmSyncStats {
  uint64_t passes = 0;
  uint64_t failed_passes = 0;
  uint64_t nodes_created = 0;
  uint64_t nodes_deleted = 0;
  uint64_t nodes_recreated = 0;
  uint64_t drains = 0;
  uint64_t resumes = 0;
  uint64_t weight_updates = 0;
  uint64_t holdings_imported = 0;
  uint64_t holdings_released = 0;
  uint64_t placeholders_cancelled = 0;
  uint64_t conflicts = 0;  // Slurm says a job holds what the ledger gives another
  uint64_t reconfigures = 0;  // `scontrol reconfigure` after a slurmctld start
  uint64_t version_refusals = 0;  // passes refused: slurmctld's release unsupported
  // Adopt mode, as of the last pass (gauges): ledger nodes whose slurmd has
  // not registered; whose Slurm name (SlurmNameFor) is not their own; whose
  // registered GPU/TPU counts differ from the ledger's. And drains duet
  // made for such a GRES mismatch (counter).
  uint64_t nodes_unregistered = 0;
  uint64_t nodes_unmapped = 0;
  uint64_t nodes_gres_mismatch = 0;
  uint64_t gres_mismatch_drains = 0;
  // DRA lending (docs/dra.md), as of the last pass (gauge): claim holdings
  // whose lend job no longer runs in Slurm. Kept (Kubernetes uses the
  // device) until the claim is deallocated; duet_dra_claims_without_lend_job.
  uint64_t claims_without_lend_job = 0;
  // Lost placeholders (their Slurm job vanished while the pod runs), by the
  // outcome of the first pass that saw each; repairs done (also of fenced
  // ones later); lost placeholders not repaired yet (now).
  uint64_t placeholders_lost_repaired = 0;
  uint64_t placeholders_lost_fenced = 0;
  uint64_t placeholder_repairs = 0;
  uint64_t placeholders_fenced = 0;
  // Failed repair attempts of lost placeholders, by RepairFailureName
  // (node_unusable is not counted: nothing is tried while the node is).
  // A failed repair is tried again at the next pass, then after 5 s,
  // 10 s, ... up to 5 min.
  std::map<std::string, uint64_t> repair_failures;
  // What in Slurm's configuration could end or block a placeholder, as of
  // the last pass that could read it (PlaceholderRiskName -> detail;
  // bridge/slurm/placeholder_policy.h). Empty: none, or not read.
  std::map<std::string, std::string> placeholder_risks;
  bool placeholder_risks_known = false;
  absl::Time last_success = absl::InfinitePast();
};

// Why Slurm will not start work on `node` now ("down in Slurm (reason)",
// "drained in Slurm (reason)", "not responding in Slurm", "reboot requested
// in Slurm", "failing in Slurm", "powered down in Slurm", ...); empty when it
// will, and for a FUTURE node (no slurmd yet).
std::string UnusableReason(const SlurmNodeInfo& node);

// Why a reservation keeps placeholders off its nodes at `now` (see
// SlurmNodeLoads::Replace); empty once it has ended.
std::string ReservationReason(const SlurmReservationInfo& r, absl::Time now);

// The Slurm node a ledger node becomes.
SlurmNodeConfig SlurmNodeFor(const NodeView& view, const SlurmSyncOptions& options);
// The node's Slurm weight: the placement policy (placement::Scorer,
// options.policy), the same code that scores pods. Lower is preferred.
uint32_t SlurmWeightFor(const NodeView& view, const SlurmSyncOptions& options);

// The node's Slurm Topology= ("TOPOLOGY:BLOCK", SlurmNodeConfig::topology):
// options.block_topology and the node's GKE block (placement::TopologyOf),
// the block spelled as its feature is (SanitizeFeature). Empty without
// block_topology, without a block, or in adopt mode.
std::string SlurmTopologyFor(const NodeView& view, const SlurmSyncOptions& options);

// Whether a slurmctld of `ctld_version` ("22.05.8") refuses GRES steps on
// dynamic nodes recovered from its state until `scontrol reconfigure`
// (bridge/slurm/README.md). Seen on 22.05.8; not on 24.11.5, 25.11.7 or
// 26.05.5. Releases between them and a version that does not parse: true.
bool GresStepsNeedReconfigureAfterStart(absl::string_view ctld_version);

class SlurmSync {
 public:
  // Nothing is owned; all must outlive this object.
  SlurmSync(SlurmSyncOptions options, Ledger* ledger, SlurmClient* slurm, const Clock* clock);
  ~SlurmSync();
  SlurmSync(const SlurmSync&) = delete;
  SlurmSync& operator=(const SlurmSync&) = delete;

  // Runs passes every `period` (by the clock) on a thread until Stop().
  // Idempotent.
  void Start();
  void Stop();

  // One pass. UNAVAILABLE when slurmctld cannot be reached (degraded() is
  // then true); other errors name the step that failed (the pass goes on with
  // the other steps and nodes).
  absl::Status RunOnce() ABSL_LOCKS_EXCLUDED(run_mu_);

  // True from a pass that could not reach Slurm until one that could.
  bool degraded() const { return degraded_.load(); }
  SlurmSyncStats stats() const ABSL_LOCKS_EXCLUDED(stats_mu_);

 private:
  absl::Status SyncNodes(const LedgerSnapshot& snap, const std::vector<SlurmNodeInfo>& nodes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  // SyncNodes for kAdopt (see the top).
  absl::Status AdoptNodes(const LedgerSnapshot& snap, const std::vector<SlurmNodeInfo>& nodes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  // Drains `have` with `reason` (empty: resumes it if duet drained it), as
  // SyncNodes does for a node's inventory state.
  absl::Status DrainOrResume(const SlurmNodeInfo& have, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  absl::Status ImportJobs(const LedgerSnapshot& snap, const std::vector<SlurmNodeInfo>& nodes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  // A placeholder holding whose Slurm job is gone while its pod may run:
  // keep it, try to repair it, report it once (see the class comment).
  void HandleLost(const Holding& h, const std::vector<SlurmJobInfo>& jobs,
                  const std::vector<SlurmNodeInfo>& nodes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  absl::Status SyncWeights(const LedgerSnapshot& snap, const std::vector<SlurmNodeInfo>& nodes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  // Gangs (see the top): the jobs of which the ledger holds something
  // (GangSlot{J} or Placeholder{J}, on any node); empty when `jobs` has no
  // live gang job.
  absl::flat_hash_set<uint32_t> GangJobsHeld(
      const std::vector<SlurmJobInfo>& jobs) const;
  // Records live gang job `job`, of which the ledger holds nothing, as its
  // GangSlot owners (see the top).
  void ImportGangJob(const SlurmJobInfo& job, const gang::GangKey& key,
                     const absl::flat_hash_set<std::string>& ledger_nodes, absl::Time listed_at)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  // Reads the preemption settings and partitions, and reports what could end
  // or block a placeholder (placeholder_policy.h): logged when it changes,
  // kept in stats. Nothing when the client cannot say (fakes).
  void CheckPlaceholderPolicy() ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  // Slurm 22.05 workaround (README.md): after slurmctld starts with dynamic
  // nodes recovered from its state, new steps asking for GRES fail with
  // "Invalid generic resource (gres) specification" until a reconfigure.
  // Once per slurmctld boot seen, with any GRES node, on a slurmctld for
  // which GresStepsNeedReconfigureAfterStart: `scontrol reconfigure`.
  absl::Status AfterCtldStart(const std::vector<SlurmNodeInfo>& nodes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  // Drains (if needed) and deletes a Slurm node once empty.
  absl::Status Retire(const SlurmNodeInfo& node, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);
  void Count(uint64_t SlurmSyncStats::*field, uint64_t n = 1) ABSL_LOCKS_EXCLUDED(stats_mu_);
  PodLiveness PodOf(const std::string& uid) const;
  // Releases the holdings among `candidates` (jobs' and steps' holdings on
  // `node` whose job had ended when the job list was read) that overlap
  // `devices`, and drops them from `candidates`. Returns how many it released.
  int ReleaseEndedHolders(const std::string& node, const std::vector<HeldDevice>& devices,
                          std::vector<Holding>* candidates) ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_);

  const SlurmSyncOptions options_;
  Ledger* const ledger_;
  SlurmClient* const slurm_;
  const Clock* const clock_;

  absl::Mutex run_mu_;
  // Per node: the GRES it was last recreated for, so a slurmd that reports
  // other GRES than the inventory does not cause a recreate loop.
  std::map<std::string, std::string> recreated_for_ ABSL_GUARDED_BY(run_mu_);
  // What was last seen of live placeholder jobs (pod, CPUs, memory), so a
  // lost one can be repaired as it was. By job id; pruned each pass.
  struct PlaceholderSeen {
    PlaceholderPod pod;
    uint32_t cpus = 0;
    uint64_t memory_mib = 0;
  };
  std::map<uint32_t, PlaceholderSeen> placeholders_seen_ ABSL_GUARDED_BY(run_mu_);
  // Claim holdings whose lend job was gone at the last pass (each logged once).
  absl::flat_hash_set<Owner> claims_reported_ ABSL_GUARDED_BY(run_mu_);
  // Lost placeholders reported and not repaired yet, by (node, job id).
  std::set<std::pair<std::string, uint32_t>> fenced_ ABSL_GUARDED_BY(run_mu_);
  // Repair attempts of lost placeholders, by (node, job id): failures so
  // far, when the next may run, and the last failure reported.
  struct RepairState {
    int failures = 0;
    absl::Time next_try = absl::InfinitePast();
    std::optional<RepairFailure> last_failure;
  };
  std::map<std::pair<std::string, uint32_t>, RepairState> repairs_ ABSL_GUARDED_BY(run_mu_);
  // Adopt mode: ledger nodes reported (once each) as unregistered, unmapped
  // and with a GRES mismatch, as of the last pass.
  std::set<std::string> unregistered_ ABSL_GUARDED_BY(run_mu_);
  std::set<std::string> unmapped_ ABSL_GUARDED_BY(run_mu_);
  std::set<std::string> mismatched_ ABSL_GUARDED_BY(run_mu_);
  // BOOT_TIME of the slurmctld last seen (0: none yet); see AfterCtldStart.
  int64_t ctld_boot_ ABSL_GUARDED_BY(run_mu_) = 0;
  // When (wall clock, seconds since the epoch) the sync's own reconfigure
  // returned, until the restart it may cause is seen; 0: none pending.
  int64_t own_reconfigure_at_ ABSL_GUARDED_BY(run_mu_) = 0;

  std::atomic<bool> degraded_{false};
  mutable absl::Mutex stats_mu_;
  SlurmSyncStats stats_ ABSL_GUARDED_BY(stats_mu_);

  // Ends the wait between passes (on clock_) at Stop.
  absl::Mutex stop_mu_;
  bool stopping_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread thread_;
};

}  // namespace duet
