#include "k8s_adapter/dra/taint_rules.h"

#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "openssl/sha.h"

namespace duet {
namespace k8s_dra {

namespace {

using json = nlohmann::json;
constexpr char kGroup[] = "/apis/resource.k8s.io";
constexpr size_t kMaxName = 253;

absl::StatusOr<json> ParseJson(const std::string& body, const std::string& what) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InternalError(absl::StrCat(what, ": the API server's answer is not a JSON object"));
  }
  return j;
}

// Whether resource.k8s.io/<version> lists devicetaintrules (false when the
// version is not served).
absl::StatusOr<bool> Serves(k8s::KubeClient* kube, const std::string& version) {
  absl::StatusOr<std::string> body = kube->Get(absl::StrCat(kGroup, "/", version));
  if (absl::IsNotFound(body.status())) return false;
  if (!body.ok()) return body.status();
  absl::StatusOr<json> list = ParseJson(*body, absl::StrCat("resource.k8s.io/", version));
  if (!list.ok()) return list.status();
  auto resources = list->find("resources");
  if (resources == list->end() || !resources->is_array()) return false;
  for (const json& r : *resources) {
    if (r.is_object() && r.value("name", "") == "devicetaintrules") return true;
  }
  return false;
}

std::string Selector(const json& rule, const char* field) {
  const json* sel = nullptr;
  if (rule.contains("spec") && rule["spec"].is_object() && rule["spec"].contains("deviceSelector")) {
    sel = &rule["spec"]["deviceSelector"];
  }
  if (sel == nullptr || !sel->is_object()) return "";
  auto it = sel->find(field);
  return it != sel->end() && it->is_string() ? it->get<std::string>() : "";
}

dra::DraDevice SelectedDevice(const json& rule) {
  return dra::DraDevice{Selector(rule, "driver"), Selector(rule, "pool"), Selector(rule, "device")};
}

absl::Status CheckDevices(const std::vector<dra::DraDevice>& devices) {
  for (const dra::DraDevice& d : devices) {
    if (d.driver.empty() || d.pool.empty() || d.device.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DeviceTaintRule for \"", d.ToString(),
          "\": driver, pool and device must all be set (a rule with an empty selector field "
          "taints more than one device); nothing was written"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> DetectRuleApi(k8s::KubeClient* kube) {
  for (const char* version : {"v1", "v1beta2"}) {
    absl::StatusOr<bool> serves = Serves(kube, version);
    if (!serves.ok()) return serves.status();
    if (*serves) return std::string(version);
  }
  return absl::FailedPreconditionError(
      "the API server serves no resource.k8s.io devicetaintrules at v1 or v1beta2: the DRA "
      "lending mode needs DeviceTaintRules (Kubernetes 1.37+, or 1.36 with the DRADeviceTaints "
      "and DRADeviceTaintRules feature gates on and the resource.k8s.io/v1beta2 API enabled)");
}

TaintRules::TaintRules(k8s::KubeClient* kube, TaintRulesOptions options)
    : kube_(kube), options_(std::move(options)) {
  if (options_.registry != nullptr) {
    auto& family = prometheus::BuildCounter()
                       .Name("duet_dra_rule_writes_total")
                       .Help("DeviceTaintRule writes duet made that succeeded, by op: create, delete")
                       .Register(*options_.registry);
    create_counter_ = &family.Add({{"op", "create"}});
    delete_counter_ = &family.Add({{"op", "delete"}});
  }
}

// The informer's handler: feeds the cache, reports drift.
class TaintRules::Watcher final : public k8s::InformerHandler {
 public:
  explicit Watcher(TaintRules* rules) : rules_(rules) {}
  void OnUpsert(const json& object) override {
    const std::string name = object.value("/metadata/name"_json_pointer, "");
    if (name.empty()) return;
    const Cached c = rules_->Parse(object);
    std::vector<dra::DraDevice> drift;
    {
      absl::MutexLock lock(&rules_->cache_mu_);
      auto it = rules_->cache_.find(name);
      if (it != rules_->cache_.end() && !it->second.uid.empty() && !c.uid.empty() &&
          it->second.uid != c.uid) {
        return;  // an older rule of that name
      }
      if (it != rules_->cache_.end() && it->second == c) {
        it->second.uid = c.uid;
        return;  // as duet's write left it
      }
      if (it != rules_->cache_.end() && it->second.device != c.device) {
        drift.push_back(it->second.device);
      }
      drift.push_back(c.device);
      rules_->CachePutLocked(name, c);
      // The first list: OnRulesRelisted covers everything at once.
      if (!rules_->cache_valid_) return;
    }
    rules_->ReportDrift(drift, false);
  }
  void OnDelete(const std::string& key, const json* last) override {
    dra::DraDevice was;
    const std::string uid = last != nullptr ? last->value("/metadata/uid"_json_pointer, "") : "";
    {
      absl::MutexLock lock(&rules_->cache_mu_);
      auto it = rules_->cache_.find(key);
      if (it == rules_->cache_.end()) return;  // duet deleted it (or never saw it)
      if (!uid.empty() && !it->second.uid.empty() && uid != it->second.uid) {
        return;  // an older rule of that name; duet made this one since
      }
      was = it->second.device;
      rules_->CacheEraseLocked(key);
      if (!rules_->cache_valid_) return;
    }
    rules_->ReportDrift({was}, false);
  }
  void OnSynced() override {
    {
      absl::MutexLock lock(&rules_->cache_mu_);
      rules_->cache_valid_ = true;
    }
    rules_->ReportDrift({}, true);
  }

 private:
  TaintRules* const rules_;
};

TaintRules::~TaintRules() { StopWatch(); }

absl::Status TaintRules::StartWatch() {
  if (informer_ != nullptr) return absl::FailedPreconditionError("TaintRules: already watching");
  k8s::InformerOptions o;
  o.path = Collection();
  o.label_selector = absl::StrCat(kManagedByLabel, "=", kManagedByValue);
  watcher_ = std::make_unique<Watcher>(this);
  {
    // From the first list on, the cache is the watch's (Resync lists no more).
    absl::MutexLock lock(&cache_mu_);
    watching_ = true;
  }
  informer_ = std::make_unique<k8s::Informer>(kube_, o, watcher_.get());
  if (absl::Status s = informer_->Start(); !s.ok()) {
    informer_.reset();
    absl::MutexLock lock(&cache_mu_);
    watching_ = false;
    return s;
  }
  return absl::OkStatus();
}

void TaintRules::StopWatch() {
  if (informer_ != nullptr) informer_->Stop();
}

void TaintRules::SetDriftListener(dra::RuleDriftListener* listener) {
  absl::MutexLock lock(&listener_mu_);
  listener_ = listener;
}

void TaintRules::ReportDrift(const std::vector<dra::DraDevice>& devices, bool relisted) {
  absl::MutexLock lock(&listener_mu_);
  if (listener_ == nullptr) return;
  for (const dra::DraDevice& d : devices) listener_->OnRuleDrift(d);
  if (relisted) listener_->OnRulesRelisted();
}

size_t TaintRules::cached() const {
  absl::MutexLock lock(&cache_mu_);
  return cache_.size();
}

void TaintRules::CachePutLocked(const std::string& name, const Cached& c) {
  CacheEraseLocked(name);
  cache_[name] = c;
  by_pool_[c.device.pool].insert(name);
}

void TaintRules::CacheEraseLocked(const std::string& name) {
  auto it = cache_.find(name);
  if (it == cache_.end()) return;
  auto p = by_pool_.find(it->second.device.pool);
  if (p != by_pool_.end()) {
    p->second.erase(name);
    if (p->second.empty()) by_pool_.erase(p);
  }
  cache_.erase(it);
}

TaintRules::Cached TaintRules::Parse(const json& rule) const {
  Cached c;
  c.device = SelectedDevice(rule);
  const json taint = rule.contains("spec") && rule["spec"].is_object()
                         ? rule["spec"].value("taint", json())
                         : json();
  c.uid = rule.value("/metadata/uid"_json_pointer, "");
  c.exact = !c.device.driver.empty() && !c.device.pool.empty() && !c.device.device.empty() &&
            taint.is_object() && taint.value("key", "") == options_.taint_key &&
            taint.value("effect", "") == "NoSchedule" && taint.value("value", "").empty();
  return c;
}

std::string TaintRules::RuleName(const dra::DraDevice& device) {
  const std::string raw = absl::StrCat("duet-", device.pool, "-", device.device);
  std::string name;
  name.reserve(raw.size());
  for (char c : raw) {
    const char l = absl::ascii_tolower(static_cast<unsigned char>(c));
    name.push_back(absl::ascii_isalnum(static_cast<unsigned char>(l)) || l == '-' ? l : '-');
  }
  while (!name.empty() && name.back() == '-') name.pop_back();
  if (name == raw && name.size() <= kMaxName) return name;
  // Changed or too long: a suffix from the exact device keeps it unique.
  const std::string key = device.ToString();
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), digest);
  const std::string suffix =
      absl::StrCat("-", absl::BytesToHexString(absl::string_view(
                            reinterpret_cast<const char*>(digest), SHA256_DIGEST_LENGTH))
                            .substr(0, 10));
  if (name.size() > kMaxName - suffix.size()) name.resize(kMaxName - suffix.size());
  while (!name.empty() && name.back() == '-') name.pop_back();
  return name + suffix;
}

json TaintRules::RuleObject(const dra::DraDevice& device) const {
  return json{
      {"apiVersion", absl::StrCat("resource.k8s.io/", options_.api_version)},
      {"kind", "DeviceTaintRule"},
      {"metadata", {{"name", RuleName(device)}, {"labels", {{kManagedByLabel, kManagedByValue}}}}},
      {"spec",
       {{"deviceSelector",
         {{"driver", device.driver}, {"pool", device.pool}, {"device", device.device}}},
        {"taint", {{"key", options_.taint_key}, {"value", ""}, {"effect", "NoSchedule"}}}}}};
}

std::string TaintRules::Collection() const {
  return absl::StrCat(kGroup, "/", options_.api_version, "/devicetaintrules");
}

absl::Status TaintRules::Create(const dra::DraDevice& device) {
  const json rule = RuleObject(device);
  absl::StatusOr<std::string> r = kube_->Post(Collection(), rule.dump());
  if (r.ok()) {
    ++creates_;
    if (create_counter_ != nullptr) create_counter_->Increment();
    json made = json::parse(*r, nullptr, /*allow_exceptions=*/false);
    Cached c{device, true, ""};
    if (made.is_object()) c.uid = made.value("/metadata/uid"_json_pointer, "");
    absl::MutexLock lock(&cache_mu_);
    CachePutLocked(rule["metadata"]["name"], c);
    return absl::OkStatus();
  }
  if (!absl::IsAlreadyExists(r.status())) return r.status();
  // There already: fine when it is this device's rule.
  const std::string name = rule["metadata"]["name"];
  absl::StatusOr<std::string> got = kube_->Get(absl::StrCat(Collection(), "/", name));
  if (!got.ok()) return got.status();
  absl::StatusOr<json> existing = ParseJson(*got, absl::StrCat("DeviceTaintRule ", name));
  if (!existing.ok()) return existing.status();
  const Cached c = Parse(*existing);
  {
    absl::MutexLock lock(&cache_mu_);
    if (existing->value("/metadata/labels"_json_pointer, json::object())
            .value(kManagedByLabel, "") == kManagedByValue) {
      CachePutLocked(name, c);
    }
  }
  if (c.device != device) {
    return absl::AlreadyExistsError(absl::StrCat(
        "DeviceTaintRule ", name, " exists but selects \"", c.device.ToString(),
        "\", not \"", device.ToString(), "\""));
  }
  return absl::OkStatus();
}

absl::Status TaintRules::Remove(const std::string& name) {
  absl::StatusOr<std::string> r = kube_->Delete(absl::StrCat(Collection(), "/", name));
  if (!r.ok() && !absl::IsNotFound(r.status())) return r.status();
  if (r.ok()) {
    ++deletes_;
    if (delete_counter_ != nullptr) delete_counter_->Increment();
  }
  absl::MutexLock lock(&cache_mu_);
  CacheEraseLocked(name);
  return absl::OkStatus();
}

absl::Status TaintRules::Taint(const std::vector<dra::DraDevice>& devices) {
  if (absl::Status s = CheckDevices(devices); !s.ok()) return s;
  for (const dra::DraDevice& d : devices) {
    if (absl::Status s = Create(d); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status TaintRules::Untaint(const std::vector<dra::DraDevice>& devices) {
  if (absl::Status s = CheckDevices(devices); !s.ok()) return s;
  for (const dra::DraDevice& d : devices) {
    if (absl::Status s = Remove(RuleName(d)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status TaintRules::Converge(const std::map<std::string, Cached>& have,
                                  std::map<std::string, dra::DraDevice> want) {
  for (const auto& [name, rule] : have) {
    auto w = want.find(name);
    if (w != want.end() && rule.exact && rule.device == w->second) {
      want.erase(w);
    } else if (absl::Status s = Remove(name); !s.ok()) {
      return s;
    }
  }
  for (const auto& [name, d] : want) {
    bool elsewhere = false;
    {
      // The name may be held by a rule of another pool's device (the cache
      // has it under that pool): out of the way first.
      absl::MutexLock lock(&cache_mu_);
      auto it = cache_.find(name);
      elsewhere = it != cache_.end() && it->second.device != d;
    }
    if (elsewhere) {
      if (absl::Status s = Remove(name); !s.ok()) return s;
    }
    if (absl::Status s = Create(d); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status TaintRules::Resync(const std::vector<dra::DraDevice>& tainted) {
  if (absl::Status s = CheckDevices(tainted); !s.ok()) return s;
  std::map<std::string, dra::DraDevice> want;
  for (const dra::DraDevice& d : tainted) want.emplace(RuleName(d), d);
  std::map<std::string, Cached> have;
  bool watching = false;
  {
    absl::MutexLock lock(&cache_mu_);
    watching = watching_;
    if (watching) have = cache_;
  }
  if (!watching) {
    // duet's rules as they are (paged).
    std::string cont;
    do {
      std::string path = absl::StrCat(Collection(), "?labelSelector=",
                                       k8s::QueryEscape(absl::StrCat(kManagedByLabel, "=",
                                                                     kManagedByValue)),
                                       "&limit=500");
      if (!cont.empty()) absl::StrAppend(&path, "&continue=", k8s::QueryEscape(cont));
      absl::StatusOr<std::string> body = kube_->Get(path);
      if (!body.ok()) return body.status();
      absl::StatusOr<json> list = ParseJson(*body, "DeviceTaintRule list");
      if (!list.ok()) return list.status();
      if (list->contains("items") && (*list)["items"].is_array()) {
        for (const json& item : (*list)["items"]) {
          const std::string name = item.value("/metadata/name"_json_pointer, "");
          if (!name.empty()) have.emplace(name, Parse(item));
        }
      }
      cont = list->value("/metadata/continue"_json_pointer, "");
    } while (!cont.empty());
    ++lists_;
    absl::MutexLock lock(&cache_mu_);
    cache_.clear();
    by_pool_.clear();
    for (const auto& [name, c] : have) CachePutLocked(name, c);
    cache_valid_ = true;
  }
  return Converge(have, std::move(want));
}

absl::Status TaintRules::ResyncPool(const std::string& pool,
                                    const std::vector<dra::DraDevice>& tainted) {
  if (absl::Status s = CheckDevices(tainted); !s.ok()) return s;
  std::map<std::string, dra::DraDevice> want;
  for (const dra::DraDevice& d : tainted) {
    if (d.pool != pool) {
      return absl::InvalidArgumentError(absl::StrCat("ResyncPool(\"", pool, "\"): device \"",
                                                     d.ToString(),
                                                     "\" is of another pool; nothing was written"));
    }
    want.emplace(RuleName(d), d);
  }
  std::map<std::string, Cached> have;
  {
    absl::MutexLock lock(&cache_mu_);
    if (!cache_valid_) {
      return absl::FailedPreconditionError(
          "ResyncPool: no view of duet's DeviceTaintRules yet (no watch started, no Resync)");
    }
    auto p = by_pool_.find(pool);
    if (p != by_pool_.end()) {
      for (const std::string& name : p->second) have.emplace(name, cache_.at(name));
    }
  }
  return Converge(have, std::move(want));
}

}  // namespace k8s_dra
}  // namespace duet
