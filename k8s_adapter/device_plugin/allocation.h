#pragma once

// duet-node's decisions, as pure functions over protos and JSON: which
// kubelet slots are Unhealthy, which placeholder an Allocate call belongs to,
// which pod bypassed the duet scheduler, and what a container is given.
// No I/O except the device-file checks in ContainerResponse. See README.md
// for the rules and their reasons.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/device/device.h"
#include "duet/v1/duet.pb.h"
#include "k8s/deviceplugin/v1beta1/deviceplugin.pb.h"
#include "nlohmann/json.hpp"

namespace duet {
namespace node {

// One kubelet extended resource served by duet-node.
struct ResourceSpec {
  DeviceKind kind;
  const char* resource_name;  // "nvidia.com/gpu"
  const char* endpoint;       // socket file name in the plugin directory
  const char* slot_prefix;    // slot IDs are <prefix><n>
};
const ResourceSpec& ResourceFor(DeviceKind kind);
inline constexpr DeviceKind kAllKinds[] = {DeviceKind::kGpu, DeviceKind::kTpu};

// Slot IDs are opaque to kubelet and unrelated to device indices: "gpu-slot-3"
// is the fourth unit of capacity, not /dev/nvidia3.
std::string SlotId(DeviceKind kind, int slot);
// The slot number, or nullopt when `id` is not one of this kind's slot IDs.
std::optional<int> ParseSlotId(DeviceKind kind, const std::string& id);

// Devices of `kind` on the node.
int DeviceCount(const v1::Node& node, DeviceKind kind);
// Devices of `kind` with at least one Slurm holder (a job or a step).
int SlurmHeldCount(const v1::Node& node, DeviceKind kind);
// Pod uids that hold devices on the node (as pod or placeholder).
std::set<std::string> PodUidsHolding(const v1::Node& node);

// Which of `slots` slot numbers to advertise Unhealthy so that exactly
// min(wanted, slots) are. Preference: slots already Unhealthy (no churn), then
// free slots from the highest number down, and only when that is not enough,
// slots kubelet has allocated to pods (highest first).
std::set<int> ChooseUnhealthy(int slots, int wanted, const std::set<int>& allocated,
                              const std::set<int>& previous);

// GetPreferredAllocation: `must_include` first, then the lowest-numbered
// available slots, `size` IDs in all (fewer if not enough are available).
std::vector<std::string> PreferredSlots(DeviceKind kind, const std::vector<std::string>& available,
                                        const std::vector<std::string>& must_include, int size);

// A pod's devices of one kind in the ledger, from its pod and placeholder
// holdings together (they nest in one owner group).
struct PodClaim {
  std::string uid;
  std::string ns;  // empty when only a placeholder is known
  std::string name;
  std::vector<uint32_t> devices;  // sorted indices of `kind`
  std::string granted_at;         // RFC 3339 of the earliest holding, for ordering
  uint32_t placeholder_job = 0;   // 0: no Slurm placeholder
};
std::vector<PodClaim> ClaimsOf(const std::vector<v1::Holding>& holdings, DeviceKind kind);

// A pod bound to this node that has not started, from the Kubernetes API.
struct PendingPod {
  std::string uid;
  std::string ns;
  std::string name;
  std::string created;  // metadata.creationTimestamp (RFC 3339)
  uint32_t gpus = 0;
  uint32_t tpus = 0;
  uint32_t cpus = 0;  // whole CPUs, rounded up
  uint64_t memory_mib = 0;
  uint32_t count(DeviceKind kind) const { return kind == DeviceKind::kGpu ? gpus : tpus; }
};

// Pods of a PodList (GET /api/v1/pods?fieldSelector=spec.nodeName=...) that
// are bound to `node`, in phase Pending (or no phase yet), not being deleted,
// and ask for a GPU or TPU. Their counts are the pod's effective request
// (k8s::EffectivePodRequest, the scheduler extender's reading too), rounded
// up to whole units. INVALID_ARGUMENT when the list is not a PodList, or a
// field duet reads has the wrong type or a bad quantity (naming the item
// and field); never throws.
absl::StatusOr<std::vector<PendingPod>> PendingPodsFromList(const nlohmann::json& list,
                                                            const std::string& node);
// Every pod of the list by "namespace/name" -> uid (to read PodResources,
// which names pods without uids). Items whose names are not strings are
// left out.
std::map<std::string, std::string> PodUidsByName(const nlohmann::json& list);

// What Allocate knows when it picks the pod a container belongs to.
struct MatchInput {
  DeviceKind kind = DeviceKind::kGpu;
  int count = 0;  // slots kubelet passed for the container
  std::vector<PodClaim> claims;
  // Devices already given to earlier containers, by pod uid.
  std::map<std::string, std::vector<uint32_t>> handed_out;
  // Pods kubelet already gave all their devices (from PodResources).
  std::set<std::string> served;
  // The Kubernetes API's pending pods on this node; nullopt when unknown.
  std::optional<std::vector<PendingPod>> pending;
};

struct Match {
  PodClaim claim;
  std::vector<uint32_t> devices;  // the container's devices, sorted
};

// The rule: among pods holding devices of this kind on the node that are
// not served yet and (when the Kubernetes API answers) are pending here
// asking this resource, those with at least `count` devices not yet handed
// out; prefer exactly `count` left, then the oldest holding, then the uid.
// The container gets the lowest `count` of the pod's remaining devices.
// NOT_FOUND when no pod fits.
absl::StatusOr<Match> MatchClaim(const MatchInput& in);

// A pending pod that asks this resource (at least `count`) and holds nothing
// in the ledger: it bypassed the duet scheduler. Exact count first, then the
// oldest. nullopt when none.
std::optional<PendingPod> PickBypassPod(DeviceKind kind, int count,
                                        const std::vector<PendingPod>& pending,
                                        const std::vector<v1::Holding>& holdings);

// Device nodes and environment for a container given `devices` of `kind`.
// GPUs: /dev/nvidiaN plus the control nodes present (nvidiactl, nvidia-uvm,
// nvidia-uvm-tools); NVIDIA_VISIBLE_DEVICES lists the host indices (the
// NVIDIA container runtime's meaning), CUDA_VISIBLE_DEVICES the container's
// own ordinals 0..n-1. TPUs: /dev/accelN with the variables the SPANK plugin
// sets for Slurm steps (TPU_VISIBLE_CHIPS with host indices, chip and process
// bounds). `device_dir` is where the nodes live on the host ("/dev"); in the
// container they are always under /dev. FAILED_PRECONDITION when a device
// node is missing on the host.
absl::StatusOr<v1beta1::ContainerAllocateResponse> ContainerResponse(
    DeviceKind kind, const std::vector<uint32_t>& devices, const std::string& device_dir);

}  // namespace node
}  // namespace duet
