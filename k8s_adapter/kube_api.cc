#include "k8s_adapter/kube_api.h"

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace duet {
namespace k8s {

std::string FormatMicroTime(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", t, absl::UTCTimeZone());
}

absl::Status BindPod(KubeClient& client, const std::string& ns, const std::string& name,
                     const std::string& uid, const std::string& node) {
  nlohmann::json b = {{"apiVersion", "v1"},
                      {"kind", "Binding"},
                      {"metadata", {{"name", name}, {"namespace", ns}}},
                      {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}}}};
  if (!uid.empty()) b["metadata"]["uid"] = uid;
  return client
      .Post(absl::StrCat("/api/v1/namespaces/", QueryEscape(ns), "/pods/", QueryEscape(name), "/binding"),
            b.dump())
      .status();
}

absl::Status EvictPod(KubeClient& client, const std::string& ns, const std::string& name,
                      const std::string& uid) {
  nlohmann::json e = {{"apiVersion", "policy/v1"},
                      {"kind", "Eviction"},
                      {"metadata", {{"name", name}, {"namespace", ns}}}};
  // The uid goes in the deletion's preconditions: evicting a pod that was
  // replaced under the same name must fail, not evict the new one.
  if (!uid.empty()) e["deleteOptions"] = {{"preconditions", {{"uid", uid}}}};
  return client
      .Post(absl::StrCat("/api/v1/namespaces/", QueryEscape(ns), "/pods/", QueryEscape(name), "/eviction"),
            e.dump())
      .status();
}

absl::Status PatchPodAnnotations(KubeClient& client, const std::string& ns, const std::string& name,
                                 const std::map<std::string, std::optional<std::string>>& changes) {
  nlohmann::json ann = nlohmann::json::object();
  for (const auto& [k, v] : changes) ann[k] = v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  nlohmann::json patch = {{"metadata", {{"annotations", ann}}}};
  return client
      .Patch(absl::StrCat("/api/v1/namespaces/", QueryEscape(ns), "/pods/", QueryEscape(name)),
             patch.dump(), PatchType::kMerge)
      .status();
}

absl::Status PostEvent(KubeClient& client, const EventSpec& e, absl::Time now) {
  const std::string ns = e.object_namespace.empty() ? "default" : e.object_namespace;
  const std::string ts = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", now, absl::UTCTimeZone());
  nlohmann::json involved = {{"kind", e.object_kind},
                             {"apiVersion", e.object_api_version},
                             {"name", e.object_name}};
  if (!e.object_namespace.empty()) involved["namespace"] = e.object_namespace;
  if (!e.object_uid.empty()) involved["uid"] = e.object_uid;
  nlohmann::json ev = {
      {"apiVersion", "v1"},
      {"kind", "Event"},
      {"metadata", {{"generateName", e.object_name + "."}, {"namespace", ns}}},
      {"involvedObject", involved},
      {"type", e.type},
      {"reason", e.reason},
      {"message", e.message},
      {"source", {{"component", e.component}}},
      {"reportingComponent", e.component},
      {"reportingInstance", e.instance},
      {"firstTimestamp", ts},
      {"lastTimestamp", ts},
      {"eventTime", nullptr},
      {"count", 1},
  };
  return client.Post(absl::StrCat("/api/v1/namespaces/", QueryEscape(ns), "/events"), ev.dump()).status();
}

}  // namespace k8s
}  // namespace duet
