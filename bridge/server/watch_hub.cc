#include "bridge/server/watch_hub.h"

namespace duet {

void WatchHub::Add(Subscriber* s) {
  absl::MutexLock lock(&mu_);
  subscribers_.insert(s);
}

void WatchHub::Remove(Subscriber* s) {
  absl::MutexLock lock(&mu_);
  subscribers_.erase(s);
}

void WatchHub::OnChange(const Change& change) {
  const v1::NodeEvent::Type type =
      change.erased ? v1::NodeEvent::TYPE_REMOVED : v1::NodeEvent::TYPE_UPDATED;
  absl::MutexLock lock(&mu_);
  for (Subscriber* s : subscribers_) s->Push(type, *change.view);
}

void WatchHub::CloseAll(const std::string& why) {
  absl::MutexLock lock(&mu_);
  for (Subscriber* s : subscribers_) s->Close(why);
}

}  // namespace duet
