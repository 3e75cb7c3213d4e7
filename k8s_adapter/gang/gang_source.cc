#include "k8s_adapter/gang/gang_source.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "k8s_adapter/common/pod_request.h"
#include "k8s_adapter/extender/types.h"

namespace duet {
namespace k8s {
namespace {

using nlohmann::json;

// ---- The facts, each with where it was checked ----
//
// scheduler-plugins coscheduling: pods carry the label
// scheduling.x-k8s.io/pod-group: NAME; the PodGroup is
// scheduling.x-k8s.io/v1alpha1 (plural podgroups, namespaced) with
// spec.minMember. Source: https://scheduler-plugins.sigs.k8s.io/docs/plugins/coscheduling/
// The older group scheduling.sigs.k8s.io and label
// pod-group.scheduling.sigs.k8s.io were replaced in scheduler-plugins v0.25
// (kubernetes-sigs/scheduler-plugins PR 526, "switch API group to x-k8s.io":
// "The Pods work with PodGroup feature need to migrate to use new label");
// releases that old serve Kubernetes 1.24 and earlier, so they are not read.
constexpr char kPodGroupLabel[] = "scheduling.x-k8s.io/pod-group";
constexpr char kPodGroupApi[] = "/apis/scheduling.x-k8s.io/v1alpha1";

// JobSet (kubernetes-sigs/jobset, api/jobset/v1alpha2/jobset_types.go and
// the controller's labelAndAnnotateObject): the controller labels (and
// annotates) each child Job and pod with jobset.sigs.k8s.io/jobset-name,
// .../replicatedjob-name, .../replicatedjob-replicas and .../job-index. The
// JobSet is jobset.x-k8s.io/v1alpha2 (plural jobsets); spec.replicatedJobs[]
// has name, replicas (default 1) and template (a batch/v1 JobTemplateSpec).
// A Job runs at most spec.parallelism pods at once (default 1), fewer when
// fewer completions remain (Kubernetes API reference, batch/v1 JobSpec
// "parallelism": https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/job-v1/).
// So the replicated job's gang is replicas x min(parallelism, completions).
constexpr char kJobSetNameLabel[] = "jobset.sigs.k8s.io/jobset-name";
constexpr char kReplicatedJobLabel[] = "jobset.sigs.k8s.io/replicatedjob-name";
constexpr char kJobSetApi[] = "/apis/jobset.x-k8s.io/v1alpha2";

// LeaderWorkerSet (kubernetes-sigs/lws, api/leaderworkerset/v1/
// leaderworkerset_types.go): pods carry the labels
// leaderworkerset.sigs.k8s.io/name and .../group-index and the annotation
// leaderworkerset.sigs.k8s.io/size (= spec.leaderWorkerTemplate.size, the
// pods of one group, leader included; default 1). The LeaderWorkerSet is
// leaderworkerset.x-k8s.io/v1 (plural leaderworkersets).
constexpr char kLwsNameLabel[] = "leaderworkerset.sigs.k8s.io/name";
constexpr char kLwsGroupLabel[] = "leaderworkerset.sigs.k8s.io/group-index";
constexpr char kLwsSizeAnnotation[] = "leaderworkerset.sigs.k8s.io/size";
constexpr char kLwsApi[] = "/apis/leaderworkerset.x-k8s.io/v1";

// Kubernetes' Workload API (KEP-4671, feature gate GenericWorkload):
//  - 1.35 (alpha): Workload scheduling.k8s.io/v1alpha1 with
//    spec.podGroups[] {name, policy: {basic: {}} | {gang: {minCount}}}; pods
//    point at one with spec.workloadRef {name, podGroup, podGroupReplicaKey};
//    each replica key is its own gang.
//    Sources: https://kubernetes.io/docs/concepts/workloads/pods/workload-reference
//    (1.35 version), https://kubernetes.io/ja/docs/concepts/workloads/workload-api
//    (1.35 version, the v1alpha1 example).
//  - 1.36 (alpha): v1alpha1 is replaced by v1alpha2; PodGroup is its own
//    object (plural podgroups) with spec.schedulingPolicy {basic | gang:
//    {minCount}}; pods point at one with spec.schedulingGroup.podGroupName
//    (spec.workloadRef is gone). Sources:
//    https://kubernetes.io/docs/concepts/workloads/podgroup-api/,
//    https://kubernetes.io/docs/concepts/workloads/pods/scheduling-group/,
//    https://kubernetes.io/docs/reference/kubernetes-api/scheduling/pod-group-v1alpha2/.
//  - 1.37 (beta, still off by default): PodGroup and Workload at
//    scheduling.k8s.io/v1beta1 (k8s-openapi's v1_37 scheduling::v1beta1
//    GangSchedulingPolicy.min_count; "Kubernetes v1.37: Advancing
//    Workload-Aware Scheduling", kubernetes.io blog 2026-09-08). Client
//    libraries also list a v1alpha3 PodGroup with the same schedulingPolicy.
// The version is taken from discovery (GET /apis/scheduling.k8s.io): the
// newest of these that the cluster serves.
constexpr char kSchedulingGroupApi[] = "/apis/scheduling.k8s.io";
const char* const kPodGroupVersions[] = {"v1beta1", "v1alpha3", "v1alpha2"};
constexpr char kWorkloadV1alpha1[] = "v1alpha1";

// GKE TPU node selectors (docs/gangs.md section 5).
constexpr char kTpuTopologySelector[] = "cloud.google.com/gke-tpu-topology";

// A map member as a string: nullopt when absent, null or "";
// INVALID_ARGUMENT naming it when another type.
absl::StatusOr<std::optional<std::string>> MapString(const json& obj,
                                                     std::initializer_list<const char*> path,
                                                     const std::string& key) {
  const json* cur = &obj;
  std::string where;
  for (const char* p : path) {
    cur = Field(*cur, p);
    absl::StrAppend(&where, where.empty() ? "" : ".", p);
    if (cur == nullptr || cur->is_null()) return std::nullopt;
  }
  const json* v = Field(*cur, key.c_str());
  if (v == nullptr || v->is_null()) return std::nullopt;
  if (!v->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "[", key, "]: not a string"));
  }
  std::string s = v->get<std::string>();
  if (s.empty()) return std::nullopt;
  return s;
}

// Whether `name` can be put in an API path as an object name (a DNS
// subdomain's characters; label values may also hold '_' and upper case,
// which no object name has).
bool PathSafeName(const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  for (char c : name) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-' || c == '.')) return false;
  }
  return name != "." && name != "..";
}

