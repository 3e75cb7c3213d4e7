#include "bridge/etcd/etcd_log.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bridge/journal/records.h"
#include "common/status_macros.h"
#include "duet/internal/journal.pb.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace {

// Keys a transaction may hold besides the values (etcd counts the whole
// request against --max-request-bytes).
constexpr size_t kKeyOverhead = 128;

std::string SnapPrefix(const std::string& prefix, uint64_t seq) {
  return absl::StrFormat("%s/snap/%020d/", prefix, seq);
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Reads every key of [from, end) at `revision`, `page` keys per request,
// calling `each` in key order; stops at its first error.
absl::Status ReadRange(etcd::Client* client, std::string from, const std::string& end,
                       int64_t page, int64_t revision,
                       const std::function<absl::Status(const etcd::KeyValue&)>& each) {
  for (;;) {
    DUET_ASSIGN_OR_RETURN(etcd::RangeResult r, client->Range(from, end, page, revision));
    for (const etcd::KeyValue& kv : r.kvs) DUET_RETURN_IF_ERROR(each(kv));
    if (!r.more || r.kvs.empty()) return absl::OkStatus();
    from = r.kvs.back().key + std::string(1, '\0');
  }
}

}  // namespace

std::string EtcdLog::LogKey(const std::string& prefix, uint64_t seq) {
  return absl::StrFormat("%s/log/%020d", prefix, seq);
}

EtcdLog::EtcdLog(const Options& options, Ledger* ledger)
    : DurableLog({absl::StrCat("etcd log ", options.prefix), "logged", "acknowledged"},
                 options.snapshot_every, ledger),
      options_(options),
      fence_key_(options.prefix + "/fence") {
  etcd::Client::Options co;
  co.endpoints = options.endpoints;
  co.request_timeout = options.request_timeout;
  co.tls = options.tls;
  writer_client_ = std::make_unique<etcd::Client>(co);
  absl::MutexLock lock(&snapshot_mu_);
  snapshot_client_ = std::make_unique<etcd::Client>(co);
}

absl::StatusOr<std::unique_ptr<EtcdLog>> EtcdLog::Open(const Options& options, Ledger* ledger) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("etcd log: endpoints: name at least one");
  }
  if (options.prefix.empty() || options.prefix.front() != '/' || options.prefix.back() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd log: prefix \"", options.prefix, "\" must start with / and not end with /"));
  }
  if (options.max_txn_ops == 0 || options.read_page <= 0) {
    return absl::InvalidArgumentError("etcd log: max_txn_ops and read_page must be positive");
  }
  if (absl::Status tls = etcd::CheckTls(options.endpoints, options.tls); !tls.ok()) {
    return absl::Status(tls.code(), absl::StrCat("etcd log: ", tls.message()));
  }
  if (ledger == nullptr) return absl::InvalidArgumentError("etcd log: ledger must not be null");
  if (ledger->node_count() != 0 || ledger->holding_count() != 0) {
    return absl::FailedPreconditionError("etcd log: the ledger must be empty before recovery");
  }
  std::unique_ptr<EtcdLog> log(new EtcdLog(options, ledger));
  DUET_RETURN_IF_ERROR(log->Fence());
  DUET_RETURN_IF_ERROR(log->Recover());
  log->Start();
  return log;
}

EtcdLog::~EtcdLog() {
  Stop();
}

absl::Status EtcdLog::Fence() {
  // Unconditional: whoever holds the Lease takes the log over. The put's
  // revision is this writer's fence.
  DUET_ASSIGN_OR_RETURN(etcd::TxnResult r,
                        writer_client_->Txn("", 0, {etcd::Op::Put(fence_key_, options_.owner)}));
  if (!r.succeeded || r.revision <= 0) {
    return absl::UnavailableError(absl::StrCat("etcd log: cannot write ", fence_key_));
  }
  fence_revision_ = r.revision;
  spdlog::info("etcd log {}: fenced at revision {} as \"{}\"", options_.prefix, fence_revision_,
               options_.owner);
  return absl::OkStatus();
}

