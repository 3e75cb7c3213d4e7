#include "bridge/placement/workload.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <tuple>
#include <utility>

#include "absl/hash/hash.h"
#include "bridge/placement/node_free.h"

namespace duet::placement {

void PodRequest::ResolveModelIds() {
  model_ids.clear();
  model_ids.reserve(models.size());
  for (const std::string& m : models) model_ids.push_back(FindModelId(m));
}

bool PodRequest::AcceptsModel(const std::string& model) const {
  if (models.empty()) return true;
  return std::find(models.begin(), models.end(), model) != models.end();
}

absl::Status ValidatePodRequest(const PodRequest& request) {
  if (request.count == 0) return absl::OkStatus();
  if (request.milli == 0 || request.milli > kWholeDevice) {
    return absl::InvalidArgumentError("pod.milli: must be 1..1000 per device");
  }
  if (request.milli < kWholeDevice && request.count != 1) {
    return absl::InvalidArgumentError("pod.milli: a share of a device needs count == 1");
  }
  return absl::OkStatus();
}

namespace internal {

NodeFree Summarize(const NodeView& view, const NodeLoad& load) {
  NodeFree n;
  for (const DeviceState& d : view.devices) {
    n.devices.push_back(
        {d.spec.kind, d.spec.index, d.free_milli(), d.spec.capacity_milli, &d.spec.model,
         d.spec.model_id});
  }
  if (view.spec.cpus == 0) {
    n.cpu_free = kUntracked;
  } else {
    n.cpu_capacity = int64_t{view.spec.cpus} * 1000;
    n.cpu_free = n.cpu_capacity - static_cast<int64_t>(load.cpu_milli);
  }
  if (view.spec.memory_mib == 0) {
    n.mem_free = kUntracked;
  } else {
    n.mem_capacity = static_cast<int64_t>(view.spec.memory_mib);
    n.mem_free = n.mem_capacity - static_cast<int64_t>(load.memory_mib);
  }
  n.ready = view.spec.state == NodeState::kReady;
  return n;
}

uint32_t UsableDevices(const NodeFree& node, const PodRequest& request) {
  uint32_t usable = 0;
  for (const DeviceFree& d : node.devices) usable += DeviceUsable(d, request) ? 1 : 0;
  return usable;
}

bool ShapeFits(const NodeFree& node, const PodRequest& request) {
  if (node.cpu_free < static_cast<int64_t>(request.cpu_milli) ||
      node.mem_free < static_cast<int64_t>(request.memory_mib)) {
    return false;
  }
  return request.count == 0 || UsableDevices(node, request) >= request.count;
}

double ShapeFragmentation(const NodeFree& node, const PodRequest& shape) {
  uint64_t idle = 0;
  uint64_t unusable = 0;
  uint32_t usable = 0;
  for (const DeviceFree& d : node.devices) {
    if (d.kind != shape.kind) continue;
    idle += d.free;
    if (shape.count > 0 && DeviceUsable(d, shape)) {
      ++usable;
    } else {
      unusable += d.free;
    }
  }
  // A shape with no devices never uses device capacity: all of it is
  // fragmented for it (as in the FGD paper).
  if (shape.count == 0 || usable < shape.count ||
      node.cpu_free < static_cast<int64_t>(shape.cpu_milli) ||
      node.mem_free < static_cast<int64_t>(shape.memory_mib)) {
    return static_cast<double>(idle);
  }
  return static_cast<double>(unusable);
}

// Per shape s of a group, ShapeFragmentation is the kind's idle milli when s
// does not fit and idle minus the usable devices' free milli when it does;
// summed with weights that is  W * idle - W_fit * usable_free  per group.
double WorkloadFragmentation(const NodeFree& node, const Workload& workload) {
  uint64_t idle[4] = {0, 0, 0, 0};
  for (const DeviceFree& d : node.devices) idle[static_cast<uint8_t>(d.kind) & 3] += d.free;
  double f = 0;
  for (DeviceKind k : {DeviceKind::kGpu, DeviceKind::kTpu}) {
    f += workload.no_device_weight(k) * static_cast<double>(idle[static_cast<uint8_t>(k) & 3]);
  }
  for (const Workload::Group& g : workload.groups()) {
    uint32_t usable = 0;
    uint64_t usable_free = 0;
    for (const DeviceFree& d : node.devices) {
      if (!DeviceUsable(d, g.probe)) continue;
      ++usable;
      usable_free += d.free;
    }
    double fit = 0;
    for (const Workload::Group::Member& m : g.members) {
      if (m.count > usable) break;
      if (node.cpu_free >= m.cpu_milli && node.mem_free >= m.memory_mib) fit += m.weight;
    }
    f += g.weight * static_cast<double>(idle[static_cast<uint8_t>(g.probe.kind) & 3]) -
         fit * static_cast<double>(usable_free);
  }
  return f;
}

namespace {

// A device's word in a node signature: kind, interned model, free milli.
constexpr int kFreeBits = 24;
constexpr int kModelShift = kFreeBits;
constexpr int kKindShift = kModelShift + 32;

// Memo ids (FragmentationMemo::Recent): never reused within a process.
std::atomic<uint64_t> next_memo_id{1};

void SortedDistinct(std::vector<int64_t>* v) {
  std::sort(v->begin(), v->end());
  v->erase(std::unique(v->begin(), v->end()), v->end());
}

// How many of `thresholds` (sorted, distinct) are at or below `free`: two
// free amounts with the same count are covered by exactly the same requests.
uint64_t Covered(const std::vector<int64_t>& thresholds, int64_t free) {
  return static_cast<uint64_t>(std::upper_bound(thresholds.begin(), thresholds.end(), free) -
                               thresholds.begin());
}

}  // namespace

FragmentationMemo::FragmentationMemo(const Workload& workload)
    : id_(next_memo_id.fetch_add(1, std::memory_order_relaxed)) {
  for (const Workload::Group& g : workload.groups()) {
    for (const Workload::Group::Member& m : g.members) {
      cpu_thresholds_.push_back(m.cpu_milli);
      mem_thresholds_.push_back(m.memory_mib);
    }
  }
  SortedDistinct(&cpu_thresholds_);
  SortedDistinct(&mem_thresholds_);
}

bool FragmentationMemo::MakeKey(const NodeFree& node, Key* key) const {
  key->words.clear();
  for (const DeviceFree& d : node.devices) {
    if (d.model_id == 0 || d.free >= (uint32_t{1} << kFreeBits)) return false;
    const uint64_t w = (uint64_t{static_cast<uint8_t>(d.kind)} << kKindShift) |
                       (uint64_t{d.model_id} << kModelShift) | d.free;
    // Insertion sort: a node has a handful of devices.
    key->words.push_back(w);
    for (size_t j = key->words.size() - 1; j > 0 && key->words[j - 1] > w; --j) {
      std::swap(key->words[j - 1], key->words[j]);
    }
  }
  // Then CPU and memory. Keys of equal length hold as many devices, so this
  // last word is only ever compared with another node's last word.
  key->words.push_back((Covered(cpu_thresholds_, node.cpu_free) << 32) |
                       Covered(mem_thresholds_, node.mem_free));
  key->hash = absl::HashOf(absl::MakeConstSpan(key->words));
  return true;
}

// Each thread's last answers, one per slot, for the memo whose id is `memo`:
// read and written by its own thread only, so without a lock. Ids are never
// reused, so a slot left by a memo since destroyed never answers for another.
struct FragmentationMemo::Recent {
  struct Slot {
    uint64_t memo = 0;
    Key key;
    double value = 0;
  };
  std::array<Slot, 256> slots;
};

FragmentationMemo::Recent& FragmentationMemo::ThreadRecent() {
  thread_local Recent recent;
  return recent;
}

double FragmentationMemo::Get(const NodeFree& node, const Workload& workload) {
  Key key;
  if (!MakeKey(node, &key)) return WorkloadFragmentation(node, workload);
  Recent::Slot& slot = ThreadRecent().slots[key.hash % 256];
  if (slot.memo == id_ && slot.key == key) return slot.value;
  Shard& shard = shards_[(key.hash >> 32) % kShards];
  double f = 0;
  bool found = false;
  {
    absl::ReaderMutexLock lock(&shard.mu);
    auto it = shard.values.find(key);
    if (it != shard.values.end()) {
      f = it->second;
      found = true;
    }
  }
  if (!found) {
    f = WorkloadFragmentation(node, workload);
    absl::MutexLock lock(&shard.mu);
    if (shard.values.size() >= kShardBound) shard.values.clear();
    shard.values.emplace(key, f);
  }
  slot.memo = id_;
  slot.key = std::move(key);
  slot.value = f;
  return f;
}

size_t FragmentationMemo::size() const {
  size_t n = 0;
  for (const Shard& s : shards_) {
    absl::ReaderMutexLock lock(&s.mu);
    n += s.values.size();
  }
  return n;
}

double MemoizedWorkloadFragmentation(const NodeFree& node, const Workload& workload) {
  FragmentationMemo* memo = workload.memo();
  return memo == nullptr ? WorkloadFragmentation(node, workload) : memo->Get(node, workload);
}

}  // namespace internal

Workload::Workload(std::vector<Shape> shapes) {
  double total = 0;
  for (const Shape& s : shapes) {
    if (s.weight > 0) total += s.weight;
  }
  for (Shape& s : shapes) {
    if (s.weight <= 0) continue;
    s.weight /= total;
    shapes_.push_back(std::move(s));
  }
  Compile();
}

void Workload::Compile() {
  using GroupKey = std::tuple<DeviceKind, uint32_t, std::vector<std::string>>;
  std::map<GroupKey, size_t> index;
  for (const Shape& s : shapes_) {
    if (s.request.count == 0) {
      no_device_weight_[static_cast<uint8_t>(s.request.kind) & 3] += s.weight;
      continue;
    }
    std::vector<std::string> models = s.request.models;
    std::sort(models.begin(), models.end());
    auto [it, added] =
        index.try_emplace(GroupKey{s.request.kind, s.request.milli, models}, groups_.size());
    if (added) {
      Group g;
      g.probe.kind = s.request.kind;
      g.probe.count = 1;
      g.probe.milli = s.request.milli;
      g.probe.models = std::move(models);
      groups_.push_back(std::move(g));
    }
    Group& g = groups_[it->second];
    g.weight += s.weight;
    g.members.push_back({s.request.count, static_cast<int64_t>(s.request.cpu_milli),
                         static_cast<int64_t>(s.request.memory_mib), s.weight});
  }
  double cpu = 0;
  double device_milli[4] = {0, 0, 0, 0};
  for (const Shape& s : shapes_) {
    cpu += s.weight * static_cast<double>(s.request.cpu_milli);
    if (s.request.count == 0) continue;
    device_milli[static_cast<uint8_t>(s.request.kind) & 3] +=
        s.weight * static_cast<double>(s.request.milli) * s.request.count;
  }
  for (int k = 0; k < 4; ++k) {
    cpu_per_device_milli_[k] = device_milli[k] > 0 ? cpu / device_milli[k] : 0;
  }
  for (Group& g : groups_) {
    std::sort(g.members.begin(), g.members.end(), [](const auto& a, const auto& b) {
      return std::tie(a.count, a.cpu_milli) < std::tie(b.count, b.cpu_milli);
    });
  }
  if (!shapes_.empty()) memo_ = std::make_shared<internal::FragmentationMemo>(*this);
}

Workload Workload::FromPods(const std::vector<PodRequest>& pods, double coverage) {
  using Key = std::tuple<DeviceKind, uint32_t, uint32_t, std::vector<std::string>, uint64_t>;
  std::map<Key, size_t> counts;
  for (const PodRequest& p : pods) {
    std::vector<std::string> models = p.models;
    std::sort(models.begin(), models.end());
    const uint32_t milli = p.count == 0 ? 0 : p.milli;
    ++counts[Key{p.kind, p.count, milli, std::move(models), p.cpu_milli}];
  }
  std::vector<std::pair<size_t, const Key*>> order;
  for (const auto& [key, n] : counts) order.emplace_back(n, &key);
  // Most frequent first; equal counts keep the map's (smaller shape first) order.
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<Shape> shapes;
  size_t covered = 0;
  for (const auto& [n, key] : order) {
    if (!pods.empty() && static_cast<double>(covered) >= coverage * pods.size()) break;
    Shape s;
    s.request.kind = std::get<0>(*key);
    s.request.count = std::get<1>(*key);
    s.request.milli = s.request.count == 0 ? kWholeDevice : std::get<2>(*key);
    s.request.models = std::get<3>(*key);
    s.request.cpu_milli = std::get<4>(*key);
    s.weight = static_cast<double>(n);
    shapes.push_back(std::move(s));
    covered += n;
  }
  return Workload(std::move(shapes));
}

double Fragmentation(const NodeView& view, const NodeLoad& load, const Workload& workload) {
  return internal::WorkloadFragmentation(internal::Summarize(view, load), workload);
}

}  // namespace duet::placement
