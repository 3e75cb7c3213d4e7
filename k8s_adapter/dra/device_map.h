#pragma once

// DeviceMap: the ledger's devices <-> the DRA devices that lending drivers
// publish in ResourceSlices (docs/dra.md "Mapping"), as a dra::DeviceMapView
// for the Lender and the webhook.
//
// Update() rebuilds the whole map from every ResourceSlice and the ledger's
// inventory of the lending nodes; Apply() takes only what changed since (slices
// added, changed or deleted; inventory nodes set or removed) and re-judges only
// the pools those slices belong to and the nodes those pools (before and after)
// or the inventory changes name, keeping every other node's entry. Either way
// the map is the one a full Update of the same slices and inventory gives:
//   - Per pool (driver, pool name) only the highest generation counts, and
//     only when all spec.pool.resourceSliceCount slices of it are there;
//     otherwise every node of the pool is unmappable (incomplete_pool).
//   - gpu.nvidia.com: a whole GPU is `gpu-<minor>`, the ledger GPU whose
//     index is that minor (/dev/nvidia<minor>); its `uuid` attribute must
//     equal the ledger device's id when both are set (uuid_mismatch).
//     `gpu-<m>-mig-...` or type=mig, or any device of another type
//     (partitions): mig_devices; `gpu-vfio-<i>` or type=vfio: vfio_devices.
//     A taint on gpu-N does not cover those siblings, so the node is not lent.
//   - tpu.google.com: chip `accel<N>` is the ledger TPU of index N. The uuid
//     is not compared (see device_map.cc). TPUs are lent per host: every
//     ledger chip needs its twin.
//   - Any other device name of a lending driver, or one with no ledger twin:
//     unknown_device. Two DRA devices for one ledger device: duplicate_device.
//     A ledger device (of a lending driver's kind) with no DRA twin:
//     unpublished_device. A node in the inventory with no device of a lending
//     driver: no_slices. Only the inventory's nodes are judged: any other
//     node is not lendable, reason not_in_ledger, and is not counted.
// A node with any of these is not lendable and maps nothing; one reason per
// node (the first in the order above, incomplete_pool first), plus a detail
// naming the device for the DuetLendRefused Event: among findings of the same
// reason, the first in (driver, pool) order, then slice name, then the
// slice's device order.
//
// Slices of other drivers, and slices (or devices) bound to no single node
// (spec.nodeName unset and no per-device nodeName), are ignored.
//
// Thread-safety: every method may be called concurrently. Update and Apply are
// serialized by `update_mu_`; each builds a new immutable snapshot and swaps a
// shared_ptr under `mu_`; readers copy the pointer and read without a lock.
// A snapshot is sharded by node (and by DRA device): an Apply copies only the
// shards of the nodes it re-judges, sharing every other shard with the
// snapshot before.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "bridge/dra/dra_device.h"
#include "common/device/device.h"
#include "nlohmann/json.hpp"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace duet {
namespace k8s_dra {

// One device of a node as the ledger's inventory knows it.
struct InventoryDevice {
  DeviceKind kind = DeviceKind::kGpu;
  // The host index: the /dev/nvidia<minor> minor for a GPU, the chip number
  // (/dev/accel<N>) for a TPU.
  uint32_t index = 0;
  // The device's uuid from the inventory ("" when unknown).
  std::string id;
};

// Node name -> its devices (the lending nodes only).
using LedgerInventory = std::map<std::string, std::vector<InventoryDevice>>;

struct Unmappable {
  std::string reason;  // one of DeviceMap::Reasons()
  std::string detail;  // for people: which device and why

  bool operator==(const Unmappable& o) const { return reason == o.reason && detail == o.detail; }
};

// What changed since the map's last Update or Apply.
struct MapDelta {
  // ResourceSlices added or changed, whole (as a watch gives them); each must
  // have metadata.name, which identifies it.
  std::vector<nlohmann::json> upserted;
  // The metadata.name of ResourceSlices deleted (unknown names are ignored).
  // Deletions are applied before `upserted`.
  std::vector<std::string> deleted;
  // Lending nodes added or whose devices changed, with all their devices.
  LedgerInventory inventory_set;
  // Nodes that are no longer lending nodes.
  std::vector<std::string> inventory_removed;

  bool empty() const {
    return upserted.empty() && deleted.empty() && inventory_set.empty() &&
           inventory_removed.empty();
  }
};

class DeviceMap : public dra::DeviceMapView {
 public:
  // `lending_drivers`: the drivers duet lends (dra.drivers); slices of
  // others are ignored. `registry` (may be null) gets
  // duet_dra_unmappable_nodes{reason}, set at every Update.
  explicit DeviceMap(std::vector<std::string> lending_drivers,
                     prometheus::Registry* registry = nullptr);
  ~DeviceMap() override;

  // The reasons, in the order they are judged.
  static const std::vector<std::string>& Reasons();

  // Rebuilds the map from `slices` (resource.k8s.io ResourceSlice objects as
  // a LIST or watch gives them; v1 or v1beta2) and `ledger`. A slice that is
  // not a ResourceSlice or lacks spec.driver / spec.pool.name /
  // spec.pool.generation / spec.pool.resourceSliceCount is INVALID_ARGUMENT
  // naming it, and the map stays as it was. `changed` (when not null) gets
  // the nodes, sorted, whose lendability or mapped devices differ from the
  // map before (the nodes whose DeviceTaintRules may need a look).
  // A slice named twice (or unnamed) counts once per occurrence, as listed.
  absl::Status Update(const std::vector<nlohmann::json>& slices, const LedgerInventory& ledger,
                      std::vector<std::string>* changed = nullptr);

  // Applies `delta` to the slices and inventory of the last Update/Apply and
  // re-judges only what it touches (see above); `changed` as for Update. A
  // slice of `delta.upserted` that Update would refuse, or one without
  // metadata.name, is INVALID_ARGUMENT naming it, and nothing of `delta` is
  // applied. Cost: the touched pools' slices and the touched nodes, plus
  // copying the shards they fall in (not the whole map).
  absl::Status Apply(const MapDelta& delta, std::vector<std::string>* changed = nullptr);

  std::optional<dra::LedgerDevice> ToLedger(const dra::DraDevice& device) const override;
  std::optional<dra::DraDevice> ToDra(const dra::LedgerDevice& device) const override;
  bool Lendable(const std::string& node, std::string* why) const override;
  std::vector<dra::DraDevice> NodeDevices(const std::string& node) const override;

  // The nodes that are not lendable, with why.
  std::map<std::string, Unmappable> UnmappableNodes() const;
  // How many nodes each reason holds back (every reason present, 0 or more).
  std::map<std::string, int> UnmappableCounts() const;

 private:
  struct Snapshot;
  struct NodeEntry;
  struct State;
  std::shared_ptr<const Snapshot> Current() const;
  // Re-judges `dirty` against `state_` and swaps in the new snapshot.
  void Commit(const std::set<std::string>& dirty, std::vector<std::string>* changed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(update_mu_);
  std::shared_ptr<const NodeEntry> Judge(const std::string& node) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(update_mu_);

  const std::vector<std::string> drivers_;
  // Serializes Update and Apply; guards the slices and inventory they apply to.
  absl::Mutex update_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::unique_ptr<State> state_ ABSL_GUARDED_BY(update_mu_);
  mutable absl::Mutex mu_;
  std::shared_ptr<const Snapshot> snapshot_ ABSL_GUARDED_BY(mu_);
  // duet_dra_unmappable_nodes by reason; empty without a registry.
  std::map<std::string, prometheus::Gauge*> gauges_;
};

}  // namespace k8s_dra
}  // namespace duet
