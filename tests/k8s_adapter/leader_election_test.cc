#include "k8s_adapter/leader_election.h"

#include <atomic>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace k8s {
namespace {

using fakes::FakeClock;
using testing::FakeApiServer;
using testing::WaitFor;

// The electors run on `clock`; the tests move it a retry period at a time.
LeaderElectionOptions Fast(const std::string& id, const Clock* clock) {
  LeaderElectionOptions o;
  o.clock = clock;
  o.lease_namespace = "duet-system";
  o.identity = id;
  o.lease_duration = absl::Seconds(1);
  o.renew_deadline = absl::Milliseconds(700);
  o.retry_period = absl::Milliseconds(100);
  return o;
}

struct Candidate {
  Candidate(KubeClient* client, LeaderElectionOptions o) : elector(client, std::move(o)) {
    elector.Start([this] { ++started; }, [this] { ++stopped; });
  }
  LeaderElector elector;
  std::atomic<int> started{0};
  std::atomic<int> stopped{0};
};

class LeaderElectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fake_.ok());
    KubeConfig c;
    c.server = fake_.url();
    client_ = *NewCurlKubeClient(c);
  }
  nlohmann::json Lease() {
    auto got = client_->Get("/apis/coordination.k8s.io/v1/namespaces/duet-system/leases/duet-bridge");
    return got.ok() ? nlohmann::json::parse(*got) : nlohmann::json();
  }
  LeaderElectionOptions Fast(const std::string& id) { return k8s::Fast(id, &clock_); }
  // Moves the clock on by `steps` retry periods (100 ms, above the standbys'
  // jitter of up to 120 ms every other step), each one's attempts done by all
  // `electors` before the next.
  ::testing::AssertionResult Retries(int steps, int electors) {
    return clock_.Step(absl::Milliseconds(100), steps, electors);
  }

  FakeClock clock_;
  FakeApiServer fake_;
  std::unique_ptr<KubeClient> client_;
};

TEST_F(LeaderElectionTest, SecondReplicaStaysStandbyThenTakesOverOnRelease) {
  Candidate a(client_.get(), Fast("a"));
  ASSERT_TRUE(WaitFor([&] { return a.elector.IsLeader(); }));
  Candidate b(client_.get(), Fast("b"));
  ASSERT_TRUE(clock_.AwaitSleepers(2));
  // Well past the lease duration: a keeps renewing, b stays standby.
  ASSERT_TRUE(Retries(20, 2));
  EXPECT_TRUE(a.elector.IsLeader());
  EXPECT_FALSE(b.elector.IsLeader());
  EXPECT_EQ(b.elector.observed_holder(), "a");
  EXPECT_EQ(Lease()["spec"]["holderIdentity"], "a");
  EXPECT_EQ(b.started, 0);

  const absl::Time t0 = clock_.Now();
  a.elector.Stop();  // releases
  EXPECT_EQ(a.stopped, 1);
  for (int i = 0; i < 20 && !b.elector.IsLeader(); ++i) ASSERT_TRUE(Retries(1, 1));
  ASSERT_TRUE(b.elector.IsLeader());
  EXPECT_LT(clock_.Now() - t0, absl::Milliseconds(900));  // faster than expiry
  nlohmann::json lease = Lease();
  EXPECT_EQ(lease["spec"]["holderIdentity"], "b");
  EXPECT_EQ(lease["spec"]["leaseTransitions"], 1);
  b.elector.Stop();
}

TEST_F(LeaderElectionTest, CrashedLeaderIsReplacedAfterTheLeaseExpires) {
  LeaderElectionOptions oa = Fast("a");
  oa.release_on_stop = false;  // a "crash": the lease is left held
  Candidate a(client_.get(), oa);
  ASSERT_TRUE(WaitFor([&] { return a.elector.IsLeader(); }));
  Candidate b(client_.get(), Fast("b"));
  ASSERT_TRUE(clock_.AwaitSleepers(2));
  ASSERT_TRUE(Retries(3, 2));
  EXPECT_FALSE(b.elector.IsLeader());
  a.elector.Stop();
  const absl::Time t0 = clock_.Now();
  for (int i = 0; i < 40 && !b.elector.IsLeader(); ++i) ASSERT_TRUE(Retries(1, 1));
  ASSERT_TRUE(b.elector.IsLeader());
  EXPECT_GE(clock_.Now() - t0, absl::Milliseconds(700));
  b.elector.Stop();
}

TEST_F(LeaderElectionTest, OnlyOneOfManyWins) {
  std::vector<std::unique_ptr<Candidate>> cs;
  for (int i = 0; i < 4; ++i) cs.push_back(std::make_unique<Candidate>(client_.get(), Fast("c" + std::to_string(i))));
  ASSERT_TRUE(clock_.AwaitSleepers(4));
  ASSERT_TRUE(Retries(15, 4));
  int leaders = 0;
  int starts = 0;
  for (auto& c : cs) {
    leaders += c->elector.IsLeader();
    starts += c->started;
  }
  EXPECT_EQ(leaders, 1);
  EXPECT_EQ(starts, 1);
  for (auto& c : cs) c->elector.Stop();
}

TEST_F(LeaderElectionTest, LeaderThatCannotRenewStepsDown) {
  Candidate a(client_.get(), Fast("a"));
  ASSERT_TRUE(WaitFor([&] { return a.elector.IsLeader(); }));
  ASSERT_TRUE(clock_.AwaitSleepers(1));
  fake_.Control("fail", {{"count", 1000000}, {"code", 503}});
  const absl::Time t0 = clock_.Now();
  for (int i = 0; i < 30 && a.elector.IsLeader(); ++i) ASSERT_TRUE(Retries(1, 1));
  ASSERT_FALSE(a.elector.IsLeader());
  // It stepped down at the first failed renewal past the renew deadline.
  EXPECT_GT(clock_.Now() - t0, absl::Milliseconds(700));
  EXPECT_LE(clock_.Now() - t0, absl::Milliseconds(900));
  EXPECT_EQ(a.stopped, 1);
  fake_.Control("fail", {{"count", 0}});
  for (int i = 0; i < 30 && !a.elector.IsLeader(); ++i) ASSERT_TRUE(Retries(1, 1));
  ASSERT_TRUE(a.elector.IsLeader());
  EXPECT_EQ(a.started, 2);
  a.elector.Stop();
}

}  // namespace
}  // namespace k8s
}  // namespace duet
