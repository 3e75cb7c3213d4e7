#pragma once

// The ledger's log, as duet-bridge uses it: whatever makes a ledger change
// durable before its caller is answered (invariant I3). Two implementations:
// Journal (a write-ahead log and snapshots on local disk, per replica) and
// EtcdLog (bridge/etcd/: the same records in etcd, shared by the replicas and
// fenced, so a standby that takes over starts from every acknowledged change).
//
// Both register as the ledger's ChangeListener when opened: OnChange runs
// under the ledger's lock and only buffers the record; a writer thread
// commits batches (group commit).

#include <cstddef>
#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "bridge/ledger/ledger.h"

namespace duet {

class LedgerLog : public ChangeListener {
 public:
  ~LedgerLog() override = default;

  // Blocks until every record with seq <= `seq` is durable. OK at once for a
  // seq that already is (including everything recovered at open). An error
  // (UNAVAILABLE) means the change is not known to be durable and must not be
  // acknowledged; the log then stays failed and the daemon must stop granting.
  virtual absl::Status WaitDurable(uint64_t seq) = 0;

  // Everything appended so far is durable.
  virtual absl::Status Flush() = 0;

  // OK, or the status that failed the log for good.
  virtual absl::Status Health() const = 0;

  // Called by the writer after each committed batch with its latency in
  // seconds and the batch's records and bytes. Must be quick and thread-safe
  // and must not call back into the log. An empty function removes it.
  virtual void SetFsyncObserver(
      std::function<void(double seconds, size_t records, size_t bytes)> observer) = 0;
};

}  // namespace duet
