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
//         block/sub-block cloud.google.com/gce-topology-{block,subblock}
//   cpus/memory from allocatable
//   state spec.unschedulable → cordoned; Ready False/Unknown/missing →
//         not-ready (wins over cordoned); a deletionTimestamp → cordoned;
//         a deleted Node (or one that stops matching) → sink->Remove.

#include <map>
#include <memory>
#include <string>

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

struct NodeInventoryOptions {
  // Label selector of the shared pools, e.g. "duet.dev/shared=true" or
  // "cloud.google.com/gke-nodepool in (shared-h100,shared-v5e)". Empty: every
  // node with accelerators.
  std::string label_selector;
  // Tuning of the Node list+watch (path and selector are filled in).
  InformerOptions informer;
};

// Thread-safe. Sink calls come from Start's caller (the first ReplaceAll) and
// then the informer thread, one at a time; none after Stop() returns.
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

  KubeClient* const client_;
  const NodeInventoryOptions options_;
  std::unique_ptr<Informer> informer_;

  absl::Mutex mu_;
  InventorySink* sink_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The shared nodes as last delivered.
  std::map<std::string, NodeSpec> nodes_ ABSL_GUARDED_BY(mu_);
  // The first complete list has been delivered (ReplaceAll); until then
  // changes only update nodes_.
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace k8s
}  // namespace duet
