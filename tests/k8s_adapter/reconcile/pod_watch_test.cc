// The pod watch (invariant I2) against the fake API server
// (tests/fakes/fake_apiserver.py) with a real ledger and a release action
// that records what it is asked and can be made to fail like an unreachable
// Slurm. The pod watch and the ledger run on a fake clock: sweep periods and
// the grace pass when the test advances it, never by sleeping.

#include "k8s_adapter/reconcile/pod_watch.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace k8s {
namespace {

using fakes::FakeClock;
using testing::FakeApiServer;
using testing::WaitFor;

Ledger::Options OnClock(const Clock* clock) {
  Ledger::Options o;
  o.clock = clock;
  return o;
}

// LedgerPodReleaser plus a log of calls; fails with UNAVAILABLE while
// `unavailable` is set (as Placeholders::Cancel does when Slurm is down).
class RecordingReleaser final : public PodReleaser {
 public:
  explicit RecordingReleaser(Ledger* ledger) : inner_(ledger) {}
  absl::Status Release(const PodRelease& r) override {
    absl::MutexLock l(&mu_);
    calls_.push_back(r);
    if (unavailable) return absl::UnavailableError("slurmctld: connection refused");
    return inner_.Release(r);
  }
  std::vector<PodRelease> calls() {
    absl::MutexLock l(&mu_);
    return calls_;
  }
  std::atomic<bool> unavailable{false};

 private:
  LedgerPodReleaser inner_;
  absl::Mutex mu_;
  std::vector<PodRelease> calls_ ABSL_GUARDED_BY(mu_);
};

nlohmann::json PodObject(const std::string& name, const std::string& uid,
                         const std::string& node = "n1", const std::string& phase = "Running") {
  nlohmann::json p = {{"kind", "Pod"},
                      {"apiVersion", "v1"},
                      {"metadata", {{"name", name}, {"namespace", "team"}, {"uid", uid}}},
                      {"spec", {{"containers", {{{"name", "c"}, {"image", "busybox"}}}}}},
                      {"status", {{"phase", phase}}}};
  if (!node.empty()) p["spec"]["nodeName"] = node;
  return p;
}

class PodWatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fake_.ok());
    KubeConfig c;
    c.server = fake_.url();
    client_ = *NewCurlKubeClient(c);
    NodeSpec n;
    n.name = "n1";
    for (uint32_t i = 0; i < 8; ++i) {
      DeviceSpec d;
      d.index = i;
      n.devices.push_back(d);
    }
    ASSERT_TRUE(ledger_.UpsertNode(n).ok());
    options_.grace = absl::Milliseconds(600);
    options_.sweep_period = absl::Milliseconds(150);
    options_.informer.min_backoff = absl::Milliseconds(50);
    options_.informer.max_backoff = absl::Milliseconds(200);
    options_.clock = &clock_;
  }
  void TearDown() override {
    if (watch_ != nullptr) watch_->Stop();
    EXPECT_TRUE(ledger_.CheckInvariants().ok());
  }

  // A placeholder holding of 1 GPU for `uid`, granted `age` ago.
  void Hold(const std::string& uid, uint32_t job, absl::Duration age = absl::ZeroDuration(),
            OwnerKind kind = OwnerKind::kPlaceholder) {
    HoldRequest r;
    r.node = "n1";
    r.owner = kind == OwnerKind::kPlaceholder ? Owner::Placeholder(job, uid)
                                              : Owner::Pod(uid, "team", "p-" + uid);
    r.count = CountSelector{DeviceKind::kGpu, 1, 0, ""};
    if (age > absl::ZeroDuration()) r.granted_at = clock_.Now() - age;
    auto got = ledger_.Hold(r);
    ASSERT_TRUE(got.ok()) << got.status();
  }
  bool Held(const std::string& uid) {
    for (const Holding& h : ledger_.ListHoldings()) {
      if (h.owner.pod_uid == uid) return true;
    }
    return false;
  }
  void StartWatch() {
    watch_ = std::make_unique<PodWatch>(client_.get(), &ledger_, &releaser_, options_);
    ASSERT_TRUE(watch_->Start().ok());
  }
  size_t ViewSize() { return watch_->stats().pods; }
  // `periods` sweep periods pass, each one's sweep done before the next.
  ::testing::AssertionResult Periods(int periods) {
    return clock_.Step(options_.sweep_period, periods, /*sleepers=*/1);
  }

  FakeClock clock_;
  FakeApiServer fake_;
  std::unique_ptr<KubeClient> client_;
  Ledger ledger_{OnClock(&clock_)};
  RecordingReleaser releaser_{&ledger_};
  PodWatchOptions options_;
  std::unique_ptr<PodWatch> watch_;
};

