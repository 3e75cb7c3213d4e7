#pragma once

// The DRA lending mode's vocabulary and the seams between its parts
// (docs/dra.md). bridge/dra's Lender keeps the rule; k8s_adapter/dra speaks
// Kubernetes (ResourceSlices, DeviceTaintRules, AdmissionReviews) and reaches
// the Lender only through these interfaces. Plain values and interfaces, no
// I/O.

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/device/device.h"  // DeviceKind

namespace duet {
namespace dra {

// A device as DRA names it: a ResourceSlice's driver, pool and device name.
struct DraDevice {
  std::string driver;
  std::string pool;
  std::string device;

  bool operator==(const DraDevice& o) const {
    return driver == o.driver && pool == o.pool && device == o.device;
  }
  bool operator!=(const DraDevice& o) const { return !(*this == o); }
  bool operator<(const DraDevice& o) const {
    return std::tie(driver, pool, device) < std::tie(o.driver, o.pool, o.device);
  }
  template <typename H>
  friend H AbslHashValue(H h, const DraDevice& d) {
    return H::combine(std::move(h), d.driver, d.pool, d.device);
  }
  // "gpu.nvidia.com/node-1/gpu-3"
  std::string ToString() const { return driver + "/" + pool + "/" + device; }
};

// A device as the ledger names it.
struct LedgerDevice {
  std::string node;
  DeviceKind kind = DeviceKind::kGpu;
  uint32_t index = 0;

  bool operator==(const LedgerDevice& o) const {
    return node == o.node && kind == o.kind && index == o.index;
  }
  bool operator<(const LedgerDevice& o) const {
    return std::tie(node, kind, index) < std::tie(o.node, o.kind, o.index);
  }
};

// Ledger devices <-> DRA devices, for the nodes whose slices map cleanly
// (k8s_adapter/dra's DeviceMap, built from ResourceSlices and the ledger's
// inventory). Thread-safe.
class DeviceMapView {
 public:
  virtual ~DeviceMapView() = default;
  // nullopt: not a device of a mappable lending node (not duet's to judge).
  virtual std::optional<LedgerDevice> ToLedger(const DraDevice& device) const = 0;
  virtual std::optional<DraDevice> ToDra(const LedgerDevice& device) const = 0;
  // Whether duet may lend on `node`; when not, `why` (if non-null) gets a
  // short reason ("mig_devices", "uuid_mismatch", "incomplete_pool",
  // "unknown_device", "no_slices", "not_in_ledger").
  virtual bool Lendable(const std::string& node, std::string* why) const = 0;
  // Every DRA device mapped on `node` (empty when not lendable).
  virtual std::vector<DraDevice> NodeDevices(const std::string& node) const = 0;
};

// A ResourceClaim, as the holder of what it was allocated.
struct ClaimRef {
  std::string uid;
  std::string ns;
  std::string name;
};

// One entry of a claim's status.allocation.devices.results.
struct AllocationResult {
  DraDevice device;
  std::string request;
  bool admin_access = false;
};

// One admission of a write to resourceclaims/status.
struct AdmissionAsk {
  ClaimRef claim;
  // The allocation before and after the write (empty: none).
  std::vector<AllocationResult> old_results;
  std::vector<AllocationResult> new_results;
  // The node of the new allocation's nodeSelector ("" when none).
  std::string node;
  // The uids of the pods the claim is for: status.reservedFor's pods (the
  // scheduler writes them with the allocation) and the pods among
  // metadata.ownerReferences (a claim made from a template, or the
  // extended-resource claim). The gang fence reads them.
  std::vector<std::string> pods;
  // A dry run answers without recording anything.
  bool dry_run = false;
};

struct AdmissionVerdict {
  bool allowed = false;
  // Machine-readable reason when refused (NOT_LENT, RECLAIMING,
  // HELD_BY_OTHER_CLAIM, PARTIAL_HOST, UNMAPPABLE_NODE, UNAVAILABLE,
  // GANG_MEMBERS_ONLY, GANG_WAITING).
  std::string reason;
  // For the user: which device and why.
  std::string message;
};

// What the webhook asks. The Lender implements it. Thread-safe.
class AdmissionGate {
 public:
  virtual ~AdmissionGate() = default;
  virtual AdmissionVerdict Review(const AdmissionAsk& ask) = 0;
};

// What a RuleWriter that watches its rules tells about them (docs/dra.md,
// "DeviceTaintRules"). Called from the writer's watch thread, one call at a
// time; a call must be quick and must not call back into the writer.
class RuleDriftListener {
 public:
  virtual ~RuleDriftListener() = default;
  // The writer's view of the rule of `device` changed other than by one of
  // its own writes (a rule created, edited or deleted by someone else): that
  // device's rule may be wrong now. `device` is what the rule selects (or,
  // for a rule deleted, selected); fields may be empty for a malformed rule.
  virtual void OnRuleDrift(const DraDevice& device) = 0;
  // The writer listed its rules again (the first list and every relist after
  // a watch gap): a full Resync is due.
  virtual void OnRulesRelisted() = 0;
};

// Writes DeviceTaintRules (k8s_adapter/dra's TaintRules). Thread-safe.
class RuleWriter {
 public:
  virtual ~RuleWriter() = default;
  // Make sure each device has its rule / has none. Idempotent.
  virtual absl::Status Taint(const std::vector<DraDevice>& devices) = 0;
  virtual absl::Status Untaint(const std::vector<DraDevice>& devices) = 0;
  // The full reconcile: make the rules duet owns exactly `tainted` (creates
  // the missing, deletes the rest). Its cost is every rule duet owns: the
  // writer reads them all (a LIST, or the cache its watch keeps).
  virtual absl::Status Resync(const std::vector<DraDevice>& tainted) = 0;
  // The incremental reconcile of one pool: make the rules duet owns that
  // select a device of pool `pool` exactly `tainted` (every device of it of
  // that pool, else INVALID_ARGUMENT and nothing written). Compares with the
  // writer's view of its rules and reads no list: the cache its watch keeps,
  // or without a watch what the last Resync listed plus the writes since (so
  // drift is then seen only by the next Resync). Writes only the
  // differences; its cost is that pool's rules. FAILED_PRECONDITION before
  // the writer has any view (no watch started and no Resync yet).
  virtual absl::Status ResyncPool(const std::string& pool, const std::vector<DraDevice>& tainted) = 0;
  // Where drift is reported (null: nowhere). The listener must outlive the
  // writer or be unset first; no call reaches it after this returns.
  virtual void SetDriftListener(RuleDriftListener* listener) = 0;
};

// A claim's allocated devices, as a quorum LIST of ResourceClaims shows them.
struct AllocatedClaim {
  ClaimRef claim;
  std::vector<DraDevice> devices;  // admin-access results excluded
};

// Quorum reads of ResourceClaims (served from etcd, not a cache).
// Thread-safe.
class ClaimLister {
 public:
  virtual ~ClaimLister() = default;
  // Every claim with an allocation.
  virtual absl::StatusOr<std::vector<AllocatedClaim>> ListAllocated() = 0;
  // The claim `claim.ns`/`claim.name`: nullopt when it does not exist or is
  // now another claim (its uid is not `claim.uid`); else its allocated
  // devices (none: not allocated).
  virtual absl::StatusOr<std::optional<AllocatedClaim>> GetClaim(const ClaimRef& claim) = 0;
};

}  // namespace dra
}  // namespace duet