absl::Status EtcdLog::Recover() {
  const auto t0 = std::chrono::steady_clock::now();
  etcd::Client* client = writer_client_.get();
  const std::string& p = options_.prefix;
  // Everything at the fence's revision: no other writer can have changed
  // the log since, and the reads agree with each other.
  const int64_t rev = fence_revision_;
  uint64_t snapshot_seq = 0;
  DUET_ASSIGN_OR_RETURN(etcd::RangeResult head, client->Range(p + "/snapshot", "", 0, rev));
  if (!head.kvs.empty()) {
    internal::JournalSnapshot marker;
    if (!marker.ParseFromString(head.kvs.front().value)) {
      return absl::DataLossError(absl::StrCat("etcd log: ", p, "/snapshot is unparsable"));
    }
    snapshot_seq = marker.seq();
    const std::string snap = SnapPrefix(p, snapshot_seq);
    bool ended = false;
    internal::JournalSnapshot chunk;
    // Snapshot values are large: about 4 MiB per response.
    const int64_t page = std::max<int64_t>(
        1, std::min<int64_t>(options_.read_page,
                             static_cast<int64_t>((4u << 20) / std::max<size_t>(
                                                      options_.snapshot_value_bytes, 1))));
    DUET_RETURN_IF_ERROR(ReadRange(
        client, snap, etcd::PrefixEnd(snap), page, rev,
        [&](const etcd::KeyValue& kv) -> absl::Status {
          auto corrupt = [&](const std::string& why) {
            return absl::DataLossError(absl::StrCat("etcd log: snapshot key ", kv.key, ": ", why,
                                                    "; refusing to start"));
          };
          if (ended) return corrupt("after the end marker");
          if (!chunk.ParseFromString(kv.value)) return corrupt("unparsable chunk");
          if (chunk.seq() != snapshot_seq) return corrupt("seq does not match the snapshot");
          if (chunk.nodes_size() == 0) {
            ended = true;
            return absl::OkStatus();
          }
          if (absl::Status s = RestoreSnapshot(chunk, ledger_); !s.ok()) {
            return corrupt(absl::StrCat("refused by the ledger: ", s.ToString()));
          }
          return absl::OkStatus();
        }));
    if (!ended) {
      return absl::DataLossError(absl::StrCat("etcd log: snapshot ", snapshot_seq,
                                              " has no end marker; refusing to start"));
    }
  }
  uint64_t last = snapshot_seq;
  uint64_t replayed = 0;
  internal::JournalRecord rec;
  DUET_RETURN_IF_ERROR(ReadRange(
      client, LogKey(p, snapshot_seq + 1), etcd::PrefixEnd(p + "/log/"), options_.read_page, rev,
      [&](const etcd::KeyValue& kv) -> absl::Status {
        auto corrupt = [&](const std::string& why) {
          return absl::DataLossError(
              absl::StrCat("etcd log: record ", kv.key, ": ", why, "; refusing to start"));
        };
        if (!rec.ParseFromString(kv.value)) return corrupt("unparsable");
        if (kv.key != LogKey(p, rec.seq())) return corrupt("seq does not match the key");
        if (rec.seq() <= last) return corrupt(absl::StrCat("follows seq ", last));
        if (absl::Status s = ApplyRecord(rec, ledger_); !s.ok()) {
          return corrupt(absl::StrCat("refused by the ledger: ", s.ToString()));
        }
        last = rec.seq();
        ++replayed;
        return absl::OkStatus();
      }));
  ledger_->RestoreSeq(last);
  const uint64_t ledger_seq = ledger_->seq();
  const size_t nodes = ledger_->node_count();
  const size_t holdings = ledger_->holding_count();
  {
    absl::MutexLock lock(&mu_);
    appended_seq_ = durable_seq_ = ledger_seq;
    snapshot_seq_ = snapshot_seq;
    stats_.durable_seq = durable_seq_;
    stats_.recovered_records = replayed;
    stats_.recovered_holdings = holdings;
    stats_.fence_revision = fence_revision_;
  }
  spdlog::info(
      "etcd log {}: recovered {} nodes and {} holdings (snapshot seq {}, {} log records, last seq "
      "{}) in {:.3f} s",
      p, nodes, holdings, snapshot_seq, replayed, last, SecondsSince(t0));
  return absl::OkStatus();
}

