#include "k8s_adapter/dra/demand.h"

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "k8s_adapter/common/quantity.h"

namespace duet {
namespace k8s_dra {

namespace {

using json = nlohmann::json;
constexpr char kExtendedClassPrefix[] = "deviceclass.resource.kubernetes.io/";

const json& Get(const json& j, const char* key) {
  static const json* null = new json();
  if (!j.is_object()) return *null;
  auto it = j.find(key);
  return it == j.end() ? *null : *it;
}

std::string Str(const json& j, const char* key) {
  const json& v = Get(j, key);
  return v.is_string() ? v.get<std::string>() : "";
}

// The lending driver a DeviceClass selects ("" when none).
std::string ClassDriver(const json& cls, const std::set<std::string>& lending) {
  const json& selectors = Get(Get(cls, "spec"), "selectors");
  if (!selectors.is_array()) return "";
  for (const json& s : selectors) {
    const std::string expr = Str(Get(s, "cel"), "expression");
    for (absl::string_view term : absl::StrSplit(expr, "&&")) {
      term = absl::StripAsciiWhitespace(term);
      for (const std::string& d : lending) {
        if (term == absl::StrCat("device.driver == \"", d, "\"") ||
            term == absl::StrCat("device.driver == '", d, "'")) {
          return d;
        }
      }
    }
  }
  return "";
}

// A claim's (or template's inner) spec.devices.requests into `out`.
absl::Status CountRequests(const json& spec, const std::string& where,
                           const std::map<std::string, std::string>& class_driver,
                           std::map<std::string, DeviceDemand>* out) {
  const json& requests = Get(Get(spec, "devices"), "requests");
  if (requests.is_null()) return absl::OkStatus();
  if (!requests.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".devices.requests: must be a list"));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const json& exactly = Get(requests[i], "exactly");
    if (!exactly.is_object()) continue;  // firstAvailable: chosen at allocation
    auto driver = class_driver.find(Str(exactly, "deviceClassName"));
    if (driver == class_driver.end()) continue;
    const std::string mode = Str(exactly, "allocationMode");
    DeviceDemand& d = (*out)[driver->second];
    if (mode == "All") {
      d.all = true;
    } else if (mode.empty() || mode == "ExactCount") {
      const json& count = Get(exactly, "count");
      if (!count.is_null() && (!count.is_number_integer() || count.get<int64_t>() < 1)) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ".devices.requests[", i, "].exactly.count: must be a whole number >= 1"));
      }
      d.count += count.is_null() ? 1 : count.get<int64_t>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".devices.requests[", i, "].exactly.allocationMode: unknown \"", mode, "\""));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool UnschedulablePod(const json& pod) {
  if (!Str(Get(pod, "spec"), "nodeName").empty()) return false;
  const json& conditions = Get(Get(pod, "status"), "conditions");
  if (!conditions.is_array()) return false;
  for (const json& c : conditions) {
    if (Str(c, "type") == "PodScheduled") {
      return Str(c, "status") == "False" && Str(c, "reason") == "Unschedulable";
    }
  }
  return false;
}

