#include "k8s_adapter/gang/gang_source.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace k8s {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;
using testing::FakeApiServer;

// A pending pod in namespace ml asking `gpus` GPUs, 4 CPUs and 16 GiB.
json Pod(const std::string& name, int gpus = 2) {
  json c = {{"name", "c"},
            {"image", "i"},
            {"resources", {{"limits", {{"nvidia.com/gpu", std::to_string(gpus)}}},
                           {"requests", {{"cpu", "4"}, {"memory", "16Gi"}}}}}};
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", "ml"}, {"uid", name + "-uid"}}},
          {"spec", {{"schedulerName", "duet"}, {"containers", {c}}}}};
}

json WithLabels(json pod, const json& labels) {
  pod["metadata"]["labels"] = labels;
  return pod;
}

// How many GETs of `path` the fake has answered.
int Gets(FakeApiServer& fake, const std::string& path) {
  int n = 0;
  for (const json& r : fake.Requests()) {
    if (r.value("method", "") == "GET" && r.value("path", "") == path) ++n;
  }
  return n;
}

struct Env {
  explicit Env(std::vector<std::string> args) : fake(std::move(args)) {
    KubeConfig c;
    c.server = fake.url();
    client = *NewCurlKubeClient(c);
    GangSourceOptions o;
    o.clock = &clock;
    source = std::make_unique<GangSource>(client.get(), o);
  }
  FakeApiServer fake;
  fakes::FakeClock clock;
  std::unique_ptr<KubeClient> client;
  std::unique_ptr<GangSource> source;
};

json SchedulerPluginsPodGroup(const std::string& name, const json& min_member) {
  return {{"apiVersion", "scheduling.x-k8s.io/v1alpha1"},
          {"kind", "PodGroup"},
          {"metadata", {{"name", name}, {"namespace", "ml"}}},
          {"spec", {{"minMember", min_member}, {"scheduleTimeoutSeconds", 10}}}};
}

TEST(GangSourceTest, PodWithoutMarkerIsNoGangAndAsksNothing) {
  Env env({"--gang-crds"});
  ASSERT_TRUE(env.fake.ok());
  auto got = env.source->Recognise(WithLabels(Pod("p"), {{"app", "x"}}));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->has_value());
  EXPECT_TRUE(env.fake.Requests().empty());
}

TEST(GangSourceTest, PodGroupLabel) {
  Env env({"--gang-crds"});
  ASSERT_TRUE(env.fake.ok());
  env.fake.Put(SchedulerPluginsPodGroup("train", 3));
  auto got = env.source->Recognise(WithLabels(Pod("p0"), {{"scheduling.x-k8s.io/pod-group", "train"}}));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  const gang::GangSpec& g = **got;
  EXPECT_EQ(g.key.ns, "ml");
  EXPECT_EQ(g.key.source, gang::GangSource::kPodGroup);
  EXPECT_EQ(g.key.name, "train");
  EXPECT_EQ(g.min_member, 3u);
  EXPECT_EQ(g.member.kind, DeviceKind::kGpu);
  EXPECT_EQ(g.member.count, 2u);
  EXPECT_EQ(g.member.cpu_milli, 4000u);
  EXPECT_EQ(g.member.memory_mib, 16384u);
  EXPECT_EQ(g.tpu_topology, "");
  EXPECT_EQ(g.tpu_accelerator, "");
}

