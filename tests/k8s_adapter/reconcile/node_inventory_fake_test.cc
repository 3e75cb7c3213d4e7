// KubeNodeInventory against the fake apiserver: what the sink sees as Nodes
// are added, cordoned, go NotReady, leave the pool and are deleted.

#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "k8s_adapter/reconcile/node_inventory.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace k8s {
namespace {

using testing::FakeApiServer;
using testing::GoldenNode;
using testing::WaitFor;

class RecordingSink : public InventorySink {
 public:
  void ReplaceAll(const std::vector<NodeSpec>& nodes) override {
    absl::MutexLock l(&mu_);
    nodes_.clear();
    for (const NodeSpec& n : nodes) nodes_[n.name] = n;
    calls_.push_back("replace:" + std::to_string(nodes.size()));
  }
  void Upsert(const NodeSpec& node) override {
    absl::MutexLock l(&mu_);
    nodes_[node.name] = node;
    calls_.push_back(std::string("upsert:") + node.name + ":" + NodeStateName(node.state));
  }
  void Remove(const std::string& name) override {
    absl::MutexLock l(&mu_);
    nodes_.erase(name);
    calls_.push_back("remove:" + name);
  }
  std::vector<std::string> calls() {
    absl::MutexLock l(&mu_);
    return calls_;
  }
  bool Has(const std::string& call) {
    for (const std::string& c : calls()) {
      if (c == call) return true;
    }
    return false;
  }
  std::map<std::string, NodeSpec> nodes() {
    absl::MutexLock l(&mu_);
    return nodes_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, NodeSpec> nodes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
};

TEST(KubeNodeInventoryTest, NodesFlowToTheSink) {
  FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  fake.Put(GoldenNode("gke_a3_h100_node.json", "gpu-1"));
  fake.Put(GoldenNode("gke_ct5lp_tpu_node.json", "tpu-1"));
  nlohmann::json cpu = GoldenNode("gke_a3_h100_node.json", "cpu-1");
  cpu["status"]["capacity"].erase("nvidia.com/gpu");
  fake.Put(cpu);  // in the pool, no accelerators: not inventory
  nlohmann::json other = GoldenNode("gke_a3_h100_node.json", "private-1");
  other["metadata"]["labels"].erase("duet.dev/shared");
  fake.Put(other);  // not in the shared pool

  KubeConfig c;
  c.server = fake.url();
  auto client = NewCurlKubeClient(c);
  ASSERT_TRUE(client.ok());
  NodeInventoryOptions o;
  o.label_selector = "duet.dev/shared=true";
  o.informer.min_backoff = absl::Milliseconds(20);
  KubeNodeInventory inv(client->get(), o);
  RecordingSink sink;
  ASSERT_TRUE(inv.Start(&sink).ok());
  // The first inventory arrived before Start returned.
  EXPECT_EQ(sink.calls(), std::vector<std::string>{"replace:2"});
  auto nodes = sink.nodes();
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes["gpu-1"].devices.size(), 8u);
  EXPECT_EQ(nodes["tpu-1"].devices[0].topology.tpu_host_bounds, "2x2");
  ASSERT_TRUE(WaitFor([&] { return fake.OpenWatches() == 1; }));

  // Cordon (kubectl cordon is a patch of spec.unschedulable).
  ASSERT_TRUE((*client)
                  ->Patch("/api/v1/nodes/gpu-1", R"({"spec":{"unschedulable":true}})",
                          PatchType::kStrategicMerge)
                  .ok());
  ASSERT_TRUE(WaitFor([&] { return sink.Has("upsert:gpu-1:cordoned"); }));

  // A heartbeat-only change is not delivered.
  const size_t before = sink.calls().size();
  ASSERT_TRUE((*client)
                  ->Patch("/api/v1/nodes/tpu-1",
                          R"({"metadata":{"annotations":{"node.alpha.kubernetes.io/ttl":"1"}}})",
                          PatchType::kMerge)
                  .ok());

  // NotReady.
  nlohmann::json tpu = nlohmann::json::parse(*(*client)->Get("/api/v1/nodes/tpu-1"));
  for (auto& cond : tpu["status"]["conditions"]) {
    if (cond["type"] == "Ready") cond["status"] = "Unknown";
  }
  ASSERT_TRUE((*client)->Put("/api/v1/nodes/tpu-1", tpu.dump()).ok());
  ASSERT_TRUE(WaitFor([&] { return sink.Has("upsert:tpu-1:not-ready"); }));
  EXPECT_EQ(sink.calls().size(), before + 1);

