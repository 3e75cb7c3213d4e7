// PickGangNodes, TopologyOf and DomainPacking on hand-built clusters whose
// right answer is known (docs/gangs.md 4).
#include "bridge/placement/topology.h"

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bridge/placement/placement.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet::placement {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kGpu = kWholeDevice;

// A node with `free_gpus` free GPUs of `total`, members of `member_gpus`.
GangCandidate Cand(const std::string& name, uint32_t free_gpus, uint32_t member_gpus,
                   const std::string& block = "", const std::string& subblock = "",
                   const std::string& clique = "", const std::string& pool = "p") {
  GangCandidate c;
  c.node = name;
  c.pool = pool;
  c.topology.block = block;
  c.topology.subblock = subblock;
  c.topology.clique = clique;
  c.fits = free_gpus / member_gpus;
  c.free_milli = free_gpus * kGpu;
  c.member_milli = member_gpus * kGpu;
  return c;
}

std::vector<GangCandidate> Fitting(std::vector<GangCandidate> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](const GangCandidate& c) { return c.fits == 0; }),
          v.end());
  return v;
}

TEST(PickGangNodesTest, OneNodeWhenOneNodeHoldsAll) {
  // 4 members of 2 GPUs on 8-GPU nodes: one node.
  // The fuller of two nodes that could.
  std::vector<GangCandidate> c = {Cand("a", 8, 2, "b1"), Cand("b", 6, 2, "b1")};
  auto p = PickGangNodes(c, 3);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->nodes, ElementsAre("b"));
  EXPECT_EQ(p->per_node, 3u);
  p = PickGangNodes(c, 4);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->nodes, ElementsAre("a"));
  EXPECT_EQ(p->per_node, 4u);
  EXPECT_EQ(p->level, DomainLevel::kNode);
}

TEST(PickGangNodesTest, FewestNodesWithTheSameCountEach) {
  // 4 members of 2 GPUs on 4-GPU nodes: two nodes x 2, not four x 1.
  std::vector<GangCandidate> c = {Cand("a", 4, 2, "b1"), Cand("b", 4, 2, "b1"),
                                  Cand("c", 4, 2, "b1"), Cand("d", 4, 2, "b1")};
  auto p = PickGangNodes(c, 4);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->nodes.size(), 2u);  // which two of the four alike is fixed, not by name
  EXPECT_TRUE(std::is_sorted(p->nodes.begin(), p->nodes.end()));
  EXPECT_EQ(p->per_node, 2u);
  EXPECT_EQ(p->level, DomainLevel::kBlock);
}

TEST(PickGangNodesTest, OddGangTakesOnePerNode) {
  // 3 members of 2 GPUs on 4-GPU nodes: 2 per node cannot divide 3, so three
  // nodes x 1.
  std::vector<GangCandidate> c = {Cand("a", 4, 2), Cand("b", 4, 2), Cand("c", 4, 2),
                                  Cand("d", 5, 2)};
  auto p = PickGangNodes(c, 3);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->nodes, ElementsAre("a", "b", "c"));  // d is the roomiest: left out
  EXPECT_EQ(p->per_node, 1u);
  EXPECT_EQ(p->level, DomainLevel::kPool);
}

// Block b1: sub-block s1 (clique k1: n1 n2; clique k2: n3 n4), sub-block s2
// (n5 n6); block b2: sub-block s3 (n7 n8). 8 GPUs per node; `used` says how
// many GPUs each node has in use.
std::vector<GangCandidate> Cluster(const std::vector<uint32_t>& used, uint32_t member_gpus) {
  struct N {
    const char* name;
    const char* block;
    const char* subblock;
    const char* clique;
  };
  const N nodes[] = {{"n1", "b1", "s1", "k1"}, {"n2", "b1", "s1", "k1"}, {"n3", "b1", "s1", "k2"},
                     {"n4", "b1", "s1", "k2"}, {"n5", "b1", "s2", ""},   {"n6", "b1", "s2", ""},
                     {"n7", "b2", "s3", ""},   {"n8", "b2", "s3", ""}};
  std::vector<GangCandidate> out;
  for (size_t i = 0; i < 8; ++i) {
    out.push_back(
        Cand(nodes[i].name, 8 - used[i], member_gpus, nodes[i].block, nodes[i].subblock,
             nodes[i].clique));
  }
  return Fitting(out);
}

