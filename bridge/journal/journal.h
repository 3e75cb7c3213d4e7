#pragma once

// The ledger's journal: a write-ahead log plus snapshots, so that a holding
// granted to a caller is durable before the caller is answered (invariant I3)
// and survives a crash or restart of duet-bridge.
//
// On disk, in one directory:
//   wal-<first seq, 20 digits>.log   log segments: framed JournalRecords
//   snapshot-<seq, 20 digits>.pb     framed JournalSnapshot chunks, one per
//                                    node (with its holdings), then an end
//                                    marker: a chunk without nodes
//   LOCK                             the one-writer lock; its content is
//                                    "pid <pid> on host <hostname>" of the
//                                    process that holds it (or last held it)
// Every frame is [u32 length][u32 crc32 of the payload][payload], little
// endian. A snapshot covers every record with seq <= its seq; segments whose
// records it covers are deleted once it is durable (compaction).
//
// One writer per directory: Open takes an exclusive flock(2) on <dir>/LOCK
// (FileLayer::Lock) before it reads, truncates or deletes anything there,
// and the journal holds it until it is destroyed; the kernel drops it when
// the process dies, even by SIGKILL. A second Open of the same directory, by
// another duet-bridge or in the same process, fails with FAILED_PRECONDITION
// and touches no file but LOCK (which it only opens and reads):
//   journal /var/lib/duet/journal is in use by another process:
//   /var/lib/duet/journal/LOCK held by pid 1234 on host node-7; only one
//   duet-bridge may use a journal directory (two would grant the same device
//   twice); refusing to start
// The LOCK file stays after a clean exit; the name in it is then stale and
// blocks nothing (it is rewritten by the next holder). It must not be
// deleted by hand while a bridge runs: a new file would be a second lock.
// flock needs a local file system (or NFS with lock support); where locking
// fails, Open fails (UNAVAILABLE) instead of running unprotected.
//
// How a change becomes durable (group commit): the ledger calls OnChange under
// its own lock; the journal only serializes the record and appends it to an
// in-memory buffer. One writer thread takes whatever has accumulated, write()s
// it, fdatasync()s once, and wakes every caller waiting in WaitDurable for a
// seq in that batch. Many concurrent callers therefore share one fsync.
//
// Usage in the daemon:
//   Ledger ledger;
//   DUET_ASSIGN_OR_RETURN(auto journal, Journal::Open(options, &ledger));
//   ... HoldResult r = ledger.Hold(...); journal->WaitDurable(r.seq); answer.
//
// The watermarks, the failure status, WaitDurable, Flush, Health and the
// observer are DurableLog's (bridge/journal/durable_log.h), shared with
// EtcdLog.
//
// Thread-safety: every public method may be called from any thread. `mu_`
// (DurableLog's) guards the append buffer, the durability watermark, the
// failure status, the stats and the writer's segment bookkeeping; `snapshot_mu_` serializes
// snapshots. I/O (through the FileLayer) is never done while holding `mu_`. Lock order: the ledger's
// lock, then `mu_` (OnChange); `snapshot_mu_` before the ledger's lock, and
// never `mu_` while calling into the ledger.

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
#include "bridge/journal/durable_log.h"
#include "bridge/journal/file_layer.h"
#include "bridge/ledger/ledger.h"
#include "bridge/ledger/types.h"

namespace duet {

class Journal final : public DurableLog {
 public:
  struct Options {
    // The journal's directory; created (with parents) if missing.
    std::string dir;
    // fdatasync every batch. False only for tests and benchmarks: records are
    // then "durable" once written to the page cache.
    bool fsync = true;
    // Records between automatic snapshots (taken by a background thread);
    // 0 = only when WriteSnapshot is called.
    uint64_t snapshot_every = 100000;
    // A segment grows to about this size before the writer starts a new one.
    uint64_t segment_bytes = 64ull << 20;
    // The file operations; null: FileLayer::Posix(). Tests pass a faulty
    // layer here. Not owned; must outlive the journal.
    FileLayer* files = nullptr;
  };

