#pragma once

// The few writes duet-bridge makes to the Kubernetes API, over a KubeClient:
// pod bindings, pod annotation patches, pod evictions and Events. Errors are the
// KubeClient's (kube_client.h): e.g. ABORTED when a pod is already bound or
// its UID does not match, NOT_FOUND when the pod is gone.

#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "k8s_adapter/kube_client.h"

namespace duet {
namespace k8s {

// POST /api/v1/namespaces/{ns}/pods/{name}/binding. A non-empty `uid` is a
// precondition: the binding fails (ABORTED) if the pod was replaced.
absl::Status BindPod(KubeClient& client, const std::string& ns, const std::string& name,
                     const std::string& uid, const std::string& node);

// POST /api/v1/namespaces/{ns}/pods/{name}/eviction (a policy/v1 Eviction):
// the Eviction API deletes the pod only if its PodDisruptionBudget allows one
// more disruption, and spends that disruption. A non-empty `uid` is a
// precondition on the deletion. OK: the eviction was accepted and the pod is
// being deleted (gracefully: it may still be listed, with a
// deletionTimestamp). NOT_FOUND: the pod is gone (callers treat that as
// done). RESOURCE_EXHAUSTED (HTTP 429): a PodDisruptionBudget forbids it now;
// retry later. ABORTED (409): the pod was replaced (`uid` no longer
// matches). Other errors are the KubeClient's, among them UNAVAILABLE (500)
// when more than one PodDisruptionBudget selects the pod, which retrying
// does not cure.
absl::Status EvictPod(KubeClient& client, const std::string& ns, const std::string& name,
                      const std::string& uid);

// Merge-patches the pod's metadata.annotations: a value sets the key,
// std::nullopt removes it.
absl::Status PatchPodAnnotations(KubeClient& client, const std::string& ns, const std::string& name,
                                 const std::map<std::string, std::optional<std::string>>& changes);

struct EventSpec {
  // The object the event is about. Cluster-scoped objects (Nodes) leave
  // `object_namespace` empty; their events go to "default".
  std::string object_kind;  // "Pod", "Node"
  std::string object_api_version = "v1";
  std::string object_namespace;
  std::string object_name;
  std::string object_uid;
  std::string type = "Warning";  // "Normal" or "Warning"
  std::string reason;            // CamelCase, e.g. "DuetRefused"
  std::string message;
  std::string component = "duet-bridge";
  std::string instance;  // reporting instance (pod name)
};

// POST a core/v1 Event (generateName "<object>."), timestamped `now`.
absl::Status PostEvent(KubeClient& client, const EventSpec& event, absl::Time now);

// RFC 3339 with microseconds in UTC, as metav1.MicroTime serializes.
std::string FormatMicroTime(absl::Time t);

}  // namespace k8s
}  // namespace duet