TEST(GangSourceTest, PodGroupMissingOrBadSizeIsRefusedNamingIt) {
  Env env({"--gang-crds"});
  ASSERT_TRUE(env.fake.ok());
  auto missing = env.source->Recognise(WithLabels(Pod("p"), {{"scheduling.x-k8s.io/pod-group", "absent"}}));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.status().message(), HasSubstr("PodGroup ml/absent"));
  EXPECT_THAT(missing.status().message(), HasSubstr("not found"));

  env.fake.Put(SchedulerPluginsPodGroup("zero", 0));
  env.fake.Put(SchedulerPluginsPodGroup("text", "three"));
  json unset = SchedulerPluginsPodGroup("unset", 1);
  unset["spec"].erase("minMember");
  env.fake.Put(unset);
  for (const char* name : {"zero", "text", "unset"}) {
    auto got = env.source->Recognise(WithLabels(Pod("p"), {{"scheduling.x-k8s.io/pod-group", name}}));
    EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << name;
    EXPECT_THAT(got.status().message(), HasSubstr(std::string("PodGroup ml/") + name));
    EXPECT_THAT(got.status().message(), HasSubstr("spec.minMember"));
  }
  // A label value that cannot be an object name never reaches a path.
  auto odd = env.source->Recognise(WithLabels(Pod("p"), {{"scheduling.x-k8s.io/pod-group", "A_b"}}));
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(GangSourceTest, PodGroupCrdNotInstalledIsRefused) {
  Env env({});
  ASSERT_TRUE(env.fake.ok());
  auto got = env.source->Recognise(WithLabels(Pod("p"), {{"scheduling.x-k8s.io/pod-group", "train"}}));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(got.status().message(), HasSubstr("scheduling.x-k8s.io/v1alpha1"));
}

json JobSet() {
  auto rjob = [](const std::string& name, const json& replicas, const json& job_spec) {
    json j = {{"name", name}, {"template", {{"spec", job_spec}}}};
    if (!replicas.is_null()) j["replicas"] = replicas;
    return j;
  };
  json pod_template = {{"spec", {{"containers", {{{"name", "c"}, {"image", "i"}}}}}}};
  return {{"apiVersion", "jobset.x-k8s.io/v1alpha2"},
          {"kind", "JobSet"},
          {"metadata", {{"name", "js"}, {"namespace", "ml"}}},
          {"spec",
           {{"replicatedJobs",
             {rjob("workers", 2, {{"parallelism", 4}, {"completions", 4}, {"template", pod_template}}),
              rjob("capped", 3, {{"parallelism", 4}, {"completions", 2}, {"template", pod_template}}),
              rjob("defaults", nullptr, {{"template", pod_template}}),
              rjob("idle", 2, {{"parallelism", 0}, {"template", pod_template}})}}}}};
}

json JobSetPod(const std::string& rjob) {
  return WithLabels(Pod("js-" + rjob + "-0-0"), {{"jobset.sigs.k8s.io/jobset-name", "js"},
                                                 {"jobset.sigs.k8s.io/replicatedjob-name", rjob},
                                                 {"jobset.sigs.k8s.io/replicatedjob-replicas", "2"},
                                                 {"jobset.sigs.k8s.io/job-index", "0"}});
}

TEST(GangSourceTest, JobSetReplicatedJob) {
  Env env({"--gang-crds"});
  ASSERT_TRUE(env.fake.ok());
  env.fake.Put(JobSet());
  auto got = env.source->Recognise(JobSetPod("workers"));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->key.source, gang::GangSource::kJobSet);
  EXPECT_EQ((*got)->key.name, "js/workers");
  EXPECT_EQ((*got)->min_member, 8u);  // 2 Jobs x 4 pods
  // Fewer completions than parallelism: a Job runs only that many pods.
  auto capped = env.source->Recognise(JobSetPod("capped"));
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ((*capped)->min_member, 6u);
  // replicas and parallelism default to 1.
  auto defaults = env.source->Recognise(JobSetPod("defaults"));
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ((*defaults)->min_member, 1u);
  // One JobSet read served all three.
  EXPECT_EQ(Gets(env.fake, "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets/js"), 1);

  auto idle = env.source->Recognise(JobSetPod("idle"));
  EXPECT_EQ(idle.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(idle.status().message(), HasSubstr("JobSet ml/js"));
  EXPECT_THAT(idle.status().message(), HasSubstr("parallelism"));
  auto unknown = env.source->Recognise(JobSetPod("nope"));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(unknown.status().message(), HasSubstr("no replicated job \"nope\""));
  json half = Pod("half");
  half["metadata"]["labels"] = {{"jobset.sigs.k8s.io/jobset-name", "js"}};
  EXPECT_EQ(env.source->Recognise(half).status().code(), absl::StatusCode::kFailedPrecondition);
  env.fake.Delete("JobSet", "js", "ml");
  env.source->Flush();
  auto gone = env.source->Recognise(JobSetPod("workers"));
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(gone.status().message(), HasSubstr("JobSet ml/js (jobset.x-k8s.io/v1alpha2): not found"));
}

