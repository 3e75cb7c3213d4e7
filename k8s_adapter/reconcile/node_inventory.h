#pragma once

// The Kubernetes Node watch as an InventorySource: every Node that matches
// the shared-pool label selector and has accelerators becomes a NodeSpec.
//
//   GPUs  capacity nvidia.com/gpu; model cloud.google.com/gke-accelerator;
//         NVLink domain nvidia.com/gpu.clique
//   TPUs  capacity google.com/tpu; model cloud.google.com/gke-tpu-accelerator;
//         slice topology cloud.google.com/gke-tpu-topology; host bounds and
//         sub-slice shapes from the chips per host
//   pool  cloud.google.com/gke-nodepool; zone topology.kubernetes.io/zone;
//         block/sub-block/host cloud.google.com/gce-topology-{block,subblock,host}
//   cpus/memory from allocatable
//   state spec.unschedulable → cordoned; Ready False/Unknown/missing →
//         not-ready (wins over cordoned); a deletionTimestamp → cordoned;
//         a deleted Node (or one that stops matching) → sink->Remove.
//
// DRA pools (options.dra_pools, the DRA lending mode, docs/dra.md): there no
// device plugin advertises capacity, so for a Node of such a pool the devices
// of each DRA driver in options.dra_drivers come from the ResourceSlices
// (resource.k8s.io/v1, watched beside the Nodes) whose spec.nodeName is the
// node: per driver and pool only the highest spec.pool.generation, and only
// once all resourceSliceCount slices of it are there (until then the node
// has no devices of that driver).
//   gpu.nvidia.com  each whole GPU `gpu-<minor>` is GPU index <minor>
//                   (/dev/nvidia<minor>), id its `uuid` attribute; MIG,
//                   vfio and other devices are not GPUs here
//   tpu.google.com  each chip `accel<N>` is TPU index N, id "<node>/tpu<N>"
//                   (the driver gives every chip of a host one uuid)
// Models, topology and state come from the Node as above. Slurm's GRES
// indices are positions in gres.conf's File= list and the ledger takes them
// as device indices, so a node whose minors are not 0..n-1 is refused
// (logged, not inventory). Capacity beside slices for the same kind
// (KEP-5004 forbids the mix) is logged as an error; the slices win. A slice
// change re-delivers its node (Upsert, or Remove when no devices are left).

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "bridge/inventory/inventory.h"
#include "k8s_adapter/informer.h"
#include "k8s_adapter/kube_client.h"
#include "nlohmann/json.hpp"

