#pragma once

// The ledger's vocabulary: devices, nodes, owners and holdings. Plain values,
// no I/O; the gRPC layer converts them to and from duet.v1 protos.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/device/device.h"  // DeviceKind, DeviceKindName

namespace duet {

// 1000 milli-units are one whole device.
inline constexpr uint32_t kWholeDevice = 1000;

struct Topology {
  std::string nvlink_domain;
  std::string tpu_host_bounds;
  std::string tpu_topology;
  std::vector<std::string> tpu_subslice_shapes;
  std::string block;
  std::string subblock;
  // The physical host (cloud.google.com/gce-topology-host); may be empty.
  std::string host;

  bool operator==(const Topology& o) const;
};

struct DeviceSpec {
  // The fields every hold reads come first, so they share a cache line.
  DeviceKind kind = DeviceKind::kGpu;
  // Index among the node's devices of the same kind (/dev/nvidiaN).
  uint32_t index = 0;
  uint32_t capacity_milli = kWholeDevice;
  // `model` interned (InternModel): set by the ledger on every device it
  // stores, so hot paths compare an integer instead of a string (and read no
  // further than this cache line). 0 outside the ledger (compare `model`
  // then). Not part of the spec's identity.
  uint32_t model_id = 0;
  std::string model;
  // Stable identity (GPU UUID, TPU chip coordinates). May be empty.
  std::string id;
  Topology topology;

  bool operator==(const DeviceSpec& o) const;
};

// A process-wide id for a device model name: equal names, equal ids; ids
// start at 1 and are never reused. The table only grows by the models the
// inventory names (the ledger interns them on UpsertNode). Thread-safe.
uint32_t InternModel(const std::string& model);
// The id InternModel gave `model`, or 0 if it never did (then no ledger
// device has that model). Never grows the table. Thread-safe.
uint32_t FindModelId(const std::string& model);

enum class NodeState : uint8_t { kReady = 1, kCordoned = 2, kNotReady = 3, kGone = 4 };
const char* NodeStateName(NodeState state);

// What the inventory says about a node.
struct NodeSpec {
  std::string name;
  uint32_t cpus = 0;
  uint64_t memory_mib = 0;
  std::vector<DeviceSpec> devices;
  std::map<std::string, std::string> labels;
  std::string pool;
  std::string zone;
  NodeState state = NodeState::kReady;
};

// The pod_uid of every Owner::Lend on a node: "lend:NODE".
inline constexpr char kLendGroupPrefix[] = "lend:";
// The pod_uid of an Owner::GangSlot: "gang:KEY#SLOT" (docs/gangs.md; KEY is
// gang::GangKey::ToString, which the ledger does not depend on).
inline constexpr char kGangSlotGroupPrefix[] = "gang:";

// Slurm-side or Kubernetes-side: the holder classes operators see.
enum class HolderClass : uint8_t { kSlurm, kPod };

// kClaim and kLend are the DRA lending mode's (docs/dra.md), kGangSlot the
// gangs' (docs/gangs.md): only the bridge itself makes them, never a gRPC
// caller.
enum class OwnerKind : uint8_t {
  kSlurmJob = 1,
  kSlurmStep = 2,
  kPod = 3,
  kPlaceholder = 4,
  kClaim = 5,
  kLend = 6,
  kGangSlot = 7,
};

// Who holds devices. Identity is (kind, job_id, step_id, pod_uid); a pod's
// namespace and name are carried for messages only.
//
// Owners nest in groups: a Slurm job and its steps form one group (a step
// holds what its job holds); a pod and its placeholder form another. Devices
// are exclusive between groups, shared within one.
//
// The lending mode's owners are pod-side: Lend{job J, node} is a lend job's
// device lent to Kubernetes (pod_uid "lend:NODE", so every lend owner of a
// node is one group); Claim{job J, claim uid} is a ResourceClaim that was
// allocated a device lent by job J (pod_uid the claim's uid: one group per
// claim, whatever lend jobs its devices came from).
//
// A gang's reserved slot is pod-side too: GangSlot{job J, "gang:KEY#SLOT"}
// holds slot SLOT's devices under the gang's Slurm job J until a member's
// bind rebinds them to Placeholder{J, member uid} (one group per slot).
struct Owner {
  OwnerKind kind = OwnerKind::kSlurmJob;
  uint32_t job_id = 0;
  uint32_t step_id = 0;
  std::string pod_uid;
  std::string pod_namespace;
  std::string pod_name;

  static Owner SlurmJob(uint32_t job_id);
  static Owner SlurmStep(uint32_t job_id, uint32_t step_id);
  static Owner Pod(std::string uid, std::string ns = "", std::string name = "");
  static Owner Placeholder(uint32_t job_id, std::string pod_uid);
  static Owner Claim(uint32_t job_id, std::string claim_uid, std::string ns = "",
                     std::string name = "");
  static Owner Lend(uint32_t job_id, const std::string& node);
  // `gang` is the gang's key as text (gang::GangKey::ToString).
  static Owner GangSlot(uint32_t job_id, const std::string& gang, uint32_t slot);

  HolderClass holder_class() const {
    return kind == OwnerKind::kSlurmJob || kind == OwnerKind::kSlurmStep ? HolderClass::kSlurm
                                                                         : HolderClass::kPod;
  }
  // True when both belong to the same nesting group.
  bool SameGroup(const Owner& o) const;
  // "slurm job 12 step 0", "pod default/web-1 (uid 1f…)", ...
  std::string ToString() const;

  bool operator==(const Owner& o) const {
    return kind == o.kind && job_id == o.job_id && step_id == o.step_id && pod_uid == o.pod_uid;
  }
  bool operator!=(const Owner& o) const { return !(*this == o); }
  template <typename H>
  friend H AbslHashValue(H h, const Owner& o) {
    return H::combine(std::move(h), o.kind, o.job_id, o.step_id, o.pod_uid);
  }
};

// Splits a GangSlot owner's pod_uid "gang:KEY#SLOT" into KEY and SLOT;
// false when `uid` is not of that form.
bool ParseGangSlotUid(absl::string_view uid, std::string* gang, uint32_t* slot);

struct HeldDevice {
  DeviceKind kind = DeviceKind::kGpu;
  uint32_t index = 0;
  // Milli-units held; kWholeDevice for the whole device.
  uint32_t milli = kWholeDevice;

  bool operator==(const HeldDevice& o) const {
    return kind == o.kind && index == o.index && milli == o.milli;
  }
};

struct Holding {
  Owner owner;
  std::string node;
  // Sorted by (kind, index).
  std::vector<HeldDevice> devices;
  absl::Time granted_at;
  // The node's generation right after the grant.
  uint64_t generation = 0;
};

// One holder's share of one device, as seen in a node view.
struct DeviceUse {
  // Shared with the Holding it came from; never null.
  std::shared_ptr<const Owner> owner;
  uint32_t milli = 0;
};

struct DeviceState {
  // Hot state first (read by every hold), then the spec (kind, index and
  // capacity lead it).
  // Sum over owner groups of each group's largest share (GroupedUse,
  // bridge/ledger/usage.h).
  uint32_t used_milli = 0;
  std::vector<DeviceUse> uses;
  DeviceSpec spec;

  uint32_t free_milli() const { return spec.capacity_milli - used_milli; }
};

// A node as the ledger sees it: spec plus who holds what. Immutable once
// published; readers keep it alive with a shared_ptr.
struct NodeView {
  NodeSpec spec;  // spec.devices is empty: devices live in `devices`.
  std::vector<DeviceState> devices;
  uint64_t generation = 0;
};

}  // namespace duet
