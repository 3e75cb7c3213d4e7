#include "bridge/server/dra_mode.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "bridge/dra/slice_lends.h"
#include "bridge/placement/topology.h"
#include "k8s_adapter/dra/demand.h"
#include "k8s_adapter/dra/device_map.h"
#include "k8s_adapter/dra/taint_rules.h"
#include "k8s_adapter/dra/webhook.h"
#include "k8s_adapter/event_recorder.h"
#include "k8s_adapter/informer.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace {

constexpr char kTpuDriver[] = "tpu.google.com";
constexpr char kDra[] = "/apis/resource.k8s.io/v1";
// LendDemand's lends under way at once (a thread each).
constexpr int kDemandLendsInFlight = 4;
// A pod asking again is served again after this long (its lend may have
// gone to another pod first, or the scheduler may still be catching up).
constexpr absl::Duration kDemandRetry = absl::Seconds(5);

const nlohmann::json* Path(const nlohmann::json& j, std::initializer_list<const char*> keys) {
  const nlohmann::json* cur = &j;
  for (const char* k : keys) {
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(k);
    if (it == cur->end()) return nullptr;
    cur = &*it;
  }
  return cur;
}

std::string Str(const nlohmann::json& j, std::initializer_list<const char*> keys) {
  const nlohmann::json* v = Path(j, keys);
  return v != nullptr && v->is_string() ? v->get<std::string>() : "";
}

