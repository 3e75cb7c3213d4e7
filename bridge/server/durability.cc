#include "bridge/server/durability.h"

#include <algorithm>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace duet {
namespace {

class ImmediateDurability final : public Durability {
 public:
  void WhenDurable(uint64_t, std::function<void(absl::Status)> done) override {
    done(absl::OkStatus());
  }
};

// Thread-safety: `mu_` guards `pending_` and `stop_`. The waiter thread calls
// `wait_` and the callbacks without holding `mu_`.
class WaitingDurability final : public Durability {
 public:
  explicit WaitingDurability(std::function<absl::Status(uint64_t)> wait)
      : wait_(std::move(wait)), thread_([this] { Loop(); }) {}

  ~WaitingDurability() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  void WhenDurable(uint64_t seq, std::function<void(absl::Status)> done) override {
    absl::MutexLock lock(&mu_);
    pending_.emplace_back(seq, std::move(done));
  }

 private:
  void Loop() {
    for (;;) {
      std::vector<std::pair<uint64_t, std::function<void(absl::Status)>>> batch;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](WaitingDurability* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
              return self->stop_ || !self->pending_.empty();
            },
            this));
        if (pending_.empty()) return;  // stopping, nothing left to answer
        batch.swap(pending_);
      }
      uint64_t max_seq = 0;
      for (const auto& p : batch) max_seq = std::max(max_seq, p.first);
      const absl::Status s = wait_(max_seq);
      for (auto& p : batch) p.second(s);
    }
  }

  const std::function<absl::Status(uint64_t)> wait_;
  absl::Mutex mu_;
  std::vector<std::pair<uint64_t, std::function<void(absl::Status)>>> pending_
      ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Durability> NewImmediateDurability() {
  return std::make_unique<ImmediateDurability>();
}

std::unique_ptr<Durability> NewWaitingDurability(
    std::function<absl::Status(uint64_t)> wait_durable) {
  return std::make_unique<WaitingDurability>(std::move(wait_durable));
}

}  // namespace duet
