// DraMode (bridge/server/dra_mode.h) on multi-host TPU slices (docs/gangs.md
// 5 and 6), in process against the fake API server (1.37), with TPU hosts
// whose chips Google's driver publishes as accel<N>: a single pod is lent
// no host of a multi-host slice (an Event on the pod says TPU_SLICE_WHOLE)
// but a single-host node whole; a TPU gang that selects a slice is reserved
// on every host of one free slice in one gang job; a TPU gang that selects
// none is lent for alone, never on a slice's host. The whole mode on real
// Slurm: tests/integration/dra_slice_e2e_test.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bridge/config/config.h"
#include "bridge/ledger/ledger.h"
#include "bridge/server/dra_mode.h"
#include "bridge/slurm/placeholders.h"
#include "gtest/gtest.h"
#include "k8s_adapter/event_recorder.h"
#include "k8s_adapter/kube_client.h"
#include "nlohmann/json.hpp"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_slurm.h"
#include "tests/fakes/wait.h"
#include "tests/gang/fake_gang.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace {

using json = nlohmann::json;
using k8s::testing::FakeApiServer;

constexpr char kDra[] = "/apis/resource.k8s.io/v1";
constexpr char kAccel[] = "tpu-v5-lite-podslice";

class DraSliceModeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(api_.ok());
    tmp_ = k8s::testing::MakeTempDir();
    tls_ = k8s::testing::MakeTestCerts(tmp_);
    Post(absl::StrCat(kDra, "/deviceclasses"), json::parse(R"({
      "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
      "metadata": {"name": "tpu.google.com"},
      "spec": {"selectors": [{"cel": {"expression": "device.driver == \"tpu.google.com\""}}],
               "extendedResourceName": "google.com/tpu"}})"));
    // Two slices of 2 hosts x 4 chips (2x4) and a single-host 2x2 node,
    // each its own node pool, as GKE makes them.
    for (const char* p : {"slice-a", "slice-b"}) {
      for (int h = 0; h < 2; ++h) AddNode(absl::StrCat(p, "-", h), p, "2x4");
    }
    AddNode("single-0", "single", "2x2");
    k8s::KubeConfig kc;
    kc.server = api_.url();
    absl::StatusOr<std::unique_ptr<k8s::KubeClient>> kube = k8s::NewCurlKubeClient(kc);
    ASSERT_TRUE(kube.ok()) << kube.status();
    kube_ = *std::move(kube);
    k8s::EventRecorderOptions eo;
    eo.events_per_minute = 6000;
    eo.burst = 100;
    events_ = std::make_unique<k8s::EventRecorder>(kube_.get(), eo);
  }
  void TearDown() override {
    if (mode_) mode_->Stop();
    mode_.reset();
    events_.reset();
    k8s::testing::RemoveTree(tmp_);
  }

  void AddNode(const std::string& name, const std::string& pool, const std::string& topology) {
    NodeSpec spec;
    spec.name = name;
    spec.pool = pool;
    spec.cpus = 64;
    spec.memory_mib = 256 * 1024;
    json devices = json::array();
    for (uint32_t c = 0; c < 4; ++c) {
      DeviceSpec d;
      d.kind = DeviceKind::kTpu;
      d.index = c;
      d.model = kAccel;
      d.topology.tpu_topology = topology;
      spec.devices.push_back(d);
      devices.push_back({{"name", absl::StrCat("accel", c)}});
    }
    ASSERT_TRUE(ledger_.UpsertNode(spec).ok());
    Post(absl::StrCat(kDra, "/resourceslices"),
         {{"apiVersion", "resource.k8s.io/v1"},
          {"kind", "ResourceSlice"},
          {"metadata", {{"name", absl::StrCat(name, "-tpu.google.com")}}},
          {"spec",
           {{"driver", "tpu.google.com"},
            {"nodeName", name},
            {"pool", {{"name", name}, {"generation", 1}, {"resourceSliceCount", 1}}},
            {"devices", devices}}}});
  }

  // Starts the mode lending `pools`; `gangs`: with the lending mode's gangs
  // (a PodGroup label names the gang, of `min-member` members, and its
  // node selector's gke-tpu-topology the slice).
  void StartMode(std::vector<std::string> pools, bool gangs) {
    config_.enabled = true;
    config_.pools = std::move(pools);
    config_.drivers = {"tpu.google.com"};
    config_.reclaim_after = absl::Hours(1);
    config_.webhook.cert_file = tls_.cert;
    config_.webhook.key_file = tls_.key;
    config_.webhook.listen = "127.0.0.1:0";
    config_.kube_version = "1.37";
    DraModeDeps d;
    d.config = &config_;
    d.ledger = &ledger_;
    d.kube = kube_.get();
    d.lends = &lends_;
    d.clock = &clock_;
    d.events = events_.get();
    if (gangs) {
      d.gangs.config = &gang_config_;
      d.gangs.maker = &maker_;
      d.gangs.planner = gang::fakes::SimplePlanner;
      d.gangs.events = events_.get();
      d.gangs.clock = &clock_;
      d.gang_of = [](const json& pod) -> absl::StatusOr<std::optional<gang::GangSpec>> {
        const json& meta = pod["metadata"];
        if (!meta.contains("labels") || !meta["labels"].contains("scheduling.x-k8s.io/pod-group")) {
          return std::nullopt;
        }
        gang::GangSpec s;
        s.key = gang::GangKey{meta["namespace"].get<std::string>(), gang::GangSource::kPodGroup,
                              meta["labels"]["scheduling.x-k8s.io/pod-group"].get<std::string>()};
        s.min_member = 2;
        const json& spec = pod["spec"];
        if (spec.contains("nodeSelector")) {
          s.tpu_topology =
              spec["nodeSelector"].value("cloud.google.com/gke-tpu-topology", std::string());
        }
        return s;
      };
    }
    absl::StatusOr<std::unique_ptr<DraMode>> m = DraMode::Start(std::move(d));
    ASSERT_TRUE(m.ok()) << m.status();
    mode_ = *std::move(m);
  }

  json Post(const std::string& path, const json& body) {
    absl::StatusOr<std::string> r = api_.control()->Post(path, body.dump());
    EXPECT_TRUE(r.ok()) << path << ": " << r.status();
    return r.ok() ? json::parse(*r) : json::object();
  }
  // Holdings on `node`.
  size_t Held(const std::string& node) { return ledger_.ListHoldings(node).size(); }
  // The TPU chips lend jobs hold on `node`.
  int Lent(const std::string& node) {
    int n = 0;
    for (const DeviceState& d : ledger_.GetNode(node)->devices) {
      n += d.uses.size() == 1 && d.uses.front().owner->kind == OwnerKind::kLend ? 1 : 0;
    }
    return n;
  }
  // The message of the Event `reason` on pod `name` ("" when none yet).
  std::string EventOn(const std::string& name, const std::string& reason) {
    absl::StatusOr<std::string> r = api_.control()->Get("/api/v1/namespaces/default/events");
    if (!r.ok()) return "";
    const json list = json::parse(*r);
    for (const json& e : list["items"]) {
      if (e["involvedObject"].value("name", "") == name && e.value("reason", "") == reason) {
        return e.value("message", "");
      }
    }
    return "";
  }

  // The in-memory slurmctld gives a lend job 4 chips (job 5000) on
  // whichever node it asks: a lend on a slice host would be made.
  void LendJobsGetChips() {
    SlurmAllocation a;
    a.job_id = 5000;
    a.devices.node = "single-0";
    a.devices.tpus = {0, 1, 2, 3};
    slurm_.set_allocation(a);
  }
  // Whether any chip of a slice host is held.
  bool AnySliceHostHeld() {
    for (const char* n : {"slice-a-0", "slice-a-1", "slice-b-0", "slice-b-1"}) {
      if (Held(n) != 0) return true;
    }
    return false;
  }

  // A pending pod asking 4 google.com/tpu that kube-scheduler marked
  // Unschedulable; of PodGroup `group` when set, selecting `topology`.
  void PendingPod(const std::string& name, const std::string& group = "",
                  const std::string& topology = "") {
    json pod = json::parse(R"({
      "apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "default"},
      "spec": {"containers": [{"name": "main", "image": "jax",
        "resources": {"requests": {"google.com/tpu": "4"}, "limits": {"google.com/tpu": "4"}}}]}})");
    pod["metadata"]["name"] = name;
    if (!group.empty()) pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = group;
    if (!topology.empty()) {
      pod["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] = topology;
    }
    pod = Post("/api/v1/namespaces/default/pods", pod);
    pod["status"]["conditions"] = json::array({{{"type", "PodScheduled"},
                                                {"status", "False"},
                                                {"reason", "Unschedulable"},
                                                {"message", "no node has the devices"}}});
    ASSERT_TRUE(api_.control()
                    ->Put(absl::StrCat("/api/v1/namespaces/default/pods/", name, "/status"),
                          pod.dump())
                    .ok());
  }

  FakeApiServer api_{std::vector<std::string>{"--kube-version", "1.37"}};
  std::string tmp_;
  k8s::testing::TlsFiles tls_;
  fakes::FakeClock clock_;  // never advanced: the pod informer wakes the loop
  Ledger ledger_;
  fakes::FakeSlurmClient slurm_;
  Placeholders lends_{&ledger_, &slurm_};
  gang::fakes::FakeGangMaker maker_{&ledger_};
  GangConfig gang_config_;
  DraConfig config_;
  std::unique_ptr<k8s::KubeClient> kube_;
  std::unique_ptr<k8s::EventRecorder> events_;
  std::unique_ptr<DraMode> mode_;
};

