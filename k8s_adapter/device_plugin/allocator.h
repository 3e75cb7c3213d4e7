#pragma once

// Allocate: which pod a container kubelet is admitting belongs to, and which
// devices it gets. Kubelet names slots, not the pod: the devices come from
// the ledger, never from kubelet's pick. In steps (README.md, "Allocate"):
//   1. ReadHoldings: the node's holdings, asked of the bridge now;
//   2. PodsHere: which pods the Kubernetes API says are pending here, and
//      ViewFor: what kubelet served and Allocate handed out before;
//   3. per container: the same slots again (SameSlotsAgain), else MatchClaim,
//      else PlaceBypassPod (PlacePod for a pod that bypassed the duet
//      scheduler, refused with its reason when Slurm has no room) and match
//      again; ContainerAnswer builds the response for the devices;
//   4. commit the bookkeeping to SlotHealth, count the metrics.
// Any refusal is all or nothing for the request, counted by status code.
//
// Thread-safety: Allocate may be called from any thread; `mu_` serialises
// calls (it is taken before SlotHealth's lock). It blocks on the bridge (up
// to bridge_timeout, PlacePod waits for Slurm), PodResources and the
// Kubernetes API.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "duet/v1/duet.pb.h"
#include "grpcpp/support/status.h"
#include "k8s/deviceplugin/v1beta1/deviceplugin.pb.h"
#include "k8s_adapter/device_plugin/allocation.h"
#include "k8s_adapter/device_plugin/bridge_link.h"
#include "k8s_adapter/device_plugin/node_options.h"
#include "k8s_adapter/device_plugin/slot_health.h"
#include "k8s_adapter/kube_client.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"

namespace duet {
namespace node {

// Allocate's metric families (not owned).
struct AllocatorMetrics {
  prometheus::Family<prometheus::Counter>* allocations = nullptr;
  prometheus::Family<prometheus::Counter>* refusals = nullptr;
  prometheus::Family<prometheus::Counter>* placed = nullptr;
  prometheus::Family<prometheus::Histogram>* allocate_seconds = nullptr;
};

class Allocator {
 public:
  // `kube` (may be null: no Kubernetes API), `bridge` and `health` are not
  // owned and must outlive the allocator.
  Allocator(const NodePluginOptions& options, k8s::KubeClient* kube, const BridgeLink* bridge,
            SlotHealth* health, AllocatorMetrics metrics);

  // kubelet's Allocate for `kind`: one response per container request, or
  // a refusal (its message is what kubelet shows the pod).
  grpc::Status Allocate(DeviceKind kind, const v1beta1::AllocateRequest& req,
                        v1beta1::AllocateResponse* resp) ABSL_LOCKS_EXCLUDED(mu_);

  // The pod and devices `slots` were given before, when they all belong to
  // one pod that still holds those devices (and is still pending, when
  // `pending` is known); nullopt otherwise.
  static std::optional<Match> SameSlotsAgain(const std::vector<int>& slots,
                                             const std::map<int, SlotUse>& known,
                                             const std::vector<PodClaim>& claims,
                                             const std::optional<std::vector<PendingPod>>& pending);

 private:
  // What the Kubernetes API says about the pods bound here.
  struct PodsHere {
    // Pending pods on this node; nullopt: no API, or it did not answer.
    std::optional<std::vector<PendingPod>> pending;
    // "ns/name" -> uid.
    std::map<std::string, std::string> uid_by_name;
  };

  // 1. UNAVAILABLE naming the bridge when it cannot be read.
  absl::StatusOr<std::vector<v1::Holding>> ReadHoldings() const;
  // 2. Logged and left unknown when the API does not answer.
  PodsHere ListPodsHere() const;
  // The match input for `kind` from the claims in `holdings`, the pods and
  // SlotHealth's view (whose slot map and slot count are returned too).
  MatchInput MatchState(DeviceKind kind, const std::vector<v1::Holding>& holdings,
                        const PodsHere& pods, std::map<int, SlotUse>* known_slots, int* slots);
  // 3. Places a pending pod that asks `count` of `kind` and holds nothing
  // (it bypassed the duet scheduler) with the bridge's PlacePod, and adds
  // its placeholder to `holdings`. `unmatched` is why MatchClaim found
  // nothing. FAILED_PRECONDITION when no pending pod fits; PlacePod's
  // refusal with its reason (RESOURCE_EXHAUSTED: no room) otherwise.
  absl::Status PlaceBypassPod(DeviceKind kind, int count,
                              const std::vector<PendingPod>& pending,
                              const absl::Status& unmatched,
                              std::vector<v1::Holding>* holdings) const;
  // The container's answer for `devices` of `uid`: device nodes, variables,
  // GPU mounts, annotations. FAILED_PRECONDITION for a missing device node.
  absl::StatusOr<v1beta1::ContainerAllocateResponse> ContainerAnswer(
      DeviceKind kind, const std::vector<uint32_t>& devices, const std::string& uid) const;
  void CountRefusal(DeviceKind kind, const absl::Status& s) const;

  const NodePluginOptions options_;
  k8s::KubeClient* const kube_;
  const BridgeLink* const bridge_;
  SlotHealth* const health_;
  const AllocatorMetrics metrics_;

  absl::Mutex mu_;
};

}  // namespace node
}  // namespace duet
