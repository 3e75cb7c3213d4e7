#include "bridge/slurm/pod_evictions.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/reason.h"
#include "proto/duet/v1/reasons.h"
#include "spdlog/spdlog.h"

namespace duet {

PodEvictions::PodEvictions(PodEvictionsOptions options, const Clock* clock)
    : options_(std::move(options)), clock_(clock) {}

absl::Time PodEvictions::Preempted(const PlaceholderPod& pod, const std::string& node,
                                   uint32_t job_id) {
  absl::Time deadline;
  {
    absl::MutexLock lock(&mu_);
    auto [it, added] = evictions_.try_emplace(pod.uid);
    Eviction& e = it->second;
    if (!added && e.job_id != job_id) {
      // A placeholder re-made after an earlier wait ran out, preempted in
      // its turn: a new eviction with a new wait.
      added = true;
      --stats_.pending;
      e = Eviction();
    }
    if (added) {
      e.pod = pod;
      e.node = node;
      e.job_id = job_id;
      e.started = clock_->Now();
      e.deadline = e.started + options_.wait;
      e.next_try = e.started;
      ++stats_.pending;
      spdlog::warn(
          "slurm preemption: Slurm preempted placeholder job {} of pod {}/{} (uid {}) on {}; "
          "evicting the pod (slurm.preemption: evict-pods); the preemptor's steps wait for its "
          "devices until {}",
          job_id, pod.ns, pod.name, pod.uid, node, absl::FormatTime(e.deadline));
    }
    deadline = e.deadline;
  }
  Attempt(pod.uid);
  return deadline;
}

std::optional<absl::Time> PodEvictions::Check(const Owner& holder, const std::string& node,
                                              bool ask_slurm) {
  if (holder.kind != OwnerKind::kPlaceholder) return std::nullopt;
  std::optional<absl::Time> known;
  {
    absl::MutexLock lock(&mu_);
    auto it = evictions_.find(holder.pod_uid);
    if (it != evictions_.end() && it->second.job_id == holder.job_id) known = it->second.deadline;
  }
  if (known) {
    Attempt(holder.pod_uid);  // a refused eviction may be due again
    if (clock_->Now() >= *known) return std::nullopt;
    return known;
  }
  if (!ask_slurm || !options_.get_job) return std::nullopt;
  // Not seen yet: the step came before a pass. Slurm says whether it
  // preempted the placeholder (and keeps the ended job's record, with the
  // pod in its comment, for MinJobAge).
  absl::StatusOr<std::optional<SlurmJobInfo>> job = options_.get_job(holder.job_id);
  if (!job.ok()) {
    spdlog::warn("slurm preemption: cannot tell whether Slurm preempted placeholder job {} on {}: {}",
                 holder.job_id, node, job.status().ToString());
    return std::nullopt;
  }
  if (!job->has_value() || !(*job)->preempted) return std::nullopt;
  std::optional<PlaceholderPod> pod = ParsePlaceholderComment((*job)->comment);
  if (!pod || pod->uid != holder.pod_uid || pod->name.empty()) return std::nullopt;
  return Preempted(*pod, node, holder.job_id);
}

void PodEvictions::Attempt(const std::string& uid) {
  PlaceholderPod pod;
  {
    absl::MutexLock lock(&mu_);
    auto it = evictions_.find(uid);
    if (it == evictions_.end()) return;
    Eviction& e = it->second;
    const absl::Time now = clock_->Now();
    if (now >= e.deadline && !e.expired_counted) {
      e.expired_counted = true;
      ++stats_.expired;
      spdlog::error(
          "slurm preemption: pod {}/{} (uid {}) still holds its devices on {} {} after Slurm "
          "preempted its placeholder job {}; the preemptor's steps are refused from now on",
          e.pod.ns, e.pod.name, uid, e.node, absl::FormatDuration(options_.wait), e.job_id);
    }
    if (e.next_try == absl::InfinitePast() || now < e.next_try || now >= e.deadline) return;
    // Claimed: a concurrent caller waits for the next retry.
    e.next_try = now + options_.retry;
    pod = e.pod;
  }
  const absl::Status s = options_.evict ? options_.evict(pod)
                                        : absl::FailedPreconditionError("no way to evict pods");
  absl::MutexLock lock(&mu_);
  auto it = evictions_.find(uid);
  if (it == evictions_.end()) return;
  Eviction& e = it->second;
  if (s.ok() || absl::IsNotFound(s)) {
    e.next_try = absl::InfinitePast();
    ++stats_.evicted;
    spdlog::info("slurm preemption: evicted pod {}/{} (uid {}) from {}{}", pod.ns, pod.name, uid,
                 e.node, s.ok() ? "" : " (it was gone already)");
    return;
  }
  if (absl::IsResourceExhausted(s)) {
    ++stats_.blocked;
  } else {
    ++stats_.failed;
  }
  spdlog::warn("slurm preemption: eviction of pod {}/{} (uid {}) from {} refused ({}); next try "
               "in {}: {}",
               pod.ns, pod.name, uid, e.node,
               absl::IsResourceExhausted(s) ? "a PodDisruptionBudget forbids it now" : "error",
               absl::FormatDuration(options_.retry), s.ToString());
}

void PodEvictions::Retain(const std::set<std::string>& held) {
  absl::MutexLock lock(&mu_);
  for (auto it = evictions_.begin(); it != evictions_.end();) {
    if (held.count(it->first) > 0) {
      ++it;
      continue;
    }
    spdlog::info("slurm preemption: pod {}/{} (uid {}) has left {}; its devices are free",
                 it->second.pod.ns, it->second.pod.name, it->first, it->second.node);
    it = evictions_.erase(it);
    --stats_.pending;
  }
}

std::optional<PlaceholderPod> PodEvictions::Evicting(const std::string& pod_uid) const {
  absl::MutexLock lock(&mu_);
  auto it = evictions_.find(pod_uid);
  if (it == evictions_.end()) return std::nullopt;
  return it->second.pod;
}

PodEvictionStats PodEvictions::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

std::optional<absl::Status> PodEvictionWait(PodEvictions& evictions, const Ledger& ledger,
                                            const HoldRequest& request, absl::Time now,
                                            bool ask_slurm) {
  if (request.devices.empty()) return std::nullopt;  // "any N": no room, not a holder
  std::optional<absl::Time> until;
  std::string holder;
  std::string device;
  for (const Holding& h : ledger.ListHoldings(request.node)) {
    if (h.owner.SameGroup(request.owner)) continue;
    const HeldDevice* named = nullptr;
    for (const HeldDevice& d : h.devices) {
      for (const HeldDevice& w : request.devices) {
        if (w.kind == d.kind && w.index == d.index) named = &d;
      }
    }
    if (named == nullptr) continue;
    std::optional<absl::Time> d = evictions.Check(h.owner, request.node, ask_slurm);
    if (!d) return std::nullopt;  // a holder nobody evicts: the refusal stands
    until = until ? std::min(*until, *d) : *d;
    if (holder.empty()) {
      std::optional<PlaceholderPod> pod = evictions.Evicting(h.owner.pod_uid);
      holder = pod ? absl::StrCat(pod->ns, "/", pod->name) : h.owner.pod_uid;
      device = absl::StrCat(DeviceKindName(named->kind), " ", named->index);
    }
  }
  if (!until) return std::nullopt;
  const int64_t wait_s =
      static_cast<int64_t>(std::ceil(absl::ToDoubleSeconds(*until - now)));
  if (wait_s < 1) return std::nullopt;
  return WithReason(
      absl::ResourceExhaustedError(absl::StrCat(
          device, " on ", request.node, " is held by pod ", holder,
          ", which duet is evicting because Slurm preempted its placeholder for this job; ask "
          "again (the wait ends in ", wait_s, " s)")),
      v1::reason::kPodEvicting,
      {{"node", request.node}, {"device", device}, {"holder", holder},
       {"wait_s", absl::StrCat(wait_s)}});
}

}  // namespace duet