// The pod's name for messages ("" when unreadable).
std::string PodName(const json& pod) {
  const json* md = Field(pod, "metadata");
  const json* name = md != nullptr ? Field(*md, "name") : nullptr;
  return name != nullptr && name->is_string() ? name->get<std::string>() : std::string();
}

absl::Status BadName(const std::string& what, const std::string& name) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, " \"", name, "\": not a valid object name"));
}

// A gang size: a JSON integer in 1..2^31-1 (the fields are int32).
// FAILED_PRECONDITION naming `what` and `field` otherwise.
absl::StatusOr<uint32_t> Size(const json* v, const std::string& what, const std::string& field) {
  if (v == nullptr || v->is_null()) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", field, " is not set"));
  }
  if (!v->is_number_integer()) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", field, " is not an integer"));
  }
  const int64_t n = v->get<int64_t>();
  if (n < 1 || n > std::numeric_limits<int32_t>::max()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": ", field, " is ", n, "; a gang needs at least one member"));
  }
  return static_cast<uint32_t>(n);
}

// An optional int32 field with a default (JobSet replicas, Job parallelism).
absl::StatusOr<uint32_t> SizeOr(const json* v, uint32_t dflt, const std::string& what,
                                const std::string& field) {
  if (v == nullptr || v->is_null()) return dflt;
  return Size(v, what, field);
}

}  // namespace

GangSource::GangSource(KubeClient* client, GangSourceOptions options)
    : client_(client),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()) {}

void GangSource::Flush() {
  absl::MutexLock l(&mu_);
  for (auto it = cache_.begin(); it != cache_.end();) {
    if (it->second.loading) {
      ++it;  // its reader stores it; it expires as usual
    } else {
      it = cache_.erase(it);
    }
  }
}

