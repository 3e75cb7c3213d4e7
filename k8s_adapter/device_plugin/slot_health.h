#pragma once

// Slot health: duet-node's view of its node and the slot list it advertises
// per device kind. It owns the node as the bridge's watch last sent it, what
// kubelet reports given out (PodResources), and what Allocate handed out; from
// those it picks which slots are Unhealthy (as many as Slurm holds devices,
// ChooseUnhealthy in allocation.h) and versions the list that ListAndWatch
// streams. A pod's Allocate bookkeeping is dropped once the ledger has shown
// it holding and then no longer.
//
// Thread-safety: every method may be called from any thread; `mu_` guards
// all state. WaitForList blocks (up to 250 ms) on `cv_`, which is signalled on
// every change to a list, on EndStreams and on Stop. The rules it applies
// (allocation.h) take no lock; the `duet_node_slots` gauge is set under `mu_`.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/device/device.h"
#include "duet/v1/duet.pb.h"
#include "k8s/deviceplugin/v1beta1/deviceplugin.pb.h"
#include "k8s_adapter/device_plugin/pod_resources.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"

namespace duet {
namespace node {

// A slot Allocate mapped: to which pod's which device.
struct SlotUse {
  std::string uid;
  uint32_t device = 0;
};

// What Allocate reads before it matches a kind's containers.
struct AllocationView {
  int slots = 0;
  // Devices Allocate gave out, by pod uid.
  std::map<std::string, std::vector<uint32_t>> handed_out;
  // Slots Allocate mapped.
  std::map<int, SlotUse> slot_pod;
  // "ns/name" -> resource name -> devices, from PodResources.
  std::map<std::string, std::map<std::string, int>> served;
};

class SlotHealth {
 public:
  // `slots` (not owned): the duet_node_slots gauge family.
  explicit SlotHealth(prometheus::Family<prometheus::Gauge>* slots);

  // The bridge's view of the node; nullptr: the node left the ledger (every
  // slot Unhealthy).
  void SetNode(const v1::Node* node) ABSL_LOCKS_EXCLUDED(mu_);
  bool have_node() const ABSL_LOCKS_EXCLUDED(mu_);
  // What kubelet has given out (PodResources).
  void SetKubeletGiven(KubeletGiven given) ABSL_LOCKS_EXCLUDED(mu_);

  // Slot counts of every kind the node has had, in kind order; nullopt
  // once stopping.
  std::optional<std::map<DeviceKind, int>> SlotCounts() const ABSL_LOCKS_EXCLUDED(mu_);

  // ListAndWatch support. Epoch: the current server generation of `kind`.
  uint64_t Epoch(DeviceKind kind) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the streams of the current generation (a server restart).
  void EndStreams(DeviceKind kind) ABSL_LOCKS_EXCLUDED(mu_);
  enum class Next { kStopped, kSend, kNothing };
  // Waits up to 250 ms for the list of `kind` to move past version `*sent`.
  // kStopped: stopping, or `epoch` is no longer current. kSend: `*list` is
  // the list now and `*sent` its version. kNothing: no change yet.
  Next WaitForList(DeviceKind kind, uint64_t epoch, uint64_t* sent,
                   v1beta1::ListAndWatchResponse* list) ABSL_LOCKS_EXCLUDED(mu_);

  // Allocate support: the view of `kind`, and the commit of what it gave
  // (health avoids those slots from then on).
  AllocationView ViewFor(DeviceKind kind) ABSL_LOCKS_EXCLUDED(mu_);
  void Commit(DeviceKind kind, std::map<std::string, std::vector<uint32_t>> handed_out,
              const std::vector<std::pair<int, SlotUse>>& new_slots) ABSL_LOCKS_EXCLUDED(mu_);

  // Wakes every waiter; WaitForList answers kStopped from now on.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct KindState {
    int slots = 0;
    std::set<int> unhealthy;
    uint64_t version = 0;  // bumped on every change to the advertised list
    uint64_t epoch = 0;    // bumped when the server restarts: old streams end
  };

  // Node view -> health.
  void RecomputeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1beta1::ListAndWatchResponse DeviceListLocked(DeviceKind kind) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  prometheus::Family<prometheus::Gauge>* const slots_;

  mutable absl::Mutex mu_;
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
};

}  // namespace node
}  // namespace duet
