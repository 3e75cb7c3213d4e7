// Kubernetes objects the gang e2e tests post to the fake API server.
#ifndef DUET_TESTS_INTEGRATION_GANG_OBJECTS_H_
#define DUET_TESTS_INTEGRATION_GANG_OBJECTS_H_

#include <string>

#include "nlohmann/json.hpp"

namespace duet::testing {

// A scheduler-plugins PodGroup (scheduling.x-k8s.io/v1alpha1) of
// `min_member` pods in namespace default.
inline nlohmann::json PodGroup(const std::string& name, int min_member) {
  return {{"apiVersion", "scheduling.x-k8s.io/v1alpha1"},
          {"kind", "PodGroup"},
          {"metadata", {{"name", name}, {"namespace", "default"}}},
          {"spec", {{"minMember", min_member}}}};
}

// A JobSet (jobset.x-k8s.io/v1alpha2) in namespace default with one
// replicated job `rjob` of `replicas` Jobs, each running `parallelism` pods
// (completions the same): a gang of replicas x parallelism pods.
inline nlohmann::json JobSet(const std::string& name, const std::string& rjob, int replicas,
                             int parallelism) {
  return {{"apiVersion", "jobset.x-k8s.io/v1alpha2"},
          {"kind", "JobSet"},
          {"metadata", {{"name", name}, {"namespace", "default"}}},
          {"spec",
           {{"replicatedJobs",
             {{{"name", rjob},
               {"replicas", replicas},
               {"template",
                {{"spec", {{"parallelism", parallelism}, {"completions", parallelism}}}}}}}}}}};
}

// The labels the JobSet controller puts on a pod of Job `job_index` of
// replicated job `rjob` (the same keys it also sets as annotations; the
// annotations are not read by duet): the JobSet's name, the replicated
// job's name and replicas, the Job's index within it, and the Job's name
// (JOBSET-RJOB-INDEX).
inline nlohmann::json JobSetPodLabels(const std::string& jobset, const std::string& rjob,
                                      int job_index, int replicas) {
  return {{"jobset.sigs.k8s.io/jobset-name", jobset},
          {"jobset.sigs.k8s.io/replicatedjob-name", rjob},
          {"jobset.sigs.k8s.io/replicatedjob-replicas", std::to_string(replicas)},
          {"jobset.sigs.k8s.io/job-index", std::to_string(job_index)},
          {"batch.kubernetes.io/job-name",
           jobset + "-" + rjob + "-" + std::to_string(job_index)}};
}

// A LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) in namespace default whose
// groups have `size` pods, the leader included.
inline nlohmann::json LeaderWorkerSet(const std::string& name, int size) {
  return {{"apiVersion", "leaderworkerset.x-k8s.io/v1"},
          {"kind", "LeaderWorkerSet"},
          {"metadata", {{"name", name}, {"namespace", "default"}}},
          {"spec", {{"replicas", 1}, {"leaderWorkerTemplate", {{"size", size}}}}}};
}

// The labels the LeaderWorkerSet controller puts on pod `worker` (0: the
// leader) of group `group`.
inline nlohmann::json LwsPodLabels(const std::string& lws, int group, int worker) {
  return {{"leaderworkerset.sigs.k8s.io/name", lws},
          {"leaderworkerset.sigs.k8s.io/group-index", std::to_string(group)},
          {"leaderworkerset.sigs.k8s.io/worker-index", std::to_string(worker)}};
}
// ...and the annotation it puts on every pod of a group: the group's size.
inline nlohmann::json LwsPodAnnotations(int size) {
  return {{"leaderworkerset.sigs.k8s.io/size", std::to_string(size)}};
}

}  // namespace duet::testing

#endif  // DUET_TESTS_INTEGRATION_GANG_OBJECTS_H_
