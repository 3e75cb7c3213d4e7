#pragma once

// The Lender: the DRA lending mode's rule (docs/dra.md), kept in the ledger.
//
// A device of a lending node is not lent (free or Slurm's: tainted, refused),
// lent and free (held by Owner::Lend{J, node}: untainted, admitted), being
// reclaimed (still Lend's, flagged here: tainted, refused) or allocated (held
// by Owner::Claim{J, claim uid}). The Lender
//  - answers the admission webhook (Review): an allocation is allowed only
//    when each of its devices on a lending node is lent and free (or already
//    the claim's, unless the claim is being released); allowing moves each
//    such device from Lend to Claim with Ledger::Rebind and waits until that
//    is durable. Review never acts on deallocations (results the new
//    allocation no longer has): a write it sees may still fail;
//  - gives a claim's devices back only through a fence like reclaim's
//    (ReleaseClaimIfDeallocated: flag the claim releasing, wait out its
//    admissions, quorum read of the claim, then back to Lend);
//  - lends (Lend: lend jobs through a LendMaker, then deletes the devices'
//    DeviceTaintRules) and reclaims (Reclaim: flag, taint, wait out
//    admissions in flight, quorum LIST, cancel the lend job, in that order);
//  - keeps a warm buffer of lent, free devices per pool and reclaims those
//    idle above it (Tick), and says which devices must carry a rule
//    (DesiredTainted) and makes the rules so: all of them (Resync, the full
//    reconcile) or only those of the nodes marked dirty since the last pass
//    (ReconcileRules, the incremental one).
// Nothing here speaks Kubernetes or Slurm: the seams are dra_device.h's
// interfaces and LendMaker.
//
// Tick's cost follows the lending activity, not the cluster's size: the
// Lender listens to the ledger (a ChangeListener registered for its
// lifetime) and keeps an index of the nodes whose devices are lent (Lend or
// Claim holdings) and of the nodes with free devices, ordered by how many;
// idle reclaim looks only at the former, and the warm buffer looks through
// the latter only for a pool below its buffer, in order, until the buffer is
// met. The same index keeps, per claim uid, the nodes where that claim holds
// and its owners there (Claim{J, uid}, one per lend job J), so a claim's
// release reads the ledger only on those nodes, not every holding. The index
// is built from the ledger once at construction (holdings a journal replay
// left are indexed) and follows every change after.
//
// The rules' reconcile follows the churn the same way. A node is marked
// dirty by every ledger change on it (the same listener), by a change of a
// device's reclaiming flag, by MarkRulesDirty (duet-bridge: the nodes whose
// DRA mapping changed) and by the RuleWriter's drift reports (the Lender is
// its RuleDriftListener: a rule deleted or edited behind duet's back marks
// the node of the device it selected). ReconcileRules takes the dirty set
// and, per node, compares the node's wanted rules with the writer's view of
// that node's pool (RuleWriter::ResyncPool): with nothing dirty it calls
// nothing. A full reconcile (Resync: every lendable node's devices against
// every rule duet owns) runs when ReconcileRules finds one due: at the first
// pass, after the writer relisted its rules (OnRulesRelisted), after a
// failed full pass; duet-bridge also runs one every kFullRuleResync as a
// safety net. A node's pass takes the node off the dirty set before it reads
// the ledger, so a change during the pass marks it again.
//
// Thread-safety: thread-safe. `mu_` guards the reclaiming and releasing
// flags and the admissions in flight; a Review decides and rebinds under it
// (so a device flagged reclaiming, or a claim flagged releasing, can never be
// rebound), and waits for durability, taints, quorum reads and Slurm calls
// happen outside it. `index_mu_` guards the index; the listener takes it
// under the ledger's lock, and nothing calls into the ledger while holding
// it. `rules_mu_` serialises the rule passes (Resync, ReconcileRules). Lock
// order: `rules_mu_`, `tick_mu_`, `mu_`, the ledger's, `index_mu_`. Lend's
// lend jobs run on threads of their own, joined before it returns; they
// call only the LendMaker and take none of these locks (a Tick that lends
// holds `tick_mu_` meanwhile, as it did while they ran one at a time).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bridge/dra/dra_device.h"
#include "bridge/dra/lend_maker.h"
#include "bridge/ledger/ledger.h"
#include "common/clock.h"

namespace prometheus {
class Registry;
template <typename T>
class Family;
class Counter;
class Gauge;
}  // namespace prometheus