TEST_F(PodWatchTest, DeletedPodIsReleasedAtOnce) {
  fake_.Put(PodObject("web-1", "uid-1"));
  fake_.Put(PodObject("web-2", "uid-2"));
  Hold("uid-1", 101, absl::Hours(1));
  Hold("uid-2", 102, absl::Hours(1));
  StartWatch();
  EXPECT_EQ(ViewSize(), 2u);
  const absl::Time t0 = absl::Now();
  fake_.Delete("Pod", "web-1", "team");
  ASSERT_TRUE(WaitFor([&] { return !Held("uid-1"); }, absl::Seconds(5)));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
  EXPECT_TRUE(Held("uid-2"));
  auto calls = releaser_.calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].reason, PodReleaseReason::kDeleted);
  EXPECT_EQ(calls[0].pod_name, "web-1");
  EXPECT_EQ(calls[0].pod_namespace, "team");
  EXPECT_EQ(calls[0].holding.node, "n1");
  EXPECT_EQ(calls[0].holding.owner, Owner::Placeholder(101, "uid-1"));
  EXPECT_EQ(watch_->stats().released_deleted, 1u);
}

TEST_F(PodWatchTest, SucceededAndFailedPodsAreReleased) {
  fake_.Put(PodObject("job-a", "uid-a"));
  fake_.Put(PodObject("job-b", "uid-b"));
  Hold("uid-a", 201, absl::ZeroDuration(), OwnerKind::kPod);  // young: no grace for terminal
  Hold("uid-b", 202);
  StartWatch();
  fake_.Put(PodObject("job-a", "uid-a", "n1", "Succeeded"));
  ASSERT_TRUE(WaitFor([&] { return !Held("uid-a"); }, absl::Seconds(5)));
  EXPECT_TRUE(Held("uid-b"));
  fake_.Put(PodObject("job-b", "uid-b", "n1", "Failed"));
  ASSERT_TRUE(WaitFor([&] { return !Held("uid-b"); }, absl::Seconds(5)));
  PodWatchStats s = watch_->stats();
  EXPECT_EQ(s.released_terminal, 2u);
  EXPECT_EQ(s.released_deleted + s.released_orphaned, 0u);
  // The finished pod is later deleted: nothing left to release, nothing counted.
  fake_.Delete("Pod", "job-a", "team");
  ASSERT_TRUE(WaitFor([&] { return ViewSize() == 1; }));
  ASSERT_TRUE(Periods(2));
  EXPECT_EQ(releaser_.calls().size(), 2u);
}

TEST_F(PodWatchTest, UnknownPodIsReleasedOnlyAfterTheGrace) {
  fake_.Put(PodObject("alive", "uid-alive"));
  Hold("uid-alive", 300, absl::Hours(1));
  Hold("uid-ghost", 301);  // granted now, for a pod Kubernetes does not have
  const absl::Time granted = clock_.Now();
  StartWatch();
  // The first sync's sweep and the periodic ones leave it while young.
  ASSERT_TRUE(Periods(3));
  EXPECT_TRUE(Held("uid-ghost"));
  EXPECT_GE(watch_->stats().sweeps, 2u);
  // Then the first sweep past the grace releases it.
  for (int i = 0; i < 10 && Held("uid-ghost"); ++i) ASSERT_TRUE(Periods(1));
  EXPECT_FALSE(Held("uid-ghost"));
  EXPECT_GE(clock_.Now() - granted, options_.grace);
  EXPECT_LE(clock_.Now() - granted, options_.grace + options_.sweep_period);
  EXPECT_TRUE(Held("uid-alive"));
  auto calls = releaser_.calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].reason, PodReleaseReason::kOrphaned);
  EXPECT_EQ(watch_->stats().released_orphaned, 1u);
}

TEST_F(PodWatchTest, OldOrphanIsReleasedByTheFirstSyncSweep) {
  Hold("uid-gone", 400, absl::Hours(2));
  options_.sweep_period = absl::Seconds(60);  // only the sync's sweep can do it
  StartWatch();
  ASSERT_TRUE(WaitFor([&] { return !Held("uid-gone"); }, absl::Seconds(3)));
  EXPECT_EQ(watch_->stats().released_orphaned, 1u);
}

