#pragma once

// A Clock that moves only when a test moves it. Code under test that waits
// through Clock::AwaitWithDeadline (the pod watch's sweeps, the leader
// elector's retries, the event recorder's token bucket, the Slurm sync's
// period) wakes when Advance() reaches its deadline, so a test shows "the
// period passed and nothing happened" without sleeping through it.
//
// Thread-safety: thread-safe. `mu_` guards the time and the waits in
// progress; it is taken after the waiter's own mutex, never before.

#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "tests/fakes/wait.h"

namespace duet {
namespace fakes {

class FakeClock final : public Clock {
 public:
  // Starts at `start` (by default the real time now, so that times written
  // by code that does not take a clock still look recent).
  explicit FakeClock(absl::Time start = absl::Now());

  absl::Time Now() const override ABSL_LOCKS_EXCLUDED(mu_);
  // Returns when `cond` holds (as soon as it does) or once Advance()/SetNow()
  // has moved the time to `deadline`; never because real time passed.
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond, absl::Time deadline) const
      override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) ABSL_LOCKS_EXCLUDED(mu_);

  // Moves the time forward by `d` (>= 0) and wakes the waits it reaches.
  void Advance(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);
  // Moves the time to `t`; `t` before Now() is ignored (time never goes back).
  void SetNow(absl::Time t) ABSL_LOCKS_EXCLUDED(mu_);

  // Threads blocked in AwaitWithDeadline on a deadline not reached yet: the
  // ones that have done what the current time asks of them.
  int sleepers() const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits (in real time, up to `timeout`) until at least `n` threads are
  // sleepers. After Advance(), this is how a test knows the woken threads
  // have finished their turn and wait again.
  ::testing::AssertionResult AwaitSleepers(int n, absl::Duration timeout = kWaitTimeout) const;
  // Advance(step) then AwaitSleepers(n), `steps` times: time moving in
  // small increments, each one handled before the next.
  ::testing::AssertionResult Step(absl::Duration step, int steps, int n);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  // Deadlines of the waits in progress.
  mutable std::multiset<absl::Time> deadlines_ ABSL_GUARDED_BY(mu_);
};

}  // namespace fakes
}  // namespace duet