// `view` with the `n` lowest free devices of each kind promised to lends
// under way marked used, as a pick must see it (Slurm gives a lend job the
// lowest free devices).
std::shared_ptr<const NodeView> WithPromised(const NodeView& view,
                                             const std::map<DeviceKind, uint32_t>& promised) {
  auto out = std::make_shared<NodeView>(view);
  std::map<DeviceKind, uint32_t> left = promised;
  for (DeviceState& d : out->devices) {
    uint32_t& n = left[d.spec.kind];
    if (n == 0 || d.used_milli != 0) continue;
    d.used_milli = d.spec.capacity_milli;
    --n;
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// Claims

std::vector<dra::DraDevice> AllocatedDevices(const nlohmann::json& claim) {
  std::vector<dra::DraDevice> out;
  const nlohmann::json* results = Path(claim, {"status", "allocation", "devices", "results"});
  if (results == nullptr || !results->is_array()) return out;
  for (const nlohmann::json& r : *results) {
    const nlohmann::json* admin = Path(r, {"adminAccess"});
    if (admin != nullptr && admin->is_boolean() && admin->get<bool>()) continue;
    dra::DraDevice d{Str(r, {"driver"}), Str(r, {"pool"}), Str(r, {"device"})};
    if (d.driver.empty() || d.pool.empty() || d.device.empty()) continue;
    out.push_back(std::move(d));
  }
  return out;
}

namespace {

dra::AllocatedClaim ToAllocatedClaim(const nlohmann::json& c) {
  return {dra::ClaimRef{Str(c, {"metadata", "uid"}), Str(c, {"metadata", "namespace"}),
                        Str(c, {"metadata", "name"})},
          AllocatedDevices(c)};
}

}  // namespace

QuorumClaimLister::QuorumClaimLister(k8s::KubeClient* kube, std::string api)
    : kube_(kube), api_(std::move(api)) {}

absl::StatusOr<std::optional<dra::AllocatedClaim>> QuorumClaimLister::GetClaim(
    const dra::ClaimRef& claim) {
  if (claim.ns.empty() || claim.name.empty()) {
    return absl::InvalidArgumentError("GetClaim: the claim's namespace and name must be set");
  }
  // No resourceVersion: a quorum read from etcd, never a watch cache.
  const std::string path =
      absl::StrCat(api_, "/namespaces/", claim.ns, "/resourceclaims/", claim.name);
  absl::StatusOr<std::string> body = kube_->Get(path);
  if (absl::IsNotFound(body.status())) return std::nullopt;
  if (!body.ok()) return body.status();
  nlohmann::json c = nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
  if (!c.is_object() || Str(c, {"metadata", "uid"}).empty()) {
    return absl::InternalError(absl::StrCat("GET ", path, ": not a ResourceClaim"));
  }
  dra::AllocatedClaim out = ToAllocatedClaim(c);
  if (!claim.uid.empty() && out.claim.uid != claim.uid) return std::nullopt;  // another claim now
  return out;
}

absl::StatusOr<std::vector<dra::AllocatedClaim>> QuorumClaimLister::ListAllocated() {
  std::vector<dra::AllocatedClaim> out;
  std::string cont;
  do {
    // No resourceVersion: a quorum read from etcd, never a watch cache.
    std::string path = absl::StrCat(api_, "/resourceclaims?limit=500");
    if (!cont.empty()) absl::StrAppend(&path, "&continue=", cont);
    absl::StatusOr<std::string> body = kube_->Get(path);
    if (!body.ok()) return body.status();
    nlohmann::json list = nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
    if (!list.is_object() || !list.contains("items") || !list["items"].is_array()) {
      return absl::InternalError(absl::StrCat("GET ", path, ": not a ResourceClaimList"));
    }
    for (const nlohmann::json& c : list["items"]) {
      dra::AllocatedClaim a = ToAllocatedClaim(c);
      if (!a.devices.empty()) out.push_back(std::move(a));
    }
    cont = Str(list, {"metadata", "continue"});
  } while (!cont.empty());
  return out;
}

// ---------------------------------------------------------------------------
// Informer handlers

// Told by the ledger (under its lock) of every change: remembers that a
// node's spec changed or a node left, so the loop reads the inventory only
// then. Holds and releases are not inventory changes.
class DraMode::InventoryListener final : public ChangeListener {
 public:
  void OnChange(const Change& change) override {
    if (change.type == Change::Type::kUpsertNode || change.type == Change::Type::kRemoveNode ||
        change.erased) {
      changed_.store(true, std::memory_order_release);
    }
  }
  // True once after any inventory change since the last call.
  bool Take() { return changed_.exchange(false, std::memory_order_acq_rel); }

 private:
  std::atomic<bool> changed_{false};
};

// Keeps every ResourceSlice (for a full rebuild) and what changed since the
// map last took it (for DeviceMap::Apply). A relist (OnSynced) asks for a full
// rebuild; so does the next change after a rebuild or Apply that failed (what
// it took is gone; as before, a bad slice is not retried until something
// changes).
class DraMode::SliceHandler final : public k8s::InformerHandler {
 public:
  void OnUpsert(const nlohmann::json& object) override {
    absl::MutexLock lock(&mu_);
    const std::string name = Str(object, {"metadata", "name"});
    slices_[name] = object;
    pending_[name] = object;
  }
  void OnDelete(const std::string& key, const nlohmann::json*) override {
    absl::MutexLock lock(&mu_);
    slices_.erase(key);
    pending_[key] = std::nullopt;
  }
  void OnSynced() override {
    absl::MutexLock lock(&mu_);
    full_ = true;
  }
  bool Changed() {
    absl::MutexLock lock(&mu_);
    return full_ || !pending_.empty();
  }
  bool NeedsFull() {
    absl::MutexLock lock(&mu_);
    return full_ || failed_;
  }
  // The map did not take the last Take's slices: the next change rebuilds it.
  void Failed() {
    absl::MutexLock lock(&mu_);
    failed_ = true;
  }
  // Every slice; what was pending is covered by it.
  std::vector<nlohmann::json> TakeAll() {
    absl::MutexLock lock(&mu_);
    full_ = false;
    failed_ = false;
    pending_.clear();
    std::vector<nlohmann::json> out;
    out.reserve(slices_.size());
    for (const auto& [name, s] : slices_) out.push_back(s);
    return out;
  }
  // The slices added, changed or deleted since the last Take.
  k8s_dra::MapDelta TakeDelta() {
    absl::MutexLock lock(&mu_);
    k8s_dra::MapDelta delta;
    for (auto& [name, s] : pending_) {
      if (s.has_value()) {
        delta.upserted.push_back(std::move(*s));
      } else {
        delta.deleted.push_back(name);
      }
    }
    pending_.clear();
    return delta;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, nlohmann::json> slices_ ABSL_GUARDED_BY(mu_);
  // Name -> the slice now, or nullopt when deleted.
  std::map<std::string, std::optional<nlohmann::json>> pending_ ABSL_GUARDED_BY(mu_);
  bool full_ ABSL_GUARDED_BY(mu_) = true;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

class DraMode::ClaimHandler final : public k8s::InformerHandler {
 public:
  void OnUpsert(const nlohmann::json& object) override {
    const std::string key = absl::StrCat(Str(object, {"metadata", "namespace"}), "/",
                                         Str(object, {"metadata", "name"}));
    const std::string uid = Str(object, {"metadata", "uid"});
    absl::MutexLock lock(&mu_);
    uid_of_[key] = uid;
    if (AllocatedDevices(object).empty()) {
      allocated_.erase(uid);
      check_.insert(uid);  // a fenced release if the ledger holds it
    } else {
      allocated_.insert(uid);
      check_.erase(uid);
    }
  }
  void OnDelete(const std::string& key, const nlohmann::json* last) override {
    absl::MutexLock lock(&mu_);
    std::string uid = last != nullptr ? Str(*last, {"metadata", "uid"}) : "";
    auto it = uid_of_.find(key);
    if (uid.empty() && it != uid_of_.end()) uid = it->second;
    if (it != uid_of_.end()) uid_of_.erase(it);
    if (uid.empty()) return;
    allocated_.erase(uid);
    check_.erase(uid);
    deleted_.insert(uid);
  }
  void OnSynced() override {
    absl::MutexLock lock(&mu_);
    synced_ = true;
    sweep_ = true;
  }

  struct Work {
    std::set<std::string> deleted;  // release
    std::set<std::string> check;    // release if still not allocated in the view
    bool sweep = false;             // every Claim holding not allocated in the view
    std::set<std::string> allocated;
  };
  Work Take(bool sweep) {
    absl::MutexLock lock(&mu_);
    Work w;
    w.deleted.swap(deleted_);
    w.check = check_;
    w.sweep = synced_ && (sweep_ || sweep);
    sweep_ = false;
    if (w.sweep || !w.check.empty()) w.allocated = allocated_;
    return w;
  }
  void Done(const std::string& uid) {
    absl::MutexLock lock(&mu_);
    check_.erase(uid);
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> uid_of_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> allocated_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> check_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> deleted_ ABSL_GUARDED_BY(mu_);
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  bool sweep_ ABSL_GUARDED_BY(mu_) = false;
};

namespace {

// Whether a pod carries one of the gang markers k8s::GangSource reads
// (docs/gangs.md 1): a cheap first look, Recognise decides.
bool GangMarked(const nlohmann::json& pod) {
  const nlohmann::json* labels = Path(pod, {"metadata", "labels"});
  if (labels != nullptr && labels->is_object()) {
    for (const char* l : {"scheduling.x-k8s.io/pod-group", "jobset.sigs.k8s.io/jobset-name",
                          "leaderworkerset.sigs.k8s.io/name"}) {
      if (labels->contains(l)) return true;
    }
  }
  return Path(pod, {"spec", "schedulingGroup"}) != nullptr ||
         Path(pod, {"spec", "workloadRef"}) != nullptr;
}

// Unbound, with PodScheduled False for any reason (a gang member the
// webhook refused is SchedulerError, not Unschedulable).
bool NotScheduled(const nlohmann::json& pod) {
  if (!Str(pod, {"spec", "nodeName"}).empty()) return false;
  const nlohmann::json* conds = Path(pod, {"status", "conditions"});
  if (conds == nullptr || !conds->is_array()) return false;
  for (const nlohmann::json& c : *conds) {
    if (Str(c, {"type"}) == "PodScheduled" && Str(c, {"status"}) == "False") return true;
  }
  return false;
}

}  // namespace

class DraMode::PodHandler final : public k8s::InformerHandler {
 public:
  // `on_new` runs (outside the handler's lock) when a pod becomes pending
  // for devices: not on a change of a pod already pending.
  explicit PodHandler(std::function<void()> on_new) : on_new_(std::move(on_new)) {}
  void OnUpsert(const nlohmann::json& object) override {
    const std::string key = absl::StrCat(Str(object, {"metadata", "namespace"}), "/",
                                         Str(object, {"metadata", "name"}));
    bool added = false;
    {
      absl::MutexLock lock(&mu_);
      added = Apply(key, object);
    }
    if (added) on_new_();
  }
  void OnDelete(const std::string& key, const nlohmann::json*) override {
    absl::MutexLock lock(&mu_);
    pending_.erase(key);
  }
  void OnSynced() override {}
  std::vector<nlohmann::json> Pending() {
    absl::MutexLock lock(&mu_);
    std::vector<nlohmann::json> out;
    for (const auto& [k, p] : pending_) out.push_back(p);
    return out;
  }

 private:
  // Whether `key` is newly pending.
  bool Apply(const std::string& key, const nlohmann::json& object)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (k8s_dra::UnschedulablePod(object) || (GangMarked(object) && NotScheduled(object))) {
      // Only what demand and gang recognition read.
      nlohmann::json keep = {{"metadata", object["metadata"]}, {"spec", nlohmann::json::object()}};
      for (const char* k : {"containers", "resourceClaims", "nodeSelector", "schedulingGroup",
                            "workloadRef"}) {
        if (object["spec"].contains(k)) keep["spec"][k] = object["spec"][k];
      }
      for (const char* k : {"resourceClaimStatuses", "conditions"}) {
        if (const nlohmann::json* st = Path(object, {"status", k})) keep["status"][k] = *st;
      }
      return pending_.insert_or_assign(key, std::move(keep)).second;
    }
    pending_.erase(key);
    return false;
  }

  const std::function<void()> on_new_;
  absl::Mutex mu_;
  std::map<std::string, nlohmann::json> pending_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------
// DraMode

DraMode::DraMode(DraModeDeps deps) : deps_(std::move(deps)) {}

DraMode::~DraMode() { Stop(); }

int DraMode::webhook_port() const { return webhook_ ? webhook_->port() : 0; }

std::string DraMode::PoolOf(const std::string& node) const {
  std::shared_ptr<const NodeView> v = deps_.ledger->GetNode(node);
  if (!v) return "";
  const std::vector<std::string>& pools = deps_.config->pools;
  return std::find(pools.begin(), pools.end(), v->spec.pool) != pools.end() ? v->spec.pool : "";
}

absl::StatusOr<std::unique_ptr<DraMode>> DraMode::Start(DraModeDeps deps) {
  std::unique_ptr<DraMode> m(new DraMode(std::move(deps)));
  absl::Status s = m->Init();
  if (!s.ok()) {
    m->Stop();
    return s;
  }
  return m;
}

absl::Status DraMode::Init() {
  const DraConfig& c = *deps_.config;
  if (c.kube_version == "1.37") {
    rule_api_ = "v1";
  } else if (c.kube_version == "1.36") {
    rule_api_ = "v1beta2";
  } else {
    absl::StatusOr<std::string> api = k8s_dra::DetectRuleApi(deps_.kube);
    if (!api.ok()) {
      return absl::Status(api.status().code(),
                          absl::StrCat("dra: the DeviceTaintRule API: ", api.status().message()));
    }
    rule_api_ = *api;
  }
  map_ = std::make_unique<k8s_dra::DeviceMap>(c.drivers, deps_.registry);
  k8s_dra::TaintRulesOptions ro;
  ro.api_version = rule_api_;
  ro.taint_key = c.taint_key;
  ro.registry = deps_.registry;
  rules_ = std::make_unique<k8s_dra::TaintRules>(deps_.kube, ro);
  claims_ = std::make_unique<QuorumClaimLister>(deps_.kube, kDra);
  dra::LenderOptions lo;
  if (deps_.gangs.maker != nullptr && deps_.gang_of) {
    // The lending mode's gangs: its own registry, over its pools' nodes
    // only; a complete gang lives while claims hold its devices.
    BridgeGangsDeps g = deps_.gangs;
    g.ledger = deps_.ledger;
    g.clock = deps_.clock;
    g.node_filter = [this](const std::string& node) { return !PoolOf(node).empty(); };
    auto unusable = g.unusable;
    g.unusable = [this, unusable](const std::string& node) -> std::string {
      std::string why;
      if (!map_->Lendable(node, &why)) return absl::StrCat("lends nothing: ", why);
      return unusable ? unusable(node) : "";
    };
    Ledger* ledger = deps_.ledger;
    g.in_use = [ledger](uint32_t job, const std::vector<std::string>& nodes) {
      return dra::GangLends::InUse(*ledger, job, nodes);
    };
    absl::StatusOr<std::unique_ptr<BridgeGangs>> started = BridgeGangs::Start(std::move(g));
    if (!started.ok()) {
      return absl::Status(started.status().code(),
                          absl::StrCat("dra: gangs: ", started.status().message()));
    }
    gang_registry_ = *std::move(started);
    gangs_ = std::make_unique<dra::GangLends>(gang_registry_->registry(), deps_.clock);
    dra::GangLends* gangs = gangs_.get();
    lo.gang_admit = [gangs](const Owner& slot, const std::vector<std::string>& pods) {
      return gangs->Admit(slot, pods);
    };
    lo.gang_slots = [gangs](uint32_t job, const std::string& node) {
      return gangs->SlotOwners(job, node);
    };
  }
  lo.admission_grace = c.webhook.admission_grace;
  lo.warm_buffer = static_cast<uint32_t>(c.warm_buffer);
  lo.reclaim_after = c.reclaim_after;
  lo.pool_of = [this](const std::string& node) { return PoolOf(node); };
  lender_ = std::make_unique<dra::Lender>(deps_.ledger, deps_.lends, map_.get(), rules_.get(),
                                          claims_.get(), deps_.durable, deps_.clock, lo,
                                          deps_.registry);
  // The rules' cache: one LIST here, a watch from then on.
  if (absl::Status s = rules_->StartWatch(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("dra: listing DeviceTaintRules: ", s.message()));
  }

  slice_handler_ = std::make_unique<SliceHandler>();
  claim_handler_ = std::make_unique<ClaimHandler>();
  pod_handler_ = std::make_unique<PodHandler>([this] {
    // A pod newly unschedulable for devices: lend now, not at the next pass.
    absl::MutexLock lock(&mu_);
    wake_ = true;
  });
  k8s::InformerOptions so;
  so.path = absl::StrCat(kDra, "/resourceslices");
  slice_informer_ = std::make_unique<k8s::Informer>(deps_.kube, so, slice_handler_.get());
  k8s::InformerOptions co;
  co.path = absl::StrCat(kDra, "/resourceclaims");
  claim_informer_ = std::make_unique<k8s::Informer>(deps_.kube, co, claim_handler_.get());
  k8s::InformerOptions po;
  po.path = "/api/v1/pods";
  po.field_selector = "spec.nodeName=";  // pending pods only
  pod_informer_ = std::make_unique<k8s::Informer>(deps_.kube, po, pod_handler_.get());
  const std::pair<k8s::Informer*, const char*> informers[] = {
      {slice_informer_.get(), "ResourceSlices"},
      {claim_informer_.get(), "ResourceClaims"},
      {pod_informer_.get(), "pending pods"}};
  for (const auto& [inf, what] : informers) {
    if (absl::Status s = inf->Start(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("dra: listing ", what, ": ", s.message()));
    }
  }
  inventory_listener_ = std::make_unique<InventoryListener>();
  deps_.ledger->AddListener(inventory_listener_.get());
  RebuildMap(/*force=*/true, /*read_inventory=*/true);
  if (absl::Status s = lender_->Resync(); !s.ok()) {
    spdlog::warn("dra: the first DeviceTaintRule resync failed (retried at the next pass): {}",
                 s.ToString());
  }
  k8s_dra::WebhookOptions wo;
  wo.listen = c.webhook.listen;
  wo.cert_file = c.webhook.cert_file;
  wo.key_file = c.webhook.key_file;
  wo.admission_threads = c.webhook.admission_threads;
  wo.registry = deps_.registry;
  absl::StatusOr<std::unique_ptr<k8s_dra::WebhookServer>> hook =
      k8s_dra::WebhookServer::Start(lender_.get(), wo);
  if (!hook.ok()) {
    return absl::Status(hook.status().code(),
                        absl::StrCat("dra.webhook: ", hook.status().message()));
  }
  webhook_ = *std::move(hook);
  spdlog::info("dra: lending pools [{}], DeviceTaintRule API resource.k8s.io/{}, webhook on port {}",
               absl::StrJoin(c.pools, ", "), rule_api_, webhook_->port());
  loop_ = std::thread([this] { Loop(); });
  release_ = std::thread([this] { ReleaseLoop(); });
  tick_ = std::thread([this] { TickLoop(); });
  return absl::OkStatus();
}

void DraMode::Stop() {
  if (webhook_) webhook_->Stop();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
  ReapLends(/*all=*/true);  // the loop's lends under way
  if (release_.joinable()) release_.join();
  if (tick_.joinable()) tick_.join();
  if (gang_registry_) gang_registry_->Stop();
  for (auto* inf : {pod_informer_.get(), claim_informer_.get(), slice_informer_.get()}) {
    if (inf != nullptr) inf->Stop();
  }
  if (rules_) rules_->StopWatch();
  if (inventory_listener_) {
    deps_.ledger->RemoveListener(inventory_listener_.get());
    inventory_listener_.reset();
  }
}

void DraMode::RebuildMap(bool force, bool read_inventory) {
  if (!force && !read_inventory && !slice_handler_->Changed()) return;
  // A full rebuild when asked, after a relist or a failed Apply, or when the
  // lending nodes' inventory changed; otherwise only the slices that changed
  // are applied (DeviceMap::Apply re-judges just their pools' nodes).
  bool full = force || slice_handler_->NeedsFull();
  k8s_dra::LedgerInventory inv;
  uint64_t fingerprint = 1469598103934665603ull;
  if (full || read_inventory) {
    // The lending nodes' devices as the ledger's inventory has them.
    LedgerSnapshot snap = deps_.ledger->Snapshot();
    auto mix = [&fingerprint](uint64_t v) { fingerprint = (fingerprint ^ v) * 1099511628211ull; };
    for (const std::shared_ptr<const NodeView>& v : snap.nodes) {
      const std::vector<std::string>& pools = deps_.config->pools;
      if (std::find(pools.begin(), pools.end(), v->spec.pool) == pools.end()) continue;
      std::vector<k8s_dra::InventoryDevice>& devs = inv[v->spec.name];
      mix(std::hash<std::string>()(v->spec.name));
      for (const DeviceState& d : v->devices) {
        devs.push_back({d.spec.kind, d.spec.index, d.spec.id});
        mix(static_cast<uint64_t>(d.spec.kind) * 4096 + d.spec.index);
        mix(std::hash<std::string>()(d.spec.id));
      }
    }
    if (fingerprint != map_ledger_seq_) full = true;
  }
  std::vector<std::string> changed;
  if (full) {
    map_ledger_seq_ = fingerprint;
    if (absl::Status s = map_->Update(slice_handler_->TakeAll(), inv, &changed); !s.ok()) {
      slice_handler_->Failed();
      spdlog::error("dra: the device map was not rebuilt (kept as it was): {}", s.ToString());
      return;
    }
  } else {
    const k8s_dra::MapDelta delta = slice_handler_->TakeDelta();
    if (delta.empty()) return;
    if (absl::Status s = map_->Apply(delta, &changed); !s.ok()) {
      // The delta is gone: the next change rebuilds from every slice.
      slice_handler_->Failed();
      spdlog::error("dra: the device map was not updated (kept as it was): {}", s.ToString());
      return;
    }
  }
  // Their rules may be wrong now (a node became lendable, or not).
  if (lender_) lender_->MarkRulesDirty(changed);
  // Said when a node's reason appears or changes, not on every rebuild: a
  // log line and a DuetLendRefused Event on the Node.
  std::map<std::string, std::string> now_refused;
  for (const auto& [node, why] : map_->UnmappableNodes()) {  // lending nodes only
    now_refused[node] = why.reason;
    auto was = refused_.find(node);
    if (was != refused_.end() && was->second == why.reason) continue;
    spdlog::warn("dra: node {} lends nothing: {} ({})", node, why.reason, why.detail);
    if (deps_.events != nullptr) {
      k8s::EventSpec e;
      e.object_kind = "Node";
      e.object_name = node;
      e.reason = "DuetLendRefused";
      e.message = absl::StrCat("duet lends no devices of this node to Kubernetes: ", why.reason,
                               " (", why.detail, ")");
      deps_.events->Record(e);
    }
  }
  refused_ = std::move(now_refused);
}

void DraMode::ReleaseClaims() {
  const absl::Time now = deps_.clock->Now();
  const bool periodic = now - last_sweep_ > absl::Seconds(30);
  ClaimHandler::Work w = claim_handler_->Take(periodic);
  if (w.deleted.empty() && w.check.empty() && !w.sweep) return;
  if (w.sweep) last_sweep_ = now;
  // The claims the ledger holds.
  std::set<std::string> held;
  for (const Holding& h : deps_.ledger->ListHoldings()) {
    if (h.owner.kind == OwnerKind::kClaim) held.insert(h.owner.pod_uid);
  }
  // Deleted, seen deallocated, or (sweep) not allocated in the view: the
  // fence decides (an admission whose write has not reached the informer
  // yet looks the same; the release waits it out and reads the claim).
  std::set<std::string> release;
  for (const std::string& uid : w.deleted) {
    if (held.count(uid)) release.insert(uid);
  }
  for (const std::string& uid : held) {
    if (w.allocated.count(uid)) continue;
    if (w.sweep || w.check.count(uid)) release.insert(uid);
  }
  for (const std::string& uid : release) {
    absl::Status s = lender_->ReleaseClaimIfDeallocated(uid);
    if (!s.ok()) {
      spdlog::warn("dra: giving back claim {}: {}", uid, s.ToString());
      continue;  // a checked claim is tried again; a deleted one by the sweep
    }
    claim_handler_->Done(uid);
  }
  for (const std::string& uid : w.check) {
    if (!held.count(uid)) claim_handler_->Done(uid);
  }
}

void DraMode::ReleaseLoop() {
  // Its own thread: a release waits out its claim's admission grace.
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(200))) return;
    }
    ReleaseClaims();
  }
}

void DraMode::LendDemand() {
  ReapLends(/*all=*/false);
  std::vector<nlohmann::json> pending = pod_handler_->Pending();
  if (pending.empty()) return;
  std::map<std::string, absl::Time>& served = served_;
  const absl::Time now = deps_.clock->Now();
  for (auto it = served.begin(); it != served.end();) {
    it = now - it->second > absl::Minutes(10) ? served.erase(it) : std::next(it);
  }
  k8s_dra::DemandInputs inputs;
  auto items = [this](const std::string& path) {
    std::vector<nlohmann::json> out;
    absl::StatusOr<std::string> body = deps_.kube->Get(path);
    if (!body.ok()) return out;
    nlohmann::json list = nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
    if (list.is_object() && list.contains("items") && list["items"].is_array()) {
      for (nlohmann::json& i : list["items"]) out.push_back(std::move(i));
    }
    return out;
  };
  inputs.device_classes = items(absl::StrCat(kDra, "/deviceclasses"));
  for (const nlohmann::json& pod : pending) {
    const std::string uid = Str(pod, {"metadata", "uid"});
    const std::string ns = Str(pod, {"metadata", "namespace"});
    const std::string name = Str(pod, {"metadata", "name"});
    auto s = served.find(uid);
    if (s != served.end() && now - s->second < kDemandRetry) continue;
    {
      // A pod whose lend is under way is not served again meanwhile.
      absl::MutexLock lock(&lend_mu_);
      if (lending_pods_.count(uid)) continue;
    }
    // The claims and templates the pod names, read now (a claim may have
    // been made or allocated since the pod was seen).
    for (const char* what : {"resourceclaims", "resourceclaimtemplates"}) {
      for (nlohmann::json& o : items(absl::StrCat(kDra, "/namespaces/", ns, "/", what))) {
        const std::string key = absl::StrCat(ns, "/", Str(o, {"metadata", "name"}));
        (std::string(what) == "resourceclaims" ? inputs.claims : inputs.templates)[key] =
            std::move(o);
      }
    }
    absl::StatusOr<std::map<std::string, k8s_dra::DeviceDemand>> demand =
        k8s_dra::PodDemand(pod, inputs, deps_.config->drivers);
    if (!demand.ok()) {
      // Said once per kDemandRetry, not on every pass.
      served[uid] = now;
      spdlog::warn("dra: pod {}/{}: what it asks cannot be read, nothing lent for it: {}", ns,
                   name, demand.status().ToString());
      continue;
    }
    if (gangs_ != nullptr && LendForGang(pod, *demand)) {
      served[uid] = now;
      continue;  // a gang is lent for whole, or not at all
    }
    // A single pod is lent for once kube-scheduler found it unschedulable
    // (a pod kept only for its gang markers is not).
    if (!k8s_dra::UnschedulablePod(pod)) continue;
    for (const auto& [driver, want] : *demand) {
      const DeviceKind kind = driver == kTpuDriver ? DeviceKind::kTpu : DeviceKind::kGpu;
      // TPUs are lent per host; an All request takes a whole node too.
      const bool whole = kind == DeviceKind::kTpu || want.all;
      if (!whole && want.count <= 0) continue;
      served[uid] = now;
      DemandLend l;
      l.pod_uid = uid;
      l.pod = absl::StrCat(ns, "/", name);
      l.kind = kind;
      {
        // The pick, and its devices promised, under lend_mu_: a pick counts
        // the devices of the lends under way as taken (they are, or will be
        // when Slurm answers), so two pods never pick the same free ones.
        absl::MutexLock lock(&lend_mu_);
        auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(lend_mu_) {
          return lends_in_flight_ < kDemandLendsInFlight;
        };
        lend_mu_.Await(absl::Condition(&room));
        // A lending node where the devices fit among the free ones
        // (placement decides, as for every pod). A lend's promise goes only
        // once Lend returned (its devices are in the ledger) and never while
        // this holds lend_mu_: a device counts twice at worst (held and
        // promised), never not at all.
        LedgerSnapshot snap = deps_.ledger->Snapshot();
        std::vector<std::shared_ptr<const NodeView>> nodes;
        // A single pod is lent no host of a multi-host TPU slice: a slice is
        // taken whole, by a gang or by Slurm (docs/gangs.md 5).
        std::string slice_refusal;
        size_t slice_hosts = 0;
        for (const std::shared_ptr<const NodeView>& v : snap.nodes) {
          if (!PoolOf(v->spec.name).empty() && map_->Lendable(v->spec.name, nullptr)) {
            if (kind == DeviceKind::kTpu) {
              if (std::string why = dra::SingleTpuLendRefusal(*v); !why.empty()) {
                if (slice_hosts++ == 0) slice_refusal = std::move(why);
                continue;
              }
            }
            auto p = promised_.find(v->spec.name);
            nodes.push_back(p == promised_.end() ? v : WithPromised(*v, p->second));
          }
        }
        // When nothing is lent for the pod, it is told of the slice hosts
        // left out (the recorder drops a repeat of the same Event).
        auto say_slices = [&] {
          if (slice_hosts == 0) return;
          spdlog::info("dra: pod {}/{} asks a TPU host: none is lent to a single pod on a host "
                       "of a multi-host slice ({})",
                       ns, name, slice_refusal);
          if (deps_.events != nullptr) {
            k8s::EventSpec e;
            e.object_kind = "Pod";
            e.object_namespace = ns;
            e.object_name = name;
            e.object_uid = uid;
            e.reason = "DuetLendRefused";
            e.message = absl::StrCat(
                "duet lends no host of a multi-host TPU slice to a single pod (", slice_hosts,
                " such lending hosts): ", slice_refusal);
            deps_.events->Record(e);
          }
        };
        if (nodes.empty()) {
          say_slices();
          continue;
        }
        placement::PodRequest req;
        req.kind = kind;
        req.count = whole ? 1 : static_cast<uint32_t>(std::min<int64_t>(want.count, 1024));
        std::vector<placement::NodeLoad> loads(nodes.size());
        // Domain packing (docs/gangs.md 4): between lending nodes alike, the
        // one whose clique/sub-block/block is already in use.
        const placement::DomainUsage domains = placement::DomainUsage::Of(nodes);
        placement::Scorer scorer(deps_.policy, nullptr, &domains);
        std::optional<placement::NodeChoice> pick =
            placement::SelectNode(nodes, loads, req, scorer);
        if (!pick) {
          say_slices();
          spdlog::info("dra: pod {}/{} asks {} {} of {}: no lending node has room", ns, name,
                       whole ? "a host of" : absl::StrCat(want.count), DeviceKindName(kind),
                       driver);
          continue;
        }
        const NodeView& node = *nodes[pick->node];
        l.node = node.spec.name;
        l.count = req.count;
        if (whole) {
          l.count = 0;
          for (const DeviceState& d : node.devices) l.count += d.spec.kind == kind ? 1 : 0;
        }
        promised_[l.node][kind] += l.count;
        ++lends_in_flight_;
        ++lending_pods_[uid];
      }
      // Its own thread: up to kDemandLendsInFlight lends at once, and the
      // loop goes on (the next pass may start more).
      lends_.push_back(std::async(std::launch::async, [this, l] { RunLend(l); }));
    }
  }
}

bool DraMode::LendForGang(const nlohmann::json& pod,
                          const std::map<std::string, k8s_dra::DeviceDemand>& demand) {
  if (!GangMarked(pod)) return false;
  const gang::MemberRef member{Str(pod, {"metadata", "uid"}), Str(pod, {"metadata", "namespace"}),
                               Str(pod, {"metadata", "name"})};
  absl::StatusOr<std::optional<gang::GangSpec>> spec = deps_.gang_of(pod);
  if (!spec.ok()) {
    // Its gang cannot be read: nothing is lent for it (not even alone).
    spdlog::warn("dra: pod {}/{}: its gang cannot be read, nothing lent: {}", member.ns,
                 member.name, spec.status().ToString());
    return true;
  }
  if (!spec->has_value()) return false;
  // What each member asks of the lent drivers: whole GPUs, or every chip
  // of one host of a multi-host TPU slice (a gang's one Slurm job asks the
  // same GRES on every node). Kubernetes places the pods' CPUs and memory;
  // the gang job asks none of them.
  uint32_t gpus = 0;
  const k8s_dra::DeviceDemand* tpus = nullptr;
  for (const auto& [driver, want] : demand) {
    if (driver == kTpuDriver) {
      tpus = &want;
      continue;
    }
    if (want.all) {
      spdlog::warn("dra: pod {}/{} of gang {} asks whole GPU hosts; gangs are lent whole GPUs "
                   "or TPU slices, it is lent for alone",
                   member.ns, member.name, (*spec)->key.ToString());
      return false;
    }
    gpus += static_cast<uint32_t>(std::clamp<int64_t>(want.count, 0, 1024));
  }
  gang::GangSpec& s = **spec;
  if (tpus != nullptr) {
    if (gpus > 0) {
      spdlog::warn("dra: pod {}/{} of gang {} asks TPUs and GPUs; it is lent for alone",
                   member.ns, member.name, s.key.ToString());
      return false;
    }
    // A TPU gang takes one multi-host slice whole (docs/gangs.md 5): every
    // chip of every host of one free slice pool of the lending nodes.
    absl::StatusOr<placement::PodRequest> m = dra::TpuGangMember(
        deps_.ledger->Snapshot(), s, tpus->count, tpus->all, [this](const std::string& node) {
          return !PoolOf(node).empty() && map_->Lendable(node, nullptr);
        });
    if (absl::IsFailedPrecondition(m.status())) {
      // No slice selected: its pods are lent for one by one, never a
      // slice's host (LendDemand's single-pod rule).
      spdlog::warn("dra: pod {}/{}: {}; it is lent for alone (a single-host TPU node, never a "
                   "slice's host)",
                   member.ns, member.name, std::string(m.status().message()));
      return false;
    }
    if (!m.ok()) {
      // Nothing is reserved, nothing lent for alone.
      const std::string why = absl::StrCat("GANG_NO_ROOM: gang ", s.key.ToString(), " of ",
                                           s.min_member, " members: ", m.status().message());
      spdlog::info("dra: pod {}/{}: {}", member.ns, member.name, why);
      if (deps_.events != nullptr) {
        k8s::EventSpec e;
        e.object_kind = "Pod";
        e.object_namespace = member.ns;
        e.object_name = member.name;
        e.object_uid = member.uid;
        e.reason = "DuetGangUnplaceable";
        e.message = absl::StrCat("duet: ", why);
        deps_.events->Record(e);
      }
      return true;
    }
    s.member = *m;
  } else {
    if (gpus == 0) return false;
    s.member = placement::PodRequest{};
    s.member.kind = DeviceKind::kGpu;
    s.member.count = gpus;
  }
  const gang::Admission a = gangs_->Lend(s, member);
  if (a.kind == gang::Admission::kReady || a.kind == gang::Admission::kWaiting) {
    spdlog::debug("dra: pod {}/{}: gang {}: {}", member.ns, member.name, s.key.ToString(),
                  a.reason.empty() ? "lent" : a.reason);
  } else {
    spdlog::info("dra: pod {}/{}: gang {}: {}", member.ns, member.name, s.key.ToString(), a.reason);
  }
  return true;
}

void DraMode::RunLend(const DemandLend& l) {
  absl::StatusOr<std::vector<dra::LedgerDevice>> lent = lender_->Lend(l.node, l.kind, l.count);
  if (!lent.ok()) {
    spdlog::warn("dra: lending {} {} on {} for pod {}: {}", l.count, DeviceKindName(l.kind),
                 l.node, l.pod, lent.status().ToString());
  } else {
    spdlog::info("dra: lent {} {} on {} for pod {}", lent->size(), DeviceKindName(l.kind), l.node,
                 l.pod);
  }
  // The ledger has what it lent by now (or it lent nothing): the promise
  // goes.
  absl::MutexLock lock(&lend_mu_);
  auto p = promised_.find(l.node);
  if (p != promised_.end()) {
    uint32_t& n = p->second[l.kind];
    n -= std::min(n, l.count);
    if (n == 0) p->second.erase(l.kind);
    if (p->second.empty()) promised_.erase(p);
  }
  --lends_in_flight_;
  auto pod = lending_pods_.find(l.pod_uid);
  if (pod != lending_pods_.end() && --pod->second <= 0) lending_pods_.erase(pod);
}

void DraMode::ReapLends(bool all) {
  for (auto it = lends_.begin(); it != lends_.end();) {
    if (all) it->wait();
    const bool done = it->wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    it = done ? lends_.erase(it) : std::next(it);
  }
}

void DraMode::TickLoop() {
  // Its own thread: a reclaim waits out the admission grace.
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Seconds(1))) return;
    }
    if (gangs_ != nullptr) gangs_->Prune();
    if (absl::Status s = lender_->Tick(); !s.ok()) {
      spdlog::debug("dra: warm buffer / reclaim pass: {}", s.ToString());
    }
  }
}

