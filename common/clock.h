#pragma once

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace duet {

// The time source. Code that needs "now", or waits for a time to come, takes
// a Clock so tests can pass a fake one (tests/fakes/fake_clock.h) and move
// time on instead of sleeping. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // With `mu` held by the caller: blocks until `cond` holds or this clock
  // reaches `deadline`, releasing `mu` while blocked as
  // absl::Mutex::AwaitWithDeadline does. Returns whether `cond` holds. The
  // real clock is absl::Mutex::AwaitWithDeadline itself; a fake clock returns
  // once it is advanced to `deadline`.
  virtual bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                 absl::Time deadline) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;

  // AwaitWithDeadline(mu, cond, Now() + timeout).
  bool AwaitWithTimeout(absl::Mutex* mu, const absl::Condition& cond, absl::Duration timeout) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return AwaitWithDeadline(mu, cond, Now() + timeout);
  }

  // The process-wide wall clock. Never null; never deleted.
  static const Clock* Real();
};

}  // namespace duet