void EtcdLog::OnChange(const Change& change) {
  const std::string payload = RecordOf(change).SerializeAsString();
  absl::MutexLock lock(&mu_);
  if (!AcceptLocked(change)) return;
  pending_.emplace_back(change.seq, payload);
  ++stats_.records;
}

EtcdLog::Stats EtcdLog::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::Status EtcdLog::Commit(etcd::Client* client, const std::vector<etcd::Op>& ops,
                             absl::Time deadline, uint64_t* retries) {
  absl::Duration backoff = absl::Milliseconds(20);
  for (;;) {
    absl::StatusOr<etcd::TxnResult> r = client->Txn(fence_key_, fence_revision_, ops);
    if (r.ok() && r->succeeded) return absl::OkStatus();
    if (r.ok()) {
      deposed_ = true;
      return absl::UnavailableError(absl::StrCat(
          "deposed: another replica has taken the ledger log over (", fence_key_,
          " changed since revision ", fence_revision_, "); this replica must stop serving"));
    }
    if (r.status().code() != absl::StatusCode::kUnavailable) {
      // A request etcd refuses will not succeed later.
      return absl::UnavailableError(
          absl::StrCat("etcd refused a transaction: ", r.status().message()));
    }
    if (absl::Now() + backoff >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "etcd did not commit within journal.etcd.commit_timeout (",
          absl::FormatDuration(options_.commit_timeout), "): ", r.status().message()));
    }
    ++*retries;
    absl::SleepFor(backoff);  // a back-off between tries, not synchronization
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
}

void EtcdLog::WriterLoop() {
  std::vector<std::pair<uint64_t, std::string>> batch;
  std::vector<etcd::Op> ops;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (!AwaitBatchLocked()) return;
      batch.swap(pending_);
    }
    const auto t0 = std::chrono::steady_clock::now();
    const absl::Time deadline = absl::Now() + options_.commit_timeout;
    size_t i = 0;
    while (i < batch.size()) {
      // One transaction: records in seq order within etcd's limits.
      ops.clear();
      size_t bytes = 0;
      size_t j = i;
      while (j < batch.size() && ops.size() < options_.max_txn_ops) {
        const size_t add = batch[j].second.size() + kKeyOverhead;
        if (!ops.empty() && bytes + add > options_.max_txn_bytes) break;
        ops.push_back(etcd::Op::Put(LogKey(options_.prefix, batch[j].first), batch[j].second));
        bytes += add;
        ++j;
      }
      uint64_t retries = 0;
      const absl::Status s = Commit(writer_client_.get(), ops, deadline, &retries);
      if (!s.ok()) {
        Fail(s);
        break;
      }
      NotifyObserver(SecondsSince(t0), j - i, bytes);
      absl::MutexLock lock(&mu_);
      MarkDurableLocked(batch[j - 1].first, j - i);
      stats_.durable_seq = durable_seq_;
      stats_.bytes += bytes;
      ++stats_.txns;
      stats_.retries += retries;
      i = j;
    }
    {
      absl::MutexLock lock(&mu_);
      ++stats_.batches;
      stats_.largest_batch = std::max<uint64_t>(stats_.largest_batch, batch.size());
    }
    batch.clear();
  }
}