TEST_F(PodWatchTest, AlivePodsAreNeverReleased) {
  fake_.Put(PodObject("a", "uid-a"));
  fake_.Put(PodObject("b", "uid-b", "n1", "Pending"));
  fake_.Put(PodObject("c", "uid-c"));
  Hold("uid-a", 501, absl::Hours(5));
  Hold("uid-b", 0, absl::Hours(5), OwnerKind::kPod);
  StartWatch();
  // Later updates (labels, a deletionTimestamp while it terminates) keep it.
  nlohmann::json a = PodObject("a", "uid-a");
  a["metadata"]["labels"] = {{"x", "y"}};
  a["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z";
  fake_.Put(a);
  Hold("uid-c", 503);  // granted after the list: found by the watch
  ASSERT_TRUE(WaitFor([&] { return watch_->stats().informer.events >= 1; }));
  ASSERT_TRUE(Periods(6));
  ASSERT_GE(watch_->stats().sweeps, 6u);
  EXPECT_TRUE(Held("uid-a"));
  EXPECT_TRUE(Held("uid-b"));
  EXPECT_TRUE(Held("uid-c"));
  EXPECT_TRUE(releaser_.calls().empty());
  // A Slurm job's holding is never the pod watch's business.
  HoldRequest r;
  r.node = "n1";
  r.owner = Owner::SlurmJob(77);
  r.count = CountSelector{DeviceKind::kGpu, 1, 0, ""};
  r.granted_at = clock_.Now() - absl::Hours(1);
  ASSERT_TRUE(ledger_.Hold(r).ok());
  ASSERT_TRUE(watch_->SweepNow());
  EXPECT_TRUE(ledger_.FindHolding("n1", Owner::SlurmJob(77)).has_value());
  EXPECT_TRUE(releaser_.calls().empty());
}

TEST_F(PodWatchTest, ReusedNameWithNewUidReleasesTheOldPod) {
  fake_.Put(PodObject("web", "uid-old"));
  Hold("uid-old", 601, absl::Hours(1));
  StartWatch();
  // Deleted and recreated between two frames the watch sees as one change.
  fake_.Control("delete", {{"kind", "Pod"}, {"namespace", "team"}, {"name", "web"}});
  fake_.Put(PodObject("web", "uid-new"));
  Hold("uid-new", 602);
  ASSERT_TRUE(WaitFor([&] { return !Held("uid-old"); }, absl::Seconds(5)));
  ASSERT_TRUE(Periods(2));
  EXPECT_TRUE(Held("uid-new"));
}

// The watch breaks (dropped connection, then 410 Gone with failing relists)
// while pods change. Nothing alive is released, even an old holding whose pod
// appeared only during the outage; what was deleted in the gap is released
// after the relist.
TEST_F(PodWatchTest, BrokenWatchReleasesNothingWrongly) {
  fake_.Put(PodObject("keep", "uid-keep"));
  fake_.Put(PodObject("lost", "uid-lost"));
  Hold("uid-keep", 701, absl::Hours(1));
  Hold("uid-lost", 702, absl::Hours(1));
  StartWatch();
  ASSERT_TRUE(WaitFor([&] { return fake_.OpenWatches() == 1; }));

  fake_.Control("drop");
  ASSERT_TRUE(WaitFor([&] { return watch_->stats().informer.failures >= 1; }));
  ASSERT_TRUE(Periods(1));  // a periodic sweep right after the failure: skipped
  // Resumed (same resourceVersion, no relist) before the next blow.
  ASSERT_TRUE(WaitFor([&] {
    return watch_->stats().informer.watches >= 2 && fake_.OpenWatches() == 1;
  }));
  // Now the watch is expired (410) and the next 12 API requests fail.
  fake_.Control("fail", {{"count", 12}, {"code", 503}});
  fake_.Control("compact", {{"expire_watches", true}});
  // A pod appears during the outage with an old holding (e.g. from a
  // journal): the stale view does not have it, yet it must be kept.
  fake_.Put(PodObject("new", "uid-new"));
  Hold("uid-new", 703, absl::Hours(1));
  const uint64_t failures = watch_->stats().informer.failures;
  ASSERT_TRUE(WaitFor([&] { return watch_->stats().informer.failures > failures; }));
  // A periodic sweep in the outage does not trust the stale view.
  ASSERT_TRUE(Periods(1));
  EXPECT_TRUE(Held("uid-new"));
  fake_.Control("delete", {{"kind", "Pod"}, {"namespace", "team"}, {"name", "lost"}});
  const uint64_t lists = watch_->stats().informer.lists;
  ASSERT_TRUE(WaitFor([&] { return watch_->stats().informer.lists > lists; }, absl::Seconds(10)));
  ASSERT_TRUE(WaitFor([&] { return !Held("uid-lost"); }, absl::Seconds(5)));
  // Periodic sweeps on the current view keep what is alive.
  ASSERT_TRUE(Periods(3));
  EXPECT_TRUE(Held("uid-keep"));
  EXPECT_TRUE(Held("uid-new"));
  PodWatchStats s = watch_->stats();
  EXPECT_GE(s.sweeps_skipped, 1u);  // the outage's periodic sweeps did not trust the view
  EXPECT_EQ(s.released_orphaned, 0u);
  for (const PodRelease& r : releaser_.calls()) {
    EXPECT_EQ(r.holding.owner.pod_uid, "uid-lost");
    EXPECT_EQ(r.reason, PodReleaseReason::kDeleted);  // from the relist's diff
  }
}

TEST_F(PodWatchTest, SlurmUnavailableKeepsTheHoldingAndRetries) {
  fake_.Put(PodObject("p", "uid-p"));
  Hold("uid-p", 801, absl::Hours(1));
  Hold("uid-orphan", 802, absl::Hours(1));
  releaser_.unavailable = true;
  StartWatch();
  fake_.Delete("Pod", "p", "team");
  // The first sync's sweep tries the orphan, the deletion tries the pod.
  ASSERT_TRUE(WaitFor([&] { return watch_->stats().release_failures >= 2; }));
  // Each period retries both.
  ASSERT_TRUE(Periods(2));
  EXPECT_GE(watch_->stats().release_failures, 4u);
  EXPECT_TRUE(Held("uid-p"));
  EXPECT_TRUE(Held("uid-orphan"));
  releaser_.unavailable = false;
  ASSERT_TRUE(Periods(1));
  EXPECT_FALSE(Held("uid-p"));
  EXPECT_FALSE(Held("uid-orphan"));
  PodWatchStats s = watch_->stats();
  EXPECT_GE(s.released_deleted + s.released_orphaned, 2u);
}

TEST_F(PodWatchTest, UnscheduledPodsStayOutOfTheView) {
  fake_.Put(PodObject("pending", "uid-pending", ""));
  fake_.Put(PodObject("bound", "uid-bound"));
  StartWatch();
  EXPECT_EQ(ViewSize(), 1u);
  fake_.Put(PodObject("pending", "uid-pending", "n1"));  // bound
  ASSERT_TRUE(WaitFor([&] { return ViewSize() == 2; }));
}

}  // namespace
}  // namespace k8s
}  // namespace duet

