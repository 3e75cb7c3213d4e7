#pragma once

// Internal to duet::placement: a compact, mutable image of one node's free
// capacity, so scoring can try "what if" placements without copying a
// NodeView. Not part of the library's API.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/synchronization/mutex.h"
#include "bridge/ledger/types.h"
#include "bridge/placement/request.h"
#include "bridge/placement/workload.h"

namespace duet::placement::internal {

struct DeviceFree {
  DeviceKind kind;
  uint32_t index;
  uint32_t free;      // milli
  uint32_t capacity;  // milli
  const std::string* model;  // points into the NodeView
  uint32_t model_id = 0;     // DeviceSpec::model_id
};

struct NodeFree {
  absl::InlinedVector<DeviceFree, 8> devices;  // in the view's order
  // Free CPU (milli) and memory (MiB); negative when overcommitted. When the
  // node's spec leaves one at 0 it is not tracked and reads as unlimited.
  int64_t cpu_free = 0;
  int64_t mem_free = 0;
  int64_t cpu_capacity = 0;  // 0: untracked
  int64_t mem_capacity = 0;  // 0: untracked
  bool ready = true;
};

inline constexpr int64_t kUntracked = int64_t{1} << 60;

NodeFree Summarize(const NodeView& view, const NodeLoad& load);

// True when a device can take a per-device share of `milli` for `request`.
inline bool DeviceUsable(const DeviceFree& d, const PodRequest& request) {
  return d.kind == request.kind && d.free >= request.milli &&
         (request.models.empty() || request.AcceptsModel(*d.model, d.model_id));
}

// Devices that can take one of the request's per-device shares.
uint32_t UsableDevices(const NodeFree& node, const PodRequest& request);

// CPU, memory and enough usable devices (readiness is not checked).
bool ShapeFits(const NodeFree& node, const PodRequest& request);

// Fragmented milli for one shape / for the whole workload (see workload.h).
double ShapeFragmentation(const NodeFree& node, const PodRequest& shape);
double WorkloadFragmentation(const NodeFree& node, const Workload& workload);

// WorkloadFragmentation(node, workload), through the workload's memo when it
// has one (Workload::memo); the same value to the last bit either way.
double MemoizedWorkloadFragmentation(const NodeFree& node, const Workload& workload);

// WorkloadFragmentation by node signature, for one Workload (it lives in the
// Workload it measures against; see Workload::memo).
//
// A node's signature is what WorkloadFragmentation reads of it, and nothing
// else: the multiset of its devices' (kind, model id, free milli), and, for
// CPU and memory, which of the workload's shapes' requests the free amount
// covers (the number of distinct CPU thresholds at or below the free CPU;
// the same for memory). Device order does not matter (the per-device sums
// are integer sums), so two nodes with one signature have bit-identical
// fragmentation, and a node whose holdings or load change simply has a new
// signature: nothing needs invalidating. Devices without an interned model
// (model_id 0) or with more free milli than a signature holds are measured
// directly, uncached.
//
// Thread-safety: thread-safe (the extender scores on several threads). Two
// levels: each thread first reads its own small table of recent answers (a
// thread_local, one slot per hash value, no lock); on a miss, the shared table,
// split into shards, each under its own lock, looked up under a reader lock.
// Each shard is cleared when it reaches its bound.
class FragmentationMemo {
 public:
  explicit FragmentationMemo(const Workload& workload);
  FragmentationMemo(const FragmentationMemo&) = delete;
  FragmentationMemo& operator=(const FragmentationMemo&) = delete;

  // `workload` must be the one this memo was built from (or a copy of it).
  double Get(const NodeFree& node, const Workload& workload);

  // Entries held, over all shards (tests).
  size_t size() const;

 private:
  struct Key {
    size_t hash = 0;
    absl::InlinedVector<uint64_t, 12> words;  // sorted device words, then CPU/memory
    bool operator==(const Key& o) const { return hash == o.hash && words == o.words; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return k.hash; }
  };
  struct Shard {
    mutable absl::Mutex mu;
    absl::flat_hash_map<Key, double, KeyHash> values ABSL_GUARDED_BY(mu);
  };
  static constexpr size_t kShards = 16;
  static constexpr size_t kShardBound = 4096;

  struct Recent;
  static Recent& ThreadRecent();

  // False when the node has no signature (see above).
  bool MakeKey(const NodeFree& node, Key* key) const;

  // Distinct CPU and memory requests of the workload's device shapes, sorted.
  const uint64_t id_;  // unique in the process
  std::vector<int64_t> cpu_thresholds_;
  std::vector<int64_t> mem_thresholds_;
  std::array<Shard, kShards> shards_;
};

}  // namespace duet::placement::internal