json LwsPod(const json& size_annotation) {
  json pod = WithLabels(Pod("lws-1-2"), {{"leaderworkerset.sigs.k8s.io/name", "lws"},
                                         {"leaderworkerset.sigs.k8s.io/group-index", "1"},
                                         {"leaderworkerset.sigs.k8s.io/worker-index", "2"}});
  if (!size_annotation.is_null()) {
    pod["metadata"]["annotations"] = {{"leaderworkerset.sigs.k8s.io/size", size_annotation}};
  }
  return pod;
}

TEST(GangSourceTest, LeaderWorkerSetGroup) {
  Env env({"--gang-crds"});
  ASSERT_TRUE(env.fake.ok());
  // The size annotation is enough: nothing is read.
  auto got = env.source->Recognise(LwsPod("4"));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->key.source, gang::GangSource::kLws);
  EXPECT_EQ((*got)->key.name, "lws/1");
  EXPECT_EQ((*got)->min_member, 4u);
  EXPECT_TRUE(env.fake.Requests().empty());

  for (const char* bad : {"0", "-1", "four", "2.5"}) {
    auto b = env.source->Recognise(LwsPod(bad));
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << bad;
    EXPECT_THAT(b.status().message(), HasSubstr("LeaderWorkerSet ml/lws"));
  }
  EXPECT_TRUE(env.fake.Requests().empty());

  // Without the annotation the LeaderWorkerSet's size is read.
  env.source->Flush();
  auto missing = env.source->Recognise(LwsPod(nullptr));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.status().message(), HasSubstr("LeaderWorkerSet ml/lws (leaderworkerset.x-k8s.io/v1)"));
  env.fake.Put({{"apiVersion", "leaderworkerset.x-k8s.io/v1"},
                {"kind", "LeaderWorkerSet"},
                {"metadata", {{"name", "lws"}, {"namespace", "ml"}}},
                {"spec", {{"replicas", 2}, {"leaderWorkerTemplate", {{"size", 3}}}}}});
  env.clock.Advance(absl::Seconds(6));  // past the negative ttl
  auto read = env.source->Recognise(LwsPod(nullptr));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ((*read)->min_member, 3u);

  json half = Pod("half");
  half["metadata"]["labels"] = {{"leaderworkerset.sigs.k8s.io/name", "lws"}};
  EXPECT_EQ(env.source->Recognise(half).status().code(), absl::StatusCode::kFailedPrecondition);
}

json NativePodGroup(const std::string& version, const std::string& name, const json& policy) {
  return {{"apiVersion", "scheduling.k8s.io/" + version},
          {"kind", "PodGroup"},
          {"metadata", {{"name", name}, {"namespace", "ml"}}},
          {"spec", {{"schedulingPolicy", policy}}}};
}

json SchedulingGroupPod(const std::string& group) {
  json pod = Pod("w-0");
  pod["spec"]["schedulingGroup"] = {{"podGroupName", group}};
  return pod;
}