namespace duet {
namespace k8s {
namespace {

// Scale: a sweep over 100k pod holdings (12,500 nodes x 8 GPUs) whose pods
// are not in the view but are younger than the grace: nothing is released,
// and the pass stays well inside a sweep period.
TEST_F(PodWatchTest, SweepOf100kYoungHoldingsReleasesNothing) {
  for (int n = 0; n < 12500; ++n) {
    NodeSpec spec;
    spec.name = "s" + std::to_string(n);
    for (uint32_t i = 0; i < 8; ++i) {
      DeviceSpec d;
      d.index = i;
      spec.devices.push_back(d);
    }
    ASSERT_TRUE(ledger_.UpsertNode(spec).ok());
    for (uint32_t i = 0; i < 8; ++i) {
      HoldRequest r;
      r.node = spec.name;
      r.owner = Owner::Placeholder(n * 8 + i + 1, "u" + std::to_string(n * 8 + i));
      r.devices = {{DeviceKind::kGpu, i, kWholeDevice}};
      ASSERT_TRUE(ledger_.Hold(r).ok());
    }
  }
  options_.grace = absl::Minutes(10);
  options_.sweep_period = absl::Minutes(10);
  StartWatch();
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(watch_->SweepNow());
  const absl::Duration took = absl::Now() - t0;
  std::fprintf(stderr, "sweep of %zu holdings: %s\n", ledger_.holding_count(),
               absl::FormatDuration(took).c_str());
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_EQ(ledger_.holding_count(), 100000u);
  EXPECT_TRUE(releaser_.calls().empty());
}

}  // namespace
}  // namespace k8s
}  // namespace duet
