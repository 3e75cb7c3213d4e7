#pragma once

// GangLends: gangs in the DRA lending mode (docs/dra.md, "Gangs";
// docs/gangs.md, "Gangs in the DRA lending mode").
//
// Lending for a gang is the extender's single gang allocation: the lending
// mode's own gang::GangRegistry (its node_filter: the lendable nodes of the
// lending pools; its in_use: InUse below) reserves the whole gang with one
// Slurm job (GangMaker::Create, "duet-gang:KEY", nodes from the planner,
// placement::PickGangNodes), or nothing, with the registry's
// DuetGangUnplaceable Event. The slots' devices (Owner::GangSlot{J,
// "gang:KEY#S"}) are untainted, and the Lender's webhook admits them only as
// Admit says:
//  - the claim's pods (status.reservedFor, ownerReferences) must include a
//    pod Lend recognised as a member of that very gang (GANG_MEMBERS_ONLY
//    otherwise: any other claim, a claim naming no pod, a gang duet does
//    not know);
//  - the gang must be complete: every member seen pending (GANG_WAITING
//    otherwise), so that nothing runs on a gang's devices before the whole
//    gang has them, and a gang released while gathering never has a claim
//    on its job.
// Admitting moves the slot to Claim{J, claim uid}; a claim given back goes
// back to a vacant slot of its node (SlotOwners). The registry releases a
// gathering gang at reserve_timeout (or when a member is deleted), and a
// complete gang idle_release after no claim holds any of its devices.
//
// Membership is remembered by pod uid, from Lend, for `member_ttl` after the
// pod was last seen pending; a member restarted under a new uid is a member
// again once seen pending (whether or not the registry had a free slot for
// it: the gang is already complete).
//
// Thread-safety: thread-safe. `mu_` guards the members; the registry is
// called outside it.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bridge/dra/dra_device.h"
#include "bridge/gang/gang.h"
#include "bridge/gang/registry.h"
#include "bridge/ledger/ledger.h"
#include "common/clock.h"

namespace duet {
namespace dra {

class GangLends {
 public:
  // `registry` (not owned) must outlive this; `clock` null: Clock::Real().
  explicit GangLends(gang::GangRegistry* registry, const Clock* clock = nullptr,
                     absl::Duration member_ttl = absl::Minutes(10));
  GangLends(const GangLends&) = delete;
  GangLends& operator=(const GangLends&) = delete;

  // A pending pod, recognised as a member of `spec.key` asking
  // `spec.member` of the lending drivers: remembers it as a member and asks
  // the registry (which reserves the whole gang when it is new, and gives
  // the pod a slot). The registry's answer: kNoRoom when the gang cannot be
  // placed whole (nothing held; the registry posted DuetGangUnplaceable),
  // kWaiting, kReady, kMismatch, kRefused (GANG_FULL for a restarted member
  // of a complete gang: it is admitted all the same).
  gang::Admission Lend(const gang::GangSpec& spec, const gang::MemberRef& member)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The fence (LenderOptions::gang_admit): whether a claim for `pods` may
  // take the devices of gang slot `slot`.
  AdmissionVerdict Admit(const Owner& slot, const std::vector<std::string>& pods) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // LenderOptions::gang_slots.
  std::vector<Owner> SlotOwners(uint32_t job_id, const std::string& node) const {
    return registry_->SlotOwners(job_id, node);
  }

  // GangRegistryOptions::in_use over `ledger`: a Claim holding of job
  // `job_id` on one of `nodes`.
  static bool InUse(const Ledger& ledger, uint32_t job_id, const std::vector<std::string>& nodes);

  // The gang `pod_uid` was recognised a member of (tests, logs).
  std::optional<gang::GangKey> MemberOf(const std::string& pod_uid) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Forgets the members not seen pending for `member_ttl`.
  void Prune() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Member {
    gang::GangKey key;
    absl::Time seen;
  };

  gang::GangRegistry* const registry_;
  const Clock* const clock_;
  const absl::Duration member_ttl_;
  mutable absl::Mutex mu_;
  std::map<std::string, Member> members_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dra
}  // namespace duet