namespace duet {
namespace dra {

// Machine-readable refusal reasons (AdmissionVerdict::reason).
inline constexpr char kReasonNotLent[] = "NOT_LENT";
inline constexpr char kReasonReclaiming[] = "RECLAIMING";
inline constexpr char kReasonReleasing[] = "RELEASING";
inline constexpr char kReasonHeldByOtherClaim[] = "HELD_BY_OTHER_CLAIM";
inline constexpr char kReasonPartialHost[] = "PARTIAL_HOST";
inline constexpr char kReasonUnmappableNode[] = "UNMAPPABLE_NODE";
inline constexpr char kReasonUnavailable[] = "UNAVAILABLE";
// A gang's slot (docs/dra.md, "Gangs"): the claim's pods are not the gang's
// members, or the gang is not complete yet.
inline constexpr char kReasonGangMembersOnly[] = "GANG_MEMBERS_ONLY";
inline constexpr char kReasonGangWaiting[] = "GANG_WAITING";

struct LenderOptions {
  // Reclaim step 3 and a claim release's step 2: how long after the last
  // admission that could touch a device (or claim) a reclaim (or release)
  // waits before its quorum read (dra.webhook.admission_grace). It must
  // cover the apiserver's write after the webhook allowed it, not only the
  // webhook's own timeout.
  absl::Duration admission_grace = absl::Seconds(15);
  // Lent, free devices kept per pool (dra.warm_buffer).
  uint32_t warm_buffer = 0;
  // A lent, free device above the buffer idle this long is reclaimed.
  absl::Duration reclaim_after = absl::Seconds(60);
  // The lending pool of a ledger node; "" when the node is not in one.
  // Unset: no node lends.
  std::function<std::string(const std::string& node)> pool_of;
  // Gangs (docs/dra.md, "Gangs"). A device of a lending node held by a gang
  // slot (Owner::GangSlot{J, "gang:KEY#S"}, one Slurm job J for the whole
  // gang) is untainted and admitted only as `gang_admit` says for the
  // claim's pods (AdmissionAsk::pods): allowed, or refused with its reason
  // (GANG_MEMBERS_ONLY, GANG_WAITING). Admitting moves the slot's holding
  // to Claim{J, claim uid}; the claim must take every device of the slot,
  // and one slot per node. Called outside the Lender's locks. Null: gang
  // slots are refused (NOT_LENT) and keep their rules.
  std::function<AdmissionVerdict(const Owner& slot, const std::vector<std::string>& pods)>
      gang_admit;
  // The slot owners of gang job `job_id` on `node`: a released claim's
  // Claim{J} holding goes back to one that holds nothing, not to Lend{J}.
  // Empty (or null): J is a lend job.
  std::function<std::vector<Owner>(uint32_t job_id, const std::string& node)> gang_slots;
};

// Lender::Lend's lend jobs in flight at once (one Slurm RPC each).
inline constexpr size_t kLendJobsInFlight = 8;

// The safety net's period: duet-bridge runs a full rule reconcile (Resync)
// this often, besides the first pass and each relist of the rules' watch.
inline constexpr absl::Duration kFullRuleResync = absl::Minutes(10);

// What the rule passes did (tests, benchmarks).
struct RuleSyncStats {
  uint64_t full = 0;          // full reconciles (Resync, or one ReconcileRules ran)
  uint64_t incremental = 0;   // ReconcileRules passes that had dirty nodes
  uint64_t nodes = 0;         // nodes those passes reconciled
};

class Lender final : public AdmissionGate, private ChangeListener, private RuleDriftListener {
 public:
  // Waits until the ledger change `seq` is durable (duet-bridge's journal).
  using DurableWait = std::function<absl::Status(uint64_t seq)>;

  // None is owned; all must outlive the Lender. `registry` may be null (no
  // metrics).
  Lender(Ledger* ledger, LendMaker* lends, const DeviceMapView* map, RuleWriter* rules,
         ClaimLister* claims, DurableWait durable, const Clock* clock, LenderOptions options,
         prometheus::Registry* registry = nullptr);
  // Stops listening to the ledger and to the RuleWriter's drift.
  ~Lender() override;
  Lender(const Lender&) = delete;
  Lender& operator=(const Lender&) = delete;

  // The webhook's question (docs/dra.md, "Admission"). Refused results
  // refuse the whole write and leave the ledger as it was; a dry run decides
  // and records nothing. Deallocations are allowed and change nothing (the
  // write may still fail; ReleaseClaimIfDeallocated gives devices back). A
  // claim being released is refused (RELEASING) any device it does not
  // already hold in the old allocation as well: its holding is no longer
  // "already the claim's" to a new allocation.
  AdmissionVerdict Review(const AdmissionAsk& ask) override ABSL_LOCKS_EXCLUDED(mu_);

