// Issue 27, item 4: duet-sim's gang arrivals. The counts a gang replay reports
// agree with what the real Ledger holds at the end (every member placed at
// most once, no device held twice), and duet's all-or-nothing policy never
// leaves part of a gang holding devices, where the per-pod policy does.
// Also PickGangNodes' contract (docs/gangs.md 4), whichever definition
// duet-sim links (bridge/placement's own).

#include "bench/sim/gang.h"

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "bench/sim/replay.h"
#include "bridge/placement/topology.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet::sim {
namespace {

using placement::DomainLevel;
using placement::GangCandidate;
using placement::GangPick;

// 16 nodes of 4 GPUs, T4 and V100 alternating in blocks of 4 (so a clique of
// 4 nodes is one model), and Kubernetes pods of 1 and 2 whole GPUs (any model).
Trace SmallTrace() {
  Trace t;
  for (uint32_t i = 0; i < 16; ++i) {
    NodeSpec n;
    n.name = absl::StrCat("node-", i < 10 ? "0" : "", i);
    n.cpus = 64;
    n.memory_mib = 262144;
    for (uint32_t d = 0; d < 4; ++d) {
      DeviceSpec dev;
      dev.index = d;
      dev.model = (i / 4) % 2 == 0 ? "T4" : "V100";
      n.devices.push_back(dev);
    }
    t.nodes.push_back(std::move(n));
  }
  for (uint32_t i = 0; i < 60; ++i) {
    TracePod p;
    p.name = absl::StrCat("pod-", 1000 + i);
    p.request.count = i % 3 == 0 ? 2 : 1;
    p.request.cpu_milli = 4000;
    p.request.memory_mib = 8192;
    p.qos = "LS";
    t.pods.push_back(std::move(p));
  }
  return t;
}

std::vector<Arrival> GangArrivals(const Trace& t, uint64_t seed) {
  absl::StatusOr<Mapping> mapping = ParseMapping("all-k8s");
  EXPECT_TRUE(mapping.ok());
  absl::StatusOr<std::vector<Arrival>> base = MakeArrivals(t, *mapping, seed, 1.3);
  EXPECT_TRUE(base.ok()) << base.status();
  GangMix mix;
  mix.share = 1.0;
  mix.min_size = 2;
  mix.max_size = 8;
  return AddGangs(t, *base, mix, seed, 1.3);
}

TEST(GangMixTest, ParsesAndRefuses) {
  absl::StatusOr<GangMix> m = ParseGangMix("0.25,2-8");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->share, 0.25);
  EXPECT_EQ(m->min_size, 2u);
  EXPECT_EQ(m->max_size, 8u);
  EXPECT_EQ(m->gap, 1u);
  ASSERT_TRUE(ParseGangMix("1,4-4,10").ok());
  EXPECT_EQ(ParseGangMix("1,4-4,10")->gap, 10u);
  for (const char* bad : {"", "0.5", "0,2-8", "1.5,2-8", "0.5,1-8", "0.5,8-2", "0.5,2-99",
                          "0.5,2-8,0", "x,2-8", "0.5,2-8,1,1"}) {
    EXPECT_FALSE(ParseGangMix(bad).ok()) << bad;
  }
  EXPECT_TRUE(ParseSimTopology("4,16,64").ok());
  EXPECT_FALSE(ParseSimTopology("3,16,64").ok());
  EXPECT_FALSE(ParseSimTopology("4,16").ok());
}

// Every gang has exactly its size in members, numbered 0..size-1, all copies
// of one multi-GPU pod; the pods on their own are the base stream's, in order.
TEST(GangMixTest, GangsAreWholeCopiesOfOneMultiGpuPod) {
  const Trace t = SmallTrace();
  const std::vector<Arrival> arrivals = GangArrivals(t, 7);
  std::map<uint32_t, std::vector<Arrival>> gangs;
  for (const Arrival& a : arrivals) {
    if (a.gang != 0) gangs[a.gang].push_back(a);
  }
  ASSERT_GE(gangs.size(), 3u);
  for (const auto& [id, members] : gangs) {
    ASSERT_GE(members.front().gang_size, 2u);
    ASSERT_LE(members.front().gang_size, 8u);
    ASSERT_EQ(members.size(), members.front().gang_size) << "gang " << id;
    for (uint32_t m = 0; m < members.size(); ++m) {
      EXPECT_EQ(members[m].member, m);
      EXPECT_EQ(members[m].pod, members.front().pod);
      EXPECT_EQ(members[m].gang_size, members.front().gang_size);
    }
    EXPECT_EQ(t.pods[members.front().pod].request.count, 2u);
  }
  // Share 1: every multi-GPU arrival is a gang member.
  for (const Arrival& a : arrivals) {
    if (t.pods[a.pod].request.count >= 2) {
      EXPECT_NE(a.gang, 0u);
    }
  }
}

