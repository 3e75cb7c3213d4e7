// Multi-host TPU slices (docs/gangs.md 5), the pure part: which nodes are
// hosts of a slice, and which slice a gang takes on hand-built clusters
// where the answer is known.

#include "bridge/placement/tpu_slice.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet::placement {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

NodeSpec TpuNode(const std::string& name, const std::string& pool, uint32_t chips,
                 const std::string& topology) {
  NodeSpec n;
  n.name = name;
  n.pool = pool;
  for (uint32_t i = 0; i < chips; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kTpu;
    d.index = i;
    d.model = "tpu-v5-lite-podslice";
    d.topology.tpu_topology = topology;
    n.devices.push_back(d);
  }
  return n;
}

TEST(TpuSliceTest, TopologyChips) {
  EXPECT_EQ(*TpuTopologyChips("4x4"), 16u);
  EXPECT_EQ(*TpuTopologyChips("2x2x4"), 16u);
  EXPECT_EQ(*TpuTopologyChips("1x1"), 1u);
  for (const char* bad : {"", "4x", "x4", "0x4", "axb", "4x-1", "+4x4", "4096x4096x4096"}) {
    EXPECT_FALSE(TpuTopologyChips(bad).ok()) << bad;
  }
}

TEST(TpuSliceTest, AHostOfAMultiHostSliceKnowsItsSlice) {
  // v5e 4x4: 16 chips, 4 per host, 4 hosts.
  std::optional<TpuSliceHost> s = TpuSliceOf(TpuNode("t0", "v5e-a", 4, "4x4"));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->pool, "v5e-a");
  EXPECT_EQ(s->topology, "4x4");
  EXPECT_EQ(s->accelerator, "tpu-v5-lite-podslice");
  EXPECT_EQ(s->chips, 4u);
  EXPECT_EQ(s->hosts, 4u);
  // Single-host slices (the node has every chip of its topology), nodes
  // without TPUs, without topology or pool, or an uneven split: no slice.
  EXPECT_FALSE(TpuSliceOf(TpuNode("t1", "v5e-b", 8, "2x4")).has_value());
  EXPECT_FALSE(TpuSliceOf(TpuNode("t2", "v5e-b", 4, "")).has_value());
  EXPECT_FALSE(TpuSliceOf(TpuNode("t3", "", 4, "4x4")).has_value());
  EXPECT_FALSE(TpuSliceOf(TpuNode("t4", "v5e-b", 3, "2x4")).has_value());
  EXPECT_FALSE(TpuSliceOf(TpuNode("t5", "v5e-b", 0, "4x4")).has_value());
}

// Hosts of two 2x4 slices (2 hosts of 4 chips each), pools s-a and s-b.
std::vector<SliceCandidate> TwoSlices() {
  std::vector<SliceCandidate> out;
  for (const char* pool : {"s-b", "s-a"}) {
    for (int h = 1; h >= 0; --h) {
      SliceCandidate c;
      c.node = std::string(pool) + "-" + std::to_string(h);
      c.slice = *TpuSliceOf(TpuNode(c.node, pool, 4, "2x4"));
      out.push_back(c);
    }
  }
  return out;
}

TEST(TpuSliceTest, AFreeSliceIsTakenWholeOneMemberPerHost) {
  std::string why;
  std::optional<GangPick> p = PickTpuSlice(TwoSlices(), "2x4", "tpu-v5-lite-podslice", 2, 4, &why);
  ASSERT_TRUE(p.has_value()) << why;
  EXPECT_THAT(p->nodes, ElementsAre("s-a-0", "s-a-1"));
  EXPECT_EQ(p->per_node, 1u);
  // Without an accelerator in the selector, any model of that topology.
  p = PickTpuSlice(TwoSlices(), "2x4", "", 2, 4, &why);
  ASSERT_TRUE(p.has_value()) << why;
  EXPECT_THAT(p->nodes, ElementsAre("s-a-0", "s-a-1"));
}

TEST(TpuSliceTest, ASliceWithOneChipHeldIsSkipped) {
  std::vector<SliceCandidate> hosts = TwoSlices();
  for (SliceCandidate& c : hosts) {
    if (c.node == "s-a-1") c.busy = "1 of its 4 TPU chips held";
  }
  std::string why;
  std::optional<GangPick> p = PickTpuSlice(hosts, "2x4", "tpu-v5-lite-podslice", 2, 4, &why);
  ASSERT_TRUE(p.has_value()) << why;
  EXPECT_THAT(p->nodes, ElementsAre("s-b-0", "s-b-1"));
  // Both slices touched: none, and the reason names each slice's obstacle.
  for (SliceCandidate& c : hosts) {
    if (c.node == "s-b-0") c.busy = "node is not-ready";
  }
  EXPECT_FALSE(PickTpuSlice(hosts, "2x4", "tpu-v5-lite-podslice", 2, 4, &why).has_value());
  EXPECT_THAT(why, HasSubstr("pool s-a: host s-a-1: 1 of its 4 TPU chips held"));
  EXPECT_THAT(why, HasSubstr("pool s-b: host s-b-0: node is not-ready"));
}

TEST(TpuSliceTest, ASliceWithAHostMissingIsNoCandidate) {
  std::vector<SliceCandidate> hosts = TwoSlices();
  hosts.erase(hosts.begin());  // s-b-1
  std::string why;
  std::optional<GangPick> p = PickTpuSlice(hosts, "2x4", "", 2, 4, &why);
  ASSERT_TRUE(p.has_value()) << why;
  EXPECT_THAT(p->nodes, ElementsAre("s-a-0", "s-a-1"));
  hosts.pop_back();  // s-a-0
  EXPECT_FALSE(PickTpuSlice(hosts, "2x4", "", 2, 4, &why).has_value());
  EXPECT_THAT(why, HasSubstr("pool s-a: 1 of its 2 hosts are known"));
}

TEST(TpuSliceTest, AGangOfAnotherShapeIsRefusedWithTheSlicesShape) {
  std::string why;
  EXPECT_FALSE(PickTpuSlice(TwoSlices(), "2x4", "", 3, 4, &why).has_value());
  EXPECT_THAT(why, HasSubstr("has 2 hosts, one member each; this gang has 3 members"));
  EXPECT_FALSE(PickTpuSlice(TwoSlices(), "2x4", "", 2, 2, &why).has_value());
  EXPECT_THAT(why, HasSubstr("takes every chip of its host (4); these members ask 2"));
  EXPECT_FALSE(PickTpuSlice(TwoSlices(), "4x4", "", 4, 4, &why).has_value());
  EXPECT_THAT(why, HasSubstr("no multi-host TPU 4x4 slice is known"));
  EXPECT_FALSE(PickTpuSlice(TwoSlices(), "2x4", "tpu-v6e-slice", 2, 4, &why).has_value());
  EXPECT_THAT(why, HasSubstr("no multi-host TPU 2x4 slice of tpu-v6e-slice is known"));
}

TEST(TpuSliceTest, TheSingleHostRefusalNamesTheSlice) {
  const std::string r = SliceRefusal("s-a-0", *TpuSliceOf(TpuNode("s-a-0", "s-a", 4, "2x4")));
  EXPECT_THAT(r, HasSubstr("TPU_SLICE_WHOLE: node s-a-0 is one of the 2 hosts of multi-host TPU "
                           "slice s-a (2x4)"));
}

}  // namespace
}  // namespace duet::placement
