// SlurmSync's period, on a fake clock: a pass at Start, the next one when the
// clock reaches the period and not before, and Stop ends the wait at once.
// (Its passes against a real slurmctld are slurm_sync_test's.)

#include <cstdint>
#include <vector>

#include "bridge/ledger/ledger.h"
#include "bridge/slurm/slurm_sync.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_slurm.h"
#include "tests/slurm/test_node_spec.h"

namespace duet {
namespace {

TEST(SlurmSyncClockTest, PassesRunEveryPeriodOfTheClock) {
  Ledger ledger;
  fakes::FakeSlurmClient slurm;
  fakes::FakeClock clock;
  SlurmSyncOptions o;
  o.sync_period = absl::Seconds(10);
  SlurmSync sync(o, &ledger, &slurm, &clock);
  auto passes = [&] { return sync.stats().passes; };

  sync.Start();
  ASSERT_TRUE(clock.AwaitSleepers(1));
  EXPECT_EQ(passes(), 1u);
  clock.Advance(absl::Seconds(9));
  ASSERT_TRUE(clock.AwaitSleepers(1));
  EXPECT_EQ(passes(), 1u);  // not before the period
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(clock.AwaitSleepers(1));
  EXPECT_EQ(passes(), 2u);
  ASSERT_TRUE(clock.Step(o.sync_period, 3, 1));
  EXPECT_EQ(passes(), 5u);

  const absl::Time t0 = absl::Now();
  sync.Stop();  // the clock does not move: Stop itself ends the wait
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  EXPECT_EQ(passes(), 5u);
  EXPECT_EQ(clock.sleepers(), 0);
}

TEST(SlurmSyncClockTest, UnreachableSlurmStillWaitsThePeriod) {
  Ledger ledger;
  fakes::FakeSlurmClient slurm;
  slurm.set_ping(absl::UnavailableError("slurmctld: connection refused"));
  fakes::FakeClock clock;
  SlurmSyncOptions o;
  o.sync_period = absl::Seconds(10);
  SlurmSync sync(o, &ledger, &slurm, &clock);
  sync.Start();
  ASSERT_TRUE(clock.AwaitSleepers(1));
  ASSERT_TRUE(clock.Step(o.sync_period, 2, 1));
  const SlurmSyncStats s = sync.stats();
  EXPECT_EQ(s.passes, 3u);
  EXPECT_EQ(s.failed_passes, 3u);
  EXPECT_TRUE(sync.degraded());
  sync.Stop();
}

// A lost placeholder that Slurm will not re-make (it counts the pod's GPUs
// in use although no job holds them): tried again at the next pass, then
// after 5 s, 10 s, 20 s ... (at most 5 min), not at every pass, each refusal
// counted by its reason; the pod's GPUs stay held meanwhile.
TEST(SlurmSyncClockTest, ARefusedRepairBacksOffInsteadOfRetryingEveryPass) {
  Ledger ledger;
  ASSERT_TRUE(ledger.UpsertNode(::duet::testing::TestNodeSpec("n1", 1, 8)).ok());
  HoldRequest r;
  r.node = "n1";
  r.owner = Owner::Placeholder(42, "uid-a");
  r.devices = {{DeviceKind::kGpu, 0, kWholeDevice}, {DeviceKind::kGpu, 1, kWholeDevice}};
  ASSERT_TRUE(ledger.Hold(r).ok());
  fakes::FakeSlurmClient slurm;
  SlurmNodeInfo node;
  node.name = "n1";
  node.state = "IDLE";
  slurm.add_node(node);
  slurm.set_allocation(absl::ResourceExhaustedError(
      "allocate gres:gpu:2 on n1: Requested nodes are busy (slurm errno 2016)"));
  fakes::FakeClock clock;  // after the hold: the pass lists jobs after it was granted
  SlurmSyncOptions o;
  o.manage_nodes = false;
  o.manage_weights = false;
  o.release_grace = absl::ZeroDuration();
  o.pod_liveness = [](const std::string&) { return PodLiveness::kLive; };
  SlurmSync sync(o, &ledger, &slurm, &clock);

  // One pass a second for 40 s: which of them asked Slurm for a placeholder.
  std::vector<int> tried;
  for (int t = 0; t <= 40; ++t) {
    const size_t before = slurm.asked().size();
    ASSERT_TRUE(sync.RunOnce().ok());
    if (slurm.asked().size() > before) tried.push_back(t);
    clock.Advance(absl::Seconds(1));
  }
  EXPECT_EQ(tried, (std::vector<int>{0, 1, 6, 16, 36}));
  EXPECT_EQ(sync.stats().repair_failures.at("slurm_devices_busy"), 5u);
  EXPECT_TRUE(ledger.FindHolding("n1", r.owner).has_value()) << "the pod's GPUs stay held";
}

}  // namespace
}  // namespace duet
