// duet-node's pure decisions: slot IDs, health, the Allocate matching rule,
// pending pods from a PodList and container responses.

#include "k8s_adapter/device_plugin/allocation.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"

namespace duet {
namespace node {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

TEST(SlotIdTest, RoundTripsAndRejectsOthers) {
  EXPECT_EQ(SlotId(DeviceKind::kGpu, 3), "gpu-slot-3");
  EXPECT_EQ(ParseSlotId(DeviceKind::kGpu, "gpu-slot-3"), 3);
  EXPECT_EQ(ParseSlotId(DeviceKind::kTpu, "tpu-slot-0"), 0);
  EXPECT_FALSE(ParseSlotId(DeviceKind::kTpu, "gpu-slot-0"));
  EXPECT_FALSE(ParseSlotId(DeviceKind::kGpu, "gpu-slot-"));
  EXPECT_FALSE(ParseSlotId(DeviceKind::kGpu, "gpu-slot-01"));
  EXPECT_FALSE(ParseSlotId(DeviceKind::kGpu, "gpu-slot--1"));
  EXPECT_FALSE(ParseSlotId(DeviceKind::kGpu, "nvidia0"));
}

TEST(ChooseUnhealthyTest, FreeSlotsFromTheTopAndAllocatedOnlyWhenForced) {
  EXPECT_THAT(ChooseUnhealthy(8, 0, {}, {}), ElementsAre());
  EXPECT_THAT(ChooseUnhealthy(8, 2, {}, {}), ElementsAre(6, 7));
  // Slots kubelet gave pods are avoided.
  EXPECT_THAT(ChooseUnhealthy(4, 2, {2, 3}, {}), ElementsAre(0, 1));
  // Already-Unhealthy slots stay so (no churn), unless a pod now has one.
  EXPECT_THAT(ChooseUnhealthy(8, 2, {}, {1, 4}), ElementsAre(1, 4));
  EXPECT_THAT(ChooseUnhealthy(8, 2, {4}, {1, 4}), ElementsAre(1, 7));
  // Shrinking keeps the older choice first.
  EXPECT_THAT(ChooseUnhealthy(8, 1, {}, {1, 4}), ElementsAre(1));
  // More Slurm devices than free slots: allocated slots too, from the top.
  EXPECT_THAT(ChooseUnhealthy(4, 3, {0, 1, 2}, {}), ElementsAre(1, 2, 3));
  EXPECT_EQ(ChooseUnhealthy(4, 9, {}, {}).size(), 4u);
}

TEST(PreferredSlotsTest, MustIncludeThenLowest) {
  EXPECT_THAT(PreferredSlots(DeviceKind::kGpu, {"gpu-slot-5", "gpu-slot-2", "gpu-slot-10"},
                             {"gpu-slot-10"}, 2),
              ElementsAre("gpu-slot-10", "gpu-slot-2"));
  EXPECT_THAT(PreferredSlots(DeviceKind::kGpu, {"gpu-slot-1"}, {}, 3), ElementsAre("gpu-slot-1"));
}

v1::Holding PlaceholderHolding(uint32_t job, const std::string& uid, std::vector<uint32_t> gpus,
                               int64_t granted) {
  v1::Holding h;
  h.mutable_owner()->mutable_placeholder()->set_job_id(job);
  h.mutable_owner()->mutable_placeholder()->set_pod_uid(uid);
  h.set_node("n");
  for (uint32_t g : gpus) {
    auto* d = h.add_devices();
    d->set_kind(v1::DEVICE_KIND_GPU);
    d->set_index(g);
  }
  *h.mutable_granted_at() = google::protobuf::util::TimeUtil::SecondsToTimestamp(granted);
  return h;
}

v1::Holding SlurmHolding(uint32_t job, std::vector<uint32_t> gpus) {
  v1::Holding h;
  h.mutable_owner()->mutable_slurm_job()->set_job_id(job);
  for (uint32_t g : gpus) {
    auto* d = h.add_devices();
    d->set_kind(v1::DEVICE_KIND_GPU);
    d->set_index(g);
  }
  return h;
}

TEST(ClaimsOfTest, GroupsPodAndPlaceholderAndSkipsSlurm) {
  v1::Holding pod;
  pod.mutable_owner()->mutable_pod()->set_uid("a");
  pod.mutable_owner()->mutable_pod()->set_namespace_("ml");
  pod.mutable_owner()->mutable_pod()->set_name("train");
  auto* d = pod.add_devices();
  d->set_kind(v1::DEVICE_KIND_GPU);
  d->set_index(4);
  auto claims = ClaimsOf({SlurmHolding(9, {0}), PlaceholderHolding(5, "a", {4, 2}, 10), pod},
                         DeviceKind::kGpu);
  ASSERT_EQ(claims.size(), 1u);
  EXPECT_EQ(claims[0].uid, "a");
  EXPECT_EQ(claims[0].ns, "ml");
  EXPECT_EQ(claims[0].placeholder_job, 5u);
  EXPECT_THAT(claims[0].devices, ElementsAre(2, 4));
  EXPECT_TRUE(ClaimsOf({PlaceholderHolding(5, "a", {4}, 1)}, DeviceKind::kTpu).empty());
}

TEST(MatchClaimTest, ExactCountThenOldest) {
  MatchInput in;
  in.kind = DeviceKind::kGpu;
  in.claims =
      ClaimsOf({PlaceholderHolding(1, "old2", {0, 1}, 100), PlaceholderHolding(2, "new1", {5}, 300),
                PlaceholderHolding(3, "old1", {6}, 200)},
               DeviceKind::kGpu);
  in.count = 1;
  auto m = MatchClaim(in);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->claim.uid, "old1");  // exact count beats the older 2-GPU pod
  EXPECT_THAT(m->devices, ElementsAre(6));
  in.count = 2;
  m = MatchClaim(in);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->claim.uid, "old2");
  EXPECT_THAT(m->devices, ElementsAre(0, 1));
  in.count = 3;
  EXPECT_EQ(MatchClaim(in).status().code(), absl::StatusCode::kNotFound);
}