  // Gives back what claim `claim_uid` holds if Kubernetes no longer
  // allocates it (the claim was deallocated or deleted, or an allowed write
  // of it never landed), fenced as a reclaim is (docs/dra.md,
  // "Deallocation"): (1) flag the claim releasing, so Review no longer
  // admits it on what it holds as a retry; (2) wait `admission_grace` after
  // the claim's last admission (or after this Lender started, whichever is
  // later) and until none of its admissions is in flight; (3) a quorum read
  // of the claim (ClaimLister::GetClaim; ListAllocated when the holding
  // does not name the claim): each Claim holding of a device the claim
  // still allocates stays, every other goes back to its Lend owner (lent,
  // free; released when its node left the inventory); then un-flag. OK when
  // the claim holds nothing, and when the read shows it still allocated.
  // A failed read keeps everything, un-flags and returns the error.
  // FAILED_PRECONDITION while another release of the claim is under way.
  absl::Status ReleaseClaimIfDeallocated(const std::string& claim_uid)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Lends devices of `kind` on `node`: GPUs as `count` lend jobs of one GPU
  // each, TPUs as one job with every chip of the host (`count` ignored), then
  // deletes their DeviceTaintRules. The lend jobs are asked for concurrently,
  // up to kLendJobsInFlight at once (LendMaker::CreateLend on a thread each);
  // after a group of them with a failure no more are asked for, and what the
  // others lent stays lent. Returns the devices lent, sorted (fewer than
  // `count` GPUs when Slurm had room for fewer; the first failure when none).
  // FAILED_PRECONDITION (with why) on a node that is not lendable. When the
  // rules cannot be deleted the devices stay lent (the webhook admits them;
  // Resync deletes the rules) and the error is returned.
  absl::StatusOr<std::vector<LedgerDevice>> Lend(const std::string& node, DeviceKind kind,
                                                 uint32_t count) ABSL_LOCKS_EXCLUDED(mu_);

  // Reclaims a lent, free device (with every device its lend job lends: a
  // TPU host's chips go back together): (1) flag it reclaiming, (2) taint it,
  // (3) wait `admission_grace` after the last admission that could touch it
  // (or after this Lender started, whichever is later) and until none is in
  // flight,
  // (4) a quorum LIST shows no claim allocates it, (5) cancel its lend job.
  // Any failure un-flags, untaints and returns the error: the device stays
  // lent. FAILED_PRECONDITION when it is not lent and free (or already being
  // reclaimed), or when the LIST shows a claim allocating it.
  absl::Status Reclaim(const LedgerDevice& device) ABSL_LOCKS_EXCLUDED(mu_);

  // One pass of the warm buffer: per pool, lends up to `warm_buffer` lent,
  // free devices on nodes with free devices (never the chips of a host of a
  // multi-host TPU slice: a slice is lent only whole, to a gang), and
  // reclaims lent, free devices
  // above the buffer that have been idle for `reclaim_after`. Returns the
  // first error (the pass goes on past it).
  absl::Status Tick() ABSL_LOCKS_EXCLUDED(mu_);

  // Every DRA device of a lendable node that must carry duet's rule: all but
  // the lent, free, unflagged ones and the ones a claim holds. Sorted.
  std::vector<DraDevice> DesiredTainted() const ABSL_LOCKS_EXCLUDED(mu_);
  // The full reconcile: RuleWriter::Resync(DesiredTainted()). Clears the
  // dirty set first (everything is looked at); on failure the next
  // ReconcileRules runs a full one again.
  absl::Status Resync() ABSL_LOCKS_EXCLUDED(rules_mu_, mu_, index_mu_);
  // The incremental reconcile: a full one when due (the first pass, after a
  // relist of the rules, after a failed full one), else, for each node
  // marked dirty since the last pass, RuleWriter::ResyncPool of its pools
  // (the node's name, and the pool of each DRA device mapped on it) with
  // the node's devices that must carry a rule. Nothing dirty: no call to the
  // RuleWriter, the ledger or the map. A node whose pass fails stays dirty;
  // returns the first error (the pass goes on past it).
  absl::Status ReconcileRules() ABSL_LOCKS_EXCLUDED(rules_mu_, mu_, index_mu_);
  // Marks nodes dirty for the next ReconcileRules (their DRA mapping
  // changed).
  void MarkRulesDirty(const std::vector<std::string>& nodes) ABSL_LOCKS_EXCLUDED(index_mu_);
  RuleSyncStats rule_stats() const ABSL_LOCKS_EXCLUDED(index_mu_);
  // The dirty nodes, sorted (tests).
  std::vector<std::string> DirtyNodes() const ABSL_LOCKS_EXCLUDED(index_mu_);

