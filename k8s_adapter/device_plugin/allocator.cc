#include "k8s_adapter/device_plugin/allocator.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc/status.h"
#include "common/slurm/slurm_format.h"
#include "k8s_adapter/device_plugin/pod_resources.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace duet {
namespace node {
namespace {

std::string KindLabel(DeviceKind kind) { return ResourceFor(kind).resource_name; }

}  // namespace

Allocator::Allocator(const NodePluginOptions& options, k8s::KubeClient* kube,
                     const BridgeLink* bridge, SlotHealth* health, AllocatorMetrics metrics)
    : options_(options), kube_(kube), bridge_(bridge), health_(health), metrics_(metrics) {}

std::optional<Match> Allocator::SameSlotsAgain(
    const std::vector<int>& slots, const std::map<int, SlotUse>& known,
    const std::vector<PodClaim>& claims, const std::optional<std::vector<PendingPod>>& pending) {
  std::string uid;
  std::vector<uint32_t> devices;
  for (int s : slots) {
    auto it = known.find(s);
    if (it == known.end() || (!uid.empty() && it->second.uid != uid)) return std::nullopt;
    uid = it->second.uid;
    devices.push_back(it->second.device);
  }
  if (uid.empty()) return std::nullopt;
  // Only while that pod still holds those devices and (when the API
  // answers) is still waiting to start here: a slot of a pod that ended may
  // be reused by kubelet for another pod before the ledger has caught up.
  if (pending.has_value() && std::none_of(pending->begin(), pending->end(),
                                          [&](const PendingPod& p) { return p.uid == uid; })) {
    return std::nullopt;
  }
  for (const PodClaim& c : claims) {
    if (c.uid != uid) continue;
    for (uint32_t d : devices) {
      if (std::find(c.devices.begin(), c.devices.end(), d) == c.devices.end()) return std::nullopt;
    }
    Match m;
    m.claim = c;
    m.devices = devices;
    std::sort(m.devices.begin(), m.devices.end());
    return m;
  }
  return std::nullopt;
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> Allocator::ContainerAnswer(
    DeviceKind kind, const std::vector<uint32_t>& devices, const std::string& uid) const {
  absl::StatusOr<v1beta1::ContainerAllocateResponse> r =
      ContainerResponse(kind, devices, options_.device_dir);
  if (!r.ok()) return r;
  if (kind == DeviceKind::kGpu) {
    for (const std::string& m : options_.gpu_mounts) {
      const size_t colon = m.find(':');
      auto* mount = r->add_mounts();
      mount->set_host_path(m.substr(0, colon));
      mount->set_container_path(m.substr(colon + 1));
      mount->set_read_only(true);
    }
  }
  (*r->mutable_annotations())["duet.dev/devices"] =
      absl::StrCat(DeviceKindName(kind), ":", FormatIndexList(devices));
  (*r->mutable_annotations())["duet.dev/pod-uid"] = uid;
  return r;
}

void Allocator::CountRefusal(DeviceKind kind, const absl::Status& s) const {
  std::string reason = absl::StatusCodeToString(s.code());
  for (char& c : reason) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  metrics_.refusals->Add({{"resource", KindLabel(kind)}, {"reason", reason}}).Increment();
  spdlog::warn("Allocate {} refused: {}", ResourceFor(kind).resource_name, s.ToString());
}


absl::StatusOr<std::vector<v1::Holding>> Allocator::ReadHoldings() const {
  // Fresh, not the watch's view: a placeholder made a moment ago must be seen.
  std::vector<v1::Holding> holdings;
  grpc::Status st = bridge_->ListHoldings(&holdings);
  if (!st.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "duet-node cannot read the ledger from duet-bridge (", options_.bridge,
        "), so it cannot tell which devices this pod may use: ", st.error_message()));
  }
  return holdings;
}