TEST(PickGangNodesTest, OneCliqueWhenACliqueHasRoom) {
  // 2 members of 8 GPUs: clique k2 is whole; k1 has a busy node.
  auto p = PickGangNodes(Cluster({4, 0, 0, 0, 0, 0, 0, 0}, 8), 2);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->nodes, ElementsAre("n3", "n4"));
  EXPECT_EQ(p->level, DomainLevel::kClique);
  EXPECT_EQ(p->per_node, 1u);
}

TEST(PickGangNodesTest, FallsToOneSubblock) {
  // No clique has two free nodes; sub-blocks s1 (n2, n4), s2 (n5, n6) and
  // s3 (n7, n8) each do, alike in every measure: names decide.
  auto p = PickGangNodes(Cluster({4, 0, 4, 0, 0, 0, 0, 0}, 8), 2);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->nodes, ElementsAre("n2", "n4"));
  EXPECT_EQ(p->level, DomainLevel::kSubblock);
}

TEST(PickGangNodesTest, FallsToOneBlock) {
  // Every sub-block has at most one free node; block b1 has three.
  auto p = PickGangNodes(Cluster({8, 8, 8, 0, 0, 8, 0, 8}, 8), 2);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->nodes, ElementsAre("n4", "n5"));
  EXPECT_EQ(p->level, DomainLevel::kBlock);
}

TEST(PickGangNodesTest, SplitsAcrossBlocksOnlyWhenItMust) {
  // 3 whole nodes: b1 has two free, b2 one: only the pool holds three.
  auto p = PickGangNodes(Cluster({8, 8, 8, 0, 8, 0, 0, 8}, 8), 3);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->nodes, ElementsAre("n4", "n6", "n7"));
  EXPECT_EQ(p->level, DomainLevel::kPool);
  // Two fit in one block: no split.
  p = PickGangNodes(Cluster({8, 8, 8, 0, 8, 0, 0, 8}, 8), 2);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->nodes, ElementsAre("n4", "n6"));
  EXPECT_EQ(p->level, DomainLevel::kBlock);
}

TEST(PickGangNodesTest, LeastStrandedBetweenEqualDomains) {
  // 4 members of 2 GPUs; no node takes all four. Cliques ka (6 free each)
  // and kb (4, 4 and 7 free) both hold them as two nodes x 2; kb strands
  // nothing, ka 2 GPUs per node, so kb wins although "a*" sorts first and
  // ka has less free in all (the next tie-break).
  std::vector<GangCandidate> c = {Cand("a1", 6, 2, "b", "s", "ka"), Cand("a2", 6, 2, "b", "s", "ka"),
                                  Cand("b1", 4, 2, "b", "s", "kb"), Cand("b2", 4, 2, "b", "s", "kb"),
                                  Cand("b3", 7, 2, "b", "s", "kb")};
  auto p = PickGangNodes(c, 4);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->level, DomainLevel::kClique);
  EXPECT_EQ(p->per_node, 2u);
  EXPECT_THAT(p->nodes, ElementsAre("b1", "b2"));
}

TEST(PickGangNodesTest, TighterLevelBeatsFewerNodes) {
  // 4 whole-GPU members: clique k (4 nodes x 1 GPU free) against a node pair
  // outside any clique with 2 each: the clique wins, as the header says
  // (level first, then nodes).
  std::vector<GangCandidate> c = {Cand("k1", 1, 1, "b", "s", "k"), Cand("k2", 1, 1, "b", "s", "k"),
                                  Cand("k3", 1, 1, "b", "s", "k"), Cand("k4", 1, 1, "b", "s", "k"),
                                  Cand("x1", 2, 1, "b2"), Cand("x2", 2, 1, "b3")};
  auto p = PickGangNodes(c, 4);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->level, DomainLevel::kClique);
  EXPECT_EQ(p->per_node, 1u);
  EXPECT_THAT(p->nodes, ElementsAre("k1", "k2", "k3", "k4"));
}

