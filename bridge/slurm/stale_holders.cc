#include "bridge/slurm/stale_holders.h"

#include <algorithm>
#include <set>
#include <utility>

#include "spdlog/spdlog.h"

namespace duet {
namespace {

bool Overlaps(const Holding& h, const std::vector<HeldDevice>& devices) {
  return std::any_of(h.devices.begin(), h.devices.end(), [&](const HeldDevice& d) {
    return std::any_of(devices.begin(), devices.end(),
                       [&](const HeldDevice& w) { return w.kind == d.kind && w.index == d.index; });
  });
}

}  // namespace

namespace {
// Pods and claims are Kubernetes' to end, whatever Slurm says of a job.
bool NotSlurms(const Owner& o) {
  return o.kind == OwnerKind::kPod || o.kind == OwnerKind::kClaim;
}
}  // namespace

StaleHolders::StaleHolders(Ledger* ledger, SlurmClient* slurm, PodLivenessFn pod_liveness)
    : ledger_(ledger), slurm_(slurm), pod_liveness_(std::move(pod_liveness)) {}

absl::StatusOr<int> StaleHolders::ReleaseEnded(const std::string& node, const Owner& requester,
                                               const std::vector<HeldDevice>& devices) const {
  const std::vector<Holding> holdings = ledger_->ListHoldings(node);
  // Slurm job ids whose holdings block the request, asked of slurmctld once each.
  std::set<uint32_t> blocking;
  for (const Holding& h : holdings) {
    if (NotSlurms(h.owner) || h.owner.SameGroup(requester)) continue;
    if (!Overlaps(h, devices)) continue;
    blocking.insert(h.owner.job_id);
  }
  int released = 0;
  for (const uint32_t job_id : blocking) {
    absl::StatusOr<std::optional<SlurmJobInfo>> job = slurm_->GetJob(job_id);
    if (!job.ok()) return job.status();
    const bool runs = job->has_value() && ((*job)->state == SlurmJobState::kRunning ||
                                           (*job)->state == SlurmJobState::kSuspended);
    if (runs) continue;  // a live holder: the refusal stands
    const char* why = job->has_value() ? SlurmJobStateName((*job)->state) : "gone from Slurm";
    for (const Holding& h : holdings) {
      if (NotSlurms(h.owner) || h.owner.job_id != job_id ||
          h.owner.SameGroup(requester))
        continue;
      if (h.owner.kind == OwnerKind::kPlaceholder) {
        const PodLiveness pod =
            pod_liveness_ ? pod_liveness_(h.owner.pod_uid) : PodLiveness::kUnknown;
        if (pod != PodLiveness::kGone) {
          spdlog::warn(
              "{} refused on {}: placeholder job {} has ended in Slurm ({}) but pod uid {} is {}: "
              "its devices stay fenced",
              requester.ToString(), node, job_id, why, h.owner.pod_uid,
              pod == PodLiveness::kLive ? "still running" : "not known to have ended");
          continue;
        }
      }
      absl::StatusOr<ReleaseResult> r = ledger_->Release(node, h.owner);
      if (!r.ok()) return r.status();
      if (r->released) {
        ++released;
        spdlog::info("{} on {}: released {}, whose Slurm job has ended ({})", requester.ToString(),
                     node, h.owner.ToString(), why);
      }
    }
  }
  return released;
}

}  // namespace duet
