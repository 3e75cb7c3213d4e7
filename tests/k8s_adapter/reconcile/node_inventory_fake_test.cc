// KubeNodeInventory against the fake apiserver: what the sink sees as Nodes
// are added, cordoned, go NotReady, leave the pool and are deleted; and, in
// DRA pools, as the drivers' ResourceSlices come, change and go.

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
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

// The errors the inventory logs while it lives.
class ErrorLog {
 public:
  ErrorLog() : ring_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64)) {
    spdlog::default_logger()->sinks().push_back(ring_);
  }
  ~ErrorLog() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), ring_), sinks.end());
  }
  bool Has(const std::string& part) {
    for (const spdlog::details::log_msg_buffer& m : ring_->last_raw()) {
      if (m.level == spdlog::level::err &&
          std::string(m.payload.data(), m.payload.size()).find(part) != std::string::npos) {
        return true;
      }
    }
    return false;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> ring_;
};

// ResourceSlices in fake_dra_driver.py's shapes (testdata/make_dra_slices.py).
nlohmann::json FixtureSlice(const std::string& which) {
  return nlohmann::json::parse(testing::ReadTestdata("dra_resource_slices.json")).at(which);
}

// `slice` for `node` (its nodeName, pool and name), generation `gen` of a
// pool of `count` slices, keeping only the devices named in `keep` (all when
// empty).
nlohmann::json SliceFor(nlohmann::json slice, const std::string& node, int gen, int count = 1,
                        const std::vector<std::string>& keep = {}, const std::string& name = "") {
  const std::string driver = slice["spec"]["driver"].get<std::string>();
  slice["metadata"] = {{"name", name.empty() ? node + "-" + driver : name}};
  slice["spec"]["nodeName"] = node;
  slice["spec"]["pool"] = {{"name", node}, {"generation", gen}, {"resourceSliceCount", count}};
  if (!keep.empty()) {
    nlohmann::json devices = nlohmann::json::array();
    for (const auto& d : slice["spec"]["devices"]) {
      if (std::find(keep.begin(), keep.end(), d["name"]) != keep.end()) devices.push_back(d);
    }
    slice["spec"]["devices"] = devices;
  }
  return slice;
}

std::string UuidOf(const nlohmann::json& slice, const std::string& device) {
  for (const auto& d : slice["spec"]["devices"]) {
    if (d["name"] == device) return d["attributes"]["uuid"]["string"].get<std::string>();
  }
  return "";
}

// A Node of pool `pool` shaped like `golden`, without device-plugin capacity.
nlohmann::json DraNode(const std::string& golden, const std::string& name, const std::string& pool) {
  nlohmann::json n = GoldenNode(golden, name, {{"cloud.google.com/gke-nodepool", pool}});
  n["status"]["capacity"].erase("nvidia.com/gpu");
  n["status"]["allocatable"].erase("nvidia.com/gpu");
  n["status"]["capacity"].erase("google.com/tpu");
  n["status"]["allocatable"].erase("google.com/tpu");
  return n;
}

std::vector<std::pair<uint32_t, std::string>> Gpus(const NodeSpec& n) {
  std::vector<std::pair<uint32_t, std::string>> out;
  for (const DeviceSpec& d : n.devices) {
    if (d.kind == DeviceKind::kGpu) out.emplace_back(d.index, d.id);
  }
  return out;
}

NodeInventoryOptions DraOptions() {
  NodeInventoryOptions o;
  o.informer.min_backoff = absl::Milliseconds(20);
  o.dra_pools = {"dra-h100", "dra-v6e"};
  return o;
}