void GangSource::EvictLocked(absl::Time now) {
  if (cache_.size() < options_.max_entries) return;
  for (auto it = cache_.begin(); it != cache_.end();) {
    if (!it->second.loading && it->second.expires <= now) {
      it = cache_.erase(it);
    } else {
      ++it;
    }
  }
  while (cache_.size() >= options_.max_entries) {
    auto oldest = cache_.end();
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->second.loading) continue;
      if (oldest == cache_.end() || it->second.fetched < oldest->second.fetched) oldest = it;
    }
    if (oldest == cache_.end()) return;  // every entry is being read
    cache_.erase(oldest);
  }
}

absl::StatusOr<json> GangSource::Read(const std::string& path, const std::string& what) {
  {
    absl::MutexLock l(&mu_);
    while (true) {
      auto it = cache_.find(path);
      if (it == cache_.end()) break;
      if (it->second.loading) {
        loaded_.Wait(&mu_);
        continue;
      }
      if (clock_->Now() < it->second.expires) return it->second.value;
      break;
    }
    EvictLocked(clock_->Now());
    Entry& e = cache_[path];
    e.loading = true;
  }

  absl::StatusOr<std::string> body = client_->Get(path);
  absl::StatusOr<json> value;
  bool cache = true;
  absl::Duration ttl = options_.ttl;
  if (body.ok()) {
    json parsed = json::parse(*body, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !parsed.is_object()) {
      value = absl::UnavailableError(absl::StrCat(what, ": the API server's answer is not a JSON object"));
      cache = false;
    } else {
      value = std::move(parsed);
    }
  } else {
    const absl::StatusCode code = body.status().code();
    if (code == absl::StatusCode::kNotFound) {
      value = absl::FailedPreconditionError(absl::StrCat(what, ": not found"));
      ttl = options_.negative_ttl;
    } else if (code == absl::StatusCode::kPermissionDenied ||
               code == absl::StatusCode::kUnauthenticated) {
      value = absl::FailedPreconditionError(
          absl::StrCat(what, ": cannot be read (", body.status().message(), ")"));
      ttl = options_.negative_ttl;
    } else {
      value = absl::UnavailableError(
          absl::StrCat(what, ": the API server could not be asked: ", body.status().message()));
      cache = false;
    }
  }

  absl::MutexLock l(&mu_);
  auto it = cache_.find(path);  // still there: loading entries are never evicted
  if (cache) {
    const absl::Time now = clock_->Now();
    it->second.loading = false;
    it->second.fetched = now;
    it->second.expires = now + ttl;
    it->second.value = value;
  } else {
    cache_.erase(it);
  }
  loaded_.SignalAll();
  return value;
}