absl::StatusOr<std::map<std::string, DeviceDemand>> PodDemand(
    const json& pod, const DemandInputs& inputs, const std::vector<std::string>& lending_drivers) {
  const std::set<std::string> lending(lending_drivers.begin(), lending_drivers.end());
  const std::string ns = Str(Get(pod, "metadata"), "namespace");
  const std::string pod_name = Str(Get(pod, "metadata"), "name");
  // Class name -> its lending driver.
  std::map<std::string, std::string> class_driver;
  for (const json& cls : inputs.device_classes) {
    const std::string driver = ClassDriver(cls, lending);
    if (!driver.empty()) class_driver[Str(Get(cls, "metadata"), "name")] = driver;
  }
  std::map<std::string, DeviceDemand> out;

  // Claims.
  std::map<std::string, std::string> generated;  // pod claim name -> claim
  const json& statuses = Get(Get(pod, "status"), "resourceClaimStatuses");
  if (statuses.is_array()) {
    for (const json& s : statuses) generated[Str(s, "name")] = Str(s, "resourceClaimName");
  }
  const json& pod_claims = Get(Get(pod, "spec"), "resourceClaims");
  if (!pod_claims.is_null() && !pod_claims.is_array()) {
    return absl::InvalidArgumentError("spec.resourceClaims: must be a list");
  }
  for (size_t i = 0; pod_claims.is_array() && i < pod_claims.size(); ++i) {
    const json& pc = pod_claims[i];
    const std::string where = absl::StrCat("pods/", pod_name, " spec.resourceClaims[", i, "]");
    std::string claim_name = Str(pc, "resourceClaimName");
    const std::string tmpl_name = Str(pc, "resourceClaimTemplateName");
    if (claim_name.empty() && !tmpl_name.empty()) {
      auto g = generated.find(Str(pc, "name"));
      if (g != generated.end() && !g->second.empty()) claim_name = g->second;
    }
    if (!claim_name.empty()) {
      auto c = inputs.claims.find(absl::StrCat(ns, "/", claim_name));
      if (c == inputs.claims.end()) {
        return absl::NotFoundError(absl::StrCat(where, ": ResourceClaim ", ns, "/", claim_name,
                                                " not found"));
      }
      if (!Get(Get(c->second, "status"), "allocation").is_null()) continue;  // has its devices
      if (absl::Status s = CountRequests(Get(c->second, "spec"),
                                         absl::StrCat("ResourceClaim ", ns, "/", claim_name, " spec"),
                                         class_driver, &out);
          !s.ok()) {
        return s;
      }
    } else if (!tmpl_name.empty()) {
      auto t = inputs.templates.find(absl::StrCat(ns, "/", tmpl_name));
      if (t == inputs.templates.end()) {
        return absl::NotFoundError(absl::StrCat(where, ": ResourceClaimTemplate ", ns, "/",
                                                tmpl_name, " not found"));
      }
      if (absl::Status s = CountRequests(
              Get(Get(t->second, "spec"), "spec"),
              absl::StrCat("ResourceClaimTemplate ", ns, "/", tmpl_name, " spec.spec"),
              class_driver, &out);
          !s.ok()) {
        return s;
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": needs resourceClaimName or resourceClaimTemplateName"));
    }
  }

  // Extended resources (KEP-5004), unless their claim is made already.
  if (!Get(Get(pod, "status"), "extendedResourceClaimStatus").is_null()) return out;
  // extendedResourceName -> class: the newest class wins, ties to the first name.
  std::map<std::string, const json*> by_resource;
  for (const json& cls : inputs.device_classes) {
    const std::string res = Str(Get(cls, "spec"), "extendedResourceName");
    if (res.empty()) continue;
    const json*& best = by_resource[res];
    auto key = [](const json* c) {
      return std::make_pair(Str(Get(*c, "metadata"), "creationTimestamp"),
                            Str(Get(*c, "metadata"), "name"));
    };
    if (best == nullptr || key(&cls).first > key(best).first ||
        (key(&cls).first == key(best).first && key(&cls).second < key(best).second)) {
      best = &cls;
    }
  }
  const json& containers = Get(Get(pod, "spec"), "containers");
  for (size_t ci = 0; containers.is_array() && ci < containers.size(); ++ci) {
    const json& res = Get(containers[ci], "resources");
    std::map<std::string, json> asked;
    for (const char* part : {"limits", "requests"}) {  // requests override limits
      const json& m = Get(res, part);
      if (!m.is_object()) continue;
      for (auto it = m.begin(); it != m.end(); ++it) asked[it.key()] = it.value();
    }
    for (const auto& [name, qty] : asked) {
      std::string cls_name;
      if (absl::StartsWith(name, kExtendedClassPrefix)) {
        cls_name = name.substr(sizeof(kExtendedClassPrefix) - 1);
      } else if (auto b = by_resource.find(name); b != by_resource.end()) {
        cls_name = Str(Get(*b->second, "metadata"), "name");
      }
      auto driver = class_driver.find(cls_name);
      if (cls_name.empty() || driver == class_driver.end()) continue;
      const std::string where =
          absl::StrCat("pods/", pod_name, " spec.containers[", ci, "].resources: ", name);
      // The API server stores quantities as strings; a client may still
      // send a JSON integer (kubectl does), which means the same count.
      absl::StatusOr<int64_t> milli =
          qty.is_string()            ? k8s::ParseQuantityMilli(qty.get<std::string>())
          : qty.is_number_integer()  ? absl::StatusOr<int64_t>(qty.get<int64_t>() * 1000)
                                     : absl::InvalidArgumentError("not a quantity");
      if (!milli.ok() || *milli % 1000 != 0 || *milli < 0) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": ", qty.dump(),
                                                       " is not a whole number of devices"));
      }
      if (*milli > 0) out[driver->second].count += *milli / 1000;
    }
  }
  return out;
}

}  // namespace k8s_dra
}  // namespace duet
