#pragma once

// The group-commit bookkeeping shared by the two LedgerLogs, Journal (local
// disk) and EtcdLog (bridge/etcd/): the appended and durable watermarks, the
// failure status, the batch observer, the capture of released holdings while
// a snapshot is taken, and the waits on them. What differs (how a batch is
// buffered, written and snapshotted) stays in the subclass, which:
//   - in OnChange, serializes the record, takes `mu_`, calls AcceptLocked and
//     buffers the record only if it returns true;
//   - at the end of Open (once recovered), calls Start; first thing in its
//     destructor, calls Stop;
//   - in its writer thread (WriterLoop), calls AwaitBatchLocked (under
//     `mu_`) to wait for buffered records, writes what it takes without
//     `mu_`, then calls NotifyObserver and, under `mu_`, MarkDurableLocked;
//     or Fail on an error;
//   - in WriteSnapshot, brackets its capture of the ledger with BeginCapture
//     and EndCapture.
// The snapshot thread calls WriteSnapshot whenever MarkDurableLocked asks
// for a snapshot.
//
// Contract: a seq is durable once the subclass has passed it to
// MarkDurableLocked; WaitDurable returns OK for it from then on. After Fail
// the log stays failed for good: OnChange buffers nothing more,
// AwaitBatchLocked drops what is buffered, and every WaitDurable for a seq not
// yet durable returns the failure (UNAVAILABLE).
//
// Thread-safety: every public method may be called from any thread. `mu_`
// guards everything here and, in the subclasses, the buffer and the stats;
// no I/O is done and the observer is never called while holding it. Lock
// order: the ledger's lock, then `mu_` (OnChange); never `mu_` while calling
// into the ledger.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "bridge/journal/ledger_log.h"
#include "bridge/ledger/ledger.h"
#include "bridge/ledger/types.h"

namespace duet {

class DurableLog : public LedgerLog {
 public:
  // How the log names itself in its messages.
  struct Naming {
    // Prefixes the log lines: "journal <dir>", "etcd log <prefix>".
    std::string name;
    // WaitDurable's error for a seq never appended: "seq N was never
    // <appended> (last is M)"; "journaled", "logged".
    std::string appended;
    // Fail's log line: "no change after seq N is <committed>"; "durable",
    // "acknowledged".
    std::string committed;
  };

  ~DurableLog() override = default;

  absl::Status WaitDurable(uint64_t seq) final ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Flush() final ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Health() const final ABSL_LOCKS_EXCLUDED(mu_);
  void SetFsyncObserver(std::function<void(double seconds, size_t records, size_t bytes)> observer)
      final ABSL_LOCKS_EXCLUDED(mu_);

  // Writes a snapshot of the ledger now and compacts what it covers.
  virtual absl::Status WriteSnapshot() ABSL_LOCKS_EXCLUDED(mu_) = 0;

 protected:
  // The log of `ledger` (not owned; must outlive the log).
  // `snapshot_every`: records made durable between automatic snapshots; 0 =
  // only when WriteSnapshot is called.
  DurableLog(Naming naming, uint64_t snapshot_every, Ledger* ledger);

  // Starts the writer thread (WriterLoop) and the snapshot thread, then
  // registers as the ledger's ChangeListener.
  void Start();
  // Removes itself as the ledger's listener, sets `stop_` and joins both
  // threads; the writer returns once the buffer is written (or dropped, if
  // the log has failed).
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // The writer thread's body; returns when AwaitBatchLocked says so.
  virtual void WriterLoop() ABSL_LOCKS_EXCLUDED(mu_) = 0;

  // OnChange's bookkeeping: records `change` as appended and, while a
  // snapshot is being captured, keeps a released holding. False once the log
  // has failed: the record must then not be buffered.
  bool AcceptLocked(const Change& change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The writer's wait: until records are buffered or `stop_` is set; drops
  // the buffer if the log has failed. True when there is a batch to take,
  // false when the writer must return.
  bool AwaitBatchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether records are buffered; and drops them.
  virtual bool HasPendingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  virtual void DropPendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;

  // Tells the observer about a committed batch. Called before
  // MarkDurableLocked, so whoever sees its change durable also sees the batch
  // counted (metrics, tests).
  void NotifyObserver(double seconds, size_t records, size_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Every seq <= `seq` is durable (`records` more of them); wakes their
  // waiters and asks for a snapshot every `snapshot_every` records.
  void MarkDurableLocked(uint64_t seq, size_t records) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Fails the log for good with `s` (the first failure wins) and logs it,
  // with `why` (default: s.message()) as the cause.
  void Fail(const absl::Status& s) ABSL_LOCKS_EXCLUDED(mu_) { Fail(s, s.message()); }
  void Fail(const absl::Status& s, absl::string_view why) ABSL_LOCKS_EXCLUDED(mu_);

  // WriteSnapshot's capture: BeginCapture returns the failure if the log has
  // failed, else starts keeping released holdings (and resets the snapshot
  // count); EndCapture stops and returns them.
  absl::Status BeginCapture() ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::pair<uint64_t, Holding>> EndCapture() ABSL_LOCKS_EXCLUDED(mu_);

  Ledger* const ledger_;

  mutable absl::Mutex mu_;
  uint64_t appended_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t durable_seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);

 private:
  // The snapshot thread: WriteSnapshot whenever MarkDurableLocked asks for
  // one, until `stop_`.
  void SnapshotLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const Naming naming_;
  const uint64_t snapshot_every_;

  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  uint64_t since_snapshot_ ABSL_GUARDED_BY(mu_) = 0;
  bool snapshot_wanted_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void(double, size_t, size_t)> observer_ ABSL_GUARDED_BY(mu_);
  // While a snapshot is being captured, AcceptLocked also keeps every
  // released holding here (with its seq); see Journal::WriteSnapshot for why.
  bool capturing_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::pair<uint64_t, Holding>> captured_releases_ ABSL_GUARDED_BY(mu_);

  std::thread writer_;
  std::thread snapshotter_;
};

}  // namespace duet
