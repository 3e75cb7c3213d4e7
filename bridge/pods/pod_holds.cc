#include "bridge/pods/pod_holds.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/reason.h"

namespace duet {
namespace pods {
namespace {

// Placement's refusal of `view` (`why`: its words) as a status with a reason:
// the node's state when it takes no new pods, else no room.
absl::Status Refusal(const NodeView& view, const std::string& why) {
  const std::string& node = view.spec.name;
  if (view.spec.state == NodeState::kGone) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat("node ", node, " is leaving the inventory")),
        v1::reason::kNodeGone, {{"node", node}});
  }
  if (view.spec.state != NodeState::kReady) {
    const char* state = NodeStateName(view.spec.state);
    return WithReason(absl::FailedPreconditionError(
                          absl::StrCat("node ", node, " is ", state, ": no new pod holdings")),
                      v1::reason::kNodeNotReady, {{"node", node}, {"state", state}});
  }
  return WithReason(absl::ResourceExhaustedError(why), v1::reason::kNoRoom, {{"node", node}});
}

}  // namespace

PodHolds::PodHolds(Ledger* ledger, PlaceholderMaker* placeholders, PodHoldsOptions options)
    : ledger_(ledger),
      placeholders_(placeholders),
      options_(std::move(options)) {}

placement::NodeLoad PodHolds::LoadOf(const NodeView& view) const {
  return options_.load ? options_.load(view) : placement::NodeLoad{};
}

std::optional<Holding> PodHolds::HoldingOf(const std::string& pod_uid,
                                           const std::string& node) const {
  for (Holding& h : ledger_->ListHoldings(node)) {
    if (h.owner.holder_class() == HolderClass::kPod && h.owner.pod_uid == pod_uid)
      return std::move(h);
  }
  return std::nullopt;
}

absl::StatusOr<PodHold> PodHolds::Hold(const Owner& pod, const std::string& node,
                                       const placement::PodRequest& request) {
  if (pod.kind != OwnerKind::kPod || pod.pod_uid.empty()) {
    return absl::InvalidArgumentError("a pod's holding needs a pod owner with a uid");
  }
  if (request.count == 0) return absl::InvalidArgumentError("the pod asks for no devices");
  if (std::optional<Holding> held = HoldingOf(pod.pod_uid, node)) {
    // A retry: the holding from the first try is still there.
    return PodHold{std::move(*held), false, ledger_->seq()};
  }
  return placeholders_ != nullptr ? HoldWithSlurm(pod, node, request)
                                  : HoldInLedger(pod, node, request);
}

bool PodHolds::Fits(const NodeView& view, const placement::PodRequest& request,
                    std::string* why) const {
  if (flying_.load() == 0) return placement::Fits(view, LoadOf(view), request, why);
  const placement::NodeLoad load = LoadOf(view);
  absl::MutexLock l(&mu_);
  return FitsLocked(view, load, request, why);
}

bool PodHolds::FitsLocked(const NodeView& view, placement::NodeLoad load,
                          const placement::PodRequest& request, std::string* why) const {
  auto it = in_flight_.find(view.spec.name);
  if (it == in_flight_.end()) return placement::Fits(view, load, request, why);
  // Beside the placeholders being granted: Slurm gives each whole devices,
  // so those count as whole devices of the kind asked.
  const InFlight& f = it->second;
  load.cpu_milli += f.load.cpu_milli;
  load.memory_mib += f.load.memory_mib;
  placement::PodRequest with = request;
  if (request.count > 0) with.count += request.kind == DeviceKind::kGpu ? f.gpus : f.tpus;
  if (with.count != request.count) with.milli = kWholeDevice;
  if (placement::Fits(view, load, with, why)) return true;
  if (why != nullptr && with.count != request.count) {
    absl::StrAppend(why, " (counting ", with.count - request.count,
                    " asked of Slurm and not yet granted)");
  }
  return false;
}

