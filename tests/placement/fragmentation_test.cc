// The grouped fragmentation (internal::WorkloadFragmentation, what scoring
// runs) against its definition, shape by shape (internal::ShapeFragmentation),
// on nodes driven through random holds and releases of a real Ledger.

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bridge/ledger/ledger.h"
#include "bridge/placement/node_free.h"
#include "bridge/placement/placement.h"
#include "bridge/placement/workload.h"
#include "gtest/gtest.h"

namespace duet::placement {
namespace {

const char* const kModels[] = {"H100", "A100", "L4"};

double Reference(const internal::NodeFree& node, const Workload& w) {
  double f = 0;
  for (const Workload::Shape& s : w.shapes()) f += s.weight * internal::ShapeFragmentation(node, s.request);
  return f;
}

Workload RandomWorkload(std::mt19937& rng) {
  std::vector<Workload::Shape> shapes;
  const int n = 1 + static_cast<int>(rng() % 128);
  for (int i = 0; i < n; ++i) {
    PodRequest r;
    r.kind = rng() % 5 == 0 ? DeviceKind::kTpu : DeviceKind::kGpu;
    r.count = rng() % 6 == 0 ? 0 : 1 + rng() % 8;
    r.milli = r.count == 1 && rng() % 2 == 0 ? 50 * (1 + rng() % 19) : kWholeDevice;
    if (rng() % 4 == 0) r.models = {kModels[rng() % 3]};
    if (rng() % 8 == 0) r.models.push_back(kModels[rng() % 3]);
    r.cpu_milli = 1000 * (rng() % 40);
    r.memory_mib = rng() % 3 == 0 ? 4096 * (rng() % 64) : 0;
    shapes.push_back({r, 1.0 + rng() % 100});
  }
  return Workload(std::move(shapes));
}

NodeSpec RandomNode(std::mt19937& rng, int i) {
  NodeSpec n;
  n.name = absl::StrCat("n", i);
  n.cpus = rng() % 4 == 0 ? 0 : 16 + rng() % 112;
  n.memory_mib = rng() % 4 == 0 ? 0 : 65536 * (1 + rng() % 16);
  const uint32_t gpus = rng() % 9;
  const char* model = kModels[rng() % 3];
  for (uint32_t g = 0; g < gpus; ++g) {
    DeviceSpec d;
    d.kind = DeviceKind::kGpu;
    d.index = g;
    d.model = model;
    n.devices.push_back(d);
  }
  const uint32_t tpus = rng() % 3 == 0 ? 4 : 0;
  for (uint32_t t = 0; t < tpus; ++t) {
    DeviceSpec d;
    d.kind = DeviceKind::kTpu;
    d.index = t;
    d.model = "v5e";
    n.devices.push_back(d);
  }
  return n;
}

TEST(Fragmentation, GroupedEqualsShapeByShapeUnderRandomHoldsAndReleases) {
  int compared = 0;
  for (uint32_t seed = 1; seed <= 60; ++seed) {
    std::mt19937 rng(seed);
    const Workload w = RandomWorkload(rng);
    Ledger ledger;
    const int nodes = 4;
    std::vector<NodeSpec> specs;
    for (int i = 0; i < nodes; ++i) {
      specs.push_back(RandomNode(rng, i));
      ASSERT_TRUE(ledger.UpsertNode(specs.back()).ok());
    }
    std::vector<NodeLoad> loads(nodes);
    uint32_t next_job = 1;
    for (int op = 0; op < 200; ++op) {
      const int i = static_cast<int>(rng() % nodes);
      const NodeSpec& spec = specs[i];
      if (rng() % 3 == 0) {
        // Release one holder of the node, if any.
        auto view = ledger.GetNode(spec.name);
        for (const DeviceState& d : view->devices) {
          if (d.uses.empty()) continue;
          const Owner owner = *d.uses.front().owner;
          ASSERT_TRUE(ledger.Release(spec.name, owner).ok());
          break;
        }
      } else if (!spec.devices.empty()) {
        // Hold a random share or whole device(s) where free.
        auto view = ledger.GetNode(spec.name);
        HoldRequest h;
        h.node = spec.name;
        h.owner = Owner::SlurmJob(next_job++);
        const uint32_t milli = rng() % 2 == 0 ? kWholeDevice : 100 * (1 + rng() % 9);
        for (const DeviceState& d : view->devices) {
          if (d.free_milli() >= milli && rng() % 2 == 0) {
            h.devices.push_back({d.spec.kind, d.spec.index, milli});
          }
        }
        if (!h.devices.empty()) {
          ASSERT_TRUE(ledger.Hold(h).ok()) << seed << " op " << op;
        }
      }
      loads[i].cpu_milli = rng() % 130000;
      loads[i].memory_mib = rng() % (1 << 20);
      const internal::NodeFree free = internal::Summarize(*ledger.GetNode(spec.name), loads[i]);
      const double want = Reference(free, w);
      const double got = internal::WorkloadFragmentation(free, w);
      ASSERT_NEAR(got, want, 1e-9 * std::max(1.0, std::abs(want))) << "seed " << seed << " op " << op;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 60 * 200);
}

TEST(Fragmentation, GroupsShapesBySharedDeviceDemand) {
  PodRequest whole1, whole4, share, cpu_only;
  whole1.count = 1;
  whole4.count = 4;
  share.count = 1;
  share.milli = 500;
  cpu_only.cpu_milli = 2000;
  const Workload w({{whole4, 1}, {whole1, 1}, {share, 1}, {cpu_only, 1}});
  ASSERT_EQ(w.groups().size(), 2u);  // whole GPUs; half GPUs
  EXPECT_EQ(w.groups()[0].members.size(), 2u);
  EXPECT_EQ(w.groups()[0].members[0].count, 1u);  // sorted by count
  EXPECT_DOUBLE_EQ(w.no_device_weight(DeviceKind::kGpu), 0.25);
  EXPECT_DOUBLE_EQ(w.no_device_weight(DeviceKind::kTpu), 0);
}

// Bit-for-bit equality of two doubles (EXPECT_EQ on doubles is exact too, but
// this also tells +0 from -0).
bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

PodRequest RandomRequest(std::mt19937& rng) {
  PodRequest r;
  r.kind = rng() % 8 == 0 ? DeviceKind::kTpu : DeviceKind::kGpu;
  r.count = rng() % 10 == 0 ? 0 : 1 + rng() % 8;
  r.milli = r.count == 1 && rng() % 2 == 0 ? 100 * (1 + rng() % 9) : kWholeDevice;
  if (rng() % 5 == 0) r.models = {kModels[rng() % 3]};
  r.cpu_milli = 1000 * (rng() % 24);
  r.memory_mib = rng() % 3 == 0 ? 4096 * (rng() % 32) : 0;
  r.ResolveModelIds();
  return r;
}

// The memo (Workload::memo, what scoring reads) against the full
// recomputation, and scoring with it against scoring without it, on a
// cluster driven through random holds, releases, load changes and workload
// replacements. Nodes are drawn from a few specs and loads from a few values,
// so that many nodes share a signature and the memo is actually hit.
TEST(Fragmentation, MemoEqualsFullRecomputationUnderRandomHoldsReleasesAndWorkloads) {
  uint64_t compared = 0;
  uint64_t decisions = 0;
  for (uint32_t seed = 1; seed <= 150; ++seed) {
    std::mt19937 rng(seed);
    auto workload = std::make_shared<Workload>(RandomWorkload(rng));
    Ledger ledger;
    const int nodes = 12;
    std::vector<NodeSpec> kinds;
    for (int k = 0; k < 3; ++k) kinds.push_back(RandomNode(rng, k));
    std::vector<NodeSpec> specs;
    std::vector<std::shared_ptr<const NodeView>> views;
    for (int i = 0; i < nodes; ++i) {
      NodeSpec n = kinds[rng() % kinds.size()];
      n.name = absl::StrCat("n", i);
      specs.push_back(n);
      ASSERT_TRUE(ledger.UpsertNode(n).ok());
      views.push_back(ledger.GetNode(n.name));
    }
    std::vector<NodeLoad> loads(nodes);
    uint32_t next_job = 1;
    for (int op = 0; op < 120; ++op) {
      const int i = static_cast<int>(rng() % nodes);
      const NodeSpec& spec = specs[i];
      const uint32_t what = rng() % 10;
      if (what == 0) {
        // The model's next snapshot: a new workload, with a new memo.
        workload = std::make_shared<Workload>(RandomWorkload(rng));
      } else if (what <= 3) {
        for (const DeviceState& d : views[i]->devices) {
          if (d.uses.empty()) continue;
          ASSERT_TRUE(ledger.Release(spec.name, *d.uses.front().owner).ok());
          break;
        }
      } else if (what <= 7 && !spec.devices.empty()) {
        HoldRequest h;
        h.node = spec.name;
        h.owner = Owner::SlurmJob(next_job++);
        const uint32_t milli = rng() % 2 == 0 ? kWholeDevice : 100 * (1 + rng() % 9);
        for (const DeviceState& d : views[i]->devices) {
          if (d.free_milli() >= milli && rng() % 2 == 0) {
            h.devices.push_back({d.spec.kind, d.spec.index, milli});
          }
        }
        if (!h.devices.empty()) {
          ASSERT_TRUE(ledger.Hold(h).ok()) << seed << " op " << op;
        }
      } else {
        loads[i].cpu_milli = 8000 * (rng() % 8);
        loads[i].memory_mib = 65536 * (rng() % 4);
      }
      views[i] = ledger.GetNode(spec.name);

      // Every node, every step: the memo's value is the full recomputation's.
      ASSERT_NE(workload->memo(), nullptr);
      for (int j = 0; j < nodes; ++j) {
        const internal::NodeFree free = internal::Summarize(*views[j], loads[j]);
        const double want = internal::WorkloadFragmentation(free, *workload);
        const double got = internal::MemoizedWorkloadFragmentation(free, *workload);
        ASSERT_TRUE(SameBits(got, want))
            << "seed " << seed << " op " << op << " node " << j << ": " << got << " vs " << want;
        ++compared;
      }

      // Decisions: the same node, devices and scores with and without the memo.
      Workload plain = *workload;
      plain.DisableMemo();
      ASSERT_EQ(plain.memo(), nullptr);
      const PodRequest req = RandomRequest(rng);
      for (Policy policy : {Policy::kDuet, Policy::kFgd}) {
        const Scorer memoized(policy, workload.get());
        const Scorer reference(policy, &plain);
        const auto a = SelectNode(views, loads, req, memoized);
        const auto b = SelectNode(views, loads, req, reference);
        ASSERT_EQ(a.has_value(), b.has_value()) << seed << " op " << op;
        if (a.has_value()) {
          EXPECT_EQ(a->node, b->node) << seed << " op " << op;
          EXPECT_TRUE(SameBits(a->placement.raw, b->placement.raw)) << seed << " op " << op;
          EXPECT_EQ(a->placement.score, b->placement.score);
          EXPECT_EQ(a->placement.devices, b->placement.devices);
          ++decisions;
        }
        for (int j = 0; j < nodes; ++j) {
          const auto pa = memoized.Evaluate(*views[j], loads[j], req);
          const auto pb = reference.Evaluate(*views[j], loads[j], req);
          ASSERT_EQ(pa.has_value(), pb.has_value());
          if (!pa.has_value()) continue;
          EXPECT_TRUE(SameBits(pa->raw, pb->raw)) << seed << " op " << op << " node " << j;
          EXPECT_EQ(pa->score, pb->score);
          EXPECT_EQ(pa->devices, pb->devices);
        }
        EXPECT_EQ(memoized.SlurmWeight(*views[i], loads[i]),
                  reference.SlurmWeight(*views[i], loads[i]));
      }
    }
    // Many nodes share a signature: the memo holds fewer entries than it
    // answered lookups (12 nodes per step, plus the scoring's).
    EXPECT_LT(workload->memo()->size(), static_cast<size_t>(nodes) * 120);
  }
  EXPECT_EQ(compared, uint64_t{150} * 120 * 12);
  EXPECT_GT(decisions, 1000u);
}

// Devices outside the ledger (no interned model) are measured directly.
TEST(Fragmentation, MemoMeasuresNodesWithoutInternedModelsDirectly) {
  std::mt19937 rng(7);
  const Workload w = RandomWorkload(rng);
  NodeView view;
  view.spec = RandomNode(rng, 0);
  for (const DeviceSpec& d : view.spec.devices) {
    DeviceState s;
    s.spec = d;  // model_id 0
    view.devices.push_back(s);
  }
  const internal::NodeFree free = internal::Summarize(view, NodeLoad{});
  ASSERT_NE(w.memo(), nullptr);
  EXPECT_TRUE(SameBits(internal::MemoizedWorkloadFragmentation(free, w),
                       internal::WorkloadFragmentation(free, w)));
  EXPECT_EQ(w.memo()->size(), view.devices.empty() ? 1u : 0u);
}

// The extender scores on several threads against one workload.
TEST(Fragmentation, MemoIsExactUnderConcurrentReaders) {
  std::mt19937 rng(11);
  const Workload w = RandomWorkload(rng);
  Ledger ledger;
  std::vector<internal::NodeFree> nodes;
  std::vector<double> want;
  for (int i = 0; i < 40; ++i) {
    NodeSpec n = RandomNode(rng, i);
    ASSERT_TRUE(ledger.UpsertNode(n).ok());
    auto view = ledger.GetNode(n.name);
    HoldRequest h;
    h.node = n.name;
    h.owner = Owner::SlurmJob(static_cast<uint32_t>(i + 1));
    for (const DeviceState& d : view->devices) {
      const auto milli = static_cast<uint32_t>(100 * (1 + rng() % 10));
      if (rng() % 2 == 0) h.devices.push_back({d.spec.kind, d.spec.index, milli});
    }
    if (!h.devices.empty()) {
      ASSERT_TRUE(ledger.Hold(h).ok());
    }
    NodeLoad load;
    load.cpu_milli = 4000 * (rng() % 10);
    nodes.push_back(internal::Summarize(*ledger.GetNode(n.name), load));
    want.push_back(internal::WorkloadFragmentation(nodes.back(), w));
  }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 200; ++round) {
        for (size_t i = 0; i < nodes.size(); ++i) {
          const size_t k = (i + static_cast<size_t>(t) * 7) % nodes.size();
          if (!SameBits(internal::MemoizedWorkloadFragmentation(nodes[k], w), want[k])) {
            ++mismatches[t];
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

}  // namespace
}  // namespace duet::placement