TEST(MatchClaimTest, SkipsServedAndHandedOutAndNonPending) {
  MatchInput in;
  in.kind = DeviceKind::kGpu;
  in.claims =
      ClaimsOf({PlaceholderHolding(1, "a", {0, 1}, 100), PlaceholderHolding(2, "b", {2}, 200)},
               DeviceKind::kGpu);
  in.count = 1;
  in.served = {"b"};
  // "a" has two left; a first container took device 0.
  in.handed_out["a"] = {0};
  auto m = MatchClaim(in);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->claim.uid, "a");
  EXPECT_THAT(m->devices, ElementsAre(1));
  in.handed_out["a"] = {0, 1};
  EXPECT_FALSE(MatchClaim(in).ok());
  // With the Kubernetes API, only pods pending here asking the resource.
  in.handed_out.clear();
  in.served.clear();
  PendingPod b;
  b.uid = "b";
  b.gpus = 1;
  in.pending = std::vector<PendingPod>{b};
  m = MatchClaim(in);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->claim.uid, "b");
}

TEST(PickBypassPodTest, OnlyPodsWithoutHoldings) {
  PendingPod a{"a", "ns", "a", "2026-01-01T00:00:02Z", 2, 0, 1, 0};
  PendingPod b{"b", "ns", "b", "2026-01-01T00:00:01Z", 2, 0, 1, 0};
  PendingPod c{"c", "ns", "c", "2026-01-01T00:00:00Z", 4, 0, 1, 0};
  auto p = PickBypassPod(DeviceKind::kGpu, 2, {a, b, c}, {PlaceholderHolding(1, "b", {0, 1}, 1)});
  ASSERT_TRUE(p);
  EXPECT_EQ(p->uid, "a");  // b holds already; c asks more than 2 (exact first)
  p = PickBypassPod(DeviceKind::kGpu, 3, {a, b, c}, {});
  ASSERT_TRUE(p);
  EXPECT_EQ(p->uid, "c");
  EXPECT_FALSE(PickBypassPod(DeviceKind::kTpu, 1, {a, b, c}, {}));
}

TEST(PendingPodsTest, ReadsRequestsAndFiltersPhases) {
  nlohmann::json list = nlohmann::json::parse(R"({
    "kind": "PodList", "items": [
      {"metadata": {"uid": "u1", "namespace": "ml", "name": "a", "creationTimestamp": "t1"},
       "spec": {"nodeName": "n",
                "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "3"}}}],
                "containers": [
                  {"name": "c1", "resources": {"limits": {"nvidia.com/gpu": "1"},
                                               "requests": {"cpu": "500m", "memory": "1Gi"}}},
                  {"name": "c2", "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "2",
                                                            "memory": "512Mi"}}}]},
       "status": {"phase": "Pending"}},
      {"metadata": {"uid": "u2", "namespace": "ml", "name": "running"},
       "spec": {"nodeName": "n", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
       "status": {"phase": "Running"}},
      {"metadata": {"uid": "u3", "namespace": "ml", "name": "cpu-only"},
       "spec": {"nodeName": "n", "containers": [{"resources": {}}]}},
      {"metadata": {"uid": "u4", "namespace": "ml", "name": "elsewhere"},
       "spec": {"nodeName": "m", "containers": [{"resources": {"limits": {"google.com/tpu": "4"}}}]}},
      {"metadata": {"uid": "u5", "namespace": "ml", "name": "tpu", "deletionTimestamp": null},
       "spec": {"nodeName": "n", "containers": [{"resources": {"limits": {"google.com/tpu": "4"}}}]}}
    ]})");
  auto pods = PendingPodsFromList(list, "n");
  ASSERT_TRUE(pods.ok()) << pods.status();
  ASSERT_EQ(pods->size(), 2u);
  EXPECT_EQ((*pods)[0].uid, "u1");
  EXPECT_EQ((*pods)[0].gpus, 3u);  // the init container asks more than the sum
  EXPECT_EQ((*pods)[0].cpus, 3u);  // 2.5 rounded up
  EXPECT_EQ((*pods)[0].memory_mib, 1536u);
  EXPECT_EQ((*pods)[1].uid, "u5");
  EXPECT_EQ((*pods)[1].tpus, 4u);
  EXPECT_THAT(PodUidsByName(list), testing::Contains(Pair("ml/running", "u2")));
  EXPECT_FALSE(PendingPodsFromList(nlohmann::json::parse("{}"), "n").ok());
}

