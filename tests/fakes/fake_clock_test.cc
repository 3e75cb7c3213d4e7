#include "tests/fakes/fake_clock.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"
#include "tests/fakes/wait.h"

namespace duet {
namespace fakes {
namespace {

// A thread that waits on `clock` for `flag` or `timeout`, as the code under
// test does.
class Waiter {
 public:
  Waiter(const Clock* clock, absl::Duration timeout) : clock_(clock) {
    thread_ = std::thread([this, timeout] {
      absl::MutexLock l(&mu_);
      const bool held = clock_->AwaitWithTimeout(&mu_, absl::Condition(&flag_), timeout);
      result_ = held ? 1 : 0;
    });
  }
  ~Waiter() {
    Set();
    thread_.join();
  }
  void Set() {
    absl::MutexLock l(&mu_);
    flag_ = true;
  }
  // -1 while waiting, then 1 (the flag) or 0 (the deadline).
  int result() const { return result_.load(); }

 private:
  const Clock* const clock_;
  absl::Mutex mu_;
  bool flag_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int> result_{-1};
  std::thread thread_;
};

TEST(FakeClockTest, TimeMovesOnlyWhenAdvanced) {
  const absl::Time start = absl::FromUnixSeconds(1'800'000'000);
  FakeClock clock(start);
  EXPECT_EQ(clock.Now(), start);
  absl::SleepFor(absl::Milliseconds(5));  // real time passing changes nothing
  EXPECT_EQ(clock.Now(), start);
  clock.Advance(absl::Seconds(90));
  EXPECT_EQ(clock.Now(), start + absl::Seconds(90));
  clock.SetNow(start);  // never backwards
  EXPECT_EQ(clock.Now(), start + absl::Seconds(90));
  clock.SetNow(start + absl::Hours(1));
  EXPECT_EQ(clock.Now(), start + absl::Hours(1));
  clock.Advance(-absl::Seconds(1));
  EXPECT_EQ(clock.Now(), start + absl::Hours(1));
}

TEST(FakeClockTest, WaitEndsWhenTheClockReachesTheDeadline) {
  FakeClock clock;
  Waiter w(&clock, absl::Seconds(10));
  ASSERT_TRUE(clock.AwaitSleepers(1));
  clock.Advance(absl::Seconds(9));
  // Not yet: the waiter is still a sleeper after its next look at the time.
  ASSERT_TRUE(clock.AwaitSleepers(1));
  EXPECT_EQ(w.result(), -1);
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(WaitFor([&] { return w.result() != -1; }, kWaitTimeout, "the wait to end"));
  EXPECT_EQ(w.result(), 0);
  EXPECT_EQ(clock.sleepers(), 0);
}

TEST(FakeClockTest, WaitEndsAtOnceWhenTheConditionHolds) {
  FakeClock clock;
  Waiter w(&clock, absl::Hours(1));
  ASSERT_TRUE(clock.AwaitSleepers(1));
  w.Set();
  ASSERT_TRUE(WaitFor([&] { return w.result() != -1; }, kWaitTimeout, "the wait to end"));
  EXPECT_EQ(w.result(), 1);
}

TEST(FakeClockTest, StepWaitsForEveryWaiterToWaitAgain) {
  FakeClock clock;
  std::atomic<int> turns{0};
  absl::Mutex mu;
  bool stop = false;
  std::thread t([&] {
    absl::MutexLock l(&mu);
    while (!clock.AwaitWithTimeout(&mu, absl::Condition(&stop), absl::Seconds(1))) ++turns;
  });
  ASSERT_TRUE(clock.AwaitSleepers(1));
  ASSERT_TRUE(clock.Step(absl::Seconds(1), 5, 1));
  EXPECT_EQ(turns.load(), 5);
  {
    absl::MutexLock l(&mu);
    stop = true;
  }
  t.join();
}

TEST(FakeClockTest, RealClockWaitsInRealTime) {
  absl::Mutex mu;
  bool never = false;
  const absl::Time t0 = absl::Now();
  absl::MutexLock l(&mu);
  EXPECT_FALSE(Clock::Real()->AwaitWithTimeout(&mu, absl::Condition(&never), absl::Milliseconds(20)));
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(20));
}

TEST(WaitForTest, FailsNamingWhatItWaitedFor) {
  ::testing::AssertionResult r = WaitFor([] { return false; }, absl::Milliseconds(20), "pigs to fly");
  EXPECT_FALSE(r);
  EXPECT_NE(std::string(r.message()).find("pigs to fly"), std::string::npos) << r.message();
  EXPECT_TRUE(WaitFor([] { return true; }, absl::ZeroDuration()));
}

}  // namespace
}  // namespace fakes
}  // namespace duet
