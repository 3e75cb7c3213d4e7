// SlurmSync's job pass (slurm_sync.h, step 3): records every live Slurm job
// on a ledger node (placeholders, lend jobs and users' jobs), releases the
// holdings of jobs Slurm no longer runs, cancels placeholders whose pod is
// gone. Lost placeholders are handed to HandleLost (lost_placeholders.cc),
// gang jobs to GangJobsHeld / ImportGangJob (gang_jobs.cc).

#include "bridge/slurm/slurm_sync.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bridge/slurm/placeholders.h"
#include "bridge/slurm/pod_evictions.h"
#include "bridge/slurm/slurm_sync_internal.h"
#include "spdlog/spdlog.h"

namespace duet {

using slurm_sync_internal::ToHeld;

absl::Status SlurmSync::ImportJobs(const LedgerSnapshot& snap,
                                   const std::vector<SlurmNodeInfo>& nodes) {
  const absl::Time listed_at = clock_->Now();
  auto jobs = slurm_->ListJobs();
  if (!jobs.ok()) return jobs.status();
  absl::flat_hash_set<std::string> ledger_nodes;
  for (const auto& v : snap.nodes) ledger_nodes.insert(v->spec.name);
  absl::flat_hash_set<uint32_t> live;
  // Jobs Slurm lists as ended: their holdings go whenever they were granted
  // (the grace below is for jobs too new to be in the list). Keeping one
  // for the grace made the next job on its devices a false conflict.
  absl::flat_hash_set<uint32_t> ended;
  absl::Status first;

  for (const SlurmJobInfo& job : *jobs) {
    if (job.live()) live.insert(job.job_id);
    if (job.state == SlurmJobState::kFinished) ended.insert(job.job_id);
    if (!job.live()) continue;
    if (std::optional<PlaceholderPod> pod = ParsePlaceholderComment(job.comment)) {
      placeholders_seen_[job.job_id] = {*pod, job.cpus, job.memory_mib};
    } else if (ParseLendComment(job.comment) || ParseGangJobName(job.name)) {
      // A lend or gang job is duet's, not a user's job.
    } else if (options_.on_live_job) {
      options_.on_live_job(job);
    }
  }
  // First release holdings of jobs Slurm no longer runs. Only what was granted before the
  // list was read: a step may have registered since.
  absl::flat_hash_set<uint32_t> kept;  // lost placeholders still held
  // Jobs' and steps' holdings kept only for the grace although they were
  // granted before the list was read and their job is not live in it: if a
  // live job of the list needs their devices, they belong to a job that had
  // ended by then (Slurm never gives a device to two running jobs).
  std::map<std::string, std::vector<Holding>> in_grace;  // by node
  std::set<std::string> placeholder_pods;  // pods holding a placeholder
  // (lend job, node) pairs whose devices a claim now holds (DRA lending).
  std::set<std::pair<uint32_t, std::string>> claimed;
  uint64_t claims_without_lend_job = 0;
  for (const Holding& h : ledger_->ListHoldings()) {
    if (h.owner.kind == OwnerKind::kPlaceholder) placeholder_pods.insert(h.owner.pod_uid);
    if (h.owner.kind == OwnerKind::kClaim) {
      claimed.emplace(h.owner.job_id, h.node);
      // Kubernetes still uses the device: kept, never repaired here.
      if (!live.contains(h.owner.job_id)) {
        ++claims_without_lend_job;
        if (!claims_reported_.contains(h.owner)) {
          spdlog::warn("slurm sync: {} on {}: its lend job {} no longer runs in Slurm; the claim "
                       "keeps the device until it is deallocated",
                       h.owner.ToString(), h.node, h.owner.job_id);
        }
      }
      continue;
    }
    // A gang's slots (GangSlot{J}) and members (Placeholder{J}) go with
    // their gang job J like a placeholder: slots are released, members whose
    // pod may run are kept (HandleLost below).
    const bool slurm_side = h.owner.kind == OwnerKind::kSlurmJob ||
                            h.owner.kind == OwnerKind::kSlurmStep ||
                            h.owner.kind == OwnerKind::kPlaceholder ||
                            h.owner.kind == OwnerKind::kLend ||
                            h.owner.kind == OwnerKind::kGangSlot;
    if (!slurm_side || live.contains(h.owner.job_id)) continue;
    if (!ended.contains(h.owner.job_id) && h.granted_at > listed_at - options_.release_grace) {
      if (h.owner.kind != OwnerKind::kPlaceholder && h.owner.kind != OwnerKind::kLend &&
          h.owner.kind != OwnerKind::kGangSlot && h.granted_at <= listed_at) {
        in_grace[h.node].push_back(h);
      }
      continue;
    }
    if (h.owner.kind == OwnerKind::kPlaceholder && PodOf(h.owner.pod_uid) != PodLiveness::kGone) {
      HandleLost(h, *jobs, nodes);
      kept.insert(h.owner.job_id);
      continue;
    }
    auto r = ledger_->Release(h.node, h.owner);
    if (r.ok() && r->released) {
      Count(&SlurmSyncStats::holdings_released);
      spdlog::info("slurm sync: released {} on {}: job {} no longer runs", h.owner.ToString(),
                   h.node, h.owner.job_id);
    }
  }
  {
    absl::flat_hash_set<Owner> reported;
    for (const Holding& h : ledger_->ListHoldings()) {
      if (h.owner.kind == OwnerKind::kClaim && !live.contains(h.owner.job_id)) {
        reported.insert(h.owner);
      }
    }
    claims_reported_.swap(reported);
    absl::MutexLock lock(&stats_mu_);
    stats_.claims_without_lend_job = claims_without_lend_job;
  }
  if (options_.evictions != nullptr) options_.evictions->Retain(placeholder_pods);
  // Gang jobs (duet-gang:KEY) are recorded by their slots and members, never
  // as Slurm jobs.
  const absl::flat_hash_set<uint32_t> gang_held = GangJobsHeld(*jobs);
  // Then record every live job (placeholders as such) the ledger lacks.
  for (const SlurmJobInfo& job : *jobs) {
    if (!job.live()) continue;
    if (std::optional<gang::GangKey> key = ParseGangJobName(job.name)) {
      if (!gang_held.contains(job.job_id)) ImportGangJob(job, *key, ledger_nodes, listed_at);
      continue;
    }
    const std::optional<PlaceholderPod> pod = ParsePlaceholderComment(job.comment);
    if (pod && PodOf(pod->uid) == PodLiveness::kGone) {
      absl::Status s = slurm_->KillJob(job.job_id);
      if (s.ok()) {
        for (const SlurmJobNodeDevices& d : job.devices) {
          (void)ledger_->Release(d.node, Owner::Placeholder(job.job_id, pod->uid));
        }
        Count(&SlurmSyncStats::placeholders_cancelled);
        spdlog::info("slurm sync: cancelled placeholder job {}: pod {}/{} (uid {}) is gone",
                     job.job_id, pod->ns, pod->name, pod->uid);
      } else if (first.ok()) {
        first = s;
      }
      continue;
    }
    const bool lend = !pod && ParseLendComment(job.comment).has_value();
    for (const SlurmJobNodeDevices& d : job.devices) {
      if (!ledger_nodes.contains(d.node)) continue;
      std::vector<HeldDevice> devices = ToHeld(d);
      if (devices.empty()) continue;
      const Owner owner = pod    ? Owner::Placeholder(job.job_id, pod->uid)
                          : lend ? Owner::Lend(job.job_id, d.node)
                                 : Owner::SlurmJob(job.job_id);
      if (ledger_->FindHolding(d.node, owner)) continue;
      // A lend job whose devices a claim holds is present, not lost.
      if (lend && claimed.count({job.job_id, d.node})) continue;
      HoldRequest req;
      req.node = d.node;
      req.owner = owner;
      req.devices = devices;
      auto held = ledger_->Hold(req);
      if (!held.ok() && absl::IsResourceExhausted(held.status()) &&
          ReleaseEndedHolders(d.node, devices, &in_grace[d.node]) > 0) {
        held = ledger_->Hold(req);
      }
      if (held.ok()) {
        Count(&SlurmSyncStats::holdings_imported);
        spdlog::info("slurm sync: imported {} on {}", owner.ToString(), d.node);
      } else if (options_.evictions != nullptr && absl::IsResourceExhausted(held.status()) &&
                 PodEvictionWait(*options_.evictions, *ledger_, req, clock_->Now(),
                                 /*ask_slurm=*/false)) {
        // A preemptor on the devices of a pod being evicted (slurm.preemption:
        // evict-pods): imported once the pod has left; not a conflict.
      } else {
        Count(&SlurmSyncStats::conflicts);
        spdlog::error("slurm sync: cannot record {} on {} (Slurm runs it): {}", owner.ToString(),
                      d.node, held.status().ToString());
      }
    }
  }
  // Forget what no longer matters: placeholder jobs neither live nor kept,
  // fenced entries whose holding is gone (repaired, or the pod ended).
  for (auto it = placeholders_seen_.begin(); it != placeholders_seen_.end();) {
    it = live.contains(it->first) || kept.contains(it->first) ? std::next(it)
                                                              : placeholders_seen_.erase(it);
  }
  for (auto it = fenced_.begin(); it != fenced_.end();) {
    it = kept.contains(it->second) ? std::next(it) : fenced_.erase(it);
  }
  for (auto it = repairs_.begin(); it != repairs_.end();) {
    it = kept.contains(it->first.second) ? std::next(it) : repairs_.erase(it);
  }
  {
    absl::MutexLock lock(&stats_mu_);
    stats_.placeholders_fenced = fenced_.size();
  }
  return first;
}

int SlurmSync::ReleaseEndedHolders(const std::string& node, const std::vector<HeldDevice>& devices,
                                   std::vector<Holding>* candidates) {
  int released = 0;
  for (auto it = candidates->begin(); it != candidates->end();) {
    const bool overlaps = std::any_of(it->devices.begin(), it->devices.end(),
                                      [&](const HeldDevice& x) {
                                        return std::any_of(
                                            devices.begin(), devices.end(), [&](const HeldDevice& y) {
                                              return x.kind == y.kind && x.index == y.index;
                                            });
                                      });
    if (!overlaps) {
      ++it;
      continue;
    }
    auto r = ledger_->Release(node, it->owner);
    if (r.ok() && r->released) {
      ++released;
      Count(&SlurmSyncStats::holdings_released);
      spdlog::info("slurm sync: released {} on {}: job {} had ended (a running job holds its "
                   "devices in Slurm)",
                   it->owner.ToString(), node, it->owner.job_id);
    }
    it = candidates->erase(it);
  }
  return released;
}

}  // namespace duet