  struct Stats {
    uint64_t records = 0;      // records appended since Open
    uint64_t bytes = 0;        // log bytes written since Open
    uint64_t batches = 0;      // write() batches
    uint64_t fsyncs = 0;       // fdatasync calls on log segments
    uint64_t snapshots = 0;    // snapshots written since Open
    uint64_t durable_seq = 0;  // every seq <= this is on disk
    uint64_t recovered_records = 0;   // log records replayed by Open
    uint64_t recovered_holdings = 0;  // holdings in the ledger after Open
  };

  // Opens the journal in options.dir, replays the newest snapshot and then
  // every later log record into `ledger`, and registers itself as the
  // ledger's ChangeListener. `ledger` must be empty, must not be changed by
  // anyone else until Open returns, and must outlive the journal.
  //
  // A torn last record (a crash in the middle of a write) is dropped, the
  // segment truncated before it, and a warning logged. Errors:
  //   FAILED_PRECONDITION  the ledger is not empty; or another journal (in
  //                        this or another process) holds options.dir, the
  //                        message naming the directory and the holder's pid
  //                        and host as its LOCK file says
  //   INVALID_ARGUMENT     options.dir is empty
  //   DATA_LOSS            a corrupt snapshot or log record, or a record the
  //                        ledger refuses; the message names the file and the
  //                        byte offset. The daemon must not start.
  //   UNAVAILABLE / others the directory or a file cannot be read or written
  static absl::StatusOr<std::unique_ptr<Journal>> Open(const Options& options, Ledger* ledger);

  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Removes itself as the ledger's listener, makes everything appended
  // durable (if the journal has not failed), and joins its threads.
  ~Journal() override;

  // ChangeListener: called under the ledger's lock. Serializes the record and
  // appends it to the buffer; no I/O, no blocking beyond `mu_`.
  void OnChange(const Change& change) override ABSL_LOCKS_EXCLUDED(mu_);

  // WaitDurable (DurableLog): blocks until every record with seq <= `seq`
  // is on disk. OK at once for a seq that is already durable (including
  // everything recovered by Open). UNAVAILABLE if writing or syncing failed:
  // the journal then stays failed for good and the daemon must stop granting.
  // Health: OK, or the UNAVAILABLE status that failed the journal.
  // SetFsyncObserver: the observer is called after each log fsync (or write,
  // when fsync is off).

  // Writes a snapshot of the ledger now, then deletes the log segments and
  // older snapshots it covers. Concurrent changes continue meanwhile.
  absl::Status WriteSnapshot() override ABSL_LOCKS_EXCLUDED(mu_, snapshot_mu_);

  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Journal(const Options& options, Ledger* ledger);

  // Recovery, before the threads start.
  absl::Status Recover();

  void WriterLoop() override ABSL_LOCKS_EXCLUDED(mu_);
  bool HasPendingLocked() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !pending_.empty();
  }
  void DropPendingLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { pending_.clear(); }
  // Writes one batch to the active segment (opening a new one if needed).
  absl::Status WriteBatch(const std::string& batch, uint64_t first_seq, bool rotate);
  absl::Status OpenSegment(uint64_t first_seq);
  // Deletes segments and snapshots covered by the snapshot at `seq`.
  void Compact(uint64_t seq);

  const Options options_;

  std::string pending_ ABSL_GUARDED_BY(mu_);  // framed records not yet written
  uint64_t pending_first_seq_ ABSL_GUARDED_BY(mu_) = 0;
  size_t pending_records_ ABSL_GUARDED_BY(mu_) = 0;
  bool rotate_ ABSL_GUARDED_BY(mu_) = false;  // next batch starts a new segment
  Stats stats_ ABSL_GUARDED_BY(mu_);

  FileLayer* const files_;

  // The directory's lock (`<dir>/LOCK`), from Recover until the destructor:
  // every file of the directory is read, written, truncated, renamed and
  // deleted only while it is held.
  std::unique_ptr<FileLock> lock_;

  // The writer thread's own state (only it touches these after Open).
  std::unique_ptr<WritableFile> segment_;
  uint64_t segment_size_ = 0;

  absl::Mutex snapshot_mu_ ABSL_ACQUIRED_BEFORE(mu_);
};

}  // namespace duet