  // Whether `device` is flagged reclaiming (tests, status).
  bool Reclaiming(const LedgerDevice& device) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether claim `claim_uid` is flagged releasing (tests, status).
  bool Releasing(const std::string& claim_uid) const ABSL_LOCKS_EXCLUDED(mu_);
  // The index (tests): the nodes with lent devices (held by Lend or Claim
  // owners), sorted, and how many devices are lent on `node`.
  std::vector<std::string> IndexedLentNodes() const ABSL_LOCKS_EXCLUDED(index_mu_);
  uint32_t IndexedLent(const std::string& node) const ABSL_LOCKS_EXCLUDED(index_mu_);
  // The index (tests): where claim `claim_uid` holds, as (node, lend job)
  // pairs, sorted; empty when it holds nothing.
  std::vector<std::pair<std::string, uint32_t>> IndexedClaim(const std::string& claim_uid) const
      ABSL_LOCKS_EXCLUDED(index_mu_);

 private:
  struct Admissions {
    int in_flight = 0;
    absl::Time last = absl::InfinitePast();
  };
  // A rebind this call made, for undo.
  struct Moved {
    std::string node;
    Owner from;
    Owner to;
  };

  // What the index knows of one node, from its latest view.
  struct NodeEntry {
    uint32_t lent = 0;       // devices held by a Lend or Claim owner
    uint32_t free_gpus = 0;  // GPUs nobody holds
    uint32_t tpus = 0;       // TPU chips; the host is room when all are free
    bool tpu_room = false;
    // The Claim owners holding on the node (each once).
    std::vector<Owner> claims;
  };
  // Where one claim holds: (node, lend job) -> its owner there.
  using ClaimPlaces = std::map<std::pair<std::string, uint32_t>, Owner>;
  // A node with room, in the order the warm buffer tries them: the most
  // free devices first, then by node name, GPUs before TPUs.
  using RoomKey = std::tuple<uint32_t /* UINT32_MAX - free */, std::string, int /* kind */>;

