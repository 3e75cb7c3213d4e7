#pragma once

// Kubernetes Events, posted asynchronously: Record() only queues (callers
// never wait on the API server); one worker thread posts them (PostEvent in
// kube_api.h).
//
//   rate limit   a token bucket: `events_per_minute` tokens a minute, at most
//                `burst` saved up. An event waits in the queue for a token
//                (it is delayed, not dropped).
//   dedupe       the same object (kind, namespace, name, uid) + reason +
//                message recorded again within `dedupe_window` of the first
//                one that was queued is DROPPED and counted (`deduplicated`);
//                the first is the one posted. The record of what was queued
//                is pruned as entries age out, so its size is bounded by
//                what the queue and the rate let through in one window.
//   queue        bounded (`queue_capacity`); an event that finds it full is
//                dropped and counted (`dropped`). At Stop() what is still
//                queued is dropped and counted too: shutdown never waits on
//                the API server beyond the post in flight.
//   failures     a post that fails is logged and counted (`failed`), not
//                retried: events are best effort.
//
// Thread-safety: thread-safe. `mu_` guards the queue, the dedupe record, the
// bucket and the stats.

#include <cstdint>
#include <deque>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "k8s_adapter/kube_api.h"
#include "k8s_adapter/kube_client.h"

namespace duet {
namespace k8s {

struct EventRecorderOptions {
  // kubernetes.events_per_minute. 0 disables posting (every Record is
  // counted as dropped).
  int events_per_minute = 60;
  // Tokens the bucket holds at most (and starts with).
  int burst = 10;
  absl::Duration dedupe_window = absl::Minutes(5);
  size_t queue_capacity = 256;
  // Reporting instance written into each event (the bridge's pod name).
  std::string instance;
  // Times the bucket and the dedupe window, and stamps the events.
  const Clock* clock = Clock::Real();
};

struct EventRecorderStats {
  uint64_t recorded = 0;      // Record() calls
  uint64_t posted = 0;        // accepted by the API server
  uint64_t failed = 0;        // posts that failed
  uint64_t deduplicated = 0;  // dropped as repeats within the window
  uint64_t dropped = 0;       // queue full, disabled, or unsent at Stop
  size_t queued = 0;
};

class EventRecorder {
 public:
  // `client` must outlive this object. Starts the worker.
  EventRecorder(KubeClient* client, EventRecorderOptions options);
  ~EventRecorder();
  EventRecorder(const EventRecorder&) = delete;
  EventRecorder& operator=(const EventRecorder&) = delete;

  // Queues `event` (never blocks on the network). Fills `instance` from the
  // options when empty.
  void Record(const EventSpec& event) ABSL_LOCKS_EXCLUDED(mu_);
  // Idempotent. Drops what is still queued; waits for a post in flight.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  EventRecorderStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run();
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); }
  // Adds the tokens earned since the last refill.
  void Refill(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Prune(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  KubeClient* const client_;
  const EventRecorderOptions options_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<EventSpec> queue_ ABSL_GUARDED_BY(mu_);
  // Dedupe key → when it was queued; and the keys in that order (pruning).
  absl::flat_hash_map<std::string, absl::Time> seen_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<absl::Time, std::string>> seen_order_ ABSL_GUARDED_BY(mu_);
  double tokens_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time refilled_at_ ABSL_GUARDED_BY(mu_);
  EventRecorderStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace k8s
}  // namespace duet