absl::Status EtcdLog::WriteSnapshot() {
  absl::MutexLock snapshot_lock(&snapshot_mu_);
  const auto t0 = std::chrono::steady_clock::now();
  DUET_RETURN_IF_ERROR(BeginCapture());
  uint64_t previous = 0;
  {
    absl::MutexLock lock(&mu_);
    previous = snapshot_seq_;  // written only under snapshot_mu_, which is held
  }
  // As Journal::WriteSnapshot: the views at one seq, then the holdings, and
  // the releases in between (records.h, SnapshotChunks).
  LedgerSnapshot image = ledger_->Snapshot();
  std::vector<Holding> later = ledger_->ListHoldings();
  const std::vector<std::pair<uint64_t, Holding>> releases = EndCapture();
  const uint64_t seq = image.seq;
  if (seq == previous) return absl::OkStatus();  // nothing new since the last one
  DUET_ASSIGN_OR_RETURN(std::vector<internal::JournalSnapshot> chunks,
                        SnapshotChunks(image, later, releases));
  const std::string& p = options_.prefix;
  const std::string snap = SnapPrefix(p, seq);
  const absl::Time deadline = absl::Now() + options_.commit_timeout;
  uint64_t retries = 0;
  etcd::Client* const client = snapshot_client_.get();  // under snapshot_mu_
  auto commit = [&](const std::vector<etcd::Op>& ops) {
    absl::Status s = Commit(client, ops, deadline, &retries);
    if (!s.ok() && deposed_) Fail(s);
    return s;
  };
  // Node chunks merged into values of about snapshot_value_bytes, written in
  // transactions within the limits; then the end marker, the pointer and
  // the compaction together, so the snapshot appears whole or not at all.
  std::vector<etcd::Op> ops;
  size_t txn_bytes = 0;
  size_t values = 0;
  size_t holdings = 0;
  internal::JournalSnapshot value;
  auto put_value = [&]() -> absl::Status {
    std::string bytes = value.SerializeAsString();
    value.Clear();
    const size_t add = bytes.size() + kKeyOverhead;
    if (!ops.empty() && (ops.size() >= options_.max_txn_ops ||
                         txn_bytes + add > options_.max_txn_bytes)) {
      DUET_RETURN_IF_ERROR(commit(ops));
      ops.clear();
      txn_bytes = 0;
    }
    ops.push_back(etcd::Op::Put(absl::StrFormat("%s%08d", snap, values++), std::move(bytes)));
    txn_bytes += add;
    return absl::OkStatus();
  };
  for (internal::JournalSnapshot& c : chunks) {
    holdings += static_cast<size_t>(c.holdings_size());
    if (value.nodes_size() > 0 &&
        value.ByteSizeLong() + c.ByteSizeLong() > options_.snapshot_value_bytes) {
      DUET_RETURN_IF_ERROR(put_value());
    }
    value.set_seq(seq);
    value.mutable_nodes()->MergeFrom(c.nodes());
    value.mutable_holdings()->MergeFrom(c.holdings());
  }
  if (value.nodes_size() > 0) DUET_RETURN_IF_ERROR(put_value());
  // The last transaction needs room for four more operations.
  if (ops.size() + 4 > options_.max_txn_ops) {
    DUET_RETURN_IF_ERROR(commit(ops));
    ops.clear();
  }
  internal::JournalSnapshot marker;
  marker.set_seq(seq);
  ops.push_back(etcd::Op::Put(absl::StrFormat("%s%08d", snap, values), marker.SerializeAsString()));
  ops.push_back(etcd::Op::Put(p + "/snapshot", marker.SerializeAsString()));
  ops.push_back(etcd::Op::DeleteRange(LogKey(p, 0), LogKey(p, seq + 1)));
  // Every older snapshot, and the chunks of any that never completed.
  ops.push_back(etcd::Op::DeleteRange(p + "/snap/", SnapPrefix(p, seq)));
  DUET_RETURN_IF_ERROR(commit(ops));
  {
    absl::MutexLock lock(&mu_);
    ++stats_.snapshots;
    stats_.retries += retries;
    snapshot_seq_ = seq;
  }
  spdlog::info("etcd log {}: snapshot at seq {} ({} nodes, {} holdings) in {:.3f} s", p, seq,
               image.nodes.size(), holdings, SecondsSince(t0));
  return absl::OkStatus();
}

}  // namespace duet
