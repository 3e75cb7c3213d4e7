#pragma once

// GangRegistry: the one place gangs live in duet-bridge (docs/gangs.md 2).
//
//  Reserve   the first member of an unknown gang that the filter sees
//            reserves the gang whole: the planner picks `min_member` slots
//            on nodes of one pool (every node the same number of members)
//            from the ledger's snapshot, counting on each node how many
//            members fit now (placement::Fits against the node's load, as
//            the extender's filter does for one pod), and GangMaker::Create
//            makes the one Slurm job and records each slot's devices under
//            its slot owner. A gang that cannot be placed whole holds
//            nothing (Admission::kNoRoom, Event DuetGangUnplaceable).
//            A gang whose members select a multi-host TPU slice
//            (GangSpec::tpu_topology) takes every host of one free slice
//            pool instead, one member per host (slice.h); the hosts of
//            multi-host slices are no candidates for any other TPU gang.
//  Gather    each member takes a slot: the lowest free one; a member keeps
//            its slot (by pod uid). A member asking something else than the
//            gang's member request is refused (kMismatch). The gang is
//            complete once every slot has a member: `on_complete` is told of
//            every member and its node (duet-bridge annotates the pods).
//  Bind      only once complete, only on the member's slot's node: the slot
//            owner's holding is Ledger::Rebind-ed to Placeholder{J, pod uid};
//            Unbind moves it back (a failed POST, a member that ended).
//  Release   while gathering: a member's deletion, or reserve_timeout
//            passing since the reservation, cancels the whole gang
//            (GangMaker::Cancel). Once complete: a member that ends gives
//            its devices back to its slot; a gang with no member for
//            idle_release is cancelled. Event DuetGangReleased, counted by
//            reason.
//  Recover   at start, from the ledger: slot holdings (pod uid
//            "gang:KEY#SLOT") and the Placeholder holdings of their jobs
//            (and of jobs `job_gang` names) become gangs again, with the
//            same slots on the same nodes (slot s is on the s / per_node-th
//            node by name, as Reserve lays them out). With `in_use` (the
//            DRA lending mode) the Claim holdings of those jobs count as
//            taken slots too.
//
// The slot owner is whatever GangMaker::Create recorded (bridge/slurm's
// Placeholders: Owner::GangSlot, kind kGangSlot); the registry recognises
// slot holdings by their pod uid prefix ("gang:", kGangSlotPrefix) only.
//
// Thread-safety: every method may be called concurrently. One mutex (`mu_`)
// guards the gangs (single pods never take it). A reservation picks its nodes
// under it, then makes the Slurm job (GangMaker::Create, and the wait for
// durability) without it: meanwhile the gang is "reserving" (its other
// members' Admit waits for the outcome, so a gang is reserved once) and its
// nodes are promised (no other reservation picks them, so two reservations
// in flight never ask Slurm for the same node); both end under the mutex
// when Create returns, whether it succeeded or not. A reservation that finds
// no room while others are in flight waits for them and looks again, so it
// decides as if they had run one after another. GangMaker::Cancel still runs
// under the mutex (releases are rare and not on a filter's path). The
// callbacks (`on_event`, `on_complete`) run after the mutex is released.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bridge/gang/gang.h"
#include "bridge/ledger/ledger.h"
#include "bridge/placement/placement.h"
#include "bridge/placement/topology.h"
#include "common/clock.h"

