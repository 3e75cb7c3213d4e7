// DraMode (bridge/server/dra_mode.h), the DRA lending mode's wiring, in
// process against the fake API server (1.37, resource.k8s.io/v1), the
// in-memory slurmctld and a clock that never moves: a pod kube-scheduler
// marks Unschedulable is lent its devices as soon as the pending-pod
// informer sees it, not at the loop's next 200 ms pass (which never comes
// on this clock). The whole mode with real Slurm: tests/integration/
// dra_e2e_test.

#include "bridge/server/dra_mode.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bridge/config/config.h"
#include "bridge/ledger/ledger.h"
#include "bridge/slurm/placeholders.h"
#include "gtest/gtest.h"
#include "k8s_adapter/kube_client.h"
#include "nlohmann/json.hpp"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_slurm.h"
#include "tests/fakes/gate.h"
#include "tests/fakes/wait.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace {

using json = nlohmann::json;
using k8s::testing::FakeApiServer;

constexpr char kNode[] = "gpu-node-1";
constexpr char kPool[] = "lend-h100";
constexpr char kDra[] = "/apis/resource.k8s.io/v1";

// The placeholders, with each lend job first passing the gate when one is
// set (a test that lends run at once).
class GatedLends final : public dra::LendMaker {
 public:
  explicit GatedLends(dra::LendMaker* lends) : lends_(lends) {}
  void SetGate(fakes::Gate* gate) { gate_ = gate; }
  absl::StatusOr<Holding> CreateLend(const std::string& node, DeviceKind kind,
                                     uint32_t count) override {
    if (fakes::Gate* g = gate_.load(); g != nullptr) g->Arrive();
    return lends_->CreateLend(node, kind, count);
  }
  absl::Status CancelLend(const std::string& node, uint32_t job_id) override {
    return lends_->CancelLend(node, job_id);
  }

 private:
  dra::LendMaker* const lends_;
  std::atomic<fakes::Gate*> gate_{nullptr};
};

class DraModeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(api_.ok());
    tmp_ = k8s::testing::MakeTempDir();
    tls_ = k8s::testing::MakeTestCerts(tmp_);
    Post(absl::StrCat(kDra, "/deviceclasses"), json::parse(R"({
      "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
      "metadata": {"name": "gpu.nvidia.com"},
      "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.nvidia.com\""}}],
               "extendedResourceName": "nvidia.com/gpu"}})"));
    // gpu-node-1 (kNode), gpu-node-2, ...: 4 GPUs each.
    for (int n = 1; n <= nodes_; ++n) {
      const std::string name = absl::StrCat("gpu-node-", n);
      NodeSpec spec;
      spec.name = name;
      spec.pool = kPool;
      json devices = json::array();
      for (uint32_t g = 0; g < 4; ++g) {
        DeviceSpec d;
        d.index = g;
        d.id = absl::StrCat("GPU-", g, "-4f1d-11ee-be56-0242ac12000", n);
        spec.devices.push_back(d);
        devices.push_back({{"name", absl::StrCat("gpu-", g)},
                           {"attributes", {{"uuid", {{"string", d.id}}}}}});
      }
      ASSERT_TRUE(ledger_.UpsertNode(spec).ok());
      Post(absl::StrCat(kDra, "/resourceslices"),
           {{"apiVersion", "resource.k8s.io/v1"},
            {"kind", "ResourceSlice"},
            {"metadata", {{"name", absl::StrCat(name, "-gpu.nvidia.com")}}},
            {"spec",
             {{"driver", "gpu.nvidia.com"},
              {"nodeName", name},
              {"pool", {{"name", name}, {"generation", 1}, {"resourceSliceCount", 1}}},
              {"devices", devices}}}});
    }
    config_.enabled = true;
    config_.pools = {kPool};
    config_.drivers = {"gpu.nvidia.com"};
    config_.reclaim_after = absl::Hours(1);
    config_.webhook.cert_file = tls_.cert;
    config_.webhook.key_file = tls_.key;
    config_.webhook.listen = "127.0.0.1:0";
    config_.kube_version = "1.37";
    k8s::KubeConfig kc;
    kc.server = api_.url();
    absl::StatusOr<std::unique_ptr<k8s::KubeClient>> kube = k8s::NewCurlKubeClient(kc);
    ASSERT_TRUE(kube.ok()) << kube.status();
    kube_ = *std::move(kube);
    DraModeDeps d;
    d.config = &config_;
    d.ledger = &ledger_;
    d.kube = kube_.get();
    d.lends = &gated_;
    d.clock = &clock_;
    absl::StatusOr<std::unique_ptr<DraMode>> m = DraMode::Start(std::move(d));
    ASSERT_TRUE(m.ok()) << m.status();
    mode_ = *std::move(m);
  }
  void TearDown() override {
    if (mode_) mode_->Stop();
    k8s::testing::RemoveTree(tmp_);
  }

  json Post(const std::string& path, const json& body) {
    absl::StatusOr<std::string> r = api_.control()->Post(path, body.dump());
    EXPECT_TRUE(r.ok()) << path << ": " << r.status();
    return r.ok() ? json::parse(*r) : json::object();
  }
  int Rules() {
    absl::StatusOr<std::string> r = api_.control()->Get(absl::StrCat(kDra, "/devicetaintrules"));
    return r.ok() ? static_cast<int>(json::parse(*r)["items"].size()) : -1;
  }
  int Lent(const std::string& node = kNode) {
    int n = 0;
    for (const DeviceState& d : ledger_.GetNode(node)->devices) {
      n += d.uses.size() == 1 && d.uses.front().owner->kind == OwnerKind::kLend ? 1 : 0;
    }
    return n;
  }

  // A pending pod asking `gpus` of nvidia.com/gpu that kube-scheduler then
  // marks Unschedulable (as tests/fakes/test_scheduler.py writes it).
  void PendingPod(const std::string& name, int gpus) {
    const std::string n = std::to_string(gpus);
    json pod = Post("/api/v1/namespaces/default/pods", json::parse(absl::StrCat(R"({
      "apiVersion": "v1", "kind": "Pod", "metadata": {"name": ")", name, R"(", "namespace": "default"},
      "spec": {"containers": [{"name": "main", "image": "pytorch",
        "resources": {"requests": {"nvidia.com/gpu": ")", n, R"("}, "limits": {"nvidia.com/gpu": ")", n, R"("}}}]}})")));
    pod["status"]["conditions"] = json::array({{{"type", "PodScheduled"},
                                                {"status", "False"},
                                                {"reason", "Unschedulable"},
                                                {"message", "no node has the devices"}}});
    ASSERT_TRUE(api_.control()
                    ->Put(absl::StrCat("/api/v1/namespaces/default/pods/", name, "/status"),
                          pod.dump())
                    .ok());
  }

  int nodes_ = 1;  // lending nodes of 4 GPUs (set before SetUp)
  FakeApiServer api_{std::vector<std::string>{"--kube-version", "1.37"}};
  std::string tmp_;
  k8s::testing::TlsFiles tls_;
  fakes::FakeClock clock_;  // never advanced: the loop's 200 ms pass never comes
  Ledger ledger_;
  fakes::FakeSlurmClient slurm_;
  Placeholders lends_{&ledger_, &slurm_};
  GatedLends gated_{&lends_};
  std::unique_ptr<fakes::Gate> gate_;  // outlives mode_ (a lend may still pass it)
  DraConfig config_;
  std::unique_ptr<k8s::KubeClient> kube_;
  std::unique_ptr<DraMode> mode_;
};

TEST_F(DraModeTest, APodMarkedUnschedulableIsLentAtOnceNotAtTheNextPass) {
  const absl::Time start = clock_.Now();
  ASSERT_EQ(Rules(), 4);  // Start's resync: every device not lent is tainted
  json pod = Post("/api/v1/namespaces/default/pods", json::parse(R"({
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "default"},
    "spec": {"containers": [{"name": "main", "image": "pytorch",
      "resources": {"requests": {"nvidia.com/gpu": "2"}, "limits": {"nvidia.com/gpu": "2"}}}]}})"));
  // kube-scheduler gives up on it (as tests/fakes/test_scheduler.py writes it).
  pod["status"]["conditions"] = json::array({{{"type", "PodScheduled"},
                                              {"status", "False"},
                                              {"reason", "Unschedulable"},
                                              {"message", "no node has the devices"}}});
  ASSERT_TRUE(
      api_.control()->Put("/api/v1/namespaces/default/pods/train/status", pod.dump()).ok());
  ASSERT_TRUE(fakes::WaitFor([&] { return Lent() == 2 && Rules() == 2; }, fakes::kWaitTimeout,
                             "two GPUs lent and their DeviceTaintRules deleted"));
  EXPECT_EQ(clock_.Now(), start);  // no 200 ms pass came
}

TEST_F(DraModeTest, AChangedNodeInTheLedgerRebuildsTheMapWithoutAnySliceChange) {
  ASSERT_EQ(Rules(), 4);
  // The inventory now says GPU 0 is another GPU than the one the driver
  // publishes as gpu-0: the node no longer maps (uuid mismatch), so nothing
  // of it may be lent and its rules go. No slice changes: only the ledger's
  // change listener can tell the loop to read the inventory again.
  NodeSpec spec = ledger_.GetNode(kNode)->spec;
  for (const DeviceState& d : ledger_.GetNode(kNode)->devices) spec.devices.push_back(d.spec);
  spec.devices[0].id = "GPU-ffffffff-4f1d-11ee-be56-0242ac120002";
  ASSERT_TRUE(ledger_.UpsertNode(spec).ok());
  ASSERT_TRUE(fakes::WaitFor(
      [&] {
        clock_.Advance(absl::Milliseconds(200));  // the loop's passes
        return Rules() == 0;
      },
      fakes::kWaitTimeout, "the unmappable node's DeviceTaintRules gone"));
}

