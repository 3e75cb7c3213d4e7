#include "k8s_adapter/event_recorder.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace k8s {
namespace {

std::string DedupeKey(const EventSpec& e) {
  // \x1f cannot appear in Kubernetes names; it keeps fields apart.
  return absl::StrCat(e.object_kind, "\x1f", e.object_namespace, "\x1f", e.object_name, "\x1f",
                      e.object_uid, "\x1f", e.type, "\x1f", e.reason, "\x1f", e.message);
}

}  // namespace

EventRecorder::EventRecorder(KubeClient* client, EventRecorderOptions options)
    : client_(client), options_(std::move(options)) {
  {
    absl::MutexLock l(&mu_);
    tokens_ = std::max(1, options_.burst);
    refilled_at_ = options_.clock->Now();
  }
  thread_ = std::thread([this] { Run(); });
}

EventRecorder::~EventRecorder() { Stop(); }

void EventRecorder::Record(const EventSpec& event) {
  const absl::Time now = options_.clock->Now();
  absl::MutexLock l(&mu_);
  ++stats_.recorded;
  if (stopping_ || options_.events_per_minute <= 0) {
    ++stats_.dropped;
    return;
  }
  Prune(now);
  std::string key = DedupeKey(event);
  if (seen_.contains(key)) {
    ++stats_.deduplicated;
    return;
  }
  if (queue_.size() >= options_.queue_capacity) {
    ++stats_.dropped;
    spdlog::debug("events: queue full, dropped {} {} on {}/{}", event.reason, event.message,
                  event.object_namespace, event.object_name);
    return;
  }
  seen_.emplace(key, now);
  seen_order_.emplace_back(now, std::move(key));
  queue_.push_back(event);
  if (queue_.back().instance.empty()) queue_.back().instance = options_.instance;
}

void EventRecorder::Prune(absl::Time now) {
  while (!seen_order_.empty() && now - seen_order_.front().first >= options_.dedupe_window) {
    seen_.erase(seen_order_.front().second);
    seen_order_.pop_front();
  }
}

void EventRecorder::Refill(absl::Time now) {
  const double per_second = options_.events_per_minute / 60.0;
  tokens_ = std::min<double>(std::max(1, options_.burst),
                             tokens_ + absl::ToDoubleSeconds(now - refilled_at_) * per_second);
  refilled_at_ = now;
}

void EventRecorder::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock l(&mu_);
  stats_.dropped += queue_.size();
  queue_.clear();
}

EventRecorderStats EventRecorder::stats() const {
  absl::MutexLock l(&mu_);
  EventRecorderStats s = stats_;
  s.queued = queue_.size();
  return s;
}

void EventRecorder::Run() {
  const double per_second = std::max(1, options_.events_per_minute) / 60.0;
  while (true) {
    EventSpec event;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &EventRecorder::HasWork));
      if (stopping_) return;
      // Wait for a token (or Stop).
      while (true) {
        Refill(options_.clock->Now());
        if (tokens_ >= 1) break;
        const absl::Duration wait = absl::Seconds((1 - tokens_) / per_second);
        if (options_.clock->AwaitWithTimeout(&mu_, absl::Condition(&stopping_), wait)) return;
      }
      tokens_ -= 1;
      event = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::Status s = PostEvent(*client_, event, options_.clock->Now());
    absl::MutexLock l(&mu_);
    if (s.ok()) {
      ++stats_.posted;
    } else {
      ++stats_.failed;
      spdlog::warn("events: cannot post {} on {} {}/{}: {}", event.reason, event.object_kind,
                   event.object_namespace, event.object_name, std::string(s.ToString()));
    }
  }
}

}  // namespace k8s
}  // namespace duet
