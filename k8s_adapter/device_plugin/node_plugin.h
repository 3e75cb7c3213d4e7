#pragma once

// duet-node: the kubelet device plugin for nvidia.com/gpu and google.com/tpu
// on one node, fenced by duet-bridge's ledger.
//
// - Registers one plugin per device kind the node has with kubelet
//   (v1beta1, unix sockets in `plugin_dir`), and registers again whenever
//   kubelet.sock is recreated (a kubelet restart) or its own socket vanishes.
// - ListAndWatch advertises one opaque slot per device; as many slots as
//   Slurm holds devices are Unhealthy (bridge WatchNodes stream), chosen
//   away from the slots kubelet gave to pods (PodResources).
// - Allocate ignores which slots kubelet picked: it finds the pod being
//   admitted among the ledger's placeholders on this node (see MatchClaim in
//   allocation.h), and gives the container exactly that placeholder's
//   devices. A pod that bypassed the duet scheduler gets a placeholder on
//   the spot (PlacePod); only when Slurm has no room is it refused.
//
// NodePlugin only puts the parts together (README.md, "The parts"):
// BridgeLink (bridge_link.h) feeds SlotHealth (slot_health.h); KubeletSide
// (kubelet_side.h) serves SlotHealth's lists to kubelet and hands Allocate to
// the Allocator (allocator.h). It owns them and the metrics registry.
//
// Thread-safety: Start and Shutdown from one thread; the accessors from any.
// Each part documents its own locking.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "k8s_adapter/device_plugin/allocator.h"
#include "k8s_adapter/device_plugin/bridge_link.h"
#include "k8s_adapter/device_plugin/kubelet_side.h"
#include "k8s_adapter/device_plugin/node_options.h"
#include "k8s_adapter/device_plugin/pod_resources.h"
#include "k8s_adapter/device_plugin/slot_health.h"
#include "k8s_adapter/kube_client.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace duet {
namespace node {

class NodePlugin {
 public:
  // `kube` (may be null: no Kubernetes API) is not owned and must outlive
  // the plugin. Errors: INVALID_ARGUMENT (options), UNAVAILABLE (metrics
  // address cannot be bound), FAILED_PRECONDITION (another device plugin
  // serves nvidia.com/gpu or google.com/tpu here: CheckSoleAdvertiser). Start returns at once; registration with
  // kubelet follows once the bridge has sent the node.
  static absl::StatusOr<std::unique_ptr<NodePlugin>> Start(const NodePluginOptions& options,
                                                           k8s::KubeClient* kube);
  ~NodePlugin();
  // Stops the threads and servers. Idempotent.
  void Shutdown();

  // For tests and probes.
  int registrations() const;
  bool have_node() const;
  int metrics_port() const;
  std::string RenderMetrics() const;

 private:
  NodePlugin(const NodePluginOptions& options, k8s::KubeClient* kube,
             std::shared_ptr<grpc::ChannelCredentials> bridge_credentials);

  const NodePluginOptions options_;

  // Every metric family is registered by the constructor, in one place (the
  // order /metrics lists them in), and handed to the part that updates it.
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;

  // Destroyed in reverse: kubelet_ (which calls the allocator and reads
  // health) first.
  std::unique_ptr<SlotHealth> health_;
  std::unique_ptr<BridgeLink> bridge_;
  std::unique_ptr<Allocator> allocator_;
  std::unique_ptr<KubeletSide> kubelet_;
  std::unique_ptr<StepAgent> step_agent_;  // --step-agent-socket

  bool shut_down_ = false;
};

}  // namespace node
}  // namespace duet
