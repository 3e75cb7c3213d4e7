#include "k8s_adapter/common/pod_request.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "k8s_adapter/common/quantity.h"

namespace duet {
namespace k8s {
namespace {

using nlohmann::json;

absl::Status Invalid(absl::string_view where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

// `into[r] += from[r]` for every r; INVALID_ARGUMENT when a sum overflows.
absl::Status AddInto(const ResourceList& from, ResourceList* into, absl::string_view where) {
  for (const auto& [name, amount] : from) {
    int64_t& sum = (*into)[name];
    if (__builtin_add_overflow(sum, amount, &sum))
      return Invalid(where, absl::StrCat(name, ": sum out of range"));
  }
  return absl::OkStatus();
}

// `into[r] = max(into[r], from[r])` for every r.
void MaxInto(const ResourceList& from, ResourceList* into) {
  for (const auto& [name, amount] : from) {
    int64_t& m = (*into)[name];
    m = std::max(m, amount);
  }
}

// A resource list (requests, limits, overhead); empty when absent or null.
absl::StatusOr<ResourceList> ReadList(const json* list, absl::string_view where) {
  ResourceList out;
  if (list == nullptr || list->is_null()) return out;
  if (!list->is_object()) return Invalid(where, "not an object");
  for (auto it = list->begin(); it != list->end(); ++it) {
    absl::StatusOr<int64_t> q = QuantityMilli(it.value(), absl::StrCat(where, "[", it.key(), "]"));
    if (!q.ok()) return q.status();
    out[it.key()] = *q;
  }
  return out;
}

}  // namespace

int64_t Amount(const ResourceList& list, absl::string_view name) {
  auto it = list.find(name);
  return it == list.end() ? 0 : it->second;
}

bool IsExtendedResource(absl::string_view name) {
  const size_t slash = name.find('/');
  if (slash == absl::string_view::npos) return false;  // cpu, memory, hugepages-2Mi, ...
  const absl::string_view domain = name.substr(0, slash);
  return domain != "kubernetes.io" && !absl::EndsWith(domain, ".kubernetes.io");
}

absl::StatusOr<int64_t> QuantityMilli(const json& value, absl::string_view where) {
  std::string text;
  if (value.is_string()) {
    text = value.get<std::string>();
  } else if (value.is_number()) {
    text = value.dump();  // 2 -> "2", 1.5 -> "1.5", 1e3 -> "1000.0"
  } else {
    return Invalid(where, "not a quantity (want a string such as \"500m\")");
  }
  absl::StatusOr<int64_t> q = ParseQuantityMilli(text);
  if (!q.ok()) return Invalid(where, q.status().message());
  if (*q < 0) return Invalid(where, absl::StrCat("\"", text, "\": negative"));
  return q;
}

absl::StatusOr<ResourceList> ContainerRequest(const json& container, absl::string_view where) {
  if (!container.is_object()) return Invalid(where, "not an object");
  const json* resources = Field(container, "resources");
  if (resources == nullptr || resources->is_null()) return ResourceList();
  const std::string at = absl::StrCat(where, ".resources");
  if (!resources->is_object()) return Invalid(at, "not an object");
  absl::StatusOr<ResourceList> requests = ReadList(Field(*resources, "requests"), at + ".requests");
  if (!requests.ok()) return requests.status();
  absl::StatusOr<ResourceList> limits = ReadList(Field(*resources, "limits"), at + ".limits");
  if (!limits.ok()) return limits.status();
  ResourceList out = std::move(*requests);
  for (const auto& [name, limit] : *limits) {
    auto it = out.find(name);
    if (it == out.end()) {
      out.emplace(name, limit);
    } else if (IsExtendedResource(name) && it->second != limit) {
      return Invalid(at, absl::StrCat(name, ": request (", it->second, "m) and limit (", limit,
                                      "m) differ; an extended resource cannot be overcommitted"));
    }
  }
  return out;
}

absl::StatusOr<ResourceList> EffectivePodRequest(const json& pod) {
  if (!pod.is_object()) return Invalid("pod", "not an object");
  const json* spec = Field(pod, "spec");
  if (spec == nullptr || !spec->is_object()) return Invalid("spec", "missing or not an object");
  const json* containers = Field(*spec, "containers");
  if (containers == nullptr || !containers->is_array())
    return Invalid("spec.containers", "missing or not a list");

  ResourceList app;  // app containers and sidecars, all running together
  for (size_t i = 0; i < containers->size(); ++i) {
    const std::string where = absl::StrCat("spec.containers[", i, "]");
    absl::StatusOr<ResourceList> r = ContainerRequest((*containers)[i], where);
    if (!r.ok()) return r.status();
    absl::Status s = AddInto(*r, &app, where);
    if (!s.ok()) return s;
  }
  ResourceList init_peak, sidecars;
  const json* inits = Field(*spec, "initContainers");
  if (inits != nullptr && !inits->is_null()) {
    if (!inits->is_array()) return Invalid("spec.initContainers", "not a list");
    for (size_t i = 0; i < inits->size(); ++i) {
      const std::string where = absl::StrCat("spec.initContainers[", i, "]");
      const json& c = (*inits)[i];
      absl::StatusOr<ResourceList> r = ContainerRequest(c, where);
      if (!r.ok()) return r.status();
      absl::StatusOr<std::string> policy = StringField(c, "restartPolicy", where);
      if (!policy.ok()) return policy.status();
      if (*policy == "Always") {
        absl::Status s = AddInto(*r, &sidecars, where);
        if (!s.ok()) return s;
        MaxInto(sidecars, &init_peak);
      } else {
        ResourceList during = sidecars;
        absl::Status s = AddInto(*r, &during, where);
        if (!s.ok()) return s;
        MaxInto(during, &init_peak);
      }
    }
  }
  absl::Status s = AddInto(sidecars, &app, "spec.initContainers");
  if (!s.ok()) return s;
  MaxInto(init_peak, &app);
  absl::StatusOr<ResourceList> overhead = ReadList(Field(*spec, "overhead"), "spec.overhead");
  if (!overhead.ok()) return overhead.status();
  s = AddInto(*overhead, &app, "spec.overhead");
  if (!s.ok()) return s;
  return app;
}

const json* Field(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

absl::StatusOr<std::string> StringField(const json& obj, const char* key, absl::string_view where) {
  const json* v = Field(obj, key);
  if (v == nullptr || v->is_null()) return std::string();
  if (!v->is_string()) return Invalid(absl::StrCat(where, ".", key), "not a string");
  return v->get<std::string>();
}

}  // namespace k8s
}  // namespace duet
