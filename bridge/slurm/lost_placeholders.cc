// SlurmSync's lost placeholders (slurm_sync.h, step 3): a placeholder whose
// Slurm job vanished while its pod may run is kept in the ledger, repaired
// (Placeholders::Repair) with backoff, and reported once; a preempted one
// follows slurm.preemption.

#include "bridge/slurm/slurm_sync.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bridge/slurm/placeholders.h"
#include "bridge/slurm/pod_evictions.h"
#include "spdlog/spdlog.h"

namespace duet {


const char* RepairFailureName(RepairFailure f) {
  switch (f) {
    case RepairFailure::kNodeUnusable: return "node_unusable";
    case RepairFailure::kSlurmDevicesBusy: return "slurm_devices_busy";
    case RepairFailure::kLedgerConflict: return "ledger_conflict";
    case RepairFailure::kSlurmUnavailable: return "slurm_unavailable";
    case RepairFailure::kOther: return "other";
  }
  return "other";
}

namespace {

// Why a repair failed, from Placeholders::Repair's status (see its errors).
RepairFailure ClassifyRepairFailure(const absl::Status& s) {
  if (absl::IsUnavailable(s)) return RepairFailure::kSlurmUnavailable;
  const absl::string_view m = s.message();
  if (absl::StrContains(m, "also held by another owner in the ledger")) {
    return RepairFailure::kLedgerConflict;
  }
  // Slurm had no room for, or chose other indices than, devices no other
  // owner holds in the ledger: Slurm counts them in use although no job the
  // ledger knows holds them (e.g. GRES it keeps counted after a restart).
  if (absl::IsResourceExhausted(s) || absl::StrContains(m, "Slurm gave job")) {
    return RepairFailure::kSlurmDevicesBusy;
  }
  if (absl::IsFailedPrecondition(s)) return RepairFailure::kNodeUnusable;
  return RepairFailure::kOther;
}

// Waits between repair attempts of one lost placeholder: the first retry
// at the next pass, then doubling up to five minutes, so a placeholder Slurm
// cannot re-make does not allocate and cancel jobs every pass.
absl::Duration RepairBackoff(int failures) {
  if (failures <= 1) return absl::ZeroDuration();
  return std::min(absl::Seconds(5) * (1 << std::min(failures - 2, 6)), absl::Minutes(5));
}

}  // namespace

void SlurmSync::HandleLost(const Holding& h, const std::vector<SlurmJobInfo>& jobs,
                           const std::vector<SlurmNodeInfo>& nodes) {
  const auto key = std::make_pair(h.node, h.owner.job_id);
  const bool reported = fenced_.count(key) > 0;
  RepairState& state = repairs_[key];
  const absl::Time now = clock_->Now();
  if (now < state.next_try) return;  // backing off; reported already
  PlaceholderLoss loss;
  loss.node = h.node;
  loss.lost_job_id = h.owner.job_id;
  loss.devices = h.devices;
  loss.pod.uid = h.owner.pod_uid;
  uint32_t cpus = 1;
  uint64_t memory_mib = 0;
  if (auto it = placeholders_seen_.find(h.owner.job_id); it != placeholders_seen_.end()) {
    loss.pod = it->second.pod;
    cpus = std::max<uint32_t>(1, it->second.cpus);
    memory_mib = it->second.memory_mib;
  } else {
    for (const SlurmJobInfo& j : jobs) {  // a finished record Slurm still keeps
      if (j.job_id != h.owner.job_id) continue;
      if (auto pod = ParsePlaceholderComment(j.comment)) loss.pod = *pod;
      cpus = std::max<uint32_t>(1, j.cpus);
      memory_mib = j.memory_mib;
    }
  }
  // Neither the bridge nor Slurm kept the job (slurmctld lost it right
  // after the bind, before a pass saw it): the pod watch names the pod, so
  // the new placeholder is still "duet-pod:NS/NAME".
  if ((loss.pod.ns.empty() || loss.pod.name.empty()) && options_.pod_name) {
    if (std::optional<PlaceholderPod> named = options_.pod_name(h.owner.pod_uid)) {
      loss.pod.ns = named->ns;
      loss.pod.name = named->name;
    }
  }
  // Slurm preempted it: the preemptor runs on the pod's devices now, so a
  // repair cannot get them back. slurm.preemption decides.
  bool preempted = false;
  for (const SlurmJobInfo& j : jobs) {
    if (j.job_id == h.owner.job_id) preempted = j.preempted;
  }
  if (preempted && options_.evictions != nullptr && !loss.pod.name.empty()) {
    if (now < options_.evictions->Preempted(loss.pod, h.node, h.owner.job_id)) return;
    // The wait is over and the pod stays (a PodDisruptionBudget): its
    // placeholder is re-made like any lost one, so that Slurm stops giving
    // its devices to jobs that duet would refuse.
  } else if (preempted && !reported) {
    spdlog::error(
        "slurm sync: Slurm preempted placeholder job {} of pod {}/{} (uid {}) on {} although "
        "slurm.preemption is {}: its devices stay fenced and the preemptor's steps on them are "
        "refused; exempt the placeholder partition from preemption (docs/config.md, "
        "\"Placeholders in Slurm\") or set slurm.preemption: evict-pods",
        h.owner.job_id, loss.pod.ns, loss.pod.name, loss.pod.uid, h.node, options_.preemption);
  }
  std::string unusable = "not known to Slurm";
  for (const SlurmNodeInfo& n : nodes) {
    if (n.name != h.node) continue;
    unusable = n.future ? "no slurmd registered" : UnusableReason(n);
  }
  RepairFailure failure = RepairFailure::kNodeUnusable;
  if (unusable.empty()) {
    absl::StatusOr<std::vector<Holding>> fixed =
        Placeholders(ledger_, slurm_,
                     {options_.placeholder_partition, options_.placeholder_qos})
            .Repair(h, loss.pod, cpus, memory_mib);
    if (fixed.ok()) {
      loss.repaired = true;
      for (const Holding& n : *fixed) loss.new_job_ids.push_back(n.owner.job_id);
    } else {
      loss.detail = std::string(fixed.status().message());
      failure = ClassifyRepairFailure(fixed.status());
    }
  } else {
    loss.detail = absl::StrCat("node ", h.node, " is ", unusable);
  }
  if (loss.repaired) {
    Count(&SlurmSyncStats::placeholder_repairs);
    if (!reported) Count(&SlurmSyncStats::placeholders_lost_repaired);
    fenced_.erase(key);
    repairs_.erase(key);
    spdlog::warn(
        "slurm sync: placeholder job {} of pod {}/{} (uid {}) on {} was gone from Slurm; "
        "repaired as job(s) {}",
        h.owner.job_id, loss.pod.ns, loss.pod.name, loss.pod.uid, h.node,
        absl::StrJoin(loss.new_job_ids, ","));
  } else {
    loss.failure = failure;
    // Waiting for a node to come back costs nothing; a refused repair made
    // and cancelled Slurm jobs, so it backs off.
    if (failure != RepairFailure::kNodeUnusable) {
      ++state.failures;
      state.next_try = now + RepairBackoff(state.failures);
      {
        absl::MutexLock lock(&stats_mu_);
        ++stats_.repair_failures[RepairFailureName(failure)];
      }
    }
    if (state.last_failure != failure || !reported) {
      state.last_failure = failure;
      std::string why = RepairFailureName(failure);
      if (failure == RepairFailure::kSlurmDevicesBusy) {
        absl::StrAppend(&why, ": Slurm counts these devices in use although no job the ledger "
                              "knows holds them");
      }
      if (failure != RepairFailure::kNodeUnusable) {
        absl::StrAppend(&why, "; next try in ",
                        absl::FormatDuration(RepairBackoff(state.failures)));
      }
      spdlog::error(
          "slurm sync: placeholder job {} of pod {}/{} (uid {}) on {} is gone from Slurm while "
          "the pod runs; its devices stay held in the ledger (Slurm steps on them are refused) "
          "until a repair succeeds or the pod is deleted ({}): {}",
          h.owner.job_id, loss.pod.ns, loss.pod.name, loss.pod.uid, h.node, why, loss.detail);
    }
    if (reported) return;  // reported once; a later pass tries again
    Count(&SlurmSyncStats::placeholders_lost_fenced);
    fenced_.insert(key);
  }
  if (options_.on_placeholder_lost) options_.on_placeholder_lost(loss);
}

}  // namespace duet
