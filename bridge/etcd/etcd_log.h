#pragma once

// The ledger's log in etcd: the Journal's records (JournalRecord, and
// JournalSnapshot chunks) kept under one key prefix of an etcd cluster, so
// every duet-bridge replica reads the same quorum-committed history. A
// standby that wins the Lease recovers every change the old leader
// acknowledged (invariant I3 across a takeover), and a deposed leader can
// write nothing more (fencing), so no device is granted twice (I1).
//
// Keys under `prefix` P:
//   P/fence                the current writer's identity; its mod_revision is
//                          the writer's fence (the epoch)
//   P/log/<seq, 20 digits> one JournalRecord
//   P/snapshot             a JournalSnapshot carrying only `seq`: the newest
//                          complete snapshot
//   P/snap/<seq>/<n, 8 d.> JournalSnapshot chunks of that snapshot (nodes with
//                          their holdings), then an end marker (no nodes)
// Recovery reads the snapshot P/snapshot names, then every log record after
// its seq, all at one store revision.
//
// Fencing: Open first writes P/fence (unconditionally) and keeps the
// revision of that write. Every later transaction of this object compares
// P/fence's mod_revision with it, so once another replica has opened the log
// (written P/fence again), nothing of this one commits: its writer fails with
// UNAVAILABLE ("deposed"), WaitDurable fails for every change not yet
// committed, and deposed() turns true; the daemon must stop serving. Because
// the new writer fences before it reads, every record the old one committed
// is in what it reads, and nothing the old one writes later can land.
//
// Group commit: OnChange (under the ledger's lock) serializes the record and
// appends it to a buffer. One writer thread takes what has accumulated and
// commits it in transactions of at most max_txn_ops puts and max_txn_bytes
// (etcd's --max-txn-ops 128 and --max-request-bytes 1.5 MiB by default),
// in seq order; each committed transaction makes its records durable and
// wakes their waiters. A transaction that fails for want of etcd is retried
// (the same puts under the same fence: idempotent) until commit_timeout has
// passed since its first try; then the log fails for good (UNAVAILABLE).
//
// Snapshots: after snapshot_every records a background thread writes a
// snapshot (see SnapshotChunks in bridge/journal/records.h), then, in one
// transaction, the end marker, P/snapshot, and the deletion of the log keys
// and the older snapshot it covers (compaction).
//
// The watermarks, the failure status, WaitDurable, Flush, Health, the
// observer and the snapshot thread are DurableLog's
// (bridge/journal/durable_log.h), shared with the Journal.
//
// Thread-safety: every public method may be called from any thread. `mu_`
// (DurableLog's) guards the buffer, the watermarks, the failure status, the stats and the
// capture state; `snapshot_mu_` serializes snapshots. No etcd request is made
// under `mu_`. Lock order: the ledger's lock, then `mu_` (OnChange);
// `snapshot_mu_` before the ledger's lock; never `mu_` while calling into the
// ledger.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bridge/etcd/etcd_client.h"
#include "bridge/journal/durable_log.h"
#include "bridge/ledger/ledger.h"
#include "bridge/ledger/types.h"

namespace duet {

class EtcdLog final : public DurableLog {
 public:
  struct Options {
    // etcd v3 client URLs (http://host:port or https://host:port, one
    // scheme for all), tried in turn.
    std::vector<std::string> endpoints;
    // For https:// endpoints: the CA of etcd's server certificate and the
    // client certificate (etcd::CheckTls in etcd_client.h says what is accepted).
    etcd::TlsOptions tls;
    // Key prefix of this ledger; no trailing slash.
    std::string prefix = "/duet/ledger";
    // Written into P/fence, for people reading etcd (the replica's name).
    std::string owner;
    // One HTTP request.
    absl::Duration request_timeout = absl::Seconds(2);
    // How long a batch is retried while etcd does not answer.
    absl::Duration commit_timeout = absl::Seconds(10);
    // Records between automatic snapshots; 0 = only WriteSnapshot().
    uint64_t snapshot_every = 100000;
    // Limits of one transaction (etcd's defaults leave room for these).
    size_t max_txn_ops = 128;
    size_t max_txn_bytes = 1u << 20;
    // A snapshot value gathers node chunks up to about this size.
    size_t snapshot_value_bytes = 256u << 10;
    // Records per range request during recovery.
    int64_t read_page = 1000;
  };

