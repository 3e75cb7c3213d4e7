#include "bridge/server/wiring.h"

#include "absl/time/clock.h"
#include "bridge/server/workload.h"
#include "common/reason.h"
#include "bridge/slurm/placeholders.h"
#include "k8s_adapter/kube_api.h"
#include "spdlog/spdlog.h"

namespace duet {

std::function<absl::Status(uint64_t seq)> WaitDurableOn(LedgerLog* log) {
  LedgerLog* j = log;
  return [j](uint64_t seq) { return j->WaitDurable(seq); };
}

std::function<void(double seconds, size_t records, size_t bytes)> FsyncToMetrics(
    Metrics* metrics) {
  Metrics* m = metrics;
  return [m](double seconds, size_t records, size_t bytes) { m->ObserveFsync(seconds, records, bytes); };
}

PodLivenessFn WatchedPodLiveness(const std::atomic<k8s::PodWatch*>* pod_view) {
  return [pod_view](const std::string& uid) {
    k8s::PodWatch* watch = pod_view->load();
    if (watch == nullptr) return PodLiveness::kUnknown;
    switch (watch->Lookup(uid).state) {
      case k8s::PodSeen::kRunning:
        return PodLiveness::kLive;
      case k8s::PodSeen::kEnded:
        return PodLiveness::kGone;
      case k8s::PodSeen::kNotSeen:
        return PodLiveness::kUnknown;
    }
    return PodLiveness::kUnknown;
  };
}

std::function<std::optional<PlaceholderPod>(const std::string& pod_uid)> WatchedPodName(
    const std::atomic<k8s::PodWatch*>* pod_view) {
  return [pod_view](const std::string& uid) -> std::optional<PlaceholderPod> {
    k8s::PodWatch* watch = pod_view->load();
    if (watch == nullptr) return std::nullopt;
    const k8s::PodSeen seen = watch->Lookup(uid);
    if (seen.state == k8s::PodSeen::kNotSeen || seen.name.empty()) return std::nullopt;
    return PlaceholderPod{uid, seen.ns, seen.name};
  };
}

std::function<std::optional<auth::PodBinding>(const std::string& uid)> WatchedPodBinding(
    const std::atomic<k8s::PodWatch*>* pods) {
  return [pods](const std::string& uid) -> std::optional<auth::PodBinding> {
    k8s::PodWatch* watch = pods == nullptr ? nullptr : pods->load();
    if (watch == nullptr) return std::nullopt;
    k8s::PodSeen seen = watch->Lookup(uid);
    if (seen.state != k8s::PodSeen::kRunning) return std::nullopt;
    return auth::PodBinding{true, seen.node};
  };
}

std::function<void(const std::string& method, const std::string& why)> AuthRefusalsToMetrics(
    Metrics* metrics) {
  return [metrics](const std::string& method, const std::string& why) {
    metrics->CountAuthRefusal(method, why);
  };
}

std::function<void(const SlurmJobInfo& job)> SlurmJobsToWorkload(placement::WorkloadModel* model,
                                                                 const Ledger* ledger) {
  return [model, ledger](const SlurmJobInfo& job) {
    ObserveSlurmJob(model, *ledger, job, absl::Now());
  };
}

std::function<void(const nlohmann::json& pod)> BoundPodsToWorkload(
    placement::WorkloadModel* model, const Ledger* ledger) {
  return [model, ledger](const nlohmann::json& pod) {
    ObserveBoundPod(model, *ledger, pod, absl::Now());
  };
}

std::function<void(const std::string& key, const placement::PodRequest& req)>
FilteredPodsToWorkload(placement::WorkloadModel* model) {
  return [model](const std::string& key, const placement::PodRequest& req) {
    model->Observe(key, req, absl::Now());
  };
}

placement::WorkloadFn WorkloadFrom(const placement::WorkloadModel* model) {
  return [model] { return model->Current(absl::Now()); };
}

std::function<placement::NodeLoad(const NodeView&)> SlurmLoadOf(SlurmNodeLoads* loads) {
  return [loads](const NodeView& v) { return loads->Get(v.spec.name); };
}

std::function<void(const std::string& node, const placement::NodeLoad&)> PlaceholderLoadTo(
    SlurmNodeLoads* loads) {
  return [loads](const std::string& node, const placement::NodeLoad& l) { loads->Add(node, l); };
}

std::function<std::string(const std::string& node)> SlurmUnusable(SlurmNodeLoads* loads) {
  return [loads](const std::string& node) { return loads->Unusable(node); };
}

std::function<std::pair<std::string, std::string>(const std::string& node)> SlurmStateOf(
    SlurmNodeLoads* loads) {
  return [loads](const std::string& node) { return loads->State(node); };
}

std::function<absl::Status(const PlaceholderPod& pod)> EvictThroughKubernetes(
    k8s::KubeClient* kube) {
  return [kube](const PlaceholderPod& pod) {
    return k8s::EvictPod(*kube, pod.ns, pod.name, pod.uid);
  };
}

std::function<absl::StatusOr<std::optional<SlurmJobInfo>>(uint32_t job_id)> SlurmJobLookup(
    SlurmClient* slurm) {
  return [slurm](uint32_t job_id) { return slurm->GetJob(job_id); };
}

std::function<std::optional<absl::Status>(const HoldRequest& request, bool ask_slurm)>
PodEvictionWaitFor(PodEvictions* evictions, const Ledger* ledger) {
  PodEvictions* ev = evictions;
  return [ev, ledger](const HoldRequest& r, bool ask_slurm) {
    return PodEvictionWait(*ev, *ledger, r, absl::Now(), ask_slurm);
  };
}

std::function<bool(const HoldRequest& request)> ResolveSlurmConflictWith(StaleHolders* stale) {
  return [stale](const HoldRequest& r) {
    if (r.devices.empty()) return false;
    absl::StatusOr<int> n = stale->ReleaseEnded(r.node, r.owner, r.devices);
    if (!n.ok()) {
      spdlog::warn("hold for {} on {}: cannot check the placeholders that hold its devices: {}",
                   r.owner.ToString(), r.node, n.status().ToString());
      return false;
    }
    return *n > 0;
  };
}

decltype(LedgerService::Options::authorize_call) AuthorizeCallWith(auth::CallAuthorizer* authz) {
  return [authz](const grpc::ServerContextBase& ctx, const char* method, const std::string& node,
                 const Owner& owner, std::string* who) {
    return authz->Check(auth::CallerFromContext(ctx), method, node, owner, who);
  };
}

CredentialRefusalCounter CredentialRefusalsToMetrics(Metrics* metrics) {
  Metrics* m = metrics;
  return [m](const char* kind, const absl::Status& s) {
    if (s.ok()) return;
    const auto meta = ReasonMetadata(s);
    const auto why = meta.find("why");
    m->CountCredentialRefusal(kind, why != meta.end() ? why->second : "unavailable");
  };
}

decltype(LedgerService::Options::authorize_slurm_owner) MungeOwnerCheck(
    std::shared_ptr<MungeAuth> auth, CredentialRefusalCounter count) {
  return [auth, count](const SlurmCallerCredentials& c, const slurm_munge::Binding& want,
                       std::string* who) {
    absl::Status s = auth->Check(c.munge, want, who);
    count("munge", s);
    return s;
  };
}

decltype(LedgerService::Options::authorize_slurm_owner) SlurmKeyOwnerCheck(
    std::shared_ptr<SlurmKeyAuth> auth, CredentialRefusalCounter count) {
  return [auth, count](const SlurmCallerCredentials& c, const slurm_munge::Binding& want,
                       std::string* who) {
    absl::Status s = auth->Check(c.slurm_key, want, who);
    count("slurm_key", s);
    return s;
  };
}

std::function<absl::StatusOr<std::optional<gang::GangSpec>>(const nlohmann::json& pod)>
GangOfPodFrom(k8s::GangSource* source) {
  return [source](const nlohmann::json& pod) { return source->Recognise(pod); };
}

gang::GangPlannerFn GangPlanner() {
  return [](const std::vector<placement::GangCandidate>& candidates, uint32_t members,
            std::string* reason) { return placement::PickGangNodes(candidates, members, reason); };
}

std::function<placement::NodeTopology(const NodeView&)> GangTopology() {
  return [](const NodeView& v) {
    NodeSpec spec = v.spec;
    for (const DeviceState& dev : v.devices) spec.devices.push_back(dev.spec);
    return placement::TopologyOf(spec);
  };
}

std::function<std::optional<gang::GangKey>(uint32_t job_id)> GangOfSlurmJob(SlurmClient* slurm) {
  // At recovery, a job whose every slot a member holds is known as a gang
  // by its Slurm name (duet-gang:KEY).
  return [slurm](uint32_t job_id) -> std::optional<gang::GangKey> {
    absl::StatusOr<std::optional<SlurmJobInfo>> job = slurm->GetJob(job_id);
    if (!job.ok() || !job->has_value()) return std::nullopt;
    return ParseGangJobName((*job)->name);
  };
}

std::function<void(const k8s::EventSpec&)> ExtenderRefusalEvents(k8s::EventRecorder* events) {
  k8s::EventRecorder* ev = events;
  return [ev](const k8s::EventSpec& e) { ev->Record(e); };
}

}  // namespace duet