// Inside Allocate (a gRPC handler) a wrongly typed field must be a Status,
// not a nlohmann exception.
TEST(PendingPodsTest, WronglyTypedFieldsAreInvalidArgumentNotExceptions) {
  const struct {
    const char* pod;
    const char* want;
  } kCases[] = {
      {R"({"metadata": {"uid": 5}, "spec": {"nodeName": "n", "containers": []}})",
       "pod list items[0].metadata.uid: not a string"},
      {R"({"metadata": {"uid": "u"}, "spec": {"nodeName": ["n"], "containers": []}})",
       "pod list items[0].spec.nodeName: not a string"},
      {R"({"metadata": {"uid": "u"}, "spec": {"nodeName": "n", "containers": []}, "status": {"phase": 1}})",
       "pod list items[0].status.phase: not a string"},
      {R"({"metadata": "x", "spec": {"nodeName": "n"}})", "pod list items[0]: metadata or spec is not an object"},
      {R"({"metadata": {"uid": "u", "name": "p"}, "spec": {"nodeName": "n", "containers": 7}})",
       "pod /p: spec.containers: missing or not a list"},
      {R"({"metadata": {"uid": "u", "name": "p"},
           "spec": {"nodeName": "n", "containers": [{"resources": {"limits": {"nvidia.com/gpu": {}}}}]}})",
       "pod /p: spec.containers[0].resources.limits[nvidia.com/gpu]: not a quantity"},
  };
  for (const auto& c : kCases) {
    nlohmann::json list = {{"items", nlohmann::json::array({nlohmann::json::parse(c.pod)})}};
    absl::StatusOr<std::vector<PendingPod>> pods = PendingPodsFromList(list, "n");
    ASSERT_FALSE(pods.ok()) << c.pod;
    EXPECT_EQ(pods.status().code(), absl::StatusCode::kInvalidArgument) << c.pod;
    EXPECT_THAT(std::string(pods.status().message()), HasSubstr(c.want)) << c.pod;
  }
  nlohmann::json names = nlohmann::json::parse(
      R"({"items": [{"metadata": {"namespace": "a", "name": 1, "uid": "u1"}},
                    {"metadata": {"namespace": "a", "name": "b", "uid": "u2"}}, 3]})");
  EXPECT_THAT(PodUidsByName(names), ElementsAre(Pair("a/b", "u2")));
}

class ContainerResponseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("duet-dev-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    for (const char* f : {"nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "accel0",
                          "accel1", "accel2", "accel3"}) {
      std::ofstream(dir_ / f) << "";
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(ContainerResponseTest, GpusGetTheirNodesAndVariables) {
  auto r = ContainerResponse(DeviceKind::kGpu, {1, 3}, dir_.string());
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::pair<std::string, std::string>> devs;
  for (const auto& d : r->devices()) devs.emplace_back(d.host_path(), d.container_path());
  EXPECT_THAT(devs, ElementsAre(Pair(dir_.string() + "/nvidia1", "/dev/nvidia1"),
                                Pair(dir_.string() + "/nvidia3", "/dev/nvidia3"),
                                Pair(dir_.string() + "/nvidiactl", "/dev/nvidiactl")));
  EXPECT_THAT(r->envs(), UnorderedElementsAre(Pair("NVIDIA_VISIBLE_DEVICES", "1,3"),
                                              Pair("CUDA_VISIBLE_DEVICES", "0,1")));
}

TEST_F(ContainerResponseTest, TpusGetTheSpankVariables) {
  auto r = ContainerResponse(DeviceKind::kTpu, {0, 1, 2, 3}, dir_.string());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->devices_size(), 4);
  EXPECT_EQ(r->devices(2).container_path(), "/dev/accel2");
  EXPECT_THAT(r->envs(), UnorderedElementsAre(Pair("TPU_VISIBLE_CHIPS", "0,1,2,3"),
                                              Pair("TPU_CHIPS_PER_PROCESS_BOUNDS", "2,2,1"),
                                              Pair("TPU_PROCESS_BOUNDS", "1,1,1")));
}

TEST_F(ContainerResponseTest, AMissingDeviceNodeIsAnError) {
  auto r = ContainerResponse(DeviceKind::kGpu, {7}, dir_.string());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("nvidia7 does not exist"));
}

}  // namespace
}  // namespace node
}  // namespace duet