namespace duet {
namespace k8s {

// A Node object → NodeSpec. NOT_FOUND when the node has no accelerators (it
// is not shared inventory); INVALID_ARGUMENT naming the field when malformed.
absl::StatusOr<NodeSpec> NodeSpecFromNode(const nlohmann::json& node);

inline constexpr char kNvidiaDraDriver[] = "gpu.nvidia.com";
inline constexpr char kTpuDraDriver[] = "tpu.google.com";

// The devices one node's DRA drivers publish, in the inventory's terms.
struct DraNodeDevices {
  // Whether gpu.nvidia.com / tpu.google.com own this node's GPUs / TPUs (the
  // node is in a DRA pool and the driver is one duet reads): then they come
  // from `gpus` / `tpus`, never from capacity.
  bool gpus_from_dra = false;
  bool tpus_from_dra = false;
  // Whole GPUs: minor → uuid ("" when the slice has none).
  std::map<uint32_t, std::string> gpus;
  // TPU chips: the N of accel<N>.
  std::set<uint32_t> tpus;
};

// One ResourceSlice, reduced to what the inventory reads.
struct DraSlice {
  std::string driver;
  std::string node;  // spec.nodeName; "" for slices not bound to one node
  std::string pool;
  int64_t generation = 0;
  int64_t slice_count = 1;  // spec.pool.resourceSliceCount
  // The devices named as above (others are left out).
  std::map<uint32_t, std::string> gpus;
  std::set<uint32_t> tpus;
};

// A ResourceSlice object → DraSlice; INVALID_ARGUMENT naming the field when
// malformed.
absl::StatusOr<DraSlice> DraSliceFromObject(const nlohmann::json& slice);

// The devices of `slices` (all of one node): per driver and pool the highest
// generation, skipped when fewer than its slice_count slices are there. Only
// the flags the caller sets are set; this fills `gpus` and `tpus`.
void MergeDraSlices(const std::vector<const DraSlice*>& slices, DraNodeDevices* out);

// A Node → NodeSpec with the GPUs (TPUs) from `dra` where dra.gpus_from_dra
// (tpus_from_dra), otherwise from capacity as above. NOT_FOUND when it has no
// devices; INVALID_ARGUMENT when malformed or when DRA indices are not
// 0..n-1. `warnings` (if non-null) gets a line for capacity a DRA driver
// overrides.
absl::StatusOr<NodeSpec> NodeSpecFromNode(const nlohmann::json& node, const DraNodeDevices& dra,
                                          std::vector<std::string>* warnings);

struct NodeInventoryOptions {
  // Label selector of the shared pools, e.g. "duet.dev/shared=true" or
  // "cloud.google.com/gke-nodepool in (shared-h100,shared-v5e)". Empty: every
  // node with accelerators.
  std::string label_selector;
  // Tuning of the Node list+watch (path and selector are filled in), and of
  // the ResourceSlice one.
  InformerOptions informer;
  // Node pools (cloud.google.com/gke-nodepool) whose devices come from DRA
  // drivers' ResourceSlices. Empty: no ResourceSlice watch at all.
  std::vector<std::string> dra_pools;
  // The DRA drivers read there; others are ignored.
  std::vector<std::string> dra_drivers = {kNvidiaDraDriver, kTpuDraDriver};
};

// Thread-safe. Sink calls come from Start's caller (the first ReplaceAll) and
// then the informers' threads (Nodes, ResourceSlices), one at a time under
// one mutex; none after Stop() returns. With dra_pools, Start lists the
// ResourceSlices first, so the first ReplaceAll has their devices.
class KubeNodeInventory final : public InventorySource, private InformerHandler {
 public:
  // `client` must outlive this object.
  KubeNodeInventory(KubeClient* client, NodeInventoryOptions options);
  ~KubeNodeInventory() override;

  absl::Status Start(InventorySink* sink) override;
  void Stop() override;

  InformerStats stats() const;

 private:
  void OnUpsert(const nlohmann::json& object) override;
  void OnDelete(const std::string& key, const nlohmann::json* last) override;
  void OnSynced() override;

  // The ResourceSlice informer's handler.
  class SliceHandler final : public InformerHandler {
   public:
    explicit SliceHandler(KubeNodeInventory* inventory) : inventory_(inventory) {}
    void OnUpsert(const nlohmann::json& object) override;
    void OnDelete(const std::string& key, const nlohmann::json* last) override;
    void OnSynced() override {}

   private:
    KubeNodeInventory* const inventory_;
  };

  bool InDraPool(const nlohmann::json& node) const;
  // The node's spec from its Node object and, in a DRA pool, its slices.
  absl::StatusOr<NodeSpec> Evaluate(const std::string& name, const nlohmann::json& node, bool dra)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records `spec` for `name` and tells the sink what changed.
  void Apply(const std::string& name, absl::StatusOr<NodeSpec> spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A slice of `node` changed: re-deliver it if it is a known DRA-pool node.
  void Reevaluate(const std::string& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PutSlice(const std::string& key, absl::StatusOr<DraSlice> slice);

  KubeClient* const client_;
  const NodeInventoryOptions options_;
  const std::set<std::string> dra_pools_;
  bool gpus_from_dra_ = false;
  bool tpus_from_dra_ = false;
  SliceHandler slice_handler_{this};
  std::unique_ptr<Informer> slice_informer_;
  std::unique_ptr<Informer> informer_;

  absl::Mutex mu_;
  InventorySink* sink_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The shared nodes as last delivered.
  std::map<std::string, NodeSpec> nodes_ ABSL_GUARDED_BY(mu_);
  // The first complete list has been delivered (ReplaceAll); until then
  // changes only update nodes_.
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  // DRA pools: the Node objects (less status.images) of the pools' nodes that
  // match the selector, with or without devices, so a slice can re-deliver
  // them; the slices of the drivers read, by key and by node; the nodes whose
  // capacity-beside-slices error was logged (once per episode).
  std::map<std::string, nlohmann::json> dra_nodes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, DraSlice> slices_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::set<std::string>> slices_of_node_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> mixed_logged_ ABSL_GUARDED_BY(mu_);
};

}  // namespace k8s
}  // namespace duet
