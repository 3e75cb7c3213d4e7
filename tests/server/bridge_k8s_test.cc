// duet-bridge with its default inventory source, the Kubernetes Node watch,
// against the fake API server (tests/fakes/fake_apiserver.py), configured
// through a kubeconfig file as a developer would.

#include <filesystem>
#include <fstream>

#include "bridge/server/bridge.h"
#include "gtest/gtest.h"
#include "tests/k8s_adapter/extender/http_client.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace {

using k8s::testing::FakeApiServer;
using k8s::testing::GoldenNode;
using k8s::testing::WaitFor;

TEST(BridgeKubernetesTest, SharedPoolNodesBecomeTheLedgersNodes) {
  FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  fake.Put(GoldenNode("gke_a3_h100_node.json", "gke-a3-1"));
  fake.Put(GoldenNode("gke_ct5lp_tpu_node.json", "gke-v5e-1"));
  nlohmann::json other = GoldenNode("gke_a3_h100_node.json", "private-1");
  other["metadata"]["labels"].erase("duet.dev/shared");
  fake.Put(other);

  const auto dir = std::filesystem::temp_directory_path() /
                   ("duet-bridge-k8s-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  k8s::testing::WriteKubeconfig((dir / "kubeconfig").string(), fake.url());
  Config config;
  config.grpc.listen = "127.0.0.1:0";
  config.metrics.listen = "";
  config.journal.dir = (dir / "journal").string();
  config.kubernetes.kubeconfig = (dir / "kubeconfig").string();
  ASSERT_EQ(config.inventory.source, "kubernetes");  // the default
  ASSERT_TRUE(ValidateConfig(config).ok());
  auto bridge = Bridge::Start(config);
  ASSERT_TRUE(bridge.ok()) << bridge.status();
  Ledger* ledger = (*bridge)->ledger();

  EXPECT_EQ(ledger->node_count(), 2u);
  ASSERT_NE(ledger->GetNode("gke-a3-1"), nullptr);
  EXPECT_EQ(ledger->GetNode("gke-a3-1")->devices.size(), 8u);
  ASSERT_NE(ledger->GetNode("gke-v5e-1"), nullptr);
  EXPECT_EQ(ledger->GetNode("gke-v5e-1")->devices[0].spec.kind, DeviceKind::kTpu);
  EXPECT_EQ(ledger->GetNode("private-1"), nullptr);

  // A holding, then the node is cordoned and deleted in Kubernetes: it turns
  // GONE in the ledger (still held), and goes once released.
  HoldRequest r;
  r.node = "gke-a3-1";
  r.owner = Owner::SlurmJob(7);
  r.count = CountSelector{DeviceKind::kGpu, 2, 0, ""};
  ASSERT_TRUE(ledger->Hold(r).ok());
  nlohmann::json cordoned = GoldenNode("gke_a3_h100_node.json", "gke-a3-1");
  cordoned["spec"]["unschedulable"] = true;
  fake.Put(cordoned);
  ASSERT_TRUE(WaitFor([&] {
    auto v = ledger->GetNode("gke-a3-1");
    return v != nullptr && v->spec.state == NodeState::kCordoned;
  }));
  fake.Delete("Node", "gke-a3-1");
  ASSERT_TRUE(WaitFor([&] {
    auto v = ledger->GetNode("gke-a3-1");
    return v != nullptr && v->spec.state == NodeState::kGone;
  }));
  ASSERT_TRUE(ledger->Release("gke-a3-1", Owner::SlurmJob(7)).ok());
  EXPECT_EQ(ledger->GetNode("gke-a3-1"), nullptr);
  bridge->reset();
  std::filesystem::remove_all(dir);
}

TEST(BridgeKubernetesTest, AnUnreachableApiServerIsNamedAtStartUp) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("duet-bridge-k8s-down-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  k8s::testing::WriteKubeconfig((dir / "kubeconfig").string(), "http://127.0.0.1:9");
  Config config;
  config.grpc.listen = "127.0.0.1:0";
  config.metrics.listen = "";
  config.journal.dir = (dir / "journal").string();
  config.kubernetes.kubeconfig = (dir / "kubeconfig").string();
  config.kubernetes.request_timeout = absl::Seconds(2);
  auto bridge = Bridge::Start(config);
  ASSERT_FALSE(bridge.ok());
  EXPECT_NE(bridge.status().message().find("inventory (kubernetes)"), std::string::npos)
      << bridge.status();
  std::filesystem::remove_all(dir);
}

// The scheduler extender served by the bridge, with nodes from a file: the
// bridge still connects to the Kubernetes API (for bindings). A pod is
// filtered, bound, and its holding survives a restart (it was durable
// before the Binding was posted).
TEST(BridgeKubernetesTest, ExtenderBindsAPodWithAFileInventory) {
  FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  nlohmann::json pod = fake.Put(
      {{"kind", "Pod"},
       {"metadata", {{"name", "trainer-0"}, {"namespace", "ml"}}},
       {"spec",
        {{"schedulerName", "duet"},
         {"containers",
          {{{"name", "c"}, {"image", "i"}, {"resources", {{"limits", {{"nvidia.com/gpu", "3"}}}}}}}}}}});
  const std::string uid = pod["metadata"]["uid"];

  const auto dir = std::filesystem::temp_directory_path() /
                   ("duet-bridge-extender-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  k8s::testing::WriteKubeconfig((dir / "kubeconfig").string(), fake.url());
  std::ofstream(dir / "nodes.yaml") << "nodes: [{name: gke-a, cpus: 208, memory_mib: 1843200, "
                                       "gpus: {count: 8, model: nvidia-h100-80gb}}]\n";
  Config config;
  config.grpc.listen = "127.0.0.1:0";
  config.metrics.listen = "";
  config.journal.dir = (dir / "journal").string();
  config.inventory.source = "file";
  config.inventory.file = (dir / "nodes.yaml").string();
  config.kubernetes.kubeconfig = (dir / "kubeconfig").string();
  config.extender.listen = "127.0.0.1:0";
  config.placement.policy = "best-fit";
  config.placement.workload.min_arrivals = 1;  // one pod is the whole workload here
  ASSERT_TRUE(ValidateConfig(config).ok());
  auto bridge = Bridge::Start(config);
  ASSERT_TRUE(bridge.ok()) << bridge.status();
  ASSERT_GT((*bridge)->extender_port(), 0);

  extender::testing::HttpClient http((*bridge)->extender_port());
  nlohmann::json args = {{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", {"gke-a", "gke-b"}}};
  auto r = http.Post("/duet/filter", args.dump());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  nlohmann::json filtered = nlohmann::json::parse(r->body);
  EXPECT_EQ(filtered["NodeNames"], nlohmann::json({"gke-a"}));
  EXPECT_EQ(filtered["FailedAndUnresolvableNodes"].count("gke-b"), 1u);
  // The filter counted the pod in the learned workload: one 3-GPU shape.
  EXPECT_NE((*bridge)->metrics()->Render().find("duet_workload_arrivals_total 1\n"),
            std::string::npos);
  EXPECT_NE((*bridge)->metrics()->Render().find("duet_workload_shapes{set=\"exported\"} 1\n"),
            std::string::npos);

  nlohmann::json bind = {{"PodName", "trainer-0"}, {"PodNamespace", "ml"}, {"PodUID", uid}, {"Node", "gke-a"}};
  r = http.Post("/duet/bind", bind.dump());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(nlohmann::json::parse(r->body)["Error"], "");
  nlohmann::json bound =
      nlohmann::json::parse(*fake.control()->Get("/api/v1/namespaces/ml/pods/trainer-0"));
  EXPECT_EQ(bound["spec"]["nodeName"], "gke-a");
  auto held = (*bridge)->ledger()->ListHoldings("gke-a");
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].owner.pod_uid, uid);
  EXPECT_EQ(held[0].devices.size(), 3u);
  EXPECT_NE((*bridge)->metrics()->Render().find(
                "duet_extender_requests_total{code=\"200\",verb=\"bind\"} 1"),
            std::string::npos);

  bridge->reset();
  auto again = Bridge::Start(config);
  ASSERT_TRUE(again.ok()) << again.status();
  held = (*again)->ledger()->ListHoldings("gke-a");
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].owner.pod_uid, uid);
  // The learned workload starts empty and is rebuilt from the live pods: the
  // pod watch's first list (done before Start returns) saw the bound pod.
  const std::string text = (*again)->metrics()->Render();
  EXPECT_NE(text.find("duet_workload_arrivals_total 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("duet_workload_shapes{set=\"exported\"} 1\n"), std::string::npos);
  again->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace duet