  // ChangeListener: under the ledger's lock.
  void OnChange(const Change& change) override ABSL_LOCKS_EXCLUDED(index_mu_);
  // RuleDriftListener: on the RuleWriter's watch thread.
  void OnRuleDrift(const DraDevice& device) override ABSL_LOCKS_EXCLUDED(index_mu_);
  void OnRulesRelisted() override ABSL_LOCKS_EXCLUDED(index_mu_);
  void MarkDirty(const std::string& node) ABSL_LOCKS_EXCLUDED(index_mu_);
  // Resync's body, under rules_mu_.
  absl::Status FullResyncLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(rules_mu_);
  // One dirty node's pass.
  absl::Status ReconcileNode(const std::string& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(rules_mu_);
  // Appends the DRA devices of `view` (a lending, lendable node) that must
  // carry a rule.
  void AppendTaintedLocked(const NodeView& view, std::vector<DraDevice>* out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets `node`'s entry from `view` (null: the node left the ledger).
  void IndexNodeLocked(const std::string& node, const NodeView* view)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(index_mu_);
  // The holdings of claim `claim_uid` (sorted by node, then owner, as
  // Ledger::ListHoldings sorts them): the index names the nodes, the ledger
  // is read on those only.
  std::vector<Holding> ClaimHoldings(const std::string& claim_uid) const
      ABSL_LOCKS_EXCLUDED(index_mu_);
  // Tick's lending half for pool `pool`, which has `lent_free` lent, free
  // devices: lends on the indexed nodes with room, in order, until the
  // buffer is met. Returns the new lent, free count.
  uint32_t FillPool(const std::string& pool, uint32_t lent_free,
                    const std::function<void(const absl::Status&)>& note)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(tick_mu_) ABSL_LOCKS_EXCLUDED(mu_, index_mu_);

  // Under mu_: decides the ask and, unless a dry run, rebinds. On refusal
  // undoes what it rebound. `seq` gets the seq to wait for (0: none).
  // `gangs`: gang_admit's verdict for each gang slot the ask touches (by
  // the slot owner's pod uid), asked before the lock.
  AdmissionVerdict DecideLocked(const AdmissionAsk& ask,
                                const std::map<std::string, AdmissionVerdict>& gangs,
                                std::vector<LedgerDevice>* touched,
                                std::vector<Moved>* moved, uint64_t* seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UndoLocked(const std::vector<Moved>& moved) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reclaim step 3: waits until no admission touching `devices` is in flight
  // and `admission_grace` has passed since the last one began.
  void AwaitAdmissionsLocked(const std::vector<LedgerDevice>& devices)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Release step 2: the same for the admissions of claim `claim_uid`.
  void AwaitClaimAdmissionsLocked(const std::string& claim_uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the record of the claim's admissions once none is in flight and
  // the grace after the last has passed (it can no longer make a wait).
  void ForgetClaimAdmissionsLocked(const std::string& claim_uid)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until `in_flight()` is 0 and `last() + admission_grace` passed
  // (`last` at least started_at_).
  void AwaitQuietLocked(const std::function<int()>& in_flight,
                        const std::function<absl::Time()>& last)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // gang_admit's verdicts for the gang slots `ask` wants (outside mu_).
  std::map<std::string, AdmissionVerdict> GangVerdicts(const AdmissionAsk& ask) const;
  // The DRA names of `devices` (an error when one does not map).
  absl::StatusOr<std::vector<DraDevice>> DraNames(const std::vector<LedgerDevice>& devices) const;
  bool Lending(const std::string& node) const;
  void CountAdmission(const AdmissionVerdict& v);
  void CountReclaim(const char* result);
  void CountRelease(const char* result);

  Ledger* const ledger_;
  LendMaker* const lends_;
  const DeviceMapView* const map_;
  RuleWriter* const rules_;
  ClaimLister* const claims_;
  const DurableWait durable_;
  const Clock* const clock_;
  const LenderOptions options_;
  // Admissions before this Lender existed (a restart) are not known: reclaim
  // step 3 counts from here at least.
  const absl::Time started_at_;

  mutable absl::Mutex mu_;
  std::set<LedgerDevice> reclaiming_ ABSL_GUARDED_BY(mu_);
  std::map<LedgerDevice, Admissions> admissions_ ABSL_GUARDED_BY(mu_);
  // Claims being released, and the admissions of each claim (release step 2).
  std::set<std::string> releasing_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Admissions> claim_admissions_ ABSL_GUARDED_BY(mu_);
  // When each lent, free device was last seen lent and free (Tick).
  std::map<LedgerDevice, absl::Time> idle_since_ ABSL_GUARDED_BY(mu_);
  // Serialises Tick passes (a pass lends and reclaims outside mu_).
  absl::Mutex tick_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  // Serialises the rule passes.
  absl::Mutex rules_mu_ ABSL_ACQUIRED_BEFORE(tick_mu_, mu_);

  // The index (see the class comment).
  mutable absl::Mutex index_mu_ ABSL_ACQUIRED_AFTER(mu_);
  absl::flat_hash_map<std::string, NodeEntry> nodes_ ABSL_GUARDED_BY(index_mu_);
  std::set<std::string> lent_nodes_ ABSL_GUARDED_BY(index_mu_);
  std::set<RoomKey> room_ ABSL_GUARDED_BY(index_mu_);
  // Per claim uid, where it holds (nodes_' `claims`, by claim).
  absl::flat_hash_map<std::string, ClaimPlaces> claim_places_ ABSL_GUARDED_BY(index_mu_);
  // Nodes whose spec changed (their pool may have): Tick asks pool_of again.
  std::set<std::string> respec_ ABSL_GUARDED_BY(index_mu_);
  // While the constructor builds the index: the nodes the listener already
  // set from a later view than the constructor's snapshot.
  bool building_ ABSL_GUARDED_BY(index_mu_) = true;
  // The rules' reconcile: the nodes marked dirty, whether a full pass is due.
  std::set<std::string> dirty_ ABSL_GUARDED_BY(index_mu_);
  bool full_due_ ABSL_GUARDED_BY(index_mu_) = true;
  RuleSyncStats rule_stats_ ABSL_GUARDED_BY(index_mu_);
  std::set<std::string> touched_ ABSL_GUARDED_BY(index_mu_);
  // Tick's cache of pool_of: each node's pool ("" none), and how many nodes
  // each pool has.
  absl::flat_hash_map<std::string, std::string> pool_of_node_ ABSL_GUARDED_BY(tick_mu_);
  std::map<std::string, uint32_t> pool_nodes_ ABSL_GUARDED_BY(tick_mu_);

  prometheus::Gauge* lent_gauge_ = nullptr;
  prometheus::Family<prometheus::Counter>* admissions_total_ = nullptr;
  prometheus::Counter* lends_total_ = nullptr;
  prometheus::Family<prometheus::Counter>* reclaims_total_ = nullptr;
  prometheus::Family<prometheus::Counter>* releases_total_ = nullptr;
};

}  // namespace dra
}  // namespace duet