TEST_F(DraSliceModeTest, ASinglePodIsLentNoHostOfAMultiHostSliceAndIsToldWhy) {
  LendJobsGetChips();
  StartMode({"slice-a", "slice-b"}, /*gangs=*/false);
  PendingPod("solo");
  std::string why;
  // The Event is said where the lend would have been decided: by then a
  // lend on a slice host would be under way.
  ASSERT_TRUE(fakes::WaitFor(
      [&] { return !(why = EventOn("solo", "DuetLendRefused")).empty() || AnySliceHostHeld(); },
      fakes::kWaitTimeout, "a DuetLendRefused Event on the pod, or a lend"));
  EXPECT_TRUE(absl::StrContains(why, "TPU_SLICE_WHOLE")) << why;
  EXPECT_TRUE(absl::StrContains(why, "slice-a")) << why;
  EXPECT_TRUE(absl::StrContains(why, "2x4")) << why;
  EXPECT_FALSE(AnySliceHostHeld());
  EXPECT_TRUE(slurm_.asked_gangs().empty());
}

TEST_F(DraSliceModeTest, ASinglePodIsLentASingleHostNodeWhole) {
  LendJobsGetChips();
  StartMode({"slice-a", "single"}, /*gangs=*/false);
  PendingPod("solo");
  ASSERT_TRUE(fakes::WaitFor([&] { return Lent("single-0") == 4; }, fakes::kWaitTimeout,
                             "every chip of the single-host node lent"));
  EXPECT_EQ(Held("slice-a-0"), 0u);
  EXPECT_EQ(Held("slice-a-1"), 0u);
}

