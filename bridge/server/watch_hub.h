#pragma once

// The fan-out of ledger changes to the WatchNodes streams of the gRPC
// service (service.h): a ledger ChangeListener that pushes every node change
// to each subscribed stream.

#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "bridge/ledger/ledger.h"
#include "duet/v1/duet.pb.h"

namespace duet {

// Fans ledger changes out to watch streams. Lock order: the ledger's lock
// (held while OnChange runs) before `mu_` before a subscriber's own lock.
class WatchHub final : public ChangeListener {
 public:
  class Subscriber {
   public:
    virtual ~Subscriber() = default;
    // Called with the ledger's lock held: must only queue.
    virtual void Push(v1::NodeEvent::Type type, const std::shared_ptr<const NodeView>& view) = 0;
    // Ends the stream (shutdown). Must not call back into the hub.
    virtual void Close(const std::string& why) = 0;
  };
  void Add(Subscriber* s) ABSL_LOCKS_EXCLUDED(mu_);
  // After it returns, `s` gets no more Push calls.
  void Remove(Subscriber* s) ABSL_LOCKS_EXCLUDED(mu_);
  void OnChange(const Change& change) override ABSL_LOCKS_EXCLUDED(mu_);
  // Closes every stream (graceful shutdown).
  void CloseAll(const std::string& why) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  std::set<Subscriber*> subscribers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet
