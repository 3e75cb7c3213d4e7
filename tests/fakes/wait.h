#pragma once

// Waiting on a condition instead of sleeping: a test that needs something to
// have happened waits for it, with a timeout generous enough for a loaded
// machine, and fails saying what it waited for. Header-only, so that any test
// can use it without another library.

#include <algorithm>
#include <functional>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace duet {
namespace fakes {

// The default for every wait on a condition: long enough never to fire on a
// slow, shared machine; a test that passes never waits for it.
inline constexpr absl::Duration kWaitTimeout = absl::Seconds(30);

// Evaluates `done` until it returns true (success) or `timeout` of real time
// has passed (failure naming `what`). Use as ASSERT_TRUE(WaitFor(...)).
inline ::testing::AssertionResult WaitFor(const std::function<bool()>& done,
                                          absl::Duration timeout = kWaitTimeout,
                                          absl::string_view what = "the condition") {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  absl::Duration pause = absl::Milliseconds(1);
  while (true) {
    if (done()) return ::testing::AssertionSuccess();
    if (absl::Now() >= deadline) break;
    // Looks again soon at first, then every 10 ms.
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(10));
  }
  if (done()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "waited " << absl::FormatDuration(absl::Now() - start)
                                       << " for " << what << "; it did not happen";
}

}  // namespace fakes
}  // namespace duet