absl::StatusOr<std::optional<gang::GangSpec>> GangSource::Recognise(const json& pod) {
  if (!pod.is_object()) return absl::InvalidArgumentError("Pod: not a JSON object");
  absl::StatusOr<std::optional<std::string>> ns_field = MapString(pod, {"metadata"}, "namespace");
  if (!ns_field.ok()) return ns_field.status();
  const std::string ns = ns_field->value_or("default");

  absl::StatusOr<std::optional<gang::GangSpec>> spec = std::optional<gang::GangSpec>();
  const json* pod_spec = Field(pod, "spec");
  const json* scheduling_group = pod_spec != nullptr ? Field(*pod_spec, "schedulingGroup") : nullptr;
  const json* workload_ref = pod_spec != nullptr ? Field(*pod_spec, "workloadRef") : nullptr;
  absl::StatusOr<std::optional<std::string>> pod_group = MapString(pod, {"metadata", "labels"}, kPodGroupLabel);
  if (!pod_group.ok()) return pod_group.status();
  absl::StatusOr<std::optional<std::string>> lws = MapString(pod, {"metadata", "labels"}, kLwsNameLabel);
  if (!lws.ok()) return lws.status();
  absl::StatusOr<std::optional<std::string>> lws_group = MapString(pod, {"metadata", "labels"}, kLwsGroupLabel);
  if (!lws_group.ok()) return lws_group.status();
  absl::StatusOr<std::optional<std::string>> jobset = MapString(pod, {"metadata", "labels"}, kJobSetNameLabel);
  if (!jobset.ok()) return jobset.status();
  absl::StatusOr<std::optional<std::string>> rjob = MapString(pod, {"metadata", "labels"}, kReplicatedJobLabel);
  if (!rjob.ok()) return rjob.status();

  if (scheduling_group != nullptr && !scheduling_group->is_null()) {
    spec = FromSchedulingGroup(ns, *scheduling_group);
  } else if (workload_ref != nullptr && !workload_ref->is_null()) {
    spec = FromWorkloadRef(ns, *workload_ref);
  } else if (pod_group->has_value()) {
    spec = FromPodGroup(ns, **pod_group);
  } else if (lws->has_value() || lws_group->has_value()) {
    if (!lws->has_value() || !lws_group->has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Pod ", ns, "/", PodName(pod),
          ": has only one of the labels ", kLwsNameLabel, " and ", kLwsGroupLabel));
    }
    spec = FromLws(ns, pod, **lws, **lws_group);
  } else if (jobset->has_value() || rjob->has_value()) {
    if (!jobset->has_value() || !rjob->has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Pod ", ns, "/", PodName(pod),
          ": has only one of the labels ", kJobSetNameLabel, " and ", kReplicatedJobLabel));
    }
    spec = FromJobSet(ns, **jobset, **rjob);
  }
  if (!spec.ok() || !spec->has_value()) return spec;

  gang::GangSpec& g = **spec;
  g.key.ns = ns;
  absl::StatusOr<placement::PodRequest> member = extender::ParsePodRequest(pod);
  if (!member.ok()) return member.status();
  g.member = std::move(*member);
  absl::StatusOr<std::optional<std::string>> topology =
      MapString(pod, {"spec", "nodeSelector"}, kTpuTopologySelector);
  if (!topology.ok()) return topology.status();
  absl::StatusOr<std::optional<std::string>> accelerator =
      MapString(pod, {"spec", "nodeSelector"}, extender::kTpuModelSelector);
  if (!accelerator.ok()) return accelerator.status();
  g.tpu_topology = topology->value_or("");
  g.tpu_accelerator = accelerator->value_or("");
  return spec;
}

absl::StatusOr<std::optional<gang::GangSpec>> GangSource::FromSchedulingGroup(const std::string& ns,
                                                                             const json& ref) {
  absl::StatusOr<std::optional<std::string>> name = MapString(ref, {}, "podGroupName");
  if (!name.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.schedulingGroup: ", name.status().message()));
  }
  if (!name->has_value()) {
    return absl::FailedPreconditionError("spec.schedulingGroup: podGroupName is not set");
  }
  if (!PathSafeName(**name)) return BadName("spec.schedulingGroup.podGroupName", **name);

  const std::string what = absl::StrCat("PodGroup ", ns, "/", **name);
  absl::StatusOr<json> group = Read(kSchedulingGroupApi, "API group scheduling.k8s.io");
  if (!group.ok() && group.status().code() != absl::StatusCode::kFailedPrecondition) return group.status();
  std::string version;
  const json* versions = group.ok() ? Field(*group, "versions") : nullptr;
  if (versions != nullptr && versions->is_array()) {
    for (const char* want : kPodGroupVersions) {
      for (const json& v : *versions) {
        const json* ver = Field(v, "version");
        if (ver != nullptr && ver->is_string() && *ver == want) version = want;
      }
      if (!version.empty()) break;
    }
  }
  if (version.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": this cluster serves no scheduling.k8s.io version with PodGroups (v1alpha2 or later)"));
  }
  const std::string gv = absl::StrCat("scheduling.k8s.io/", version);
  absl::StatusOr<json> obj = Read(absl::StrCat(kSchedulingGroupApi, "/", version, "/namespaces/", ns,
                                               "/podgroups/", **name),
                                  absl::StrCat(what, " (", gv, ")"));
  if (!obj.ok()) return obj.status();
  const json* spec = Field(*obj, "spec");
  const json* policy = spec != nullptr ? Field(*spec, "schedulingPolicy") : nullptr;
  const json* gang_policy = policy != nullptr ? Field(*policy, "gang") : nullptr;
  if (gang_policy == nullptr || gang_policy->is_null()) {
    if (policy != nullptr && Field(*policy, "basic") != nullptr) return std::nullopt;
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": spec.schedulingPolicy has neither gang nor basic"));
  }
  absl::StatusOr<uint32_t> n = Size(Field(*gang_policy, "minCount"), what,
                                    "spec.schedulingPolicy.gang.minCount");
  if (!n.ok()) return n.status();
  gang::GangSpec g;
  g.key.source = gang::GangSource::kWorkload;
  g.key.name = **name;
  g.min_member = *n;
  return g;
}