// Nodes of DRA pools have no nvidia.com/gpu or google.com/tpu capacity: their
// devices come from the slices listed before the Nodes, so the first
// inventory has them. Other pools still read capacity.
TEST(KubeNodeInventoryDraTest, FirstInventoryTakesDraPoolDevicesFromSlices) {
  FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  const nlohmann::json nvidia = FixtureSlice("nvidia");
  fake.Put(nvidia);                       // dra-gpu-1: gpu-0..gpu-7
  fake.Put(FixtureSlice("nvidia_mig_vfio"));  // dra-gpu-2: gpu-0, gpu-1 and MIG/vfio siblings
  fake.Put(FixtureSlice("tpu"));              // dra-tpu-1: accel0..accel3
  fake.Put(DraNode("gke_a3_h100_node.json", "dra-gpu-1", "dra-h100"));
  fake.Put(DraNode("gke_a3_h100_node.json", "dra-gpu-2", "dra-h100"));
  fake.Put(DraNode("gke_ct5lp_tpu_node.json", "dra-tpu-1", "dra-v6e"));
  // A DRA-pool node whose slices are not there yet: not inventory.
  fake.Put(DraNode("gke_a3_h100_node.json", "dra-gpu-3", "dra-h100"));
  // Device-plugin pool: capacity, even with a slice naming the node.
  fake.Put(GoldenNode("gke_a3_h100_node.json", "gpu-1"));
  fake.Put(SliceFor(nvidia, "gpu-1", 1, 1, {"gpu-0", "gpu-1"}));
  // A DRA-pool node that also has device-plugin capacity (KEP-5004 forbids
  // it): the slices win, with an error.
  fake.Put(GoldenNode("gke_a3_h100_node.json", "mixed-1", {{"cloud.google.com/gke-nodepool", "dra-h100"}}));
  fake.Put(SliceFor(nvidia, "mixed-1", 1, 1, {"gpu-0", "gpu-1"}));

  KubeConfig c;
  c.server = fake.url();
  auto client = NewCurlKubeClient(c);
  ASSERT_TRUE(client.ok());
  ErrorLog errors;
  KubeNodeInventory inv(client->get(), DraOptions());
  RecordingSink sink;
  ASSERT_TRUE(inv.Start(&sink).ok());
  EXPECT_EQ(sink.calls(), std::vector<std::string>{"replace:5"});
  auto nodes = sink.nodes();
  EXPECT_EQ(nodes.count("dra-gpu-3"), 0u);

  const NodeSpec& g1 = nodes["dra-gpu-1"];
  ASSERT_EQ(g1.devices.size(), 8u);
  for (uint32_t i = 0; i < 8; ++i) {
    EXPECT_EQ(g1.devices[i].index, i);
    EXPECT_EQ(g1.devices[i].id, UuidOf(nvidia, "gpu-" + std::to_string(i)));
    EXPECT_EQ(g1.devices[i].model, "nvidia-h100-80gb");
  }
  EXPECT_THAT(g1.devices[0].id, ::testing::StartsWith("GPU-"));
  EXPECT_EQ(nodes["dra-gpu-2"].devices.size(), 2u);  // whole GPUs only

  const NodeSpec& t1 = nodes["dra-tpu-1"];
  ASSERT_EQ(t1.devices.size(), 4u);
  EXPECT_EQ(t1.devices[2].kind, DeviceKind::kTpu);
  EXPECT_EQ(t1.devices[2].index, 2u);
  EXPECT_EQ(t1.devices[2].id, "dra-tpu-1/tpu2");
  EXPECT_EQ(t1.devices[2].model, "tpu-v5-lite-podslice");
  EXPECT_EQ(t1.devices[2].topology.tpu_host_bounds, "2x2");

  const NodeSpec& p1 = nodes["gpu-1"];
  ASSERT_EQ(p1.devices.size(), 8u);
  EXPECT_EQ(p1.devices[7].id, "gpu-1/gpu7");

  const NodeSpec& m1 = nodes["mixed-1"];
  EXPECT_EQ(Gpus(m1), (std::vector<std::pair<uint32_t, std::string>>{
                          {0, UuidOf(nvidia, "gpu-0")}, {1, UuidOf(nvidia, "gpu-1")}}));
  EXPECT_TRUE(errors.Has("node mixed-1 has nvidia.com/gpu capacity 8 beside gpu.nvidia.com"));
  EXPECT_FALSE(errors.Has("node gpu-1"));
  inv.Stop();
}

