#include "bridge/placement/workload_model.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace duet::placement {
namespace {

PodRequest Gpu(uint32_t count, uint32_t milli = kWholeDevice, uint64_t cpu = 0,
               uint64_t mem = 0) {
  PodRequest r;
  r.kind = DeviceKind::kGpu;
  r.count = count;
  r.milli = milli;
  r.cpu_milli = cpu;
  r.memory_mib = mem;
  return r;
}

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

// The exported shapes as "count/milli/cpu:share%" strings, heaviest first.
std::vector<std::string> Describe(const WorkloadModel& m, absl::Time now) {
  std::vector<std::string> out;
  for (const auto& s : m.stats(now).shapes) {
    out.push_back(absl::StrCat(s.shape.count, "/", s.shape.count == 0 ? 0 : s.shape.milli, "/",
                               s.shape.cpu_milli, ":", std::lround(s.share * 100)));
  }
  return out;
}

WorkloadModelOptions NoDecay() {
  WorkloadModelOptions o;
  o.half_life = absl::InfiniteDuration();
  o.coverage = 1;
  o.refresh = absl::ZeroDuration();
  o.min_arrivals = 0;
  return o;
}

TEST(WorkloadModel, ShapesAndFrequenciesAfterAKnownSequence) {
  WorkloadModel m(NoDecay());
  int uid = 0;
  auto see = [&](const PodRequest& r, int times) {
    for (int i = 0; i < times; ++i) m.Observe(absl::StrCat("pod-", ++uid), r, kT0);
  };
  see(Gpu(1), 5);
  see(Gpu(1, 500), 3);
  see(Gpu(8, kWholeDevice, 32000), 2);
  EXPECT_EQ(Describe(m, kT0),
            (std::vector<std::string>{"1/1000/0:50", "1/500/0:30", "8/1000/32000:20"}));
  const auto w = m.Current(kT0);
  ASSERT_EQ(w->shapes().size(), 3u);
  EXPECT_DOUBLE_EQ(w->shapes()[0].weight, 0.5);
  EXPECT_DOUBLE_EQ(w->shapes()[2].weight, 0.2);
  const auto st = m.stats(kT0);
  EXPECT_EQ(st.arrivals, 10u);
  EXPECT_EQ(st.tracked, 3u);
  EXPECT_DOUBLE_EQ(st.total_weight, 10);
  EXPECT_DOUBLE_EQ(st.coverage, 1);
}

TEST(WorkloadModel, AnArrivalIsCountedOncePerKey) {
  WorkloadModel m(NoDecay());
  EXPECT_TRUE(m.Observe("uid-a", Gpu(1), kT0));
  // The extender's second attempt and the pod watch's sighting of the same pod.
  EXPECT_FALSE(m.Observe("uid-a", Gpu(1), kT0));
  EXPECT_FALSE(m.Observe("uid-a", Gpu(2), kT0));
  EXPECT_TRUE(m.Observe("uid-b", Gpu(2), kT0));
  // No key: always counted.
  EXPECT_TRUE(m.Observe("", Gpu(2), kT0));
  const auto st = m.stats(kT0);
  EXPECT_EQ(st.arrivals, 3u);
  EXPECT_EQ(st.duplicates, 2u);
  EXPECT_EQ(Describe(m, kT0), (std::vector<std::string>{"2/1000/0:67", "1/1000/0:33"}));
}

TEST(WorkloadModel, KeysAreForgottenOldestFirstBeyondTheBound) {
  WorkloadModelOptions o = NoDecay();
  o.max_keys = 2;
  WorkloadModel m(o);
  EXPECT_TRUE(m.Observe("a", Gpu(1), kT0));
  EXPECT_TRUE(m.Observe("b", Gpu(1), kT0));
  EXPECT_TRUE(m.Observe("c", Gpu(1), kT0));  // forgets "a"
  EXPECT_FALSE(m.Observe("c", Gpu(1), kT0));
  EXPECT_TRUE(m.Observe("a", Gpu(1), kT0));
}

TEST(WorkloadModel, OldArrivalsDecayWithTheHalfLife) {
  WorkloadModelOptions o = NoDecay();
  o.half_life = absl::Hours(1);
  WorkloadModel m(o);
  for (int i = 0; i < 4; ++i) m.Observe("", Gpu(1), kT0);
  // Two half-lives later the four weigh 1 together, as much as one new arrival.
  const absl::Time later = kT0 + absl::Hours(2);
  m.Observe("", Gpu(4), later);
  auto st = m.stats(later);
  ASSERT_EQ(st.shapes.size(), 2u);
  EXPECT_NEAR(st.shapes[0].share, 0.5, 1e-12);
  EXPECT_NEAR(st.shapes[1].share, 0.5, 1e-12);
  EXPECT_NEAR(st.total_weight, 2, 1e-12);
  // Weights read later keep decaying; shares do not change without arrivals.
  st = m.stats(later + absl::Hours(1));
  EXPECT_NEAR(st.total_weight, 1, 1e-12);
  EXPECT_NEAR(st.shapes[0].weight, 0.5, 1e-12);
  // A third arrival, three half-lives on, outweighs everything before it.
  m.Observe("", Gpu(2), later + absl::Hours(3));
  EXPECT_EQ(m.stats(later + absl::Hours(3)).shapes[0].shape.count, 2u);
  EXPECT_NEAR(m.stats(later + absl::Hours(3)).shapes[0].share, 8.0 / 10, 1e-12);
}

TEST(WorkloadModel, DecayOverThousandsOfHalfLivesStaysFinite) {
  WorkloadModelOptions o = NoDecay();
  o.half_life = absl::Seconds(1);
  WorkloadModel m(o);
  for (int i = 0; i < 5000; ++i) {
    m.Observe("", Gpu(1 + i % 2), kT0 + absl::Seconds(i));
  }
  const auto st = m.stats(kT0 + absl::Seconds(4999));
  ASSERT_EQ(st.shapes.size(), 2u);
  // The last arrival (i = 4999, two GPUs) weighs 1, the one before 1/2, ...
  EXPECT_EQ(st.shapes[0].shape.count, 2u);
  EXPECT_NEAR(st.shapes[0].share, 2.0 / 3, 1e-9);
  EXPECT_NEAR(st.total_weight, 2, 1e-9);
  EXPECT_TRUE(std::isfinite(st.shapes[1].weight));
}

TEST(WorkloadModel, ExportsTheHeaviestShapesUpToCoverageAndTheBound) {
  WorkloadModelOptions o = NoDecay();
  o.coverage = 0.8;
  WorkloadModel m(o);
  // Shapes 1..5 GPUs with 40, 30, 15, 10, 5 arrivals.
  const int counts[] = {40, 30, 15, 10, 5};
  for (uint32_t s = 0; s < 5; ++s) {
    for (int i = 0; i < counts[s]; ++i) m.Observe("", Gpu(s + 1), kT0);
  }
  // 40 + 30 = 70 < 80; 85 >= 80: three shapes.
  EXPECT_EQ(m.Current(kT0)->shapes().size(), 3u);
  EXPECT_NEAR(m.stats(kT0).coverage, 0.85, 1e-12);

  o.max_shapes = 2;
  WorkloadModel bounded(o);
  for (uint32_t s = 0; s < 5; ++s) {
    for (int i = 0; i < counts[s]; ++i) bounded.Observe("", Gpu(s + 1), kT0);
  }
  EXPECT_EQ(bounded.Current(kT0)->shapes().size(), 2u);
  EXPECT_NEAR(bounded.stats(kT0).coverage, 0.70, 1e-12);
}

TEST(WorkloadModel, TheTableIsBoundedAndDropsTheLightestShape) {
  WorkloadModelOptions o = NoDecay();
  o.max_shapes = 2;
  o.max_tracked = 3;
  WorkloadModel m(o);
  for (int i = 0; i < 3; ++i) m.Observe("", Gpu(1), kT0);
  for (int i = 0; i < 2; ++i) m.Observe("", Gpu(2), kT0);
  m.Observe("", Gpu(3), kT0);
  m.Observe("", Gpu(4), kT0);  // the table is full: 3 GPUs (weight 1) goes
  auto st = m.stats(kT0);
  EXPECT_EQ(st.tracked, 3u);
  EXPECT_EQ(st.evictions, 1u);
  // The forgotten arrival still counts in the total: coverage says so.
  EXPECT_DOUBLE_EQ(st.total_weight, 7);
  EXPECT_NEAR(st.coverage, 5.0 / 7, 1e-12);
  EXPECT_EQ(Describe(m, kT0), (std::vector<std::string>{"1/1000/0:43", "2/1000/0:29"}));
}

TEST(WorkloadModel, ASnapshotIsRebuiltAtMostOncePerRefresh) {
  WorkloadModelOptions o = NoDecay();
  o.refresh = absl::Seconds(1);
  WorkloadModel m(o);
  m.Observe("", Gpu(1), kT0);
  const auto first = m.Current(kT0);
  ASSERT_EQ(first->shapes().size(), 1u);
  m.Observe("", Gpu(2), kT0);
  EXPECT_EQ(m.Current(kT0 + absl::Milliseconds(500)), first);
  const auto second = m.Current(kT0 + absl::Seconds(1));
  EXPECT_NE(second, first);
  EXPECT_EQ(second->shapes().size(), 2u);
  // No change: the same snapshot, however late.
  EXPECT_EQ(m.Current(kT0 + absl::Hours(1)), second);
}

TEST(WorkloadModel, ASnapshotStaysUntilItsWeightsMoveByMinChange) {
  WorkloadModelOptions o = NoDecay();
  o.min_change = 0.1;
  WorkloadModel m(o);
  for (int i = 0; i < 10; ++i) m.Observe("", Gpu(1), kT0);
  for (int i = 0; i < 10; ++i) m.Observe("", Gpu(2), kT0);
  const auto even = m.Current(kT0);
  ASSERT_EQ(even->shapes().size(), 2u);
  EXPECT_DOUBLE_EQ(even->shapes()[0].weight, 0.5);
  // 11 of 21: the weights moved by 0.024, under 0.1. The snapshot (and its
  // fragmentation memo) stays; the coverage reported is today's.
  m.Observe("", Gpu(1), kT0);
  EXPECT_EQ(m.Current(kT0), even);
  // 14 of 24 moves them by 0.083 from the published 0.5: still the same.
  for (int i = 0; i < 3; ++i) m.Observe("", Gpu(1), kT0);
  EXPECT_EQ(m.Current(kT0), even);
  // 16 of 26 moves them by 0.115 (counted from what is published, not per
  // arrival): a new snapshot.
  m.Observe("", Gpu(1), kT0);
  m.Observe("", Gpu(1), kT0);
  const auto moved = m.Current(kT0);
  ASSERT_NE(moved, even);
  EXPECT_DOUBLE_EQ(moved->shapes()[0].weight, 16.0 / 26);
  EXPECT_DOUBLE_EQ(moved->shapes()[1].weight, 10.0 / 26);
  // A new shape is always a new snapshot, however light.
  m.Observe("", Gpu(3), kT0);
  const auto grown = m.Current(kT0);
  ASSERT_NE(grown, moved);
  EXPECT_EQ(grown->shapes().size(), 3u);
  // min_change 0: every change is published.
  o.min_change = 0;
  WorkloadModel every(o);
  for (int i = 0; i < 10; ++i) every.Observe("", Gpu(1), kT0);
  every.Observe("", Gpu(2), kT0);
  const auto a = every.Current(kT0);
  every.Observe("", Gpu(1), kT0);
  EXPECT_NE(every.Current(kT0), a);
}

TEST(WorkloadModel, ResetAndRebuildFromTheLiveSet) {
  WorkloadModel m(NoDecay());
  for (int i = 0; i < 10; ++i) m.Observe(absl::StrCat("old-", i), Gpu(8), kT0);
  // A restart: the pod watch's first list and the Slurm import report what
  // lives now; keys seen before the reset count again.
  m.Reset();
  EXPECT_TRUE(m.Current(kT0)->empty());
  m.Observe("old-1", Gpu(1), kT0);
  m.Observe("slurm-job-7", Gpu(2), kT0);
  EXPECT_EQ(Describe(m, kT0), (std::vector<std::string>{"1/1000/0:50", "2/1000/0:50"}));
}

TEST(WorkloadModel, MemoryIsPartOfAShapeOnlyWithAGranularity) {
  WorkloadModel plain(NoDecay());
  plain.Observe("", Gpu(1, kWholeDevice, 4000, 1000), kT0);
  plain.Observe("", Gpu(1, kWholeDevice, 4000, 30000), kT0);
  EXPECT_EQ(plain.stats(kT0).tracked, 1u);
  EXPECT_EQ(plain.stats(kT0).shapes[0].shape.memory_mib, 0u);

  WorkloadModelOptions o = NoDecay();
  o.memory_granularity_mib = 8192;
  WorkloadModel m(o);
  m.Observe("", Gpu(1, kWholeDevice, 4000, 1000), kT0);
  m.Observe("", Gpu(1, kWholeDevice, 4000, 8192), kT0);
  m.Observe("", Gpu(1, kWholeDevice, 4000, 30000), kT0);
  const auto st = m.stats(kT0);
  EXPECT_EQ(st.tracked, 2u);
  EXPECT_EQ(st.shapes[0].shape.memory_mib, 8192u);
  EXPECT_EQ(st.shapes[1].shape.memory_mib, 32768u);
}

// With no decay and no bound, the model after every arrival of a trace is
// the trace's oracle workload (Workload::FromPods), shape for shape.
TEST(WorkloadModel, WithoutDecayItConvergesToTheOracle) {
  std::mt19937 rng(7);
  std::vector<PodRequest> pods;
  for (int i = 0; i < 3000; ++i) {
    const uint32_t count = rng() % 4 == 0 ? 0 : 1 + rng() % 3;
    const uint32_t milli = count == 1 && rng() % 2 == 0 ? 100 * (1 + rng() % 9) : kWholeDevice;
    pods.push_back(Gpu(count, milli, 1000 * (rng() % 3)));
    if (rng() % 5 == 0) pods.back().models = {"H100"};
  }
  for (double coverage : {0.5, 0.9, 0.95, 1.0}) {
    WorkloadModelOptions o = NoDecay();
    o.coverage = coverage;
    o.max_shapes = o.max_tracked = 100000;
    WorkloadModel m(o);
    for (const PodRequest& p : pods) m.Observe("", p, kT0);
    const Workload oracle = Workload::FromPods(pods, coverage);
    const auto online = m.Current(kT0);
    ASSERT_EQ(online->shapes().size(), oracle.shapes().size()) << coverage;
    for (size_t i = 0; i < oracle.shapes().size(); ++i) {
      const PodRequest& a = online->shapes()[i].request;
      const PodRequest& b = oracle.shapes()[i].request;
      EXPECT_EQ(a.count, b.count);
      EXPECT_EQ(a.milli, b.milli);
      EXPECT_EQ(a.models, b.models);
      EXPECT_EQ(a.cpu_milli, b.cpu_milli);
      EXPECT_DOUBLE_EQ(online->shapes()[i].weight, oracle.shapes()[i].weight);
    }
  }
}

TEST(WorkloadModel, NothingIsExportedBeforeMinArrivals) {
  WorkloadModelOptions o = NoDecay();
  o.min_arrivals = 3;
  WorkloadModel m(o);
  m.Observe("a", Gpu(4), kT0);
  m.Observe("a", Gpu(4), kT0);  // a duplicate does not count
  m.Observe("b", Gpu(4), kT0);
  EXPECT_TRUE(m.Current(kT0)->empty());
  EXPECT_TRUE(m.stats(kT0).warming_up);
  EXPECT_EQ(m.stats(kT0).tracked, 1u);  // learned, not exported yet
  m.Observe("c", Gpu(2), kT0);
  EXPECT_FALSE(m.stats(kT0).warming_up);
  EXPECT_EQ(m.Current(kT0)->shapes().size(), 2u);
  // A reset (a restart's rebuild) warms up again.
  m.Reset();
  m.Observe("d", Gpu(1), kT0);
  EXPECT_TRUE(m.Current(kT0)->empty());
}

TEST(WorkloadModel, OptionsAreValidated) {
  WorkloadModelOptions o;
  EXPECT_TRUE(ValidateWorkloadModelOptions(o).ok());
  o.coverage = 0;
  EXPECT_EQ(ValidateWorkloadModelOptions(o).message(),
            "workload.coverage: must be in (0, 1], got 0");
  o = {};
  o.half_life = absl::ZeroDuration();
  EXPECT_FALSE(ValidateWorkloadModelOptions(o).ok());
  o = {};
  o.max_tracked = 10;
  EXPECT_EQ(ValidateWorkloadModelOptions(o).message(),
            "workload.max_tracked: must be at least max_shapes (128), got 10");
  o = {};
  o.max_shapes = 0;
  EXPECT_FALSE(ValidateWorkloadModelOptions(o).ok());
  o = {};
  o.min_change = 1.5;
  EXPECT_EQ(ValidateWorkloadModelOptions(o).message(),
            "workload.min_change: must be in [0, 1], got 1.5");
  o.min_change = -0.1;
  EXPECT_FALSE(ValidateWorkloadModelOptions(o).ok());
}

}  // namespace
}  // namespace duet::placement