Allocator::PodsHere Allocator::ListPodsHere() const {
  PodsHere pods;
  if (kube_ == nullptr) return pods;
  auto body = kube_->Get(absl::StrCat("/api/v1/pods?fieldSelector=",
                                      k8s::QueryEscape("spec.nodeName=" + options_.node_name)));
  if (body.ok()) {
    nlohmann::json list = nlohmann::json::parse(*body, nullptr, false);
    auto pending = PendingPodsFromList(list, options_.node_name);
    if (pending.ok()) {
      pods.pending = std::move(*pending);
      pods.uid_by_name = PodUidsByName(list);
    } else {
      spdlog::warn("Kubernetes pod list: {}", pending.status().ToString());
    }
  } else {
    spdlog::warn("Kubernetes pod list for {}: {}; matching without it", options_.node_name,
                 body.status().ToString());
  }
  return pods;
}

MatchInput Allocator::MatchState(DeviceKind kind, const std::vector<v1::Holding>& holdings,
                                 const PodsHere& pods, std::map<int, SlotUse>* known_slots,
                                 int* slots) {
  MatchInput state;
  state.kind = kind;
  state.claims = ClaimsOf(holdings, kind);
  std::map<std::string, std::string> uid_by_name = pods.uid_by_name;
  for (const auto& c : state.claims) {
    if (!c.ns.empty()) uid_by_name.emplace(absl::StrCat(c.ns, "/", c.name), c.uid);
  }
  AllocationView view = health_->ViewFor(kind);
  state.handed_out = std::move(view.handed_out);
  *known_slots = std::move(view.slot_pod);
  *slots = view.slots;
  for (const auto& [name, resources] : view.served) {
    auto uid = uid_by_name.find(name);
    auto r = resources.find(ResourceFor(kind).resource_name);
    if (uid == uid_by_name.end() || r == resources.end()) continue;
    for (const auto& c : state.claims) {
      if (c.uid == uid->second && r->second >= static_cast<int>(c.devices.size())) {
        state.served.insert(c.uid);
      }
    }
  }
  state.pending = pods.pending;
  return state;
}

absl::Status Allocator::PlaceBypassPod(DeviceKind kind, int count,
                                       const std::vector<PendingPod>& pending,
                                       const absl::Status& unmatched,
                                       std::vector<v1::Holding>* holdings) const {
  std::optional<PendingPod> bypass = PickBypassPod(kind, count, pending, *holdings);
  if (!bypass) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", options_.node_name, ": ", unmatched.message(),
                     ", and no pending pod here asks ", count, " ",
                     ResourceFor(kind).resource_name, " without one"));
  }
  v1::PlacePodRequest preq;
  preq.mutable_pod()->set_uid(bypass->uid);
  preq.mutable_pod()->set_namespace_(bypass->ns);
  preq.mutable_pod()->set_name(bypass->name);
  preq.set_node(options_.node_name);
  preq.set_gpus(bypass->gpus);
  preq.set_tpus(bypass->tpus);
  preq.set_cpus(bypass->cpus);
  preq.set_memory_mib(bypass->memory_mib);
  v1::Holding placed;
  grpc::Status st = bridge_->PlacePod(preq, &placed);
  metrics_.placed
      ->Add({{"resource", KindLabel(kind)}, {"result", st.ok() ? "placed" : "refused"}})
      .Increment();
  if (!st.ok()) {
    const std::string pod = absl::StrCat(bypass->ns, "/", bypass->name);
    if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "pod ", pod, " did not go through the duet scheduler and there is no room for it ",
          "on node ", options_.node_name,
          " (Slurm or the ledger holds the devices): ", st.error_message()));
    }
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                        absl::StrCat("pod ", pod,
                                     " did not go through the duet scheduler and duet-bridge "
                                     "could not place it: ",
                                     st.error_message()));
  }
  spdlog::info("placed pod {}/{} (bypassed the duet scheduler) on {}: {}", bypass->ns,
               bypass->name, options_.node_name, placed.ShortDebugString());
  holdings->push_back(placed);
  return absl::OkStatus();
}