void DraMode::Loop() {
  absl::Time last_resync = deps_.clock->Now();
  absl::Time last_warn = absl::InfinitePast();
  for (;;) {
    {
      // Every 200 ms (of deps_.clock, as the pass's own decisions), or at
      // once when a pod became pending for devices.
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || wake_; };
      deps_.clock->AwaitWithTimeout(&mu_, absl::Condition(&ready), absl::Milliseconds(200));
      if (stopping_) return;
      wake_ = false;
    }
    const absl::Time now = deps_.clock->Now();
    // Slices at once; the ledger's inventory (a walk of every node) only
    // when the ledger said a node was added, changed or removed.
    RebuildMap(/*force=*/false, inventory_listener_->Take());
    LendDemand();
    // The rules: the dirty nodes' (nothing when none is), or a full pass
    // when one is due; a full pass every kFullRuleResync regardless.
    absl::Status s;
    if (now - last_resync >= dra::kFullRuleResync) {
      last_resync = now;
      s = lender_->Resync();
    } else {
      s = lender_->ReconcileRules();
    }
    if (!s.ok() && now - last_warn >= absl::Seconds(30)) {
      // A failing pass is retried each 200 ms; said at most every 30 s.
      last_warn = now;
      spdlog::warn("dra: DeviceTaintRule reconcile: {}", s.ToString());
    }
  }
}

}  // namespace duet