void CheckNativePodGroups(const std::string& kube_version, const std::string& version) {
  Env env({"--kube-version", kube_version, "--feature-gates", "GenericWorkload=true"});
  ASSERT_TRUE(env.fake.ok());
  env.fake.Put(NativePodGroup(version, "workers-0", {{"gang", {{"minCount", 4}}}}));
  env.fake.Put(NativePodGroup(version, "loose", {{"basic", json::object()}}));
  env.fake.Put(NativePodGroup(version, "zero", {{"gang", {{"minCount", 0}}}}));
  auto got = env.source->Recognise(SchedulingGroupPod("workers-0"));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->key.source, gang::GangSource::kWorkload);
  EXPECT_EQ((*got)->key.name, "workers-0");
  EXPECT_EQ((*got)->min_member, 4u);
  EXPECT_EQ(Gets(env.fake, "/apis/scheduling.k8s.io/" + version + "/namespaces/ml/podgroups/workers-0"), 1);

  auto basic = env.source->Recognise(SchedulingGroupPod("loose"));
  ASSERT_TRUE(basic.ok()) << basic.status();
  EXPECT_FALSE(basic->has_value());
  auto zero = env.source->Recognise(SchedulingGroupPod("zero"));
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(zero.status().message(), HasSubstr("PodGroup ml/zero"));
  auto missing = env.source->Recognise(SchedulingGroupPod("absent"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.status().message(), HasSubstr("PodGroup ml/absent (scheduling.k8s.io/" + version + ")"));
}

TEST(GangSourceTest, SchedulingGroupPodGroup136) { CheckNativePodGroups("1.36", "v1alpha2"); }
TEST(GangSourceTest, SchedulingGroupPodGroup137) { CheckNativePodGroups("1.37", "v1beta1"); }

TEST(GangSourceTest, SchedulingGroupWithoutTheApiIsRefused) {
  Env env({"--kube-version", "1.36"});  // GenericWorkload off (the default)
  ASSERT_TRUE(env.fake.ok());
  auto got = env.source->Recognise(SchedulingGroupPod("workers-0"));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(got.status().message(), HasSubstr("PodGroup ml/workers-0"));
}

TEST(GangSourceTest, WorkloadRef135) {
  Env env({"--kube-version", "1.35", "--feature-gates", "GenericWorkload=true"});
  ASSERT_TRUE(env.fake.ok());
  env.fake.Put({{"apiVersion", "scheduling.k8s.io/v1alpha1"},
                {"kind", "Workload"},
                {"metadata", {{"name", "training"}, {"namespace", "ml"}}},
                {"spec",
                 {{"podGroups",
                   {{{"name", "driver"}, {"policy", {{"basic", json::object()}}}},
                    {{"name", "workers"}, {"policy", {{"gang", {{"minCount", 2}}}}}}}}}}});
  auto ref = [](const json& r) {
    json pod = Pod("w");
    pod["spec"]["workloadRef"] = r;
    return pod;
  };
  auto got = env.source->Recognise(ref({{"name", "training"}, {"podGroup", "workers"}, {"podGroupReplicaKey", "1"}}));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->key.source, gang::GangSource::kWorkload);
  EXPECT_EQ((*got)->key.name, "training/workers/1");
  EXPECT_EQ((*got)->min_member, 2u);
  auto plain = env.source->Recognise(ref({{"name", "training"}, {"podGroup", "workers"}}));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->key.name, "training/workers");
  auto driver = env.source->Recognise(ref({{"name", "training"}, {"podGroup", "driver"}}));
  ASSERT_TRUE(driver.ok()) << driver.status();
  EXPECT_FALSE(driver->has_value());
  auto nope = env.source->Recognise(ref({{"name", "training"}, {"podGroup", "nope"}}));
  EXPECT_EQ(nope.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(nope.status().message(), HasSubstr("Workload ml/training"));
  auto absent = env.source->Recognise(ref({{"name", "other"}, {"podGroup", "workers"}}));
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(absent.status().message(), HasSubstr("Workload ml/other (scheduling.k8s.io/v1alpha1): not found"));
}