struct Outcome {
  ReplayResult result;
  // Per gang id: the nodes its members' holdings are on (one per member).
  std::map<uint32_t, std::vector<std::string>> member_nodes;
};

// Replays with `policy` and checks what holds for every gang policy: the
// ledger's holdings against the reported counts.
Outcome ReplayAndCheck(const Trace& t, const std::vector<Arrival>& arrivals, GangPolicy policy) {
  std::vector<placement::PodRequest> requests;
  for (const TracePod& p : t.pods) requests.push_back(p.request);
  const placement::Workload workload = placement::Workload::FromPods(requests, 0.95);
  absl::StatusOr<PolicySpec> spec = ParsePolicySpec("duet");
  EXPECT_TRUE(spec.ok());
  spec->gang = policy;
  ReplayOptions options;
  options.keep_holdings = true;
  options.time_decisions = false;
  options.topology = SimTopology{4, 8, 16};
  absl::StatusOr<ReplayResult> r = Replay(t, arrivals, workload, *spec, options);
  Outcome out;
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return out;
  out.result = *r;

  // No device is held by two owners: whole-GPU pods only, so the milli held
  // on each device add up to at most one device.
  std::map<std::pair<std::string, uint32_t>, uint32_t> milli;
  std::set<std::string> uids;
  uint64_t placeholders = 0;
  for (const Holding& h : r->holdings) {
    for (const HeldDevice& d : h.devices) milli[{h.node, d.index}] += d.milli;
    if (h.owner.kind == OwnerKind::kPlaceholder) {
      ++placeholders;
      continue;
    }
    // Every pod holds on one node only: its uid appears once.
    EXPECT_TRUE(uids.insert(h.owner.pod_uid).second) << h.owner.ToString();
    uint64_t a = 0;
    EXPECT_TRUE(absl::SimpleAtoi(absl::StripPrefix(h.owner.pod_uid, "uid-"), &a))
        << h.owner.pod_uid;
    if (a < arrivals.size() && arrivals[a].gang != 0) {
      out.member_nodes[arrivals[a].gang].push_back(h.node);
      EXPECT_EQ(h.devices.size(), t.pods[arrivals[a].pod].request.count);
    }
  }
  for (const auto& [device, m] : milli) {
    EXPECT_LE(m, kWholeDevice) << device.first << " gpu " << device.second;
  }
  // Every member arrived, so every slot of a reservation has its member.
  EXPECT_EQ(placeholders, 0u);

  const GangStats& g = r->gangs;
  uint64_t gangs = 0, members = 0, held = 0, complete = 0, partial = 0;
  double partial_gpus = 0;
  for (const Arrival& a : arrivals) {
    if (a.gang == 0 || a.member != 0) continue;
    ++gangs;
    members += a.gang_size;
    const size_t n = out.member_nodes[a.gang].size();
    held += n;
    if (n == a.gang_size) ++complete;
    if (n > 0 && n < a.gang_size) {
      ++partial;
      partial_gpus += static_cast<double>(n * t.pods[a.pod].request.count);
    }
  }
  EXPECT_EQ(g.gangs, gangs);
  EXPECT_EQ(g.members, members);
  EXPECT_EQ(g.members_placed, held);
  EXPECT_EQ(g.placed, complete);
  EXPECT_EQ(g.waiting, partial);
  EXPECT_EQ(g.placed + g.waiting + g.never_placed, g.gangs);
  EXPECT_DOUBLE_EQ(g.idle_held_gpus, partial_gpus);
  uint64_t at_levels = 0;
  for (uint64_t c : g.placed_at_level) at_levels += c;
  EXPECT_EQ(at_levels, g.placed);
  return out;
}

TEST(GangReplayTest, DuetPlacesWholeGangsOrNothing) {
  const Trace t = SmallTrace();
  for (uint64_t seed : {1, 2, 3}) {
    const std::vector<Arrival> arrivals = GangArrivals(t, seed);
    for (GangPolicy policy : {GangPolicy::kAllOrNothing, GangPolicy::kAllOrNothingFlat}) {
      SCOPED_TRACE(absl::StrCat("seed ", seed, ", ", GangPolicyName(policy)));
      const Outcome o = ReplayAndCheck(t, arrivals, policy);
      // The cluster runs out: some gangs cannot be placed, so the rule is tested.
      EXPECT_GT(o.result.gangs.never_placed, 0u);
      EXPECT_GT(o.result.gangs.placed, 0u);
      EXPECT_EQ(o.result.gangs.waiting, 0u);
      EXPECT_EQ(o.result.gangs.idle_held_gpus, 0);
      // Every slot is held from member 0's arrival until the last member's,
      // size - 1 arrivals later (consecutive members).
      double idle = 0;
      for (const Arrival& a : arrivals) {
        if (a.gang == 0 || a.member != 0 || o.member_nodes.count(a.gang) == 0) continue;
        if (o.member_nodes.at(a.gang).empty()) continue;
        idle += static_cast<double>(a.gang_size * t.pods[a.pod].request.count) *
                static_cast<double>(a.gang_size - 1);
      }
      EXPECT_DOUBLE_EQ(o.result.gangs.idle_gpu_arrivals, idle);
      for (const auto& [id, nodes] : o.member_nodes) {
        if (nodes.empty()) continue;  // never placed
        // Placed gangs only (a gang holding anything holds every member), on
        // one pool (model), the same number of members on each node.
        std::map<std::string, int> per_node;
        std::set<std::string> models;
        for (const std::string& node : nodes) {
          ++per_node[node];
          const int index = std::stoi(node.substr(5));
          models.insert(t.nodes[index].devices[0].model);
        }
        EXPECT_EQ(models.size(), 1u) << "gang " << id;
        for (const auto& [node, count] : per_node) {
          EXPECT_EQ(count, per_node.begin()->second) << "gang " << id << " on " << node;
        }
      }
    }
  }
}