grpc::Status Allocator::Allocate(DeviceKind kind, const v1beta1::AllocateRequest& req,
                                 v1beta1::AllocateResponse* resp) {
  const absl::Time start = absl::Now();
  absl::MutexLock alloc_lock(&mu_);
  auto refuse = [&](const absl::Status& s) {
    CountRefusal(kind, s);
    return ToGrpc(s);
  };

  // 1. The ledger's holdings on this node.
  absl::StatusOr<std::vector<v1::Holding>> read = ReadHoldings();
  if (!read.ok()) return refuse(read.status());
  std::vector<v1::Holding> holdings = *std::move(read);

  // 2. What kubelet already served, and (when the API answers) which pods
  // are waiting to start here.
  if (std::optional<KubeletGiven> given = ListKubeletGiven(options_.pod_resources_socket)) {
    health_->SetKubeletGiven(*std::move(given));
  }
  const PodsHere pods = ListPodsHere();
  const std::optional<std::vector<PendingPod>>& pending = pods.pending;
  std::map<int, SlotUse> known_slots;
  int slots = 0;
  MatchInput state = MatchState(kind, holdings, pods, &known_slots, &slots);
  std::vector<std::pair<int, SlotUse>> new_slots;

  // 3. Each container, all or nothing.
  for (const auto& creq : req.container_requests()) {
    const int n = creq.devicesids_size();
    std::vector<int> slot_numbers;
    for (const auto& id : creq.devicesids()) {
      auto s = ParseSlotId(kind, id);
      if (!s || *s >= slots) {
        return refuse(absl::InvalidArgumentError(
            absl::StrCat("unknown ", ResourceFor(kind).resource_name, " device ID \"", id, "\"")));
      }
      slot_numbers.push_back(*s);
    }
    if (n == 0) return refuse(absl::InvalidArgumentError("a container request lists no devices"));
    state.count = n;
    // kubelet passes an init container's devices on to the pod's later
    // containers under the same slot IDs: the same slots, the same devices.
    if (std::optional<Match> again =
            SameSlotsAgain(slot_numbers, known_slots, state.claims, pending)) {
      auto cresp = ContainerAnswer(kind, again->devices, again->claim.uid);
      if (!cresp.ok()) return refuse(cresp.status());
      *resp->add_container_responses() = std::move(*cresp);
      spdlog::info("Allocate {} slots [{}] again -> pod {} devices {}",
                   ResourceFor(kind).resource_name, absl::StrJoin(creq.devicesids(), ","),
                   again->claim.uid, FormatIndexList(again->devices));
      continue;
    }
    absl::StatusOr<Match> m = MatchClaim(state);
    if (!m.ok() && pending.has_value()) {
      absl::Status placed = PlaceBypassPod(kind, n, *pending, m.status(), &holdings);
      if (!placed.ok()) return refuse(placed);
      state.claims = ClaimsOf(holdings, kind);
      m = MatchClaim(state);
    }
    if (!m.ok()) {
      return refuse(absl::FailedPreconditionError(absl::StrCat(
          "node ", options_.node_name, ": ", m.status().message(),
          pending.has_value() ? ""
                              : "; without the Kubernetes API duet-node cannot place a pod "
                                "that bypassed the duet scheduler")));
    }
    auto cresp = ContainerAnswer(kind, m->devices, m->claim.uid);
    if (!cresp.ok()) return refuse(cresp.status());
    *resp->add_container_responses() = std::move(*cresp);
    auto& given = state.handed_out[m->claim.uid];
    given.insert(given.end(), m->devices.begin(), m->devices.end());
    std::sort(slot_numbers.begin(), slot_numbers.end());
    for (size_t i = 0; i < slot_numbers.size(); ++i) {
      new_slots.emplace_back(slot_numbers[i], SlotUse{m->claim.uid, m->devices[i]});
      known_slots[slot_numbers[i]] = SlotUse{m->claim.uid, m->devices[i]};
    }
    spdlog::info("Allocate {} slots [{}] -> pod {} ({}{}) devices {}",
                 ResourceFor(kind).resource_name, absl::StrJoin(creq.devicesids(), ","),
                 m->claim.uid, m->claim.ns.empty() ? "" : m->claim.ns + "/", m->claim.name,
                 FormatIndexList(m->devices));
  }

  // 4. Commit the bookkeeping (health avoids these slots from now on).
  health_->Commit(kind, std::move(state.handed_out), new_slots);
  metrics_.allocations->Add({{"resource", KindLabel(kind)}})
      .Increment(req.container_requests_size());
  metrics_.allocate_seconds
      ->Add({{"resource", KindLabel(kind)}},
            prometheus::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 15})
      .Observe(absl::ToDoubleSeconds(absl::Now() - start));
  return grpc::Status::OK;
}

}  // namespace node
}  // namespace duet