  struct Stats {
    uint64_t records = 0;       // records appended since Open
    uint64_t bytes = 0;         // record bytes committed since Open
    uint64_t batches = 0;       // writer batches
    uint64_t largest_batch = 0; // most records in one batch
    uint64_t txns = 0;          // etcd transactions that committed records
    uint64_t retries = 0;       // transactions tried again
    uint64_t snapshots = 0;     // snapshots written since Open
    uint64_t durable_seq = 0;   // every seq <= this is in etcd
    uint64_t recovered_records = 0;
    uint64_t recovered_holdings = 0;
    int64_t fence_revision = 0;  // this writer's epoch
  };

  // Fences every earlier writer (see the file comment), then replays the
  // newest snapshot and every later record into `ledger` and registers as its
  // ChangeListener. `ledger` must be empty, must not change until Open
  // returns, and must outlive the log. Errors:
  //   INVALID_ARGUMENT     no endpoints, a bad prefix, a null ledger, TLS
  //                        options etcd::CheckTls refuses
  //   NOT_FOUND            a TLS file that cannot be read (the field named)
  //   FAILED_PRECONDITION  the ledger is not empty
  //   UNAVAILABLE          etcd cannot be reached (within request_timeout)
  //   DATA_LOSS            an unparsable or incomplete snapshot, or a record
  //                        the ledger refuses (the key is named)
  static absl::StatusOr<std::unique_ptr<EtcdLog>> Open(const Options& options, Ledger* ledger);

  EtcdLog(const EtcdLog&) = delete;
  EtcdLog& operator=(const EtcdLog&) = delete;

  // Stops listening, commits what is buffered (unless failed) and joins.
  ~EtcdLog() override;

  void OnChange(const Change& change) override ABSL_LOCKS_EXCLUDED(mu_);
  // WaitDurable, Flush, Health and SetFsyncObserver: DurableLog's.

  // Writes a snapshot of the ledger now and compacts what it covers.
  absl::Status WriteSnapshot() override ABSL_LOCKS_EXCLUDED(mu_, snapshot_mu_);

  // True once a transaction found another writer's fence.
  bool deposed() const { return deposed_.load(); }

  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

  // Key names, for tests and tools.
  static std::string LogKey(const std::string& prefix, uint64_t seq);

 private:
  EtcdLog(const Options& options, Ledger* ledger);

  absl::Status Fence();
  absl::Status Recover();
  void WriterLoop() override ABSL_LOCKS_EXCLUDED(mu_);
  bool HasPendingLocked() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !pending_.empty();
  }
  void DropPendingLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { pending_.clear(); }
  // Commits `ops` under the fence, retrying while etcd is unavailable until
  // `deadline`. UNAVAILABLE when deposed or out of time.
  absl::Status Commit(etcd::Client* client, const std::vector<etcd::Op>& ops,
                      absl::Time deadline, uint64_t* retries);

  const Options options_;
  const std::string fence_key_;
  int64_t fence_revision_ = 0;  // set by Open, then read-only
  std::atomic<bool> deposed_{false};

  std::vector<std::pair<uint64_t, std::string>> pending_ ABSL_GUARDED_BY(mu_);
  uint64_t snapshot_seq_ ABSL_GUARDED_BY(mu_) = 0;  // the newest snapshot in etcd
  Stats stats_ ABSL_GUARDED_BY(mu_);

  // One client per thread that talks to etcd.
  std::unique_ptr<etcd::Client> writer_client_;
  std::unique_ptr<etcd::Client> snapshot_client_ ABSL_GUARDED_BY(snapshot_mu_);

  absl::Mutex snapshot_mu_ ABSL_ACQUIRED_BEFORE(mu_);
};

}  // namespace duet