TEST(GangSourceTest, TpuSliceFromNodeSelector) {
  Env env({"--gang-crds"});
  ASSERT_TRUE(env.fake.ok());
  env.fake.Put(SchedulerPluginsPodGroup("slice", 4));
  json pod = WithLabels(Pod("t0"), {{"scheduling.x-k8s.io/pod-group", "slice"}});
  pod["spec"]["containers"][0]["resources"]["limits"] = {{"google.com/tpu", "4"}};
  pod["spec"]["nodeSelector"] = {{"cloud.google.com/gke-tpu-topology", "4x4"},
                                 {"cloud.google.com/gke-tpu-accelerator", "tpu-v5p-slice"}};
  auto got = env.source->Recognise(pod);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->tpu_topology, "4x4");
  EXPECT_EQ((*got)->tpu_accelerator, "tpu-v5p-slice");
  EXPECT_EQ((*got)->member.kind, DeviceKind::kTpu);
  EXPECT_EQ((*got)->member.count, 4u);

  pod["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] = 4;
  EXPECT_EQ(env.source->Recognise(pod).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GangSourceTest, DeclaredGangWinsOverImpliedOne) {
  Env env({"--gang-crds"});
  ASSERT_TRUE(env.fake.ok());
  env.fake.Put(SchedulerPluginsPodGroup("train", 5));
  json pod = JobSetPod("workers");
  pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = "train";
  auto got = env.source->Recognise(pod);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->key.source, gang::GangSource::kPodGroup);
  EXPECT_EQ((*got)->min_member, 5u);
}

TEST(GangSourceTest, OneReadPerTtlAndNegativeAnswersExpireSooner) {
  Env env({"--gang-crds"});
  ASSERT_TRUE(env.fake.ok());
  const std::string path = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ml/podgroups/train";
  json pod = WithLabels(Pod("p"), {{"scheduling.x-k8s.io/pod-group", "train"}});
  EXPECT_EQ(env.source->Recognise(pod).status().code(), absl::StatusCode::kFailedPrecondition);
  env.fake.Put(SchedulerPluginsPodGroup("train", 2));
  env.clock.Advance(absl::Seconds(4));  // "not found" holds for 5 s
  EXPECT_EQ(env.source->Recognise(pod).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Gets(env.fake, path), 1);
  env.clock.Advance(absl::Seconds(2));
  auto found = env.source->Recognise(pod);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ((*found)->min_member, 2u);
  EXPECT_EQ(Gets(env.fake, path), 2);

  // Many members at once, from several threads: no further read.
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      auto r = env.source->Recognise(pod);
      if (r.ok() && r->has_value() && (*r)->min_member == 2u) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 8);
  EXPECT_EQ(Gets(env.fake, path), 2);

  // The object changes; the cached size holds until the ttl (30 s) passes.
  env.fake.Put(SchedulerPluginsPodGroup("train", 6));
  env.clock.Advance(absl::Seconds(29));
  EXPECT_EQ((*env.source->Recognise(pod))->min_member, 2u);
  env.clock.Advance(absl::Seconds(2));
  EXPECT_EQ((*env.source->Recognise(pod))->min_member, 6u);
  EXPECT_EQ(Gets(env.fake, path), 3);
}

TEST(GangSourceTest, ApiUnreachableIsUnavailableAndNotCached) {
  Env env({"--gang-crds"});
  ASSERT_TRUE(env.fake.ok());
  env.fake.Put(SchedulerPluginsPodGroup("train", 2));
  json pod = WithLabels(Pod("p"), {{"scheduling.x-k8s.io/pod-group", "train"}});
  env.fake.Control("fail", {{"count", 1}, {"code", 503}});
  auto failed = env.source->Recognise(pod);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(failed.status().message(), HasSubstr("PodGroup ml/train"));
  auto again = env.source->Recognise(pod);  // at once: nothing was cached
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->min_member, 2u);

  KubeConfig nowhere;
  nowhere.server = "http://127.0.0.1:1";
  auto client = *NewCurlKubeClient(nowhere);
  GangSource source(client.get());
  EXPECT_EQ(source.Recognise(pod).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace k8s
}  // namespace duet
