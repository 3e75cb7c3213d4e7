#include "k8s_adapter/device_plugin/slot_health.h"

#include <iterator>

#include "k8s_adapter/device_plugin/allocation.h"

namespace duet {
namespace node {
namespace {

std::string KindLabel(DeviceKind kind) { return ResourceFor(kind).resource_name; }

}  // namespace

SlotHealth::SlotHealth(prometheus::Family<prometheus::Gauge>* slots) : slots_(slots) {}

void SlotHealth::SetNode(const v1::Node* node) {
  absl::MutexLock lock(&mu_);
  if (node != nullptr) {
    node_ = *node;
  } else {
    node_.reset();
  }
  RecomputeLocked();
}

bool SlotHealth::have_node() const {
  absl::MutexLock lock(&mu_);
  return node_.has_value();
}

void SlotHealth::SetKubeletGiven(KubeletGiven given) {
  absl::MutexLock lock(&mu_);
  kubelet_allocated_ = std::move(given.allocated);
  served_ = std::move(given.served);
  RecomputeLocked();
}

std::optional<std::map<DeviceKind, int>> SlotHealth::SlotCounts() const {
  absl::MutexLock lock(&mu_);
  if (stopping_) return std::nullopt;
  std::map<DeviceKind, int> counts;
  for (const auto& [kind, ks] : kinds_) counts[kind] = ks.slots;
  return counts;
}

uint64_t SlotHealth::Epoch(DeviceKind kind) {
  absl::MutexLock lock(&mu_);
  return kinds_[kind].epoch;
}

void SlotHealth::EndStreams(DeviceKind kind) {
  absl::MutexLock lock(&mu_);
  ++kinds_[kind].epoch;
  cv_.SignalAll();
}

SlotHealth::Next SlotHealth::WaitForList(DeviceKind kind, uint64_t epoch, uint64_t* sent,
                                         v1beta1::ListAndWatchResponse* list) {
  absl::MutexLock lock(&mu_);
  const KindState& ks = kinds_[kind];
  if (!stopping_ && ks.epoch == epoch && ks.version == *sent) {
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(250));
  }
  const KindState& now = kinds_[kind];
  if (stopping_ || now.epoch != epoch) return Next::kStopped;
  if (now.version == *sent) return Next::kNothing;
  *list = DeviceListLocked(kind);
  *sent = now.version;
  return Next::kSend;
}

AllocationView SlotHealth::ViewFor(DeviceKind kind) {
  absl::MutexLock lock(&mu_);
  AllocationView view;
  view.handed_out = handed_out_[kind];
  view.slot_pod = slot_pod_[kind];
  view.slots = kinds_[kind].slots;
  view.served = served_;
  return view;
}

void SlotHealth::Commit(DeviceKind kind, std::map<std::string, std::vector<uint32_t>> handed_out,
                        const std::vector<std::pair<int, SlotUse>>& new_slots) {
  absl::MutexLock lock(&mu_);
  handed_out_[kind] = std::move(handed_out);
  for (const auto& [slot, use] : new_slots) slot_pod_[kind][slot] = use;
  RecomputeLocked();
}

void SlotHealth::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  cv_.SignalAll();
}

void SlotHealth::RecomputeLocked() {
  std::set<std::string> live;
  if (node_) live = PodUidsHolding(*node_);
  for (const auto& uid : live) seen_live_.insert(uid);
  for (DeviceKind kind : kAllKinds) {
    const int count = node_ ? DeviceCount(*node_, kind) : 0;
    auto it = kinds_.find(kind);
    if (count == 0 && it == kinds_.end()) continue;
    KindState& ks = kinds_[kind];
    const int slots = node_ ? count : ks.slots;
    if (node_) {
      // Pods that held devices and no longer do have ended: forget what
      // they got.
      std::set<std::string> ended;
      for (const auto& uid : seen_live_) {
        if (!live.count(uid)) ended.insert(uid);
      }
      auto& sp = slot_pod_[kind];
      for (auto s = sp.begin(); s != sp.end();)
        s = ended.count(s->second.uid) ? sp.erase(s) : std::next(s);
      auto& ho = handed_out_[kind];
      for (auto h = ho.begin(); h != ho.end();)
        h = ended.count(h->first) ? ho.erase(h) : std::next(h);
    }
    std::set<int> allocated = kubelet_allocated_[kind];
    for (const auto& [slot, use] : slot_pod_[kind]) allocated.insert(slot);
    const int wanted = node_ ? SlurmHeldCount(*node_, kind) : slots;
    std::set<int> unhealthy = ChooseUnhealthy(slots, wanted, allocated, ks.unhealthy);
    if (slots != ks.slots || unhealthy != ks.unhealthy) {
      ks.slots = slots;
      ks.unhealthy = std::move(unhealthy);
      ++ks.version;
      const int bad = static_cast<int>(ks.unhealthy.size());
      slots_->Add({{"resource", KindLabel(kind)}, {"health", "Unhealthy"}}).Set(bad);
      slots_->Add({{"resource", KindLabel(kind)}, {"health", "Healthy"}}).Set(slots - bad);
      cv_.SignalAll();
    }
  }
  if (node_) {
    for (auto it = seen_live_.begin(); it != seen_live_.end();) {
      it = live.count(*it) ? std::next(it) : seen_live_.erase(it);
    }
  }
}

v1beta1::ListAndWatchResponse SlotHealth::DeviceListLocked(DeviceKind kind) const {
  v1beta1::ListAndWatchResponse r;
  auto it = kinds_.find(kind);
  if (it == kinds_.end()) return r;
  for (int s = 0; s < it->second.slots; ++s) {
    auto* d = r.add_devices();
    d->set_id(SlotId(kind, s));
    d->set_health(it->second.unhealthy.count(s) ? "Unhealthy" : "Healthy");
  }
  return r;
}

}  // namespace node
}  // namespace duet