TEST(PickGangNodesTest, DeterministicUnderShuffledInput) {
  std::vector<GangCandidate> c;
  for (int i = 0; i < 64; ++i) {
    c.push_back(Cand("n" + std::to_string(i), i % 3 == 0 ? 8 : 4, 2, "b" + std::to_string(i / 16),
                     "s" + std::to_string(i / 8), "", i % 2 == 0 ? "p1" : "p2"));
  }
  const auto want = PickGangNodes(c, 8);
  ASSERT_TRUE(want.has_value());
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    std::shuffle(c.begin(), c.end(), rng);
    auto got = PickGangNodes(c, 8);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->nodes, want->nodes);
    EXPECT_EQ(got->per_node, want->per_node);
    EXPECT_EQ(got->level, want->level);
  }
}

TEST(PickGangNodesTest, OnePoolOnly) {
  // Two nodes of different pools cannot share a gang, even in one block.
  std::vector<GangCandidate> c = {Cand("a", 8, 8, "b1", "", "", "p1"),
                                  Cand("b", 8, 8, "b1", "", "", "p2")};
  std::string why;
  EXPECT_FALSE(PickGangNodes(c, 2, &why).has_value());
  EXPECT_THAT(why, HasSubstr("pool \"p1\" has room for 1 on 1 node"));
  EXPECT_THAT(why, HasSubstr("pool \"p2\""));
  c.push_back(Cand("c", 8, 8, "b9", "", "", "p2"));
  auto p = PickGangNodes(c, 2);
  ASSERT_TRUE(p.has_value());
  EXPECT_THAT(p->nodes, ElementsAre("b", "c"));
}

TEST(PickGangNodesTest, RefusedWithAReason) {
  std::string why;
  EXPECT_FALSE(PickGangNodes({}, 2, &why).has_value());
  EXPECT_THAT(why, HasSubstr("no node has room"));
  // 5 members, 2 per node at most, 2 nodes: 4 slots; and no equal split.
  std::vector<GangCandidate> c = {Cand("a", 4, 2), Cand("b", 4, 2), Cand("c", 4, 2)};
  EXPECT_FALSE(PickGangNodes(c, 5, &why).has_value());
  EXPECT_THAT(why, HasSubstr("gang of 5"));
  EXPECT_THAT(why, HasSubstr("room for 6 on 3 nodes (at most 2 per node)"));
  EXPECT_FALSE(PickGangNodes(c, 0, &why).has_value());
}

TEST(TopologyOfTest, LabelsFirstThenDevices) {
  NodeSpec s;
  s.name = "n";
  s.labels["cloud.google.com/gce-topology-block"] = "B";
  s.labels["cloud.google.com/gce-topology-host"] = "H";
  s.labels["nvidia.com/gpu.clique"] = "C";
  DeviceSpec d;
  d.topology.block = "b-dev";
  d.topology.subblock = "s-dev";
  d.topology.nvlink_domain = "c-dev";
  s.devices.push_back(d);
  NodeTopology t = TopologyOf(s);
  EXPECT_EQ(t.block, "B");
  EXPECT_EQ(t.subblock, "s-dev");
  EXPECT_EQ(t.host, "H");
  EXPECT_EQ(t.clique, "C");

  NodeView v;
  v.spec.name = "n";
  DeviceState ds;
  ds.spec = d;
  ds.spec.topology.host = "h-dev";
  v.devices.push_back(ds);
  t = TopologyOf(v);
  EXPECT_EQ(t.block, "b-dev");
  EXPECT_EQ(t.host, "h-dev");
  EXPECT_EQ(t.clique, "c-dev");
}