absl::StatusOr<PodHold> PodHolds::HoldWithSlurm(const Owner& pod, const std::string& node,
                                                const placement::PodRequest& request) {
  const uint32_t gpus = request.kind == DeviceKind::kGpu ? request.count : 0;
  const uint32_t tpus = request.kind == DeviceKind::kTpu ? request.count : 0;
  const uint32_t cpus =
      static_cast<uint32_t>(std::max<uint64_t>(1, (request.cpu_milli + 999) / 1000));
  const placement::NodeLoad asked{uint64_t{cpus} * 1000, request.memory_mib};
  {
    // Counted in flight until Slurm answers. The view is read under the
    // lock: a placeholder leaves the flight only after the ledger holds it,
    // so each is counted once or (for that moment) twice, never not at all.
    absl::MutexLock l(&mu_);
    std::shared_ptr<const NodeView> view = ledger_->GetNode(node);
    if (view == nullptr) return UnknownNodeError(node);
    std::string why;
    if (!FitsLocked(*view, LoadOf(*view), request, &why)) return Refusal(*view, why);
    InFlight& f = in_flight_[node];
    f.gpus += gpus;
    f.tpus += tpus;
    f.load.cpu_milli += asked.cpu_milli;
    f.load.memory_mib += asked.memory_mib;
    flying_ = in_flight_.size();
  }
  absl::StatusOr<Holding> h =
      placeholders_->Create(pod, node, gpus, tpus, cpus, request.memory_mib);
  // Told before it leaves the flight, so `load` counts it throughout.
  if (h.ok() && options_.on_placeholder) options_.on_placeholder(node, asked);
  {
    // Answered: recorded in the ledger (or refused), no longer in flight.
    absl::MutexLock l(&mu_);
    InFlight& f = in_flight_[node];
    f.gpus -= gpus;
    f.tpus -= tpus;
    f.load.cpu_milli -= asked.cpu_milli;
    f.load.memory_mib -= asked.memory_mib;
    if (f.gpus == 0 && f.tpus == 0 && f.load.cpu_milli == 0) in_flight_.erase(node);
    flying_ = in_flight_.size();
  }
  if (!h.ok()) {
    // Slurm found no room: the same reason as placement's. Other refusals
    // (the ledger's) carry their own reasons already.
    if (h.status().code() == absl::StatusCode::kResourceExhausted && ReasonOf(h.status()).empty()) {
      return WithReason(h.status(), v1::reason::kNoRoom, {{"node", node}});
    }
    return h.status();
  }
  return PodHold{std::move(*h), true, ledger_->seq()};  // seq: at or after the placeholder's
}

absl::StatusOr<PodHold> PodHolds::HoldInLedger(const Owner& pod, const std::string& node,
                                               const placement::PodRequest& request) {
  // Hold the devices placement chooses, on the generation it saw. Losing a
  // race (another grant on the node in between) is retried once on a fresh
  // view, which then refuses if the node is full.
  for (int attempt = 0;; ++attempt) {
    std::shared_ptr<const NodeView> view = ledger_->GetNode(node);
    if (view == nullptr) return UnknownNodeError(node);
    std::string why;
    const std::shared_ptr<const placement::Workload> workload =
        options_.workload ? options_.workload() : nullptr;
    const placement::Scorer scorer(options_.policy, workload.get());
    std::optional<placement::Placement> p = scorer.Evaluate(*view, LoadOf(*view), request, &why);
    if (!p.has_value()) return Refusal(*view, why);
    HoldRequest hold;
    hold.node = node;
    hold.owner = pod;
    hold.devices = std::move(p->devices);
    hold.expected_generation = view->generation;
    absl::StatusOr<HoldResult> r = ledger_->Hold(hold);
    if (r.ok()) return PodHold{std::move(r->holding), r->created, r->seq};
    const absl::StatusCode code = r.status().code();
    if (attempt == 0 &&
        (code == absl::StatusCode::kAborted || code == absl::StatusCode::kResourceExhausted)) {
      continue;
    }
    return r.status();
  }
}

absl::Status PodHolds::Release(const Owner& pod, const std::string& node) {
  if (placeholders_ != nullptr) return placeholders_->Cancel(node, pod.pod_uid);
  absl::StatusOr<ReleaseResult> r = ledger_->Release(node, pod);
  return r.status();
}

}  // namespace pods
}  // namespace duet
