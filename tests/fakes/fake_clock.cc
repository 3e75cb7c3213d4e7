#include "tests/fakes/fake_clock.h"

#include <iterator>

#include "absl/strings/str_cat.h"

namespace duet {
namespace fakes {

FakeClock::FakeClock(absl::Time start) : now_(start) {}

absl::Time FakeClock::Now() const {
  absl::MutexLock l(&mu_);
  return now_;
}

bool FakeClock::AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                  absl::Time deadline) const {
  std::multiset<absl::Time>::iterator it;
  {
    absl::MutexLock l(&mu_);
    it = deadlines_.insert(deadline);
  }
  bool held;
  while (true) {
    held = cond.Eval();
    if (held || Now() >= deadline) break;
    // `cond` wakes this at once when another thread makes it true under
    // `mu`; an Advance() is noticed within the slice.
    mu->AwaitWithTimeout(cond, absl::Milliseconds(1));
  }
  absl::MutexLock l(&mu_);
  deadlines_.erase(it);
  return held;
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock l(&mu_);
  if (d > absl::ZeroDuration()) now_ += d;
}

void FakeClock::SetNow(absl::Time t) {
  absl::MutexLock l(&mu_);
  if (t > now_) now_ = t;
}

int FakeClock::sleepers() const {
  absl::MutexLock l(&mu_);
  return static_cast<int>(std::distance(deadlines_.upper_bound(now_), deadlines_.end()));
}

::testing::AssertionResult FakeClock::AwaitSleepers(int n, absl::Duration timeout) const {
  return WaitFor([&] { return sleepers() >= n; }, timeout,
                 absl::StrCat(n, " threads waiting on the fake clock"));
}

::testing::AssertionResult FakeClock::Step(absl::Duration step, int steps, int n) {
  for (int i = 0; i < steps; ++i) {
    Advance(step);
    ::testing::AssertionResult r = AwaitSleepers(n);
    if (!r) return r << " (after step " << i + 1 << " of " << steps << ")";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace fakes
}  // namespace duet
