#pragma once

// Internal to duet::placement: a compact, mutable image of one node's free
// capacity, so scoring can try "what if" placements without copying a
// NodeView. Not part of the library's API.

#include <cstdint>
#include <string>

#include "absl/container/inlined_vector.h"
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

}  // namespace duet::placement::internal