// The per-pod policy on the same arrivals: members that fit hold their
// devices while their gang never completes.
TEST(GangReplayTest, PerPodLeavesPartialGangsHolding) {
  const Trace t = SmallTrace();
  uint64_t waiting = 0;
  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    const Outcome o = ReplayAndCheck(t, GangArrivals(t, seed), GangPolicy::kPerPod);
    waiting += o.result.gangs.waiting;
    if (o.result.gangs.waiting > 0) {
      EXPECT_GT(o.result.gangs.idle_held_gpus, 0);
    }
  }
  EXPECT_GT(waiting, 0u);
}

GangCandidate Candidate(const std::string& node, const std::string& pool, const std::string& clique,
                        const std::string& subblock, uint32_t fits, uint64_t free_milli) {
  GangCandidate c;
  c.node = node;
  c.pool = pool;
  c.topology.block = "b0";
  c.topology.subblock = subblock;
  c.topology.clique = clique;
  c.topology.host = node;
  c.fits = fits;
  c.free_milli = free_milli;
  c.member_milli = 2000;
  return c;
}

TEST(PickGangNodesTest, TightestDomainSameCountOnePool) {
  const std::vector<GangCandidate> candidates = {
      Candidate("a1", "A", "c1", "s1", 2, 4000), Candidate("a2", "A", "c1", "s1", 2, 4000),
      Candidate("a3", "A", "c2", "s1", 4, 8000), Candidate("a4", "A", "c2", "s1", 4, 8000),
      Candidate("a5", "A", "c3", "s2", 1, 2000), Candidate("b1", "B", "c9", "s9", 3, 6000),
  };
  // 4 members: one node takes them all (a3 and a4 tie; which one is
  // PickGangNodes' deterministic tie-break, the same whatever the order).
  std::optional<GangPick> p = placement::PickGangNodes(candidates, 4);
  ASSERT_TRUE(p.has_value());
  ASSERT_EQ(p->nodes.size(), 1u);
  EXPECT_TRUE(p->nodes[0] == "a3" || p->nodes[0] == "a4") << p->nodes[0];
  EXPECT_EQ(p->per_node, 4u);
  EXPECT_EQ(p->level, DomainLevel::kNode);
  const std::vector<GangCandidate> shuffled = {candidates[4], candidates[3], candidates[0],
                                               candidates[5], candidates[2], candidates[1]};
  std::optional<GangPick> again = placement::PickGangNodes(shuffled, 4);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->nodes, p->nodes);
  // 8: clique c2 (4 + 4) before sub-block s1's other splits.
  p = placement::PickGangNodes(candidates, 8);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->nodes, std::vector<std::string>({"a3", "a4"}));
  EXPECT_EQ(p->per_node, 4u);
  EXPECT_EQ(p->level, DomainLevel::kClique);
  // 5: one member on each of 5 nodes; pool A's five share only block b0.
  p = placement::PickGangNodes(candidates, 5);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->nodes, std::vector<std::string>({"a1", "a2", "a3", "a4", "a5"}));
  EXPECT_EQ(p->per_node, 1u);
  EXPECT_EQ(p->level, DomainLevel::kBlock);
  // 13: pool A takes 2+2+4+4+1 = 13 only with unequal counts, and pool B's
  // node is never mixed in: refused, with a reason.
  std::string reason;
  EXPECT_FALSE(placement::PickGangNodes(candidates, 13, &reason).has_value());
  EXPECT_FALSE(reason.empty());
  // The input's order does not matter.
  std::vector<GangCandidate> reversed(candidates.rbegin(), candidates.rend());
  p = placement::PickGangNodes(reversed, 8);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->nodes, std::vector<std::string>({"a3", "a4"}));
}

}  // namespace
}  // namespace duet::sim
