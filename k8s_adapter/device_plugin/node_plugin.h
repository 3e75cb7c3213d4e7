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
// Thread-safety: `mu_` guards the node view, health and bookkeeping;
// `allocate_mu_` serialises Allocate calls (taken before `mu_`). Servers are
// started and stopped only by the kubelet thread (and by Shutdown after it
// has stopped). Services' handlers run on gRPC's sync thread pool and may
// block on the bridge, Slurm (through PlacePod) or the Kubernetes API.

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "duet/v1/duet.grpc.pb.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/server.h"
#include "k8s/deviceplugin/v1beta1/deviceplugin.grpc.pb.h"
#include "k8s_adapter/device_plugin/allocation.h"
#include "k8s_adapter/device_plugin/bridge_link.h"
#include "k8s_adapter/device_plugin/node_options.h"
#include "k8s_adapter/device_plugin/pod_resources.h"
#include "k8s_adapter/kube_client.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
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
  int registrations() const ABSL_LOCKS_EXCLUDED(mu_);
  bool have_node() const ABSL_LOCKS_EXCLUDED(mu_);
  int metrics_port() const;
  std::string RenderMetrics() const;

 private:
  class Service;
  struct KindState {
    int slots = 0;
    std::set<int> unhealthy;
    uint64_t version = 0;  // bumped on every change to the advertised list
    uint64_t epoch = 0;    // bumped when the server restarts: old streams end
    // kubelet.sock's identity when we registered; empty: not registered.
    std::string kubelet_id;
  };
  // A slot Allocate mapped: to which pod's which device.
  struct SlotUse {
    std::string uid;
    uint32_t device = 0;
  };

  NodePlugin(const NodePluginOptions& options, k8s::KubeClient* kube,
             std::shared_ptr<grpc::ChannelCredentials> bridge_credentials);

  // The bridge watch's node (nullptr: it left the ledger).
  void OnNode(const v1::Node* node) ABSL_LOCKS_EXCLUDED(mu_);
  // The kubelet thread.
  void KubeletLoop();

  // Kubelet side (kubelet thread only).
  void RestartServer(DeviceKind kind);
  absl::Status Register(DeviceKind kind);
  void RefreshPodResources();

  // Node view -> health. Requires mu_.
  void RecomputeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1beta1::ListAndWatchResponse DeviceListLocked(DeviceKind kind) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Service handlers.
  grpc::Status ListAndWatch(DeviceKind kind, grpc::ServerContext* ctx,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer);
  grpc::Status Allocate(DeviceKind kind, const v1beta1::AllocateRequest& req,
                        v1beta1::AllocateResponse* resp) ABSL_LOCKS_EXCLUDED(allocate_mu_, mu_);

  // The pod and devices `slots` were given before, when they all belong to
  // one pod that still holds those devices (and is still pending, when
  // `pending` is known); nullopt otherwise.
  static std::optional<Match> SameSlotsAgain(const std::vector<int>& slots,
                                             const std::map<int, SlotUse>& known,
                                             const std::vector<PodClaim>& claims,
                                             const std::optional<std::vector<PendingPod>>& pending);
  void CountRefusal(DeviceKind kind, const absl::Status& s);
  // The container's answer for `devices` of `uid`: device nodes, variables,
  // GPU mounts, annotations. FAILED_PRECONDITION for a missing device node.
  absl::StatusOr<v1beta1::ContainerAllocateResponse> Answer(DeviceKind kind,
                                                            const std::vector<uint32_t>& devices,
                                                            const std::string& uid) const;

  const NodePluginOptions options_;
  k8s::KubeClient* const kube_;

  mutable absl::Mutex mu_;
  // Signalled on every health change, server restart and shutdown.
  absl::CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<v1::Node> node_ ABSL_GUARDED_BY(mu_);
  std::map<DeviceKind, KindState> kinds_ ABSL_GUARDED_BY(mu_);
  // Slot IDs kubelet reports allocated (PodResources), per kind.
  std::map<DeviceKind, std::set<int>> kubelet_allocated_ ABSL_GUARDED_BY(mu_);
  // "ns/name" -> resource name -> devices, from PodResources.
  std::map<std::string, std::map<std::string, int>> served_ ABSL_GUARDED_BY(mu_);
  // What Allocate gave out, per kind: slot -> (pod uid, device), and pod
  // uid -> devices.
  std::map<DeviceKind, std::map<int, SlotUse>> slot_pod_ ABSL_GUARDED_BY(mu_);
  std::map<DeviceKind, std::map<std::string, std::vector<uint32_t>>> handed_out_
      ABSL_GUARDED_BY(mu_);
  // Pod uids seen holding in a node view: bookkeeping for a pod is dropped
  // once it was seen and is gone (not before the watch has caught up).
  std::set<std::string> seen_live_ ABSL_GUARDED_BY(mu_);
  int registrations_ ABSL_GUARDED_BY(mu_) = 0;

  absl::Mutex allocate_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  // Kubelet thread only.
  std::map<DeviceKind, std::unique_ptr<Service>> services_;
  std::map<DeviceKind, std::unique_ptr<grpc::Server>> servers_;

  std::thread kubelet_thread_;
  bool shut_down_ = false;

  // Metrics.
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  prometheus::Family<prometheus::Counter>* allocations_;
  prometheus::Family<prometheus::Counter>* refusals_;
  prometheus::Family<prometheus::Counter>* placed_;
  prometheus::Family<prometheus::Counter>* registrations_total_;
  prometheus::Family<prometheus::Gauge>* slots_;
  prometheus::Family<prometheus::Histogram>* allocate_seconds_;
  prometheus::Counter* watch_restarts_;
  prometheus::Gauge* watch_connected_;

  // After the metrics it reports to.
  std::unique_ptr<BridgeLink> bridge_;
};

}  // namespace node
}  // namespace duet
