#pragma once

// PodHolds: the one way duet holds a pod's devices on a node, for every path
// that does it -- the scheduler extender's bind, and the gRPC PlacePod that
// duet-node asks for a pod that reached a node without the duet scheduler.
//
//  Idempotent   a pod that already holds on the node (as owner Pod, or as
//               its Slurm placeholder) gets that holding back, created =
//               false; nothing new is made.
//  Refusals     placement (placement::Fits / Scorer::Evaluate, against the
//               node's CPU/memory less `load`) decides before anything is
//               made; each refusal carries a reason (common/reason.h):
//               NOT_FOUND NODE_NOT_SHARED (node not in the ledger),
//               FAILED_PRECONDITION NODE_GONE / NODE_NOT_READY, and
//               RESOURCE_EXHAUSTED NO_ROOM (placement's words as message).
//  With Slurm   (a PlaceholderMaker) a placeholder allocation asks Slurm for
//               the pod's devices, CPUs (whole, at least 1) and memory, and
//               records the devices Slurm chose; `on_placeholder` is told the
//               CPU/memory it asked, so `load` counts it before Slurm reports
//               it back. Slurm's refusals are returned as they come, with
//               NO_ROOM added to a RESOURCE_EXHAUSTED that has no reason.
//               Placeholders asked of Slurm and not yet answered count
//               against the node (their devices, CPUs and memory), so
//               concurrent binds to a node that only some of them fit are
//               refused here (NO_ROOM) instead of each costing slurmctld an
//               allocation it must refuse.
//  Without      the ledger holds the devices placement chooses, as owner Pod,
//               on the generation placement saw; a lost race is retried once
//               on a fresh view.
//
// Durability is the caller's: Hold returns the ledger sequence to wait for,
// and Release undoes a hold whose durability or binding failed.
//
// Thread-safety: every method may be called concurrently (the ledger and the
// PlaceholderMaker serialise; PodHolds's own state, the placeholders in
// flight, is behind a mutex).

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "bridge/ledger/ledger.h"
#include "bridge/placement/placement.h"

namespace duet {
namespace pods {

// The Slurm side of a pod's hold. duet-bridge's is bridge/slurm's
// Placeholders; tests may pass their own. Thread-safe.
class PlaceholderMaker {
 public:
  virtual ~PlaceholderMaker() = default;
  // Asks Slurm for a placeholder allocation on `node` and records the
  // devices it chose in the ledger as owner Placeholder{job, pod uid}.
  // Errors: NOT_FOUND, FAILED_PRECONDITION (node not usable),
  // RESOURCE_EXHAUSTED (no room), UNAVAILABLE (Slurm unreachable; nothing
  // recorded), INVALID_ARGUMENT.
  virtual absl::StatusOr<Holding> Create(const Owner& pod, const std::string& node, uint32_t gpus,
                                         uint32_t tpus, uint32_t cpus, uint64_t memory_mib) = 0;
  // Cancels the pod's placeholder on `node` and releases it in the ledger;
  // OK when there is none. UNAVAILABLE when Slurm cannot be reached (the
  // ledger then keeps the holding).
  virtual absl::Status Cancel(const std::string& node, const std::string& pod_uid) = 0;
};

struct PodHoldsOptions {
  // How the devices are chosen without Slurm.
  placement::Policy policy = placement::Policy::kDuet;
  // Fragmentation target for kDuet/kFgd; null: each request's own shape.
  // Not owned.
  placement::WorkloadFn workload;
  // CPU/memory already committed on a node; null: zero (only the node's
  // capacity is checked). duet-bridge: SlurmNodeLoads::Get.
  std::function<placement::NodeLoad(const NodeView&)> load;
  // Told of the CPU/memory each placeholder made here asked of Slurm. May
  // be null. duet-bridge: SlurmNodeLoads::Add.
  std::function<void(const std::string& node, const placement::NodeLoad&)> on_placeholder;
};

// The outcome of a Hold.
struct PodHold {
  Holding holding;       // the pod's holding on the node (the first, if several)
  bool created = false;  // false: it was there already (a retry)
  uint64_t seq = 0;      // the ledger sequence to wait for before answering
};

class PodHolds {
 public:
  // `ledger` is required; `placeholders` null when Slurm is off. Neither is
  // owned; both must outlive this object.
  PodHolds(Ledger* ledger, PlaceholderMaker* placeholders, PodHoldsOptions options);
  PodHolds(const PodHolds&) = delete;
  PodHolds& operator=(const PodHolds&) = delete;

  // Holds `request`'s devices (count > 0, one kind) on `node` for `pod`
  // (an Owner::Pod with a uid). Errors as in the file comment, plus
  // INVALID_ARGUMENT for a request without devices or an owner that is not
  // a pod.
  absl::StatusOr<PodHold> Hold(const Owner& pod, const std::string& node,
                               const placement::PodRequest& request);

  // Undoes Hold: cancels the pod's placeholder (with Slurm) or releases its
  // Pod holding on `node`. OK when there is nothing to undo.
  absl::Status Release(const Owner& pod, const std::string& node);

  // The pod's holding on `node` (owner Pod or its placeholder), if any.
  std::optional<Holding> HoldingOf(const std::string& pod_uid, const std::string& node) const;

  // `options.load` of the node, zero without one.
  placement::NodeLoad LoadOf(const NodeView& view) const;

  // placement::Fits against the node's load and, with Slurm, beside the
  // placeholders asked on it and not yet answered: what Hold checks first.
  // The extender's filter asks this, so a node that binds in flight fill is
  // not offered again.
  bool Fits(const NodeView& view, const placement::PodRequest& request, std::string* why) const;

  bool with_slurm() const { return placeholders_ != nullptr; }

 private:
  absl::StatusOr<PodHold> HoldWithSlurm(const Owner& pod, const std::string& node,
                                        const placement::PodRequest& request);
  absl::StatusOr<PodHold> HoldInLedger(const Owner& pod, const std::string& node,
                                       const placement::PodRequest& request);

  // What the placeholders asked of Slurm and not yet answered hold on a
  // node.
  struct InFlight {
    uint32_t gpus = 0;
    uint32_t tpus = 0;
    placement::NodeLoad load;
  };

  Ledger* const ledger_;
  PlaceholderMaker* const placeholders_;
  const PodHoldsOptions options_;
  bool FitsLocked(const NodeView& view, placement::NodeLoad load,
                  const placement::PodRequest& request, std::string* why) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, InFlight> in_flight_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> flying_{0};  // in_flight_.size(): 0 skips the lock
};

}  // namespace pods
}  // namespace duet
