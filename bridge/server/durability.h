#pragma once

// Answers callers only once their change is durable (invariant I3), without
// blocking gRPC's callback threads: callbacks run on a waiter thread after the
// journal reports the sequence number synced.

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"

namespace duet {

class Durability {
 public:
  virtual ~Durability() = default;
  // Calls `done` once every change up to `seq` is durable, or with the error
  // that makes it impossible. `done` may run on another thread, or inline.
  virtual void WhenDurable(uint64_t seq, std::function<void(absl::Status)> done) = 0;
};

// Everything is durable at once (tests, or a bridge run without a journal).
std::unique_ptr<Durability> NewImmediateDurability();

// Batches waiters on one thread that calls `wait_durable(max pending seq)`
// (e.g. Journal::WaitDurable), then answers every waiter it covered.
std::unique_ptr<Durability> NewWaitingDurability(
    std::function<absl::Status(uint64_t)> wait_durable);

}  // namespace duet
