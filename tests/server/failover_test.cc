// Failover without loss: two real duet-bridge replicas, kill -9 of the leader
// under Hold/Release load (tests/server/failover_harness.h). With the
// ledger's log in etcd nothing acknowledged is lost and no device is granted
// twice; with per-replica local journals (the "before") the same harness
// finds the loss, which shows the checks can fail.
// The long run with many kills: bench/failover (RESULTS.md there).

#include "gtest/gtest.h"
#include "absl/strings/str_join.h"
#include "tests/etcd/etcd_server.h"
#include "tests/server/failover_harness.h"

namespace duet {
namespace {

failover::Options ShortRun(bool etcd) {
  failover::Options o;
  o.etcd = etcd;
  o.kills = 1;
  o.load_before_kill = absl::Seconds(1);  // about 12 holdings live at the kill
  o.bridge_binary = DUET_BRIDGE_BIN;
  o.verbose = true;
  return o;
}

TEST(FailoverTest, WithTheLogInEtcdNothingAcknowledgedIsLostOrGrantedTwice) {
  if (!testing::EtcdServer::Available()) {
    GTEST_SKIP() << testing::EtcdServer::kBinary << " is missing (Debian package etcd-server)";
  }
  absl::StatusOr<failover::Figures> f = failover::Run(ShortRun(/*etcd=*/true));
  ASSERT_TRUE(f.ok()) << f.status();
  std::fprintf(stderr, "etcd log: takeover %s; %llu holds acknowledged, %llu live checked\n",
               failover::Summary(f->takeover_seconds).c_str(),
               static_cast<unsigned long long>(f->holds_acknowledged),
               static_cast<unsigned long long>(f->live_checked));
  ASSERT_EQ(f->takeover_seconds.size(), 1u);
  EXPECT_GT(f->holds_acknowledged, 20u);
  EXPECT_GT(f->live_checked, 0u) << "nothing was live at the takeover: the check proved nothing";
  EXPECT_EQ(f->lost, 0u) << absl::StrJoin(f->findings, "\n");
  EXPECT_EQ(f->double_grants, 0u) << absl::StrJoin(f->findings, "\n");
  // The lease (2 s) must expire first; then a retry period and start-up.
  EXPECT_LT(f->takeover_seconds[0], 10.0);
}

TEST(FailoverTest, ADeposedLeaderThatWakesUpAcknowledgesNothingAndExits) {
  if (!testing::EtcdServer::Available()) {
    GTEST_SKIP() << testing::EtcdServer::kBinary << " is missing (Debian package etcd-server)";
  }
  failover::Options o = ShortRun(/*etcd=*/true);
  o.freeze = true;  // SIGSTOP the leader, SIGCONT it after the takeover
  o.stale_client_percent = 50;
  absl::StatusOr<failover::Figures> f = failover::Run(o);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->deposed_exits.size(), 1u);
  EXPECT_EQ(f->deposed_exits[0], 3);  // kExitForRestart: it stops serving
  EXPECT_GT(f->live_checked, 0u);
  EXPECT_EQ(f->lost, 0u) << absl::StrJoin(f->findings, "\n");
  EXPECT_EQ(f->double_grants, 0u) << absl::StrJoin(f->findings, "\n");
}

TEST(FailoverTest, WithPerReplicaJournalsTheTakeoverLosesAcknowledgedHoldings) {
  absl::StatusOr<failover::Figures> f = failover::Run(ShortRun(/*etcd=*/false));
  ASSERT_TRUE(f.ok()) << f.status();
  std::fprintf(stderr, "local journals: takeover %s; %llu live checked, %llu lost, %llu double\n",
               failover::Summary(f->takeover_seconds).c_str(),
               static_cast<unsigned long long>(f->live_checked),
               static_cast<unsigned long long>(f->lost),
               static_cast<unsigned long long>(f->double_grants));
  ASSERT_GT(f->live_checked, 0u);
  // The new leader starts from its own empty journal: every holding that was
  // live at the kill is gone (the harness sees it).
  EXPECT_GT(f->lost, 0u);
}

}  // namespace
}  // namespace duet
