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
// BridgeLink (bridge_link.h) feeds SlotHealth (slot_health.h); NodePlugin
// serves SlotHealth's lists to kubelet and hands Allocate to the Allocator
// (allocator.h).
//
// Thread-safety: servers, services and registration state belong to the
// kubelet thread (and to Shutdown after it has stopped). Services' handlers
// run on gRPC's sync thread pool. Each part documents its own locking.

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/server.h"
#include "k8s/deviceplugin/v1beta1/deviceplugin.grpc.pb.h"
#include "k8s_adapter/device_plugin/allocator.h"
#include "k8s_adapter/device_plugin/bridge_link.h"
#include "k8s_adapter/device_plugin/node_options.h"
#include "k8s_adapter/device_plugin/pod_resources.h"
#include "k8s_adapter/device_plugin/slot_health.h"
#include "k8s_adapter/kube_client.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
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
  class Service;

  NodePlugin(const NodePluginOptions& options, k8s::KubeClient* kube,
             std::shared_ptr<grpc::ChannelCredentials> bridge_credentials);

  // Kubelet side (kubelet thread only).
  void KubeletLoop();
  void RestartServer(DeviceKind kind);
  absl::Status Register(DeviceKind kind);
  void RefreshPodResources();
  grpc::Status ListAndWatch(DeviceKind kind, grpc::ServerContext* ctx,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer);

  const NodePluginOptions options_;

  // Every metric family is registered by the constructor, in one place (the
  // order /metrics lists them in), and handed to the part that updates it.
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  prometheus::Family<prometheus::Counter>* registrations_total_ = nullptr;

  std::unique_ptr<SlotHealth> health_;
  std::unique_ptr<BridgeLink> bridge_;
  std::unique_ptr<Allocator> allocator_;

  std::atomic<bool> stopping_{false};
  std::atomic<int> registrations_{0};

  // Kubelet thread only.
  std::map<DeviceKind, std::unique_ptr<Service>> services_;
  std::map<DeviceKind, std::unique_ptr<grpc::Server>> servers_;
  // kubelet.sock's identity when we registered, per kind; empty: not
  // registered.
  std::map<DeviceKind, std::string> kubelet_id_;
  std::thread kubelet_thread_;

  bool shut_down_ = false;
};

}  // namespace node
}  // namespace duet
