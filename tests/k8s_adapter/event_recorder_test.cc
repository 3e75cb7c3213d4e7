// The event recorder against the fake API server: Events are POSTed from
// the worker, at most the token bucket's rate, repeats are dropped, a full
// queue drops and counts, and Record never waits on a slow API server. The
// window and the bucket run on a fake clock the tests advance.

#include "k8s_adapter/event_recorder.h"

#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace k8s {
namespace {

using fakes::FakeClock;
using testing::FakeApiServer;
using testing::WaitFor;

class EventRecorderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fake_.ok());
    KubeConfig c;
    c.server = fake_.url();
    client_ = *NewCurlKubeClient(c);
  }
  // POSTs the fake received to .../events.
  int Posted() {
    int n = 0;
    for (const auto& r : fake_.Requests()) {
      const std::string path = r.value("path", "");
      if (r.value("method", "") == "POST" && path.find("/events") != std::string::npos) ++n;
    }
    return n;
  }
  // Events the fake stores in `ns`.
  nlohmann::json Stored(const std::string& ns) {
    auto got = client_->Get("/api/v1/namespaces/" + ns + "/events");
    return got.ok() ? nlohmann::json::parse(*got)["items"] : nlohmann::json::array();
  }
  static EventSpec PodEvent(const std::string& name, const std::string& message) {
    EventSpec e;
    e.object_kind = "Pod";
    e.object_namespace = "team";
    e.object_name = name;
    e.object_uid = "uid-" + name;
    e.reason = "DuetRefused";
    e.message = message;
    return e;
  }

  FakeClock clock_;
  FakeApiServer fake_;
  std::unique_ptr<KubeClient> client_;
};

TEST_F(EventRecorderTest, PostsTheEventWithItsObjectAndInstance) {
  EventRecorderOptions o;
  o.instance = "duet-bridge-0";
  EventRecorder rec(client_.get(), o);
  EventSpec e = PodEvent("web-1", "no free GPU on n1");
  rec.Record(e);
  EventSpec node;
  node.object_kind = "Node";
  node.object_name = "n1";
  node.type = "Normal";
  node.reason = "DuetDrained";
  node.message = "drained in Slurm: node cordoned";
  rec.Record(node);
  ASSERT_TRUE(WaitFor([&] { return rec.stats().posted == 2; }));
  nlohmann::json items = Stored("team");
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0]["involvedObject"]["name"], "web-1");
  EXPECT_EQ(items[0]["involvedObject"]["uid"], "uid-web-1");
  EXPECT_EQ(items[0]["reason"], "DuetRefused");
  EXPECT_EQ(items[0]["message"], "no free GPU on n1");
  EXPECT_EQ(items[0]["reportingInstance"], "duet-bridge-0");
  nlohmann::json nodes = Stored("default");
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0]["involvedObject"]["kind"], "Node");
}

TEST_F(EventRecorderTest, RepeatsWithinTheWindowAreDroppedAndCounted) {
  EventRecorderOptions o;
  EventRecorder rec(client_.get(), o);
  for (int i = 0; i < 10; ++i) rec.Record(PodEvent("web-1", "no free GPU on n1"));
  rec.Record(PodEvent("web-1", "no free GPU on n2"));  // another message: its own event
  rec.Record(PodEvent("web-2", "no free GPU on n1"));  // another object
  ASSERT_TRUE(WaitFor([&] { return rec.stats().posted == 3; }));
  EXPECT_EQ(rec.stats().queued, 0u);  // nothing else left to post
  EXPECT_EQ(Posted(), 3);
  EventRecorderStats s = rec.stats();
  EXPECT_EQ(s.recorded, 12u);
  EXPECT_EQ(s.deduplicated, 9u);
  EXPECT_EQ(s.dropped, 0u);
}

TEST_F(EventRecorderTest, RepeatAfterTheWindowIsPostedAgain) {
  EventRecorderOptions o;
  o.dedupe_window = absl::Milliseconds(300);
  o.clock = &clock_;
  EventRecorder rec(client_.get(), o);
  rec.Record(PodEvent("web-1", "m"));
  rec.Record(PodEvent("web-1", "m"));
  ASSERT_TRUE(WaitFor([&] { return rec.stats().posted == 1; }));
  clock_.Advance(o.dedupe_window);
  rec.Record(PodEvent("web-1", "m"));
  ASSERT_TRUE(WaitFor([&] { return rec.stats().posted == 2; }));
  EXPECT_EQ(rec.stats().deduplicated, 1u);
}

