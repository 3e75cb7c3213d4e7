// DraMode (bridge/server/dra_mode.h), the DRA lending mode's wiring, in
// process against the fake API server (1.37, resource.k8s.io/v1), the
// in-memory slurmctld and a clock that never moves: a pod kube-scheduler
// marks Unschedulable is lent its devices as soon as the pending-pod
// informer sees it, not at the loop's next 200 ms pass (which never comes
// on this clock). The whole mode with real Slurm: tests/integration/
// dra_e2e_test.

#include "bridge/server/dra_mode.h"

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
#include "tests/fakes/wait.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace {

using json = nlohmann::json;
using k8s::testing::FakeApiServer;

constexpr char kNode[] = "gpu-node-1";
constexpr char kPool[] = "lend-h100";
constexpr char kDra[] = "/apis/resource.k8s.io/v1";

class DraModeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(api_.ok());
    tmp_ = k8s::testing::MakeTempDir();
    tls_ = k8s::testing::MakeTestCerts(tmp_);
    NodeSpec spec;
    spec.name = kNode;
    spec.pool = kPool;
    json devices = json::array();
    for (uint32_t g = 0; g < 4; ++g) {
      DeviceSpec d;
      d.index = g;
      d.id = absl::StrCat("GPU-", g, "-4f1d-11ee-be56-0242ac120002");
      spec.devices.push_back(d);
      devices.push_back({{"name", absl::StrCat("gpu-", g)},
                         {"attributes", {{"uuid", {{"string", d.id}}}}}});
    }
    ASSERT_TRUE(ledger_.UpsertNode(spec).ok());
    Post(absl::StrCat(kDra, "/deviceclasses"), json::parse(R"({
      "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
      "metadata": {"name": "gpu.nvidia.com"},
      "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.nvidia.com\""}}],
               "extendedResourceName": "nvidia.com/gpu"}})"));
    Post(absl::StrCat(kDra, "/resourceslices"),
         {{"apiVersion", "resource.k8s.io/v1"},
          {"kind", "ResourceSlice"},
          {"metadata", {{"name", absl::StrCat(kNode, "-gpu.nvidia.com")}}},
          {"spec",
           {{"driver", "gpu.nvidia.com"},
            {"nodeName", kNode},
            {"pool", {{"name", kNode}, {"generation", 1}, {"resourceSliceCount", 1}}},
            {"devices", devices}}}});
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
    d.lends = &lends_;
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
  int Lent() {
    int n = 0;
    for (const DeviceState& d : ledger_.GetNode(kNode)->devices) {
      n += d.uses.size() == 1 && d.uses.front().owner->kind == OwnerKind::kLend ? 1 : 0;
    }
    return n;
  }

  FakeApiServer api_{std::vector<std::string>{"--kube-version", "1.37"}};
  std::string tmp_;
  k8s::testing::TlsFiles tls_;
  fakes::FakeClock clock_;  // never advanced: the loop's 200 ms pass never comes
  Ledger ledger_;
  fakes::FakeSlurmClient slurm_;
  Placeholders lends_{&ledger_, &slurm_};
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

}  // namespace
}  // namespace duet