std::shared_ptr<const NodeView> View(const std::string& name, const std::string& block,
                                     const std::string& subblock, uint32_t used_gpus) {
  auto v = std::make_shared<NodeView>();
  v->spec.name = name;
  v->spec.cpus = 64;
  v->spec.memory_mib = 1 << 18;
  v->spec.labels["cloud.google.com/gce-topology-block"] = block;
  if (!subblock.empty()) v->spec.labels["cloud.google.com/gce-topology-subblock"] = subblock;
  for (uint32_t i = 0; i < 8; ++i) {
    DeviceState d;
    d.spec.index = i;
    d.spec.model = "G";
    d.used_milli = i < used_gpus ? kWholeDevice : 0;
    v->devices.push_back(d);
  }
  return v;
}

TEST(DomainPackingTest, CountsTheDomainsOtherNodes) {
  const std::vector<std::shared_ptr<const NodeView>> nodes = {
      View("a1", "A", "", 4), View("a2", "A", "", 0), View("b1", "B", "", 0),
      View("b2", "B", "", 0), nullptr};
  const DomainUsage u = DomainUsage::Of(nodes);
  // a2's block holds 4 of a1's 8 GPUs elsewhere; a1's block holds nothing
  // elsewhere; block B holds nothing.
  EXPECT_DOUBLE_EQ(u.NodePacking("a2"), 0.5);
  EXPECT_DOUBLE_EQ(u.NodePacking("a1"), 0);
  EXPECT_DOUBLE_EQ(u.NodePacking("b1"), 0);
  EXPECT_DOUBLE_EQ(u.NodePacking("unknown"), 0);
  // Averaged over the levels the node has: a sub-block fully used elsewhere
  // and a block half used elsewhere.
  DomainTotals self{0, 8000};
  DomainTotals sub{8000, 16000};
  DomainTotals blk{8000, 24000};
  EXPECT_DOUBLE_EQ(DomainPacking(self, nullptr, &sub, &blk), (1.0 + 0.5) / 2);
  EXPECT_DOUBLE_EQ(DomainPacking(self, nullptr, nullptr, nullptr), 0);
}

TEST(DomainPackingTest, DuetPrefersThePartlyUsedDomainOnlyAsATieBreak) {
  // Two empty nodes alike but for their block: the one whose block is in use
  // wins under kDuet with domains; without them the first seen wins.
  const std::vector<std::shared_ptr<const NodeView>> nodes = {
      View("b1", "B", "", 0), View("a2", "A", "", 0), View("a1", "A", "", 6)};
  const std::vector<NodeLoad> loads(3);
  PodRequest r;
  r.count = 1;
  r.milli = kWholeDevice;
  const DomainUsage u = DomainUsage::Of(nodes);
  auto plain = SelectNode(nodes, loads, r, Scorer(Policy::kDuet));
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->node, 2u);  // a1 is fuller: node packing still decides
  const std::vector<uint32_t> empty_ones = {0, 1};
  plain = SelectNode(nodes, loads, r, Scorer(Policy::kDuet), &empty_ones);
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->node, 0u);  // a tie: the first seen
  const Scorer with(Policy::kDuet, nullptr, &u);
  auto packed = SelectNode(nodes, loads, r, with, &empty_ones);
  ASSERT_TRUE(packed.has_value());
  EXPECT_EQ(packed->node, 1u);  // a2: block A is partly used
  // The fuller node still beats the domain term.
  packed = SelectNode(nodes, loads, r, with);
  ASSERT_TRUE(packed.has_value());
  EXPECT_EQ(packed->node, 2u);
  // Other policies ignore it.
  EXPECT_EQ(Scorer(Policy::kBestFit, nullptr, &u).DomainTerm(*nodes[1]), 0);
  EXPECT_GT(with.DomainTerm(*nodes[1]), 0);
  auto e1 = with.Evaluate(*nodes[1], loads[1], r);
  auto e0 = with.Evaluate(*nodes[0], loads[0], r);
  ASSERT_TRUE(e1.has_value() && e0.has_value());
  EXPECT_GT(e1->raw, e0->raw);
}

}  // namespace
}  // namespace duet::placement
