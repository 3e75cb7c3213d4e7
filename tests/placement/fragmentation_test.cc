// The grouped fragmentation (internal::WorkloadFragmentation, what scoring
// runs) against its definition, shape by shape (internal::ShapeFragmentation),
// on nodes driven through random holds and releases of a real Ledger.

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bridge/ledger/ledger.h"
#include "bridge/placement/node_free.h"
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

}  // namespace
}  // namespace duet::placement
