#include "bridge/inventory/inventory.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet {
namespace {

using ::testing::HasSubstr;

TEST(InventoryTest, ParsesGpusTpusAndTopology) {
  auto nodes = ParseInventory(R"(nodes:
  - name: a
    cpus: 8
    memory_mib: 1024
    pool: p
    zone: z
    state: cordoned
    labels: {k: v}
    topology: {block: b1, subblock: s1, host: h1}
    gpus: {count: 2, model: h100, nvlink_domain: d, ids: [GPU-0, GPU-1]}
  - name: t
    tpus: {count: 4, model: v5e, host_bounds: 2x2, topology: 2x4, subslice_shapes: [1x1, 2x2]}
)");
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  ASSERT_EQ(nodes->size(), 2u);
  const NodeSpec& a = (*nodes)[0];
  EXPECT_EQ(a.state, NodeState::kCordoned);
  EXPECT_EQ(a.labels.at("k"), "v");
  ASSERT_EQ(a.devices.size(), 2u);
  EXPECT_EQ(a.devices[1].id, "GPU-1");
  EXPECT_EQ(a.devices[1].topology.nvlink_domain, "d");
  EXPECT_EQ(a.devices[1].topology.block, "b1");
  EXPECT_EQ(a.devices[1].topology.host, "h1");
  const NodeSpec& t = (*nodes)[1];
  ASSERT_EQ(t.devices.size(), 4u);
  EXPECT_EQ(t.devices[3].kind, DeviceKind::kTpu);
  EXPECT_EQ(t.devices[3].id, "t/tpu3");
  EXPECT_EQ(t.devices[0].topology.tpu_subslice_shapes, (std::vector<std::string>{"1x1", "2x2"}));
}

TEST(InventoryTest, ErrorsNameThePath) {
  EXPECT_THAT(ParseInventory("nodes: [{name: a, gpus: {count: x}}]").status().message(),
              HasSubstr("nodes[0].gpus.count: must be an integer"));
  EXPECT_THAT(ParseInventory("nodes: [{name: a}, {cpus: 1}]").status().message(),
              HasSubstr("nodes[1].name: must be set"));
  EXPECT_THAT(ParseInventory("nodes: [{name: a}, {name: a}]").status().message(),
              HasSubstr("nodes[1].name: \"a\" is listed twice"));
  EXPECT_THAT(ParseInventory("nodes: [{name: a, gpu: {count: 1}}]").status().message(),
              HasSubstr("nodes[0].gpu: unknown key"));
  EXPECT_THAT(ParseInventory("nodes: [{name: a, state: drained}]").status().message(),
              HasSubstr("nodes[0].state"));
  EXPECT_THAT(ParseInventory("nodes: [{name: a, gpus: {count: 2, ids: [x]}}]").status().message(),
              HasSubstr("nodes[0].gpus.ids: has 1 entries for 2 devices"));
  EXPECT_THAT(ParseInventory("nodes: {a: 1}").status().message(), HasSubstr("nodes: must be a list"));
}

TEST(InventoryTest, EmbeddedInventoryParses) {
  auto nodes = ParseInventory(EmbeddedInventoryYaml());
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_EQ(nodes->size(), 3u);
}

TEST(InventoryTest, SinkReplacesAndRemoves) {
  Ledger ledger;
  LedgerInventorySink sink(&ledger);
  auto first = ParseInventory("nodes: [{name: a, gpus: {count: 2}}, {name: b, gpus: {count: 2}}]");
  ASSERT_TRUE(first.ok());
  sink.ReplaceAll(*first);
  EXPECT_EQ(ledger.node_count(), 2u);
  HoldRequest r;
  r.node = "a";
  r.owner = Owner::SlurmJob(1);
  r.count = CountSelector{DeviceKind::kGpu, 1, 0, ""};
  ASSERT_TRUE(ledger.Hold(r).ok());
  // A spec that drops a held device is refused and the node keeps it.
  auto shrink = ParseInventory("nodes: [{name: a, gpus: {count: 0}}]");
  EXPECT_FALSE(shrink.ok());
  auto second = ParseInventory("nodes: [{name: c, tpus: {count: 1}}]");
  ASSERT_TRUE(second.ok());
  sink.ReplaceAll(*second);
  EXPECT_EQ(ledger.GetNode("b"), nullptr);
  ASSERT_NE(ledger.GetNode("a"), nullptr);
  EXPECT_EQ(ledger.GetNode("a")->spec.state, NodeState::kGone);
  EXPECT_NE(ledger.GetNode("c"), nullptr);
}

// Issue 25, item 7: a key given twice in the inventory file is refused with
// its path and lines (yaml-cpp would keep the first and drop the second).
TEST(InventoryTest, KeyGivenTwiceIsRefused) {
  auto nodes = ParseInventory(R"(nodes:
  - name: a
    gpus: {count: 2}
    cpus: 8
    gpus: {count: 8}
)");
  EXPECT_EQ(nodes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(nodes.status().message(),
              HasSubstr("nodes[0].gpus: key given twice in one mapping (line 3 and line 5)"));
}

}  // namespace
}  // namespace duet