namespace duet {
namespace gang {

// A member pod, for slots, Events and annotations.
struct MemberRef {
  std::string uid;
  std::string ns;
  std::string name;
};

// Picks the gang's nodes among the candidates (duet-bridge passes
// placement::PickGangNodes). Same contract as PickGangNodes.
using GangPlannerFn = std::function<std::optional<placement::GangPick>(
    const std::vector<placement::GangCandidate>& candidates, uint32_t members, std::string* reason)>;

enum class GangState : uint8_t {
  kGathering = 1,  // reserved; not every slot has a member yet
  kComplete = 2,   // every slot had a member once; members may bind
};
const char* GangStateName(GangState state);

// Why a gang was released (the `reason` label of
// duet_gang_releases_total).
enum class ReleaseReason : uint8_t {
  kMemberDeleted = 0,   // a member went away before the gang was complete
  kReserveTimeout = 1,  // members stopped arriving
  kIdle = 2,            // a complete gang with no member for idle_release
};
inline constexpr int kReleaseReasons = 3;
// "member-deleted", "reserve-timeout", "idle".
const char* ReleaseReasonName(ReleaseReason reason);

// An Event about a gang, for each of `members` (duet-bridge posts it on
// every member pod through its event recorder).
struct GangEvent {
  GangKey key;
  std::string type;    // "Normal" or "Warning"
  std::string reason;  // "DuetGangUnplaceable", "DuetGangReleased"
  std::string message;
  std::vector<MemberRef> members;
};

struct GangRegistryOptions {
  // Required.
  GangPlannerFn planner;
  // A node's place in the topology, for the planner; null: none known.
  // duet-bridge: placement::TopologyOf over the view's spec and devices.
  std::function<placement::NodeTopology(const NodeView&)> topology;
  // CPU/memory committed on a node (as the extender's `load`); null: zero.
  std::function<placement::NodeLoad(const NodeView&)> load;
  // Why Slurm will not run work on a node now; empty when it will. Null:
  // never. Such nodes are no candidates.
  std::function<std::string(const std::string& node)> unusable;
  // Blocks until ledger sequence `seq` is durable; null: nothing to wait.
  std::function<absl::Status(uint64_t seq)> wait_durable;
  // Whether a member of a gathering gang still exists (Tick asks for each;
  // false: deleted, the gang is released). Null: only OnMemberGone tells.
  // An error is no answer (nothing is released on a guess).
  std::function<absl::StatusOr<bool>(const MemberRef&)> member_exists;
  // The gang a Slurm job of that id is (SlurmSync imports duet-gang:KEY
  // jobs), for Recover to find gangs whose every slot is bound. Null: only
  // jobs with a slot holding are known.
  std::function<std::optional<GangKey>(uint32_t job_id)> job_gang;
  // The owner GangMaker records for slot `slot` of job `job_id`
  // (duet-bridge: Owner::GangSlot(job, key.ToString(), slot)). Recover uses
  // it for slots whose devices a member holds; null: the kind of the job's
  // other slots (Placeholder when it has none), pod uid SlotUid(key, slot).
  std::function<Owner(uint32_t job_id, const GangKey& key, uint32_t slot)> slot_owner;
  // The nodes this registry places gangs on and recovers gangs of; null:
  // every node. duet-bridge gives the extender's registry the nodes of no
  // DRA lending pool and the lending mode's registry the lendable nodes of
  // its pools, so that two registries never share a node's gangs.
  std::function<bool(const std::string& node)> node_filter;
  // The DRA lending mode (docs/dra.md, "Gangs"): whether a ResourceClaim
  // holds a device of gang job `job_id` on one of `nodes` (Claim{J, uid}).
  // When set, members are not followed by pod uid once a gang is complete:
  // a complete gang is idle while no claim holds any of its devices, and
  // idle_release after that it is released; Recover counts the claim
  // holdings of a gang's job as taken slots (the gang is complete). Called
  // under the registry's mutex (it may read the ledger). Null: the
  // extender's rules (members end through OnMemberGone).
  std::function<bool(uint32_t job_id, const std::vector<std::string>& nodes)> in_use;
  // Told of Events; null: none.
  std::function<void(const GangEvent&)> on_event;
  // Told once a gang is complete: each member and its slot's node
  // (duet-bridge annotates duet.io/gang-node: NODE). Null: none.
  std::function<void(const GangKey&, const std::vector<std::pair<MemberRef, std::string>>&)>
      on_complete;
  absl::Duration reserve_timeout = absl::Seconds(300);
  absl::Duration idle_release = absl::Seconds(60);
  const Clock* clock = Clock::Real();
};

// The filter's answer for one member.
struct Admission {
  enum Kind {
    kWaiting,   // reserved, not complete: fail every node (GANG_WAITING)
    kNoRoom,    // cannot be placed whole; nothing held (GANG_NO_ROOM)
    kMismatch,  // asks other than the gang's members (GANG_MEMBER_MISMATCH)
    kRefused,   // any other refusal (the gang is full, Slurm failed, ...)
    kReady,     // complete: pass exactly `node`
  };
  Kind kind = kRefused;
  // "GANG_WAITING: 2/4 members (gang podgroup/ns/train)", ...; empty for kReady.
  std::string reason;
  std::string node;
  uint32_t slot = 0;
};

// The outcome of BindMember.
struct MemberBind {
  Holding holding;       // the member's Placeholder{J, uid} holding on the node
  bool created = false;  // false: it held there already (a retried bind)
  uint64_t seq = 0;      // the ledger sequence to wait for
};

// What Find says of a gang.
struct GangInfo {
  GangKey key;
  GangState state = GangState::kGathering;
  uint32_t job_id = 0;
  uint32_t slots = 0;
  uint32_t members = 0;  // slots with a member
};

struct GangStats {
  uint64_t reservations = 0;  // gangs reserved (GangMaker::Create succeeded)
  uint64_t unplaceable = 0;   // reservations refused (no room, Slurm refused)
  uint64_t releases[kReleaseReasons] = {};
  uint64_t gathering = 0;     // gangs by state now
  uint64_t complete = 0;
};

class GangRegistry {
 public:
  // `ledger` and `maker` are required, not owned, and must outlive this.
  GangRegistry(Ledger* ledger, GangMaker* maker, GangRegistryOptions options);
  GangRegistry(const GangRegistry&) = delete;
  GangRegistry& operator=(const GangRegistry&) = delete;

  // Rebuilds the gangs from the ledger (see the file comment). Call once,
  // before the first Admit. Holdings that do not form a gang (a slot uid
  // that does not parse, slots that do not lay out evenly) are logged and
  // left alone. Returns how many gangs were rebuilt.
  absl::StatusOr<size_t> Recover() ABSL_LOCKS_EXCLUDED(mu_);

