#pragma once

// StaleHolders: a Slurm step refused because the ledger lags Slurm.
//
// Slurm's allocator is the arbiter between Slurm jobs (DESIGN.md §4): it never
// gives one device to two running jobs. So when a Slurm owner's Hold is
// refused because another Slurm-side owner holds some of its devices in the
// ledger, the ledger may simply not have seen that holder end yet: a job that
// just finished (its imported holding lives until the next sync pass), or a
// placeholder whose pod's cancel killed the job but has not released the
// ledger yet. ReleaseEnded asks slurmctld about each such holder and releases
// the ones that have ended, so Slurm's next job on those devices is not
// refused; the caller then tries the Hold once more.
//
// What it never releases:
//  - a holder whose Slurm job is still running or suspended (a real conflict:
//    the refusal stands);
//  - a pod (OwnerKind::kPod): pods are not Slurm's to judge;
//  - a claim (OwnerKind::kClaim, the DRA lending mode), even when its lend
//    job has ended: Kubernetes uses the device until the claim is
//    deallocated;
//  - a placeholder whose pod is still live or unknown, even when its Slurm job
//    has ended (an admin's scancel, a node that went down): the pod still
//    uses the devices, so the SPANK fence keeps refusing them (SlurmSync
//    repairs the placeholder).
//
// Thread-safety: thread-safe (Ledger and SlurmClient are; no own state).

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bridge/ledger/ledger.h"
#include "bridge/slurm/slurm_client.h"

namespace duet {

// What Kubernetes says about the pod behind a placeholder.
enum class PodLiveness {
  kLive,     // bound and not finished: it uses its devices
  kGone,     // deleted or finished (Succeeded/Failed)
  kUnknown,  // not known (no pod watch, view not synced, not seen yet)
};
using PodLivenessFn = std::function<PodLiveness(const std::string& pod_uid)>;

class StaleHolders {
 public:
  // `ledger` and `slurm` are not owned and must outlive this object.
  // `pod_liveness` may be null: every pod then counts as kUnknown.
  StaleHolders(Ledger* ledger, SlurmClient* slurm, PodLivenessFn pod_liveness);

  // `requester` (a Slurm job or step) was refused `devices` on `node`.
  // Releases the overlapping holdings of other Slurm jobs (the job and all
  // its steps on `node`) and of placeholders whose Slurm job is no longer
  // running or suspended, as described above. Returns how many holdings it
  // released; UNAVAILABLE when slurmctld cannot be asked (nothing released).
  absl::StatusOr<int> ReleaseEnded(const std::string& node, const Owner& requester,
                                   const std::vector<HeldDevice>& devices) const;

 private:
  Ledger* const ledger_;
  SlurmClient* const slurm_;
  const PodLivenessFn pod_liveness_;
};

}  // namespace duet
