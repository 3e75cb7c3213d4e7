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
    return absl::OkStatus();
  }
  if (!absl::IsAlreadyExists(r.status())) return r.status();
  // There already: fine when it is this device's rule.
  const std::string name = rule["metadata"]["name"];
  absl::StatusOr<std::string> got = kube_->Get(absl::StrCat(Collection(), "/", name));
  if (!got.ok()) return got.status();
  absl::StatusOr<json> existing = ParseJson(*got, absl::StrCat("DeviceTaintRule ", name));
  if (!existing.ok()) return existing.status();
  if (SelectedDevice(*existing) != device) {
    return absl::AlreadyExistsError(absl::StrCat(
        "DeviceTaintRule ", name, " exists but selects \"", SelectedDevice(*existing).ToString(),
        "\", not \"", device.ToString(), "\""));
  }
  return absl::OkStatus();
}

absl::Status TaintRules::Remove(const std::string& name) {
  absl::StatusOr<std::string> r = kube_->Delete(absl::StrCat(Collection(), "/", name));
  if (absl::IsNotFound(r.status())) return absl::OkStatus();
  if (!r.ok()) return r.status();
  ++deletes_;
  if (delete_counter_ != nullptr) delete_counter_->Increment();
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

absl::Status TaintRules::Resync(const std::vector<dra::DraDevice>& tainted) {
  if (absl::Status s = CheckDevices(tainted); !s.ok()) return s;
  std::map<std::string, dra::DraDevice> want;
  for (const dra::DraDevice& d : tainted) want.emplace(RuleName(d), d);
  // duet's rules as they are (paged).
  std::map<std::string, json> have;
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
      for (json& item : (*list)["items"]) {
        const std::string name = item.value("/metadata/name"_json_pointer, "");
        if (!name.empty()) have.emplace(name, std::move(item));
      }
    }
    cont = list->value("/metadata/continue"_json_pointer, "");
  } while (!cont.empty());

  for (const auto& [name, rule] : have) {
    auto w = want.find(name);
    bool keep = false;
    if (w != want.end()) {
      const json& taint = rule.contains("spec") ? rule["spec"].value("taint", json()) : json();
      keep = SelectedDevice(rule) == w->second && taint.is_object() &&
             taint.value("key", "") == options_.taint_key &&
             taint.value("effect", "") == "NoSchedule" && taint.value("value", "").empty();
    }
    if (keep) {
      want.erase(w);
    } else if (absl::Status s = Remove(name); !s.ok()) {
      return s;
    }
  }
  for (const auto& [_, d] : want) {
    if (absl::Status s = Create(d); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace k8s_dra
}  // namespace duet
