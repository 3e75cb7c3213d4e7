#pragma once

// slurm.preemption: evict-pods. Slurm preempts a pod's placeholder like any
// job (PreemptMode CANCEL, or REQUEUE, which ends a placeholder since it is
// never requeued: the job ends PREEMPTED) and starts the preemptor on its
// devices at once. The pod still runs there, so the ledger keeps its
// devices; this evicts the pod through the Eviction API, which honours its
// PodDisruptionBudgets, and tells the preemptor's steps how long they may
// wait (the ledger service's POD_EVICTING refusal; spank_duet retries on
// it). The devices go to the steps when the pod is gone, as any pod's do.
//
// Two ways in: SlurmSync's pass finds a lost placeholder whose Slurm job
// is PREEMPTED (Preempted()), or a Slurm step is refused on a placeholder's
// devices before a pass saw it (Check(), which asks Slurm about that one
// job). An eviction refused (a PodDisruptionBudget: 429; the API
// unreachable) is tried again after `retry`, while steps may still wait.
//
// Thread-safety: thread-safe (`mu_`); `evict` and `get_job` are
// called without it held.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bridge/ledger/ledger.h"
#include "bridge/slurm/placeholders.h"
#include "bridge/slurm/slurm_client.h"
#include "common/clock.h"

namespace duet {

struct PodEvictionsOptions {
  // How long the preemptor's steps may wait for the pod's devices, from the
  // first eviction attempt (slurm.preemption_wait).
  absl::Duration wait = absl::Minutes(5);
  // Between attempts of one refused eviction.
  absl::Duration retry = absl::Seconds(5);
  // The eviction (k8s::EvictPod): OK or NOT_FOUND mean the pod is going or
  // gone; anything else is a refusal (RESOURCE_EXHAUSTED: a
  // PodDisruptionBudget) tried again later.
  std::function<absl::Status(const PlaceholderPod& pod)> evict;
  // Slurm's record of a job (SlurmClient::GetJob): whether it ended
  // PREEMPTED, and its pod (the placeholder's comment).
  std::function<absl::StatusOr<std::optional<SlurmJobInfo>>(uint32_t job_id)> get_job;
};

struct PodEvictionStats {
  uint64_t evicted = 0;  // evictions the API accepted (or the pod was gone)
  uint64_t blocked = 0;  // refused by a PodDisruptionBudget (429)
  uint64_t failed = 0;   // refused otherwise (API unreachable, forbidden, ...)
  uint64_t expired = 0;  // pods still there when their steps' wait ran out
  int pending = 0;       // pods being evicted now
};

class PodEvictions {
 public:
  // `clock` is not owned and must outlive this object.
  PodEvictions(PodEvictionsOptions options, const Clock* clock);

  // Slurm preempted `pod`'s placeholder job `job_id` on `node` while the pod
  // runs: evicts it (the first time, or again once `retry` has passed
  // since a refusal). Returns the preemptor's deadline; past it, the pod
  // keeps its devices and SlurmSync re-makes its placeholder (a later
  // preemption of that new job starts a new eviction).
  absl::Time Preempted(const PlaceholderPod& pod, const std::string& node, uint32_t job_id)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A Slurm step was refused because placeholder `holder` holds its devices.
  // When the holder's pod is being evicted, or Slurm says it preempted the
  // placeholder (the pod is then evicted now), the deadline until which the
  // step may wait for the devices; nullopt otherwise (the holder was not
  // preempted, the wait is over, or Slurm cannot say).
  // Without `ask_slurm`, only evictions already under way count (no RPC).
  std::optional<absl::Time> Check(const Owner& holder, const std::string& node, bool ask_slurm)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Forgets the evictions of pods that no longer hold a placeholder in the
  // ledger (`held`: the pod uids that do): gone, their devices released.
  void Retain(const std::set<std::string>& held) ABSL_LOCKS_EXCLUDED(mu_);

  // The pod being evicted, if `pod_uid` is.
  std::optional<PlaceholderPod> Evicting(const std::string& pod_uid) const
      ABSL_LOCKS_EXCLUDED(mu_);

  PodEvictionStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Eviction {
    PlaceholderPod pod;
    std::string node;
    uint32_t job_id = 0;
    absl::Time started;
    absl::Time deadline;
    absl::Time next_try;  // InfinitePast: accepted, nothing more to send
    bool expired_counted = false;
  };
  // Sends the eviction when due; `mu_` is released around the call.
  void Attempt(const std::string& uid) ABSL_LOCKS_EXCLUDED(mu_);

  const PodEvictionsOptions options_;
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, Eviction> evictions_ ABSL_GUARDED_BY(mu_);  // by pod uid
  PodEvictionStats stats_ ABSL_GUARDED_BY(mu_);
};

// The ledger service's answer to a Slurm Hold refused because devices are
// held (PodEvictions::Check on each holder of a named device): the
// POD_EVICTING refusal (reason metadata in proto/duet/v1/reasons.h) when
// every such holder is a pod being evicted for the preemption that gave its
// devices to this job; nullopt otherwise (the refusal stands).
std::optional<absl::Status> PodEvictionWait(PodEvictions& evictions, const Ledger& ledger,
                                            const HoldRequest& request, absl::Time now,
                                            bool ask_slurm = true);

}  // namespace duet