TEST_F(EventRecorderTest, TokenBucketLimitsTheRate) {
  EventRecorderOptions o;
  o.events_per_minute = 600;  // 10 a second
  o.burst = 5;
  o.clock = &clock_;
  EventRecorder rec(client_.get(), o);
  const absl::Time real_t0 = absl::Now();
  const absl::Time t0 = clock_.Now();
  for (int i = 0; i < 20; ++i) rec.Record(PodEvent("p" + std::to_string(i), "m"));
  EXPECT_LT(absl::Now() - real_t0, absl::Milliseconds(100));  // Record never waits
  // The burst goes at once; then the worker waits for a token.
  ASSERT_TRUE(WaitFor([&] { return rec.stats().posted == 5; }));
  ASSERT_TRUE(clock_.AwaitSleepers(1));
  EXPECT_EQ(Posted(), 5);
  // Then what 10/s earns in the time elapsed, never more.
  for (int i = 0; i < 30 && rec.stats().posted < 20; ++i) {
    clock_.Advance(absl::Milliseconds(100));
    ASSERT_TRUE(WaitFor([&] { return clock_.sleepers() == 1 || rec.stats().posted == 20; }));
    const double elapsed = absl::ToDoubleSeconds(clock_.Now() - t0);
    const int posted = static_cast<int>(rec.stats().posted);
    EXPECT_GE(posted, 5);
    EXPECT_LE(posted, 5 + static_cast<int>(elapsed * 10) + 1);
  }
  ASSERT_EQ(rec.stats().posted, 20u);
  // 15 beyond the burst at 10/s take at least 1.5 s.
  EXPECT_GE(clock_.Now() - t0, absl::Milliseconds(1400));
  EXPECT_LE(clock_.Now() - t0, absl::Milliseconds(1600));
  EXPECT_EQ(Posted(), 20);
}

TEST_F(EventRecorderTest, FullQueueDropsAndCountsAndStopDoesNotWait) {
  fake_.Control("slow", {{"delay_ms", 300}});
  EventRecorderOptions o;
  o.queue_capacity = 4;
  o.burst = 100;
  o.events_per_minute = 6000;
  auto rec = std::make_unique<EventRecorder>(client_.get(), o);
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < 20; ++i) rec->Record(PodEvent("p" + std::to_string(i), "m"));
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(100));  // a slow API server does not block
  EventRecorderStats s = rec->stats();
  EXPECT_EQ(s.recorded, 20u);
  // At most one taken by the worker, four queued: the rest dropped.
  EXPECT_GE(s.dropped, 15u);
  EXPECT_LE(s.queued, 4u);
  const absl::Time t1 = absl::Now();
  rec->Stop();
  EXPECT_LT(absl::Now() - t1, absl::Seconds(2));  // at most the post in flight
  s = rec->stats();
  EXPECT_EQ(s.posted + s.failed + s.dropped, 20u);
  rec->Record(PodEvent("late", "m"));
  EXPECT_EQ(rec->stats().dropped, s.dropped + 1);
}

TEST_F(EventRecorderTest, FailedPostIsCountedNotRetried) {
  fake_.Control("fail", {{"count", 1}, {"code", 500}});
  EventRecorder rec(client_.get(), EventRecorderOptions{});
  rec.Record(PodEvent("a", "m"));
  rec.Record(PodEvent("b", "m"));
  ASSERT_TRUE(WaitFor([&] { return rec.stats().failed == 1 && rec.stats().posted == 1; }));
  EXPECT_EQ(Stored("team").size(), 1u);
}

TEST_F(EventRecorderTest, ZeroRateDisablesEvents) {
  EventRecorderOptions o;
  o.events_per_minute = 0;
  EventRecorder rec(client_.get(), o);
  rec.Record(PodEvent("a", "m"));
  // Dropped by Record itself: nothing was queued for the worker.
  EXPECT_EQ(rec.stats().queued, 0u);
  EXPECT_EQ(rec.stats().dropped, 1u);
  EXPECT_EQ(Posted(), 0);
}

}  // namespace
}  // namespace k8s
}  // namespace duet