  // The filter's decision for `member` of `spec.key`, reserving the gang
  // when it is new and taking a slot for the member. `spec.member` is the
  // member's own request.
  Admission Admit(const GangSpec& spec, const MemberRef& member) ABSL_LOCKS_EXCLUDED(mu_);

  // The node of the member's slot, when the member's gang is complete.
  std::optional<std::string> NodeOf(const std::string& uid) const ABSL_LOCKS_EXCLUDED(mu_);

  // Moves the member's slot to Placeholder{J, uid} on `node`. Errors:
  // NOT_FOUND (not a member), FAILED_PRECONDITION (gang not complete, or
  // `node` is not the slot's node: the message names it), and the ledger's.
  absl::StatusOr<MemberBind> BindMember(const std::string& uid, const std::string& node)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Undoes BindMember (a bind that failed): the member's devices go back to
  // its slot; the member keeps the slot. OK when nothing is bound.
  absl::Status UnbindMember(const std::string& uid) ABSL_LOCKS_EXCLUDED(mu_);

  // A member pod is gone (deleted, or ended). Gathering: the gang is
  // released (reason member-deleted). Complete: its devices go back to its
  // slot and the slot is free for the next member. False when `uid` is no
  // member of any gang (nothing done).
  absl::StatusOr<bool> OnMemberGone(const std::string& uid) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether Slurm job `job_id` is a gang's (its member placeholders are
  // then the registry's to give back, not to cancel).
  bool IsGangJob(uint32_t job_id) const ABSL_LOCKS_EXCLUDED(mu_);

  // The gang `key`, when reserved.
  std::optional<GangInfo> Find(const GangKey& key) const ABSL_LOCKS_EXCLUDED(mu_);

  // The slot owners of gang job `job_id` on `node`, in slot order (the
  // owner each slot's devices go back to); empty when `job_id` is no
  // reserved gang's or the gang has no slot there.
  std::vector<Owner> SlotOwners(uint32_t job_id, const std::string& node) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Releases gangs past reserve_timeout or idle_release, and asks
  // `member_exists` about gathering members. Call periodically.
  void Tick() ABSL_LOCKS_EXCLUDED(mu_);

  GangStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Slot {
    std::string node;
    Owner owner;       // the slot owner GangMaker recorded
    MemberRef member;  // uid empty: free
    bool bound = false;  // the member holds as Placeholder{J, uid}
  };
  struct Gang {
    GangKey key;
    GangSpec spec;
    // Recovered gangs do not know the member's CPU/memory: the next member
    // sets it.
    bool member_known = true;
    uint32_t job_id = 0;
    GangState state = GangState::kGathering;
    std::vector<Slot> slots;
    absl::Time reserved_at;
    // When the last member left a complete gang; InfinitePast: members now.
    absl::Time idle_since = absl::InfinitePast();
  };
  // Callbacks to run once the mutex is released.
  struct Pending {
    std::vector<GangEvent> events;
    std::optional<std::pair<GangKey, std::vector<std::pair<MemberRef, std::string>>>> complete;
  };

  // Makes the Slurm job without mu_ (see the file comment): mu_ is released
  // and taken again inside.
  absl::StatusOr<std::unique_ptr<Gang>> Reserve(const GangSpec& spec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Nodes promised to a reservation in flight are no candidates.
  std::vector<placement::GangCandidate> Candidates(const placement::PodRequest& member,
                                                   uint32_t members) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Admission Take(Gang* gang, const MemberRef& member, Pending* pending)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancels the gang and forgets it. UNAVAILABLE keeps it.
  absl::Status Release(const GangKey& key, ReleaseReason reason, const std::string& why,
                       Pending* pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rebinds a bound slot's member placeholder back to the slot owner.
  absl::Status ReturnToSlot(Gang* gang, Slot* slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Gang* GangOfMember(const std::string& uid, Slot** slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(Pending pending) ABSL_LOCKS_EXCLUDED(mu_);

  Ledger* const ledger_;
  GangMaker* const maker_;
  const GangRegistryOptions options_;

  mutable absl::Mutex mu_;
  std::map<GangKey, std::unique_ptr<Gang>> gangs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, GangKey> member_gang_ ABSL_GUARDED_BY(mu_);
  // Gangs whose Slurm job is being made, and the nodes they picked (no two
  // reservations in flight share a node).
  absl::flat_hash_set<GangKey> reserving_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> promised_ ABSL_GUARDED_BY(mu_);
  uint64_t reservations_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t unplaceable_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t releases_[kReleaseReasons] ABSL_GUARDED_BY(mu_) = {};
};

// "gang:KEY#SLOT": the pod uid of slot `slot` of gang `key`.
std::string SlotUid(const GangKey& key, uint32_t slot);
// The inverse: INVALID_ARGUMENT for a uid that is not a slot's.
absl::StatusOr<std::pair<GangKey, uint32_t>> ParseSlotUid(const std::string& uid);

// Whether two members ask the same (devices, share, models, CPU, memory).
bool SameMemberRequest(const placement::PodRequest& a, const placement::PodRequest& b);

}  // namespace gang
}  // namespace duet
