#pragma once

// A gate that holds each caller until `want` callers are in it at once: a
// test that something runs concurrently makes each concurrent call Arrive()
// and checks timed_out() after. Calls made one at a time never reach
// `want`: the first waits `timeout`, then the gate opens for good (every
// later call goes straight on), so such a test fails instead of hanging.
// Header-only, as wait.h.
//
// Thread-safety: thread-safe.

#include <algorithm>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tests/fakes/wait.h"

namespace duet {
namespace fakes {

class Gate {
 public:
  explicit Gate(int want, absl::Duration timeout = kWaitTimeout)
      : want_(want), timeout_(timeout) {}

  // Enters the gate and waits until `want` callers have entered (or the gate
  // opened). Returns this caller's arrival number, from 1.
  int Arrive() {
    absl::MutexLock lock(&mu_);
    const int n = ++arrived_;
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return open_ || arrived_ >= want_;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout_)) timed_out_ = true;
    open_ = true;
    return n;
  }
  // Whether a caller gave up waiting for the others.
  bool timed_out() const {
    absl::MutexLock lock(&mu_);
    return timed_out_;
  }
  // How many callers entered.
  int arrived() const {
    absl::MutexLock lock(&mu_);
    return arrived_;
  }

 private:
  const int want_;
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  bool timed_out_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace fakes
}  // namespace duet
