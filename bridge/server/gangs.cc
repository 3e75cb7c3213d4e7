#include "bridge/server/gangs.h"

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace duet {
namespace {

// Gang members' placeholders go back to their slots; the rest to `inner`.
class GangPodReleaser final : public k8s::PodReleaser {
 public:
  GangPodReleaser(gang::GangRegistry* registry, Ledger* ledger, k8s::PodReleaser* inner)
      : registry_(registry), ledger_(ledger), inner_(inner) {}

  absl::Status Release(const k8s::PodRelease& r) override {
    const Owner& owner = r.holding.owner;
    if (owner.kind != OwnerKind::kPlaceholder || !registry_->IsGangJob(owner.job_id)) {
      return inner_->Release(r);
    }
    absl::StatusOr<bool> gone = registry_->OnMemberGone(owner.pod_uid);
    if (!gone.ok()) return gone.status();
    if (*gone) return absl::OkStatus();
    // A piece of a gang's job the registry has no slot for: the ledger lets
    // go of it; Slurm's job keeps the devices until the gang is released.
    spdlog::warn("gang job {}: {} on {} is no member's slot; released in the ledger only",
                 owner.job_id, owner.ToString(), r.holding.node);
    return ledger_->Release(r.holding.node, owner).status();
  }

 private:
  gang::GangRegistry* const registry_;
  Ledger* const ledger_;
  k8s::PodReleaser* const inner_;
};

std::string PodPath(const gang::MemberRef& m) {
  return absl::StrCat("/api/v1/namespaces/", m.ns, "/pods/", m.name);
}

}  // namespace

BridgeGangs::BridgeGangs(BridgeGangsDeps deps) : deps_(std::move(deps)) {
  gang::GangRegistryOptions o;
  o.planner = deps_.planner;
  o.topology = deps_.topology;
  o.load = deps_.load;
  o.unusable = deps_.unusable;
  o.wait_durable = deps_.wait_durable;
  o.job_gang = deps_.job_gang;
  o.node_filter = deps_.node_filter;
  o.in_use = deps_.in_use;
  // What Placeholders (the GangMaker) records for each slot.
  o.slot_owner = [](uint32_t job, const gang::GangKey& key, uint32_t slot) {
    return Owner::GangSlot(job, key.ToString(), slot);
  };
  o.reserve_timeout = deps_.config->reserve_timeout;
  o.idle_release = deps_.config->idle_release;
  o.clock = deps_.clock;
  if (deps_.kube != nullptr) {
    o.member_exists = [this](const gang::MemberRef& m) { return MemberExists(m); };
    o.on_complete = [this](const gang::GangKey&,
                           const std::vector<std::pair<gang::MemberRef, std::string>>& members) {
      absl::MutexLock lock(&mu_);
      for (const auto& m : members) annotate_.push_back(m);
    };
  }
  if (deps_.events != nullptr) {
    o.on_event = [this](const gang::GangEvent& e) { PostEvent(e); };
  }
  registry_ = std::make_unique<gang::GangRegistry>(deps_.ledger, deps_.maker, std::move(o));
}

absl::StatusOr<std::unique_ptr<BridgeGangs>> BridgeGangs::Start(BridgeGangsDeps deps) {
  if (deps.config == nullptr || deps.ledger == nullptr || deps.maker == nullptr || !deps.planner) {
    return absl::InvalidArgumentError("gangs: config, ledger, GangMaker and planner are required");
  }
  std::unique_ptr<BridgeGangs> g(new BridgeGangs(std::move(deps)));
  absl::StatusOr<size_t> n = g->registry_->Recover();
  if (!n.ok()) return n.status();
  spdlog::info("gangs: {} recovered from the ledger", *n);
  g->thread_ = std::thread([p = g.get()] { p->Run(); });
  return g;
}

BridgeGangs::~BridgeGangs() { Stop(); }

void BridgeGangs::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::unique_ptr<k8s::PodReleaser> BridgeGangs::Releaser(k8s::PodReleaser* inner) {
  return std::make_unique<GangPodReleaser>(registry_.get(), deps_.ledger, inner);
}

void BridgeGangs::Run() {
  absl::Time next_tick = deps_.clock->Now();
  while (true) {
    std::deque<std::pair<gang::MemberRef, std::string>> annotate;
    {
      absl::MutexLock lock(&mu_);
      deps_.clock->AwaitWithDeadline(&mu_, absl::Condition(this, &BridgeGangs::HasWork), next_tick);
      if (stopping_) return;
      annotate.swap(annotate_);
    }
    for (const auto& [member, node] : annotate) Annotate(member, node);
    if (deps_.clock->Now() >= next_tick) {
      registry_->Tick();
      next_tick = deps_.clock->Now() + deps_.tick_period;
    }
  }
}

absl::StatusOr<bool> BridgeGangs::MemberExists(const gang::MemberRef& m) const {
  if (m.name.empty()) return true;  // recovered: only the uid is known
  absl::StatusOr<std::string> body = deps_.kube->Get(PodPath(m));
  if (absl::IsNotFound(body.status())) return false;
  if (!body.ok()) return body.status();
  nlohmann::json pod = nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
  if (pod.is_discarded() || !pod.is_object()) {
    return absl::InternalError("the API server's reply is not JSON");
  }
  const nlohmann::json uid = pod["metadata"]["uid"];
  return uid.is_string() && uid.get<std::string>() == m.uid;  // replaced: a new pod
}

void BridgeGangs::Annotate(const gang::MemberRef& m, const std::string& node) const {
  if (m.name.empty()) return;
  nlohmann::json patch = {
      {"metadata", {{"uid", m.uid}, {"annotations", {{kGangNodeAnnotation, node}}}}}};
  absl::StatusOr<std::string> r =
      deps_.kube->Patch(PodPath(m), patch.dump(), k8s::PatchType::kMerge);
  if (!r.ok()) {
    // Only a requeue is lost: kube-scheduler retries the pod on its own.
    spdlog::warn("gang member {}/{}: annotating {}={}: {}", m.ns, m.name, kGangNodeAnnotation, node,
                 r.status().ToString());
  }
}

void BridgeGangs::PostEvent(const gang::GangEvent& e) const {
  for (const gang::MemberRef& m : e.members) {
    if (m.name.empty()) continue;
    k8s::EventSpec s;
    s.object_kind = "Pod";
    s.object_namespace = m.ns;
    s.object_name = m.name;
    s.object_uid = m.uid;
    s.type = e.type;
    s.reason = e.reason;
    s.message = e.message;
    deps_.events->Record(s);
  }
}

std::vector<prometheus::MetricFamily> GangFamilies(const gang::GangStats& s) {
  using prometheus::MetricType;
  prometheus::MetricFamily res = NewFamily(
      "duet_gang_reservations_total", "Gangs reserved whole (one Slurm job each)", MetricType::Counter);
  AddValue(&res, {}, static_cast<double>(s.reservations));
  prometheus::MetricFamily unpl = NewFamily(
      "duet_gang_unplaceable_total", "Gang reservations refused (no room, or Slurm refused)",
      MetricType::Counter);
  AddValue(&unpl, {}, static_cast<double>(s.unplaceable));
  prometheus::MetricFamily rel =
      NewFamily("duet_gang_releases_total", "Gangs released, by reason", MetricType::Counter);
  for (int i = 0; i < gang::kReleaseReasons; ++i) {
    AddValue(&rel, {{"reason", gang::ReleaseReasonName(static_cast<gang::ReleaseReason>(i))}},
             static_cast<double>(s.releases[i]));
  }
  prometheus::MetricFamily gangs = NewFamily("duet_gangs", "Gangs held, by state", MetricType::Gauge);
  AddValue(&gangs, {{"state", "gathering"}}, static_cast<double>(s.gathering));
  AddValue(&gangs, {{"state", "complete"}}, static_cast<double>(s.complete));
  return {std::move(res), std::move(unpl), std::move(rel), std::move(gangs)};
}

}  // namespace duet
