#pragma once

// Active/standby with a coordination.k8s.io/v1 Lease, as client-go's
// leaderelection does it: the leader renews spec.renewTime every
// retry_period; a candidate takes the lease over only after it has seen the
// same record unchanged for lease_duration (local clock: no reliance on
// clock agreement between replicas); every write is an optimistic update on
// metadata.resourceVersion, so two candidates cannot both win.

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "k8s_adapter/kube_client.h"
#include "common/leader_election_options.h"

namespace duet {
namespace k8s {

// Thread-safe. Callbacks run on the elector's thread, one at a time.
class LeaderElector {
 public:
  LeaderElector(KubeClient* client, LeaderElectionOptions options);
  ~LeaderElector();
  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

  // Campaigns on a thread of its own. `on_started` runs when this replica
  // becomes leader; `on_stopped` when it stops being leader (lost the lease,
  // or Stop). A replica that lost leadership campaigns again.
  void Start(std::function<void()> on_started, std::function<void()> on_stopped);
  // Idempotent. Releases the lease when leading and release_on_stop.
  void Stop();
  bool IsLeader() const { return leader_.load(); }
  // The holder last seen on the lease ("" if none).
  std::string observed_holder() const;

 private:
  void Run();
  // One attempt: OK when this replica holds the lease afterwards.
  absl::Status TryAcquireOrRenew();
  void Release();
  bool Sleep(absl::Duration d);
  std::string Path(bool item) const;

  KubeClient* const client_;
  const LeaderElectionOptions options_;
  std::function<void()> on_started_;
  std::function<void()> on_stopped_;
  std::atomic<bool> leader_{false};
  std::thread thread_;
  absl::BitGen rng_;  // elector thread only

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The last lease record seen (holder + renewTime + transitions) and when
  // it was first seen, by the local clock.
  std::string observed_record_ ABSL_GUARDED_BY(mu_);
  std::string observed_holder_ ABSL_GUARDED_BY(mu_);
  absl::Time observed_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace k8s
}  // namespace duet
