#pragma once

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace duet {

// The time source. Code that needs "now" takes a Clock so tests can pass a
// fake one. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;

  // The process-wide wall clock. Never null; never deleted.
  static const Clock* Real();
};

}  // namespace duet
