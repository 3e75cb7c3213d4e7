// duet-bridge with its default inventory source, the Kubernetes Node watch,
// against the fake API server (tests/fakes/fake_apiserver.py), configured
// through a kubeconfig file as a developer would.

#include <filesystem>
#include <fstream>

#include "bridge/server/bridge.h"
#include "gtest/gtest.h"
#include "tests/k8s/fake_server.h"

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
  std::ofstream(dir / "kubeconfig") << "apiVersion: v1\nkind: Config\n"
                                    << "clusters: [{name: fake, cluster: {server: \"" << fake.url()
                                    << "\"}}]\n"
                                    << "users: [{name: dev, user: {}}]\n"
                                    << "contexts: [{name: fake, context: {cluster: fake, user: dev}}]\n"
                                    << "current-context: fake\n";
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
  std::ofstream(dir / "kubeconfig")
      << "apiVersion: v1\nkind: Config\n"
      << "clusters: [{name: x, cluster: {server: \"http://127.0.0.1:9\"}}]\n"
      << "users: [{name: dev, user: {}}]\n"
      << "contexts: [{name: x, context: {cluster: x, user: dev}}]\ncurrent-context: x\n";
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

}  // namespace
}  // namespace duet
