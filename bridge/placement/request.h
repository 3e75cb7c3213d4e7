#pragma once

// What a pod (or a Slurm job on one node) asks of a node, and the CPU and
// memory already committed on a node. Plain values shared by the scheduler
// extender, the Slurm weight feedback and the placement simulator.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bridge/ledger/types.h"

namespace duet::placement {

// One pod's needs on one node.
struct PodRequest {
  DeviceKind kind = DeviceKind::kGpu;
  // Devices wanted; 0 for a pod that needs no device.
  uint32_t count = 0;
  // Milli-units per device. Below kWholeDevice the pod shares a device with
  // other holders (a "shared" pod); the trace and the extender allow that only
  // with count == 1.
  uint32_t milli = kWholeDevice;
  // Acceptable device models; empty accepts any.
  std::vector<std::string> models;
  // `models` as ledger model ids (ResolveModelIds), compared with a ledger
  // device's DeviceSpec::model_id instead of its name; an id of 0 is a model
  // no ledger device has. Empty until resolved (names are compared then).
  std::vector<uint32_t> model_ids;
  uint64_t cpu_milli = 0;
  uint64_t memory_mib = 0;

  bool shared() const { return count == 1 && milli < kWholeDevice; }
  // Device milli-units the pod takes in all.
  uint64_t device_milli() const { return uint64_t{count} * milli; }
  bool AcceptsModel(const std::string& model) const;
  // The same answer for a device whose interned id is `model_id` (0: not
  // interned, the name is compared).
  bool AcceptsModel(const std::string& model, uint32_t model_id) const {
    if (models.empty()) return true;
    if (model_id != 0 && model_ids.size() == models.size()) {
      for (uint32_t id : model_ids) {
        if (id == model_id) return true;
      }
      return false;
    }
    return AcceptsModel(model);
  }
  // Fills model_ids from the ledger's model table (FindModelId). Call again
  // after changing `models`.
  void ResolveModelIds();
};

// INVALID_ARGUMENT naming the field when `request` is malformed: milli 0 or
// above kWholeDevice, or a share (milli < kWholeDevice) over several devices.
absl::Status ValidatePodRequest(const PodRequest& request);

// CPU and memory already committed on a node. The ledger tracks devices only;
// the caller (extender cache, simulator) keeps one of these per node.
struct NodeLoad {
  uint64_t cpu_milli = 0;
  uint64_t memory_mib = 0;

  void Add(const PodRequest& r) {
    cpu_milli += r.cpu_milli;
    memory_mib += r.memory_mib;
  }
};

}  // namespace duet::placement