TEST_F(DraModeTest, AChangedSliceIsAppliedToTheMapWithoutAnInventoryChange) {
  ASSERT_EQ(Rules(), 4);
  // The driver republishes gpu-0 with another uuid: only the slice informer
  // tells the loop (DeviceMap::Apply of that slice); the node no longer maps
  // and its rules go. Then it republishes the right uuid: lendable again.
  const std::string path = absl::StrCat(kDra, "/resourceslices/", kNode, "-gpu.nvidia.com");
  absl::StatusOr<std::string> got = api_.control()->Get(path);
  ASSERT_TRUE(got.ok()) << got.status();
  json slice = json::parse(*got);
  const json good = slice;
  slice["spec"]["devices"][0]["attributes"]["uuid"]["string"] =
      "GPU-ffffffff-4f1d-11ee-be56-0242ac120002";
  ASSERT_TRUE(api_.control()->Put(path, slice.dump()).ok());
  ASSERT_TRUE(fakes::WaitFor(
      [&] {
        clock_.Advance(absl::Milliseconds(200));  // the loop's passes
        return Rules() == 0;
      },
      fakes::kWaitTimeout, "the unmappable node's DeviceTaintRules gone"));
  got = api_.control()->Get(path);
  ASSERT_TRUE(got.ok()) << got.status();
  json fixed = good;
  fixed["metadata"]["resourceVersion"] = json::parse(*got)["metadata"]["resourceVersion"];
  ASSERT_TRUE(api_.control()->Put(path, fixed.dump()).ok());
  ASSERT_TRUE(fakes::WaitFor(
      [&] {
        clock_.Advance(absl::Milliseconds(200));
        return Rules() == 4;
      },
      fakes::kWaitTimeout, "the node mappable again, its free devices tainted"));
}

TEST_F(DraModeTest, TwoPodsPendingAtOnceAreLentConcurrently) {
  ASSERT_EQ(Rules(), 4);
  // Each lend job (one GPU per pod) waits until both are in flight: pods
  // served one after the other would leave the first waiting for the gate's
  // timeout.
  gate_ = std::make_unique<fakes::Gate>(2);
  gated_.SetGate(gate_.get());
  PendingPod("a", 1);
  PendingPod("b", 1);
  ASSERT_TRUE(fakes::WaitFor([&] { return gate_->arrived() >= 2 && Lent() == 2 && Rules() == 2; },
                             fakes::kWaitTimeout + absl::Seconds(10),
                             "two GPUs lent, one per pod, and their DeviceTaintRules deleted"));
  EXPECT_FALSE(gate_->timed_out()) << "the two pods' lends did not run at once";
  EXPECT_EQ(gate_->arrived(), 2);  // one lend job per pod: neither pod was lent twice
}

class DraModeTwoNodesTest : public DraModeTest {
 protected:
  void SetUp() override {
    nodes_ = 2;
    DraModeTest::SetUp();
  }
};

TEST_F(DraModeTwoNodesTest, PodsLentAtOnceNeverPickTheSameFreeDevices) {
  ASSERT_EQ(Rules(), 8);
  // Each pod asks 3 of a node's 4 GPUs, and its 3 lend jobs wait until both
  // pods' 6 are in flight. The second pick must count the first pod's 3 as
  // taken: on the same node only 1 would be left for it.
  gate_ = std::make_unique<fakes::Gate>(6);
  gated_.SetGate(gate_.get());
  PendingPod("a", 3);
  PendingPod("b", 3);
  ASSERT_TRUE(fakes::WaitFor(
      [&] { return gate_->arrived() >= 6 && Lent("gpu-node-1") + Lent("gpu-node-2") == 6; },
      fakes::kWaitTimeout + absl::Seconds(10), "six GPUs lent, three per pod"));
  EXPECT_FALSE(gate_->timed_out()) << "the two pods' lends did not run at once";
  EXPECT_EQ(Lent("gpu-node-1"), 3);
  EXPECT_EQ(Lent("gpu-node-2"), 3);
  EXPECT_TRUE(fakes::WaitFor([&] { return Rules() == 2; }, fakes::kWaitTimeout,
                             "the six lent GPUs' DeviceTaintRules deleted"));
  EXPECT_EQ(gate_->arrived(), 6);
}

}  // namespace
}  // namespace duet
