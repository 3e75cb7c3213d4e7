#pragma once

// The kubelet side of duet-node: one v1beta1.DevicePlugin server per device
// kind the node has, on its own unix socket in `plugin_dir`, registered with
// kubelet (after CheckSoleAdvertiser) once kubelet.sock exists. One thread
// watches the directory (inotify, 200 ms re-check): when its socket vanishes
// or kubelet.sock is a new file (a kubelet restart) it serves afresh and
// registers again; failed registrations retry every second. The same thread
// re-reads PodResources every `pod_resources_period`. ListAndWatch streams
// SlotHealth's list; Allocate is the Allocator's.
//
// Thread-safety: servers, services and registration state belong to the
// kubelet thread (and to Stop, after it has joined that thread). Handlers run
// on gRPC's sync thread pool. registrations() may be read from any thread.

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/device/device.h"
#include "grpcpp/server.h"
#include "k8s_adapter/device_plugin/allocator.h"
#include "k8s_adapter/device_plugin/node_options.h"
#include "k8s_adapter/device_plugin/slot_health.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"

namespace duet {
namespace node {

class KubeletSide {
 public:
  // `health` and `allocator` (not owned) must outlive this object;
  // `registrations_total` is the duet_node_registrations_total family.
  KubeletSide(const NodePluginOptions& options, SlotHealth* health, Allocator* allocator,
              prometheus::Family<prometheus::Counter>* registrations_total);
  ~KubeletSide();
  KubeletSide(const KubeletSide&) = delete;
  KubeletSide& operator=(const KubeletSide&) = delete;

  // Starts the kubelet thread. Once.
  void Start();
  // Joins the kubelet thread, stops the servers and removes their sockets.
  // Call SlotHealth::Stop first, so open ListAndWatch streams end.
  // Idempotent.
  void Stop();

  // Successful registrations so far (for tests and probes).
  int registrations() const { return registrations_.load(); }

 private:
  class Service;

  void Loop();
  void RestartServer(DeviceKind kind);
  absl::Status Register(DeviceKind kind);
  void RefreshPodResources();
  grpc::Status ListAndWatch(DeviceKind kind, grpc::ServerContext* ctx,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer);

  const NodePluginOptions options_;
  SlotHealth* const health_;
  Allocator* const allocator_;
  prometheus::Family<prometheus::Counter>* const registrations_total_;

  std::atomic<bool> stopping_{false};
  std::atomic<int> registrations_{0};

  // Kubelet thread only.
  std::map<DeviceKind, std::unique_ptr<Service>> services_;
  std::map<DeviceKind, std::unique_ptr<grpc::Server>> servers_;
  // kubelet.sock's identity when we registered, per kind; empty: not
  // registered.
  std::map<DeviceKind, std::string> kubelet_id_;

  std::thread thread_;
};

}  // namespace node
}  // namespace duet
