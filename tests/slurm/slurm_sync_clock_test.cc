// SlurmSync's period, on a fake clock: a pass at Start, the next one when the
// clock reaches the period and not before, and Stop ends the wait at once.
// (Its passes against a real slurmctld are slurm_sync_test's.)

#include <cstdint>

#include "bridge/ledger/ledger.h"
#include "bridge/slurm/slurm_sync.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_slurm.h"

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

}  // namespace
}  // namespace duet
