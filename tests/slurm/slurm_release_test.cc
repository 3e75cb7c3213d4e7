// Which slurmctld releases a duet-bridge built against a libslurm release may
// talk to (label: unit; no cluster).

#include "absl/strings/match.h"
#include "common/clock.h"
#include "bridge/ledger/ledger.h"
#include "bridge/slurm/libslurm_client.h"
#include "bridge/slurm/slurm_sync.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_slurm.h"

namespace duet {
namespace {

TEST(SlurmReleaseTest, ParsesVersionStrings) {
  EXPECT_EQ(ParseSlurmRelease("24.11.5"), (SlurmRelease{24, 11}));
  EXPECT_EQ(ParseSlurmRelease("26.05.0-0rc1"), (SlurmRelease{26, 5}));
  EXPECT_EQ(ParseSlurmRelease("22.05"), (SlurmRelease{22, 5}));
  EXPECT_EQ(ParseSlurmRelease(""), std::nullopt);
  EXPECT_EQ(ParseSlurmRelease("slurm"), std::nullopt);
  EXPECT_EQ(ParseSlurmRelease("24"), std::nullopt);
  EXPECT_EQ(FormatRelease({26, 5}), "26.05");
}

TEST(SlurmReleaseTest, ClientServesItsOwnReleaseAndTheTwoAfter) {
  const SlurmRelease v2205{22, 5}, v2302{23, 2}, v2311{23, 11}, v2405{24, 5};
  const SlurmRelease v2411{24, 11}, v2505{25, 5}, v2511{25, 11}, v2605{26, 5};
  const SlurmRelease v2611{26, 11}, v2705{27, 5}, v2711{27, 11};
  EXPECT_TRUE(ControllerSupported(v2205, v2205));
  EXPECT_TRUE(ControllerSupported(v2205, v2302));
  EXPECT_TRUE(ControllerSupported(v2205, v2311));
  EXPECT_FALSE(ControllerSupported(v2205, v2405));
  // The support table: 24.11 serves 24.11-25.11, 26.05 serves 26.05 on.
  EXPECT_TRUE(ControllerSupported(v2411, v2411));
  EXPECT_TRUE(ControllerSupported(v2411, v2505));
  EXPECT_TRUE(ControllerSupported(v2411, v2511));
  EXPECT_FALSE(ControllerSupported(v2411, v2605));
  EXPECT_FALSE(ControllerSupported(v2605, v2511));
  EXPECT_FALSE(ControllerSupported(v2605, v2411));
  EXPECT_TRUE(ControllerSupported(v2605, v2605));
  EXPECT_TRUE(ControllerSupported(v2605, v2611));
  EXPECT_TRUE(ControllerSupported(v2605, v2705));
  EXPECT_FALSE(ControllerSupported(v2605, v2711));
  // Never an older controller, never a release that does not exist.
  EXPECT_FALSE(ControllerSupported(v2511, v2411));
  EXPECT_FALSE(ControllerSupported(v2411, SlurmRelease{25, 2}));
  EXPECT_FALSE(ControllerSupported(SlurmRelease{22, 11}, v2302));
}

TEST(SlurmReleaseTest, RefusalNamesBothVersions) {
  const std::string m = UnsupportedControllerMessage({24, 11}, "26.05.5");
  EXPECT_TRUE(absl::StrContains(m, "slurmctld is Slurm 26.05.5")) << m;
  EXPECT_TRUE(absl::StrContains(m, "built against libslurm 24.11")) << m;
}

TEST(SlurmReleaseTest, BuiltReleaseIsOneItServes) {
  EXPECT_TRUE(ControllerSupported(BuiltSlurmRelease(), BuiltSlurmRelease()));
}

// The 22.05 workaround (a reconfigure after each slurmctld start) only where
// it is needed: on 24.11 and later a reconfigure restarts slurmctld.
TEST(SlurmReleaseTest, ReconfigureAfterStartOnlyBefore2411) {
  EXPECT_TRUE(GresStepsNeedReconfigureAfterStart("22.05.8"));
  EXPECT_TRUE(GresStepsNeedReconfigureAfterStart("23.11.10"));
  EXPECT_TRUE(GresStepsNeedReconfigureAfterStart("24.05.4"));
  EXPECT_FALSE(GresStepsNeedReconfigureAfterStart("24.11.5"));
  EXPECT_FALSE(GresStepsNeedReconfigureAfterStart("25.11.7"));
  EXPECT_FALSE(GresStepsNeedReconfigureAfterStart("26.05.0-0rc1"));
  EXPECT_FALSE(GresStepsNeedReconfigureAfterStart("27.05.1"));
  // A version that does not parse keeps the workaround: one reconfigure too
  // many is cheaper than GPU steps refused.
  EXPECT_TRUE(GresStepsNeedReconfigureAfterStart(""));
  EXPECT_TRUE(GresStepsNeedReconfigureAfterStart("slurm"));
}

TEST(SlurmReleaseTest, SyncAgainstAnUnsupportedControllerIsDegradedAndCounted) {
  Ledger ledger;
  // What LibSlurmClient::Ping answers for a slurmctld of an unsupported
  // release; any other call would be a bug in SlurmSync.
  fakes::FakeSlurmClient slurm;
  slurm.set_ping(absl::FailedPreconditionError(UnsupportedControllerMessage({24, 11}, "26.05.5")));
  SlurmSync sync(SlurmSyncOptions{}, &ledger, &slurm, Clock::Real());
  absl::Status s = sync.RunOnce();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "26.05.5")) << s;
  EXPECT_TRUE(sync.degraded());
  EXPECT_TRUE(absl::IsFailedPrecondition(sync.RunOnce()));
  EXPECT_EQ(sync.stats().version_refusals, 2u);
  EXPECT_EQ(sync.stats().failed_passes, 2u);
  EXPECT_EQ(slurm.calls_but_ping(), 0);
}

}  // namespace
}  // namespace duet