absl::StatusOr<std::optional<gang::GangSpec>> GangSource::FromWorkloadRef(const std::string& ns,
                                                                         const json& ref) {
  absl::StatusOr<std::optional<std::string>> name = MapString(ref, {}, "name");
  absl::StatusOr<std::optional<std::string>> group = MapString(ref, {}, "podGroup");
  absl::StatusOr<std::optional<std::string>> replica = MapString(ref, {}, "podGroupReplicaKey");
  for (const auto* s : {&name, &group, &replica}) {
    if (!s->ok()) return absl::InvalidArgumentError(absl::StrCat("spec.workloadRef: ", s->status().message()));
  }
  if (!name->has_value() || !group->has_value()) {
    return absl::FailedPreconditionError("spec.workloadRef: name and podGroup must both be set");
  }
  if (!PathSafeName(**name)) return BadName("spec.workloadRef.name", **name);
  const std::string what = absl::StrCat("Workload ", ns, "/", **name);
  absl::StatusOr<json> obj =
      Read(absl::StrCat(kSchedulingGroupApi, "/", kWorkloadV1alpha1, "/namespaces/", ns, "/workloads/", **name),
           absl::StrCat(what, " (scheduling.k8s.io/", kWorkloadV1alpha1, ")"));
  if (!obj.ok()) return obj.status();
  const json* spec = Field(*obj, "spec");
  const json* groups = spec != nullptr ? Field(*spec, "podGroups") : nullptr;
  const json* found = nullptr;
  if (groups != nullptr && groups->is_array()) {
    for (const json& g : *groups) {
      const json* n = Field(g, "name");
      if (n != nullptr && n->is_string() && *n == **group) found = &g;
    }
  }
  if (found == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": has no pod group \"", **group, "\" in spec.podGroups"));
  }
  const std::string field = absl::StrCat("spec.podGroups[", **group, "].policy");
  const json* policy = Field(*found, "policy");
  const json* gang_policy = policy != nullptr ? Field(*policy, "gang") : nullptr;
  if (gang_policy == nullptr || gang_policy->is_null()) {
    if (policy != nullptr && Field(*policy, "basic") != nullptr) return std::nullopt;
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", field, " has neither gang nor basic"));
  }
  absl::StatusOr<uint32_t> n = Size(Field(*gang_policy, "minCount"), what, field + ".gang.minCount");
  if (!n.ok()) return n.status();
  gang::GangSpec g;
  g.key.source = gang::GangSource::kWorkload;
  g.key.name = absl::StrCat(**name, "/", **group);
  if (replica->has_value()) absl::StrAppend(&g.key.name, "/", **replica);
  g.min_member = *n;
  return g;
}

absl::StatusOr<std::optional<gang::GangSpec>> GangSource::FromPodGroup(const std::string& ns,
                                                                      const std::string& name) {
  if (!PathSafeName(name)) return BadName(absl::StrCat("label ", kPodGroupLabel), name);
  const std::string what = absl::StrCat("PodGroup ", ns, "/", name);
  absl::StatusOr<json> obj = Read(absl::StrCat(kPodGroupApi, "/namespaces/", ns, "/podgroups/", name),
                                  absl::StrCat(what, " (scheduling.x-k8s.io/v1alpha1)"));
  if (!obj.ok()) return obj.status();
  const json* spec = Field(*obj, "spec");
  absl::StatusOr<uint32_t> n = Size(spec != nullptr ? Field(*spec, "minMember") : nullptr, what,
                                    "spec.minMember");
  if (!n.ok()) return n.status();
  gang::GangSpec g;
  g.key.source = gang::GangSource::kPodGroup;
  g.key.name = name;
  g.min_member = *n;
  return g;
}

