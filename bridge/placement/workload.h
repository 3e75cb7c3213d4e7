#pragma once

// The workload a cluster expects: the pod shapes that make up most of its
// pods, with their frequencies. Fragmentation is measured against it (the
// "target workload" of the FGD paper, Weng et al., ATC'23): a node's free
// device capacity is fragmented for a shape when the shape cannot use it.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "bridge/ledger/types.h"
#include "bridge/placement/request.h"

namespace duet::placement {

namespace internal {
class FragmentationMemo;  // node_free.h
}  // namespace internal

class Workload {
 public:
  struct Shape {
    // Device count, milli per device, models and CPU; memory is not part of a
    // shape and is left 0.
    PodRequest request;
    // Frequency; the weights of a workload sum to 1.
    double weight = 0;
  };

  Workload() = default;
  // Weights are normalised to sum to 1; shapes with weight <= 0 are dropped.
  explicit Workload(std::vector<Shape> shapes);

  // The most frequent shapes of `pods` (kind, count, milli, models, CPU) that
  // together cover at least `coverage` (0..1] of them; ties in frequency go
  // to the smaller shape, so the result is deterministic.
  static Workload FromPods(const std::vector<PodRequest>& pods, double coverage = 0.95);

  const std::vector<Shape>& shapes() const { return shapes_; }
  bool empty() const { return shapes_.empty(); }

  // The shapes grouped for fast fragmentation (internal::WorkloadFragmentation):
  // shapes that ask the same per-device share of the same kind and models
  // see the same usable devices on a node, so a node's devices are scanned
  // once per group, not once per shape.
  struct Group {
    PodRequest probe;  // kind, milli and models of the group's shapes
    double weight = 0;  // sum of the group's weights
    struct Member {
      uint32_t count;
      int64_t cpu_milli;
      int64_t memory_mib;
      double weight;
    };
    std::vector<Member> members;  // by count, then CPU
  };
  const std::vector<Group>& groups() const { return groups_; }
  // Sum of the weights of shapes without devices, per DeviceKind value.
  double no_device_weight(DeviceKind kind) const {
    return no_device_weight_[static_cast<uint8_t>(kind) & 3];
  }
  // CPU milli the shapes request per device milli of `kind` they request,
  // weighted by frequency (shapes without devices add their CPU, not
  // devices); 0 when no shape asks for that kind. duet's score uses it to
  // tell how much of a node's free devices its free CPU can still feed.
  double cpu_per_device_milli(DeviceKind kind) const {
    return cpu_per_device_milli_[static_cast<uint8_t>(kind) & 3];
  }

  // Scoring's memo of this workload's fragmentation per node signature
  // (internal::FragmentationMemo): what a node's free devices and CPU and
  // memory look like to these shapes, measured once and shared by every node
  // and every decision that sees the same. A Workload never changes after
  // construction, so the memo needs no invalidation for the workload; a new
  // workload (the model's next snapshot) is a new object with an empty memo.
  // Copies share it (same shapes, same values). Null for an empty or a
  // moved-from Workload, and after DisableMemo.
  internal::FragmentationMemo* memo() const { return memo_.get(); }
  // Measures every node afresh from now on (tests and benchmarks compare
  // both ways; the values are identical).
  void DisableMemo() { memo_.reset(); }

 private:
  void Compile();

  std::vector<Shape> shapes_;
  std::vector<Group> groups_;
  double no_device_weight_[4] = {0, 0, 0, 0};
  double cpu_per_device_milli_[4] = {0, 0, 0, 0};
  std::shared_ptr<internal::FragmentationMemo> memo_;
};

// Where a component gets the workload it scores against, at the moment it
// scores: duet-bridge passes its WorkloadModel's current snapshot
// (workload_model.h). A null function, or a null or empty result: each
// request is measured against its own shape.
using WorkloadFn = std::function<std::shared_ptr<const Workload>()>;

// Expected fragmented device milli-units on a node for `workload`: for each
// shape, all the node's free milli when the shape cannot run there (too few
// devices with room, wrong model, not enough CPU or memory; a shape with no
// devices counts all free milli too), otherwise the free milli of the devices
// that cannot take one of its per-device shares; weighted by frequency.
// Devices of kinds other than the shapes' count as free only for their kind.
double Fragmentation(const NodeView& view, const NodeLoad& load, const Workload& workload);

}  // namespace duet::placement
