#include "bridge/journal/durable_log.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace duet {

DurableLog::DurableLog(Naming naming, uint64_t snapshot_every, Ledger* ledger)
    : ledger_(ledger), naming_(std::move(naming)), snapshot_every_(snapshot_every) {}

void DurableLog::Start() {
  writer_ = std::thread([this] { WriterLoop(); });
  snapshotter_ = std::thread([this] { SnapshotLoop(); });
  ledger_->AddListener(this);
}

void DurableLog::Stop() {
  ledger_->RemoveListener(this);
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (snapshotter_.joinable()) snapshotter_.join();
  if (writer_.joinable()) writer_.join();
}

bool DurableLog::AcceptLocked(const Change& change) {
  appended_seq_ = change.seq;
  if (!failed_.ok()) return false;  // nothing more is written; waiters get failed_
  if (capturing_ && change.type == Change::Type::kRelease) {
    captured_releases_.emplace_back(change.seq, *change.holding);
  }
  return true;
}

absl::Status DurableLog::WaitDurable(uint64_t seq) {
  absl::MutexLock lock(&mu_);
  if (seq > appended_seq_) {
    return absl::InvalidArgumentError(absl::StrCat("seq ", seq, " was never ", naming_.appended,
                                                   " (last is ", appended_seq_, ")"));
  }
  auto done = [this, seq]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return durable_seq_ >= seq || !failed_.ok();
  };
  mu_.Await(absl::Condition(&done));
  if (durable_seq_ >= seq) return absl::OkStatus();
  return failed_;
}

absl::Status DurableLog::Flush() {
  uint64_t seq;
  {
    absl::MutexLock lock(&mu_);
    seq = appended_seq_;
  }
  return WaitDurable(seq);
}

absl::Status DurableLog::Health() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}

void DurableLog::SetFsyncObserver(std::function<void(double, size_t, size_t)> observer) {
  absl::MutexLock lock(&mu_);
  observer_ = std::move(observer);
}

bool DurableLog::AwaitBatchLocked() {
  for (;;) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return HasPendingLocked() || stop_; };
    mu_.Await(absl::Condition(&ready));
    if (!failed_.ok()) DropPendingLocked();
    if (HasPendingLocked()) return true;
    if (stop_) return false;
  }
}

void DurableLog::NotifyObserver(double seconds, size_t records, size_t bytes) {
  std::function<void(double, size_t, size_t)> observer;
  {
    absl::MutexLock lock(&mu_);
    observer = observer_;
  }
  if (observer) observer(seconds, records, bytes);
}

void DurableLog::MarkDurableLocked(uint64_t seq, size_t records) {
  durable_seq_ = seq;
  since_snapshot_ += records;
  if (snapshot_every_ != 0 && since_snapshot_ >= snapshot_every_) snapshot_wanted_ = true;
}

void DurableLog::Fail(const absl::Status& s, absl::string_view why) {
  absl::MutexLock lock(&mu_);
  if (!failed_.ok()) return;
  failed_ = s;
  spdlog::error("{}: {}; no change after seq {} is {}", naming_.name, std::string(why),
                durable_seq_, naming_.committed);
}

absl::Status DurableLog::BeginCapture() {
  absl::MutexLock lock(&mu_);
  if (!failed_.ok()) return failed_;
  capturing_ = true;
  captured_releases_.clear();
  since_snapshot_ = 0;
  snapshot_wanted_ = false;
  return absl::OkStatus();
}

std::vector<std::pair<uint64_t, Holding>> DurableLog::EndCapture() {
  std::vector<std::pair<uint64_t, Holding>> releases;
  absl::MutexLock lock(&mu_);
  capturing_ = false;
  releases.swap(captured_releases_);
  return releases;
}

void DurableLog::SnapshotLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return snapshot_wanted_ || stop_;
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
    }
    if (absl::Status s = WriteSnapshot(); !s.ok()) {
      // The log still has everything; only compaction is late.
      spdlog::error("{}: automatic snapshot failed: {}", naming_.name, s.ToString());
    }
  }
}

}  // namespace duet