absl::StatusOr<std::optional<gang::GangSpec>> GangSource::FromLws(const std::string& ns, const json& pod,
                                                                 const std::string& lws,
                                                                 const std::string& group) {
  const std::string what = absl::StrCat("LeaderWorkerSet ", ns, "/", lws);
  uint32_t size = 0;
  absl::StatusOr<std::optional<std::string>> annotation =
      MapString(pod, {"metadata", "annotations"}, kLwsSizeAnnotation);
  if (!annotation.ok()) return annotation.status();
  if (annotation->has_value()) {
    json number = json::parse(**annotation, nullptr, /*allow_exceptions=*/false);
    if (number.is_discarded()) number = **annotation;  // "not an integer"
    absl::StatusOr<uint32_t> n =
        Size(&number, what,
             absl::StrCat("the pod's annotation ", kLwsSizeAnnotation, " \"", **annotation, "\""));
    if (!n.ok()) return n.status();
    size = *n;
  } else {
    if (!PathSafeName(lws)) return BadName(absl::StrCat("label ", kLwsNameLabel), lws);
    absl::StatusOr<json> obj = Read(absl::StrCat(kLwsApi, "/namespaces/", ns, "/leaderworkersets/", lws),
                                    absl::StrCat(what, " (leaderworkerset.x-k8s.io/v1)"));
    if (!obj.ok()) return obj.status();
    const json* spec = Field(*obj, "spec");
    const json* tmpl = spec != nullptr ? Field(*spec, "leaderWorkerTemplate") : nullptr;
    absl::StatusOr<uint32_t> n = SizeOr(tmpl != nullptr ? Field(*tmpl, "size") : nullptr, 1, what,
                                        "spec.leaderWorkerTemplate.size");
    if (!n.ok()) return n.status();
    size = *n;
  }
  gang::GangSpec g;
  g.key.source = gang::GangSource::kLws;
  g.key.name = absl::StrCat(lws, "/", group);
  g.min_member = size;
  return g;
}

absl::StatusOr<std::optional<gang::GangSpec>> GangSource::FromJobSet(const std::string& ns,
                                                                    const std::string& jobset,
                                                                    const std::string& rjob) {
  if (!PathSafeName(jobset)) return BadName(absl::StrCat("label ", kJobSetNameLabel), jobset);
  const std::string what = absl::StrCat("JobSet ", ns, "/", jobset);
  absl::StatusOr<json> obj = Read(absl::StrCat(kJobSetApi, "/namespaces/", ns, "/jobsets/", jobset),
                                  absl::StrCat(what, " (jobset.x-k8s.io/v1alpha2)"));
  if (!obj.ok()) return obj.status();
  const json* spec = Field(*obj, "spec");
  const json* jobs = spec != nullptr ? Field(*spec, "replicatedJobs") : nullptr;
  const json* found = nullptr;
  if (jobs != nullptr && jobs->is_array()) {
    for (const json& j : *jobs) {
      const json* n = Field(j, "name");
      if (n != nullptr && n->is_string() && *n == rjob) found = &j;
    }
  }
  if (found == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": has no replicated job \"", rjob, "\" in spec.replicatedJobs"));
  }
  const std::string field = absl::StrCat("spec.replicatedJobs[", rjob, "]");
  absl::StatusOr<uint32_t> replicas = SizeOr(Field(*found, "replicas"), 1, what, field + ".replicas");
  if (!replicas.ok()) return replicas.status();
  const json* tmpl = Field(*found, "template");
  const json* job_spec = tmpl != nullptr ? Field(*tmpl, "spec") : nullptr;
  absl::StatusOr<uint32_t> parallelism =
      SizeOr(job_spec != nullptr ? Field(*job_spec, "parallelism") : nullptr, 1, what,
             field + ".template.spec.parallelism");
  if (!parallelism.ok()) return parallelism.status();
  uint32_t per_job = *parallelism;
  const json* completions = job_spec != nullptr ? Field(*job_spec, "completions") : nullptr;
  if (completions != nullptr && !completions->is_null()) {
    absl::StatusOr<uint32_t> c = Size(completions, what, field + ".template.spec.completions");
    if (!c.ok()) return c.status();
    per_job = std::min(per_job, *c);
  }
  const uint64_t total = uint64_t{*replicas} * per_job;
  if (total > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": ", field, " has ", total, " pods; too many for one gang"));
  }
  gang::GangSpec g;
  g.key.source = gang::GangSource::kJobSet;
  g.key.name = absl::StrCat(jobset, "/", rjob);
  g.min_member = static_cast<uint32_t>(total);
  return g;
}

}  // namespace k8s
}  // namespace duet