// After the first inventory: a node's slices arriving, a new generation, an
// incomplete pool, a gap in the minors and a deleted slice each re-deliver it.
TEST(KubeNodeInventoryDraTest, SliceChangesRedeliverTheNode) {
  FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  fake.Put(DraNode("gke_a3_h100_node.json", "dra-gpu-1", "dra-h100"));
  fake.Put(GoldenNode("gke_a3_h100_node.json", "gpu-1"));
  KubeConfig c;
  c.server = fake.url();
  auto client = NewCurlKubeClient(c);
  ASSERT_TRUE(client.ok());
  ErrorLog errors;
  KubeNodeInventory inv(client->get(), DraOptions());
  RecordingSink sink;
  ASSERT_TRUE(inv.Start(&sink).ok());
  EXPECT_EQ(sink.calls(), std::vector<std::string>{"replace:1"});  // gpu-1
  ASSERT_TRUE(WaitFor([&] { return fake.OpenWatches() == 2; }));
  auto gpus = [&] {
    auto nodes = sink.nodes();
    auto it = nodes.find("dra-gpu-1");
    return it == nodes.end() ? std::vector<std::pair<uint32_t, std::string>>{} : Gpus(it->second);
  };
  using Gpu = std::pair<uint32_t, std::string>;

  // The driver publishes: the node joins.
  const nlohmann::json nvidia = FixtureSlice("nvidia");
  fake.Put(nvidia);
  ASSERT_TRUE(WaitFor([&] { return sink.Has("upsert:dra-gpu-1:ready"); }));
  ASSERT_EQ(gpus().size(), 8u);
  EXPECT_EQ(gpus()[5], Gpu(5, UuidOf(nvidia, "gpu-5")));

  // A new generation with fewer GPUs replaces the devices.
  fake.Put(SliceFor(nvidia, "dra-gpu-1", 2, 1, {"gpu-0", "gpu-1", "gpu-2"}));
  ASSERT_TRUE(WaitFor([&] { return gpus().size() == 3; }));
  // A uuid that changes (a GPU swapped at the same minor) is delivered.
  nlohmann::json swapped = SliceFor(nvidia, "dra-gpu-1", 3, 1, {"gpu-0", "gpu-1", "gpu-2"});
  swapped["spec"]["devices"][1]["attributes"]["uuid"]["string"] = "GPU-swapped";
  fake.Put(swapped);
  ASSERT_TRUE(WaitFor([&] { return gpus().size() == 3 && gpus()[1].second == "GPU-swapped"; }));
  EXPECT_EQ(gpus()[0], Gpu(0, UuidOf(nvidia, "gpu-0")));

  // Generation 4 is two slices; one is published: nothing known, the node leaves.
  fake.Put(SliceFor(nvidia, "dra-gpu-1", 4, 2, {"gpu-2", "gpu-3"}, "dra-gpu-1-part2"));
  ASSERT_TRUE(WaitFor([&] { return sink.Has("remove:dra-gpu-1"); }));
  fake.Put(SliceFor(nvidia, "dra-gpu-1", 4, 2, {"gpu-0", "gpu-1"}));
  ASSERT_TRUE(WaitFor([&] { return gpus().size() == 4; }));
  EXPECT_EQ(gpus()[3], Gpu(3, UuidOf(nvidia, "gpu-3")));

  // One of the two slices deleted: incomplete again.
  const size_t removes = [&] {
    size_t n = 0;
    for (const std::string& call : sink.calls()) n += call == "remove:dra-gpu-1";
    return n;
  }();
  EXPECT_EQ(removes, 1u);
  fake.Delete("ResourceSlice", "dra-gpu-1-part2");
  ASSERT_TRUE(WaitFor([&] { return sink.nodes().count("dra-gpu-1") == 0; }));

  // A gap in the minors (gpu-2 missing): refused, with the reason logged.
  fake.Put(SliceFor(nvidia, "dra-gpu-1", 5, 1, {"gpu-0", "gpu-1", "gpu-3"}));
  ASSERT_TRUE(WaitFor([&] { return errors.Has("GPU minors [0,1,3]"); }));
  EXPECT_EQ(sink.nodes().count("dra-gpu-1"), 0u);
  fake.Put(SliceFor(nvidia, "dra-gpu-1", 6, 1, {"gpu-0", "gpu-1"}));
  ASSERT_TRUE(WaitFor([&] { return gpus().size() == 2; }));

  // The last slice deleted: the node's GPUs are gone, so is the node.
  const size_t before = sink.calls().size();
  fake.Delete("ResourceSlice", "dra-gpu-1-gpu.nvidia.com");
  ASSERT_TRUE(WaitFor([&] { return sink.nodes().count("dra-gpu-1") == 0; }));
  EXPECT_EQ(sink.calls().back(), "remove:dra-gpu-1");
  EXPECT_EQ(sink.calls().size(), before + 1);
  // The device-plugin node saw none of it.
  for (const std::string& call : sink.calls()) {
    EXPECT_TRUE(call.rfind("upsert:gpu-1:", 0) != 0 && call != "remove:gpu-1") << call;
  }
  ASSERT_EQ(sink.nodes().at("gpu-1").devices.size(), 8u);
  inv.Stop();
}

// Without dra_pools no ResourceSlice is watched: a DRA-shaped node is not
// inventory and the slices change nothing.
TEST(KubeNodeInventoryDraTest, NoDraPoolsNoSliceWatch) {
  FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  fake.Put(FixtureSlice("nvidia"));
  fake.Put(DraNode("gke_a3_h100_node.json", "dra-gpu-1", "dra-h100"));
  KubeConfig c;
  c.server = fake.url();
  auto client = NewCurlKubeClient(c);
  ASSERT_TRUE(client.ok());
  KubeNodeInventory inv(client->get(), {});
  RecordingSink sink;
  ASSERT_TRUE(inv.Start(&sink).ok());
  EXPECT_EQ(sink.calls(), std::vector<std::string>{"replace:0"});
  for (const auto& r : fake.Requests()) {
    EXPECT_EQ(r.dump().find("resourceslices"), std::string::npos) << r.dump();
  }
  inv.Stop();
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