TEST_F(DraSliceModeTest, ATpuGangIsReservedOnEveryHostOfOneFreeSliceInOneJob) {
  StartMode({"slice-a", "slice-b"}, /*gangs=*/true);
  // Slurm holds a chip of slice-a: the gang takes slice-b.
  HoldRequest h;
  h.node = "slice-a-1";
  h.owner = Owner::SlurmJob(42);
  h.count = CountSelector{DeviceKind::kTpu, 1, 0, ""};
  ASSERT_TRUE(ledger_.Hold(h).ok());
  PendingPod("w-0", "slice", "2x4");
  PendingPod("w-1", "slice", "2x4");
  ASSERT_TRUE(fakes::WaitFor([&] { return maker_.creates().size() == 1; }, fakes::kWaitTimeout,
                             "one gang job"));
  const std::vector<gang::GangNode> nodes = maker_.creates()[0].nodes;
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].node, "slice-b-0");
  EXPECT_EQ(nodes[1].node, "slice-b-1");
  EXPECT_EQ(nodes[0].members, 1u);
  for (const char* n : {"slice-b-0", "slice-b-1"}) {
    std::vector<Holding> held = ledger_.ListHoldings(n);
    ASSERT_EQ(held.size(), 1u) << n;
    EXPECT_EQ(held[0].devices.size(), 4u) << n;  // every chip of the host
  }
  EXPECT_EQ(Held("slice-a-0"), 0u);
  ASSERT_TRUE(fakes::WaitFor(
      [&] {
        std::optional<gang::GangInfo> g = mode_->gang_registry()->Find(
            gang::GangKey{"default", gang::GangSource::kPodGroup, "slice"});
        return g.has_value() && g->state == gang::GangState::kComplete;
      },
      fakes::kWaitTimeout, "the gang complete"));
  EXPECT_EQ(maker_.creates().size(), 1u);
}

TEST_F(DraSliceModeTest, ATpuGangWithNoSuchSliceInTheLendingPoolsHoldsNothingAndSaysWhy) {
  StartMode({"slice-a", "slice-b"}, /*gangs=*/true);
  PendingPod("w-0", "big", "4x4");
  std::string why;
  ASSERT_TRUE(fakes::WaitFor([&] { return !(why = EventOn("w-0", "DuetGangUnplaceable")).empty(); },
                             fakes::kWaitTimeout, "a DuetGangUnplaceable Event on the member"));
  EXPECT_TRUE(absl::StrContains(why, "GANG_NO_ROOM")) << why;
  EXPECT_TRUE(absl::StrContains(why, "4x4")) << why;
  EXPECT_TRUE(maker_.creates().empty());
  EXPECT_EQ(ledger_.holding_count(), 0u);
}

TEST_F(DraSliceModeTest, ATpuGangThatSelectsNoSliceIsGivenNoSlicesHost) {
  LendJobsGetChips();
  StartMode({"slice-a", "slice-b"}, /*gangs=*/true);
  PendingPod("w-0", "loose");
  std::string why;
  ASSERT_TRUE(fakes::WaitFor(
      [&] { return !(why = EventOn("w-0", "DuetLendRefused")).empty() || AnySliceHostHeld(); },
      fakes::kWaitTimeout, "a DuetLendRefused Event on the member, or a lend"));
  EXPECT_TRUE(absl::StrContains(why, "TPU_SLICE_WHOLE")) << why;
  EXPECT_TRUE(maker_.creates().empty());
  EXPECT_EQ(ledger_.holding_count(), 0u);
}

}  // namespace
}  // namespace duet