  // A new node joins the pool; one leaves it (label removed); one is deleted.
  fake.Put(GoldenNode("gke_a3_h100_node.json", "gpu-2"));
  other["metadata"]["labels"]["duet.dev/shared"] = "true";
  fake.Put(other);
  ASSERT_TRUE(WaitFor([&] { return sink.Has("upsert:private-1:ready"); }));
  nlohmann::json gpu2 = GoldenNode("gke_a3_h100_node.json", "gpu-2");
  gpu2["metadata"]["labels"]["duet.dev/shared"] = "false";
  fake.Put(gpu2);
  fake.Delete("Node", "gpu-1");
  ASSERT_TRUE(WaitFor([&] { return sink.Has("remove:gpu-1"); }));
  EXPECT_TRUE(sink.Has("upsert:gpu-2:ready"));
  EXPECT_TRUE(sink.Has("remove:gpu-2"));
  // The device plugin lost its GPUs: the node is no longer inventory.
  other["status"]["capacity"].erase("nvidia.com/gpu");
  fake.Put(other);
  ASSERT_TRUE(WaitFor([&] { return sink.Has("remove:private-1"); }));
  EXPECT_EQ(sink.nodes().size(), 1u);  // tpu-1

  // A 410 relist delivers the complete set again.
  fake.Control("compact", {{"expire_watches", true}});
  ASSERT_TRUE(WaitFor([&] { return inv.stats().lists == 2; }));
  EXPECT_EQ(sink.calls().back(), "replace:1");

  inv.Stop();
  const size_t n = sink.calls().size();
  // A second inventory is the witness: once it sees the deletion, the
  // server has sent it to every open watch.
  KubeNodeInventory witness(client->get(), o);
  RecordingSink witness_sink;
  ASSERT_TRUE(witness.Start(&witness_sink).ok());
  fake.Delete("Node", "tpu-1");
  ASSERT_TRUE(WaitFor([&] { return witness_sink.Has("remove:tpu-1"); }));
  witness.Stop();
  EXPECT_EQ(sink.calls().size(), n);  // nothing after Stop
}

// The operator's own tool: kubectl cordon / uncordon / delete reach the sink.
TEST(KubeNodeInventoryTest, KubectlCordonUncordonDelete) {
  FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  fake.Put(GoldenNode("gke_a3_h100_node.json", "gpu-1"));
  KubeConfig c;
  c.server = fake.url();
  auto client = NewCurlKubeClient(c);
  ASSERT_TRUE(client.ok());
  KubeNodeInventory inv(client->get(), {});
  RecordingSink sink;
  ASSERT_TRUE(inv.Start(&sink).ok());
  const std::string tmp = testing::MakeTempDir();
  int calls = 0;
  auto kubectl = [&](const std::string& args) {
    // A fresh discovery cache each time.
    const std::string cmd = "KUBECONFIG=/dev/null HOME=" + tmp + " kubectl --server=" + fake.url() +
                            " --cache-dir=" + tmp + "/cache" + std::to_string(++calls) + " --request-timeout=10s " + args +
                            " >/dev/null 2>&1";
    return std::system(cmd.c_str());
  };
  ASSERT_EQ(kubectl("cordon gpu-1"), 0);
  ASSERT_TRUE(WaitFor([&] { return sink.Has("upsert:gpu-1:cordoned"); }));
  ASSERT_EQ(kubectl("uncordon gpu-1"), 0);
  ASSERT_TRUE(WaitFor([&] { return sink.Has("upsert:gpu-1:ready"); }));
  ASSERT_EQ(kubectl("delete node gpu-1"), 0);
  ASSERT_TRUE(WaitFor([&] { return sink.Has("remove:gpu-1"); }));
  inv.Stop();
  testing::RemoveTree(tmp);
}

TEST(KubeNodeInventoryTest, UnreachableApiIsAStartError) {
  KubeConfig c;
  c.server = "http://127.0.0.1:1";
  auto client = NewCurlKubeClient(c);
  ASSERT_TRUE(client.ok());
  KubeNodeInventory inv(client->get(), {});
  RecordingSink sink;
  absl::Status s = inv.Start(&sink);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("kubernetes node inventory"));
  EXPECT_TRUE(sink.calls().empty());
  inv.Stop();
}

}  // namespace
}  // namespace k8s
}  // namespace duet
