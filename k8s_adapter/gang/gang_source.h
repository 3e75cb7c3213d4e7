#pragma once

// Recognising a gang member (docs/gangs.md section 1): which gang a pod
// belongs to, how many members the gang needs, and what each member asks.
//
// A pod is a gang member through one of these (checked in this order: the
// gang a pod declares outright wins over the one its controller implies):
//
//  workload  Kubernetes' own gang API (feature gate GenericWorkload):
//            - 1.36 and later: pod spec.schedulingGroup.podGroupName names a
//              PodGroup (scheduling.k8s.io: v1alpha2 in 1.36, v1beta1 in
//              1.37); its size is spec.schedulingPolicy.gang.minCount.
//              GangKey name: the PodGroup's name.
//            - 1.35: pod spec.workloadRef {name, podGroup, podGroupReplicaKey}
//              names a pod group of a Workload (scheduling.k8s.io/v1alpha1);
//              its size is spec.podGroups[podGroup].policy.gang.minCount.
//              GangKey name: "WORKLOAD/PODGROUP[/REPLICA-KEY]".
//            A group with the basic policy is not a gang (nullopt).
//  podgroup  label scheduling.x-k8s.io/pod-group (scheduler-plugins'
//            coscheduling); size: the PodGroup's spec.minMember
//            (scheduling.x-k8s.io/v1alpha1 podgroups). GangKey name: NAME.
//  lws       labels leaderworkerset.sigs.k8s.io/name and .../group-index;
//            size: the pod's annotation leaderworkerset.sigs.k8s.io/size,
//            else the LeaderWorkerSet's spec.leaderWorkerTemplate.size
//            (leaderworkerset.x-k8s.io/v1). GangKey name: "LWS/GROUP-INDEX".
//  jobset    labels jobset.sigs.k8s.io/jobset-name and .../replicatedjob-name;
//            size: the replicated job's replicas x the pods each of its Jobs
//            runs at once (min(parallelism, completions)), from the JobSet
//            (jobset.x-k8s.io/v1alpha2). GangKey name: "JOBSET/REPLICATEDJOB".
//
// Where each fact comes from is in gang_source.cc.
//
// The objects read (PodGroup, Workload, JobSet, LeaderWorkerSet, and the
// scheduling.k8s.io discovery document) are cached: one object is read at
// most once per `ttl` (`negative_ttl` for one that does not exist), however
// many members ask at once (concurrent lookups of one object wait for the
// one read under way).
//
// Thread-safety: Recognise may be called concurrently.

#include <cstddef>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bridge/gang/gang.h"
#include "common/clock.h"
#include "k8s_adapter/kube_client.h"
#include "nlohmann/json.hpp"

namespace duet {
namespace k8s {

struct GangSourceOptions {
  // How long an object read stays good.
  absl::Duration ttl = absl::Seconds(30);
  // How long "that object does not exist" stays good (short: the user may be
  // about to create it).
  absl::Duration negative_ttl = absl::Seconds(5);
  // Cached objects kept at most; the stale ones go first, then the oldest.
  size_t max_entries = 4096;
  // The clock (not owned; tests give a fake one). Null: Clock::Real().
  const Clock* clock = nullptr;
};

class GangSource {
 public:
  // `client` (not owned) must outlive this object.
  explicit GangSource(KubeClient* client, GangSourceOptions options = {});

  // The gang `pod` (a Pod object as the API server returns it) belongs to,
  // or nullopt when it belongs to none (no marker above, or a group with the
  // basic policy). On a gang: key, min_member >= 1, member (the pod's own
  // request, read as the extender reads it: extender::ParsePodRequest),
  // tpu_topology / tpu_accelerator (the pod's nodeSelector
  // cloud.google.com/gke-tpu-topology / cloud.google.com/gke-tpu-accelerator).
  //
  // Errors (the caller refuses the pod with the message; nothing is held):
  //  FAILED_PRECONDITION  the pod names a gang whose size cannot be read:
  //                       the object is missing (or its kind is not served),
  //                       the size is 0, negative, absent or not an integer,
  //                       the pod group is not in the Workload, half of a
  //                       label pair is missing; the message names the object
  //                       ("PodGroup ml/train: not found
  //                       (scheduling.x-k8s.io/v1alpha1)").
  //  UNAVAILABLE          the API server could not be asked (unreachable,
  //                       timeout, 5xx, 429); nothing is cached, try again.
  //  INVALID_ARGUMENT     the pod itself is malformed (a marker of the wrong
  //                       JSON type, a request ParsePodRequest refuses).
  absl::StatusOr<std::optional<gang::GangSpec>> Recognise(const nlohmann::json& pod);

  // Drops every cached object (tests, and a caller that knows better).
  void Flush();

 private:
  struct Entry {
    bool loading = false;
    absl::Time fetched;
    absl::Time expires;
    // The object, or the FAILED_PRECONDITION naming why it cannot be read.
    absl::StatusOr<nlohmann::json> value = nlohmann::json();
  };

  // The object at API `path` (cached). `what` names it in errors
  // ("PodGroup ml/train (scheduling.x-k8s.io/v1alpha1)").
  absl::StatusOr<nlohmann::json> Read(const std::string& path, const std::string& what);
  void EvictLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::StatusOr<std::optional<gang::GangSpec>> FromSchedulingGroup(const std::string& ns,
                                                                   const nlohmann::json& ref);
  absl::StatusOr<std::optional<gang::GangSpec>> FromWorkloadRef(const std::string& ns,
                                                               const nlohmann::json& ref);
  absl::StatusOr<std::optional<gang::GangSpec>> FromPodGroup(const std::string& ns,
                                                            const std::string& name);
  absl::StatusOr<std::optional<gang::GangSpec>> FromLws(const std::string& ns,
                                                       const nlohmann::json& pod,
                                                       const std::string& lws,
                                                       const std::string& group);
  absl::StatusOr<std::optional<gang::GangSpec>> FromJobSet(const std::string& ns,
                                                          const std::string& jobset,
                                                          const std::string& rjob);

  KubeClient* const client_;
  const GangSourceOptions options_;
  const Clock* const clock_;
  absl::Mutex mu_;
  absl::CondVar loaded_;
  std::map<std::string, Entry> cache_ ABSL_GUARDED_BY(mu_);
};

}  // namespace k8s
}  // namespace duet
