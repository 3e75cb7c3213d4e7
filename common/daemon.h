#pragma once

// What every duet daemon does first in main.

#include "absl/synchronization/mutex.h"

namespace duet {

// Debian's Abseil is built without NDEBUG, so by default each absl::Mutex
// acquisition feeds Abseil's lock-order graph: a process-wide lock and
// bookkeeping on every Lock. The daemons turn that off; the tests keep it,
// and it catches lock-order inversions there.
inline void SkipMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace duet
