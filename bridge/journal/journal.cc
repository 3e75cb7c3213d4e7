#include "bridge/journal/journal.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bridge/api/convert.h"
#include "bridge/journal/records.h"
#include "common/status_macros.h"
#include "duet/internal/journal.pb.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace {

constexpr size_t kHeaderBytes = 8;
// No record comes near this (a node of 1024 devices is ~100 KiB); a larger
// length is corruption, not a record.
constexpr uint32_t kMaxRecordBytes = 64u << 20;
constexpr char kSegmentPrefix[] = "wal-";
constexpr char kSegmentSuffix[] = ".log";
constexpr char kSnapshotPrefix[] = "snapshot-";
constexpr char kSnapshotSuffix[] = ".pb";
constexpr char kTmpSuffix[] = ".tmp";
// The one-writer lock (see journal.h). Not a segment, snapshot or .tmp name,
// so recovery and compaction never touch it.
constexpr char kLockName[] = "LOCK";

void PutFixed32(std::string* out, uint32_t v) {
  char b[4] = {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16),
               static_cast<char>(v >> 24)};
  out->append(b, 4);
}

uint32_t GetFixed32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint32_t>(u[0]) | static_cast<uint32_t>(u[1]) << 8 |
         static_cast<uint32_t>(u[2]) << 16 | static_cast<uint32_t>(u[3]) << 24;
}

uint32_t Crc(const char* data, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  return static_cast<uint32_t>(crc32(crc, reinterpret_cast<const Bytef*>(data), static_cast<uInt>(n)));
}

// Appends [length][crc][payload].
void AppendFrame(const std::string& payload, std::string* out) {
  PutFixed32(out, static_cast<uint32_t>(payload.size()));
  PutFixed32(out, Crc(payload.data(), payload.size()));
  out->append(payload);
}

// The frame reader: one parser for both kinds of file (log segments and
// snapshots). What a frame at `off` of `data` is, or what is wrong with it.
enum class FrameError {
  kNone,
  kShortHeader,  // fewer than kHeaderBytes left
  kBadLength,    // a length outside FrameLimits
  kPastEnd,      // the payload runs past the end of the data
  kBadCrc,
};
struct Frame {
  FrameError error = FrameError::kNone;
  uint32_t length = 0;  // from the header (0 for kShortHeader)
  const char* payload = nullptr;
  // Offset just past the frame; 0 unless the frame fits in the data.
  size_t end = 0;
};
// Lengths a frame may have. A log record is never empty and never near
// kMaxRecordBytes, so either is corruption (or zeroed space); a snapshot
// frame is judged by its content.
struct FrameLimits {
  uint32_t min_length;
  uint32_t max_length;
};
constexpr FrameLimits kLogFrames{1, kMaxRecordBytes};
constexpr FrameLimits kSnapshotFrames{0, UINT32_MAX};

Frame ReadFrame(const std::string& data, size_t off, FrameLimits limits) {
  Frame f;
  const size_t left = data.size() - off;
  if (left < kHeaderBytes) {
    f.error = FrameError::kShortHeader;
    return f;
  }
  f.length = GetFixed32(data.data() + off);
  if (f.length < limits.min_length || f.length > limits.max_length) {
    f.error = FrameError::kBadLength;
    return f;
  }
  if (f.length > left - kHeaderBytes) {
    f.error = FrameError::kPastEnd;
    return f;
  }
  f.payload = data.data() + off + kHeaderBytes;
  f.end = off + kHeaderBytes + f.length;
  if (GetFixed32(data.data() + off + 4) != Crc(f.payload, f.length)) f.error = FrameError::kBadCrc;
  return f;
}

// What is wrong with `f`, for the corrupt-file error; `noun` is what the file
// calls a frame ("record" in a log segment, "frame" in a snapshot).
std::string FrameErrorText(const Frame& f, const char* noun) {
  switch (f.error) {
    case FrameError::kShortHeader:
      return absl::StrCat("incomplete ", noun, " header");
    case FrameError::kBadLength:
      return absl::StrCat("bad ", noun, " length ", f.length);
    case FrameError::kPastEnd:
      return absl::StrCat(noun, " of ", f.length, " bytes runs past the end of the file");
    case FrameError::kBadCrc:
      return "crc mismatch";
    case FrameError::kNone:
      break;
  }
  return "";
}

std::string SegmentName(uint64_t first_seq) {
  return absl::StrFormat("%s%020d%s", kSegmentPrefix, first_seq, kSegmentSuffix);
}
std::string SnapshotName(uint64_t seq) {
  return absl::StrFormat("%s%020d%s", kSnapshotPrefix, seq, kSnapshotSuffix);
}

// Parses "<prefix><20 digits><suffix>".
bool ParseName(const std::string& name, const char* prefix, const char* suffix, uint64_t* seq) {
  if (!absl::StartsWith(name, prefix) || !absl::EndsWith(name, suffix)) return false;
  const size_t p = strlen(prefix), s = strlen(suffix);
  if (name.size() != p + 20 + s) return false;
  const std::string digits = name.substr(p, 20);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  return absl::SimpleAtoi(digits, seq);
}

struct DirListing {
  std::vector<std::pair<uint64_t, std::string>> segments;   // sorted by seq
  std::vector<std::pair<uint64_t, std::string>> snapshots;  // sorted by seq
  std::vector<std::string> tmp;
};

absl::StatusOr<DirListing> ListDir(FileLayer* files, const std::string& dir) {
  DirListing out;
  DUET_ASSIGN_OR_RETURN(std::vector<std::string> names, files->ListDir(dir));
  for (const std::string& name : names) {
    uint64_t seq = 0;
    if (ParseName(name, kSegmentPrefix, kSegmentSuffix, &seq)) {
      out.segments.emplace_back(seq, name);
    } else if (ParseName(name, kSnapshotPrefix, kSnapshotSuffix, &seq)) {
      out.snapshots.emplace_back(seq, name);
    } else if (absl::EndsWith(name, kTmpSuffix)) {
      out.tmp.push_back(name);
    }
  }
  std::sort(out.segments.begin(), out.segments.end());
  std::sort(out.snapshots.begin(), out.snapshots.end());
  return out;
}

bool AllZero(const std::string& data, size_t from) {
  return std::all_of(data.begin() + static_cast<std::ptrdiff_t>(from), data.end(),
                     [](char c) { return c == 0; });
}

// The seq of a serialized JournalRecord without parsing it: field 1 (a
// varint) comes first in what OnChange writes. Returns UINT64_MAX when the
// payload does not start that way, so the caller parses it in full.
uint64_t PeekSeq(const char* p, size_t n) {
  if (n < 2 || p[0] != 0x08) return UINT64_MAX;
  uint64_t v = 0;
  for (size_t i = 1; i < n && i < 11; ++i) {
    const auto b = static_cast<unsigned char>(p[i]);
    v |= static_cast<uint64_t>(b & 0x7f) << (7 * (i - 1));
    if ((b & 0x80) == 0) return v;
  }
  return UINT64_MAX;
}

// What the lock file says about its holder, for whoever is refused:
// "pid 1234 on host node-7".
std::string LockHolderText() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat("pid ", getpid(), " on host ", host[0] != '\0' ? host : "(unknown)");
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Journal::Journal(const Options& options, Ledger* ledger)
    : DurableLog({absl::StrCat("journal ", options.dir), "journaled", "durable"},
                 options.snapshot_every, ledger),
      options_(options),
      files_(options.files != nullptr ? options.files : FileLayer::Posix()) {}

absl::StatusOr<std::unique_ptr<Journal>> Journal::Open(const Options& options, Ledger* ledger) {
  if (options.dir.empty()) return absl::InvalidArgumentError("journal dir: must be set");
  if (ledger == nullptr) return absl::InvalidArgumentError("journal: ledger must not be null");
  if (ledger->node_count() != 0 || ledger->holding_count() != 0) {
    return absl::FailedPreconditionError("journal: the ledger must be empty before recovery");
  }
  std::unique_ptr<Journal> j(new Journal(options, ledger));
  DUET_RETURN_IF_ERROR(j->Recover());
  j->Start();
  return j;
}

Journal::~Journal() {
  Stop();
  segment_.reset();
  // Last: the threads that write, rename and delete files are joined.
  lock_.reset();
}

absl::Status Journal::Recover() {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string& dir = options_.dir;
  DUET_RETURN_IF_ERROR(files_->CreateDir(dir));
  // One writer per directory, before anything in it is read, truncated or
  // deleted. Two journals on one directory would each number records from
  // the same seq, grant the same device to two owners, and delete or
  // truncate each other's files; the next start would then refuse with
  // DATA_LOSS. The lock is held until the destructor.
  if (absl::StatusOr<std::unique_ptr<FileLock>> lock =
          files_->Lock(dir + "/" + kLockName, LockHolderText());
      lock.ok()) {
    lock_ = *std::move(lock);
  } else if (absl::IsFailedPrecondition(lock.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "journal ", dir, " is in use by another process: ", lock.status().message(),
        "; only one duet-bridge may use a journal directory (two would grant the same "
        "device twice); refusing to start"));
  } else {
    return lock.status();
  }
  DUET_ASSIGN_OR_RETURN(DirListing listing, ListDir(files_, dir));
  for (const std::string& tmp : listing.tmp) {
    // A snapshot that was never renamed into place: not part of the state.
    files_->Remove(dir + "/" + tmp).IgnoreError();
  }

  uint64_t snapshot_seq = 0;
  if (!listing.snapshots.empty()) {
    const auto& [seq, name] = listing.snapshots.back();
    const std::string path = dir + "/" + name;
    std::string data;
    DUET_RETURN_IF_ERROR(files_->ReadFile(path, &data));
    auto corrupt = [&](size_t offset, const std::string& why) {
      return absl::DataLossError(absl::StrCat("journal snapshot ", path, " at byte offset ", offset,
                                              ": ", why, "; refusing to start"));
    };
    // Frames of JournalSnapshot chunks (one node and its holdings each), then
    // an end marker: a chunk with no nodes. Every chunk carries the seq.
    internal::JournalSnapshot chunk;
    size_t off = 0;
    bool ended = false;
    while (off < data.size() && !ended) {
      const Frame f = ReadFrame(data, off, kSnapshotFrames);
      if (f.error != FrameError::kNone) return corrupt(off, FrameErrorText(f, "frame"));
      if (!chunk.ParseFromArray(f.payload, static_cast<int>(f.length))) {
        return corrupt(off, "unparsable snapshot chunk");
      }
      if (chunk.seq() != seq) {
        return corrupt(off, absl::StrCat("seq ", chunk.seq(), " does not match the file name"));
      }
      if (chunk.nodes_size() == 0) {
        ended = true;
      } else if (absl::Status s = RestoreSnapshot(chunk, ledger_); !s.ok()) {
        return corrupt(off, absl::StrCat("refused by the ledger: ", s.ToString()));
      }
      off = f.end;
    }
    if (!ended) return corrupt(off, "no end marker (truncated snapshot)");
    if (off != data.size()) return corrupt(off, "data after the end marker");
    snapshot_seq = seq;
    spdlog::debug("journal {}: snapshot {} restored after {:.3f} s", dir, name, SecondsSince(t0));
  }

  uint64_t last = snapshot_seq;
  uint64_t replayed = 0;
  internal::JournalRecord rec;
  std::string data;
  for (size_t i = 0; i < listing.segments.size(); ++i) {
    const bool is_last = i + 1 == listing.segments.size();
    const std::string path = dir + "/" + listing.segments[i].second;
    DUET_RETURN_IF_ERROR(files_->ReadFile(path, &data));
    size_t off = 0;
    while (off < data.size()) {
      const Frame f = ReadFrame(data, off, kLogFrames);
      const bool ends_file = f.end == data.size();
      std::string bad;
      bool torn = false;  // could be the unfinished tail of the last write
      switch (f.error) {
        case FrameError::kShortHeader:
        case FrameError::kPastEnd:
          torn = is_last;
          break;
        case FrameError::kBadLength:
          torn = is_last && AllZero(data, off);
          break;
        case FrameError::kBadCrc:
          torn = is_last && (ends_file || AllZero(data, off));
          break;
        case FrameError::kNone:
          break;
      }
      if (f.error != FrameError::kNone) {
        bad = FrameErrorText(f, "record");
      } else if (PeekSeq(f.payload, f.length) <= snapshot_seq) {
        // Covered by the snapshot (the segment is not compacted yet): skip
        // the full parse, which is most of the cost of reading a record.
        off = f.end;
        continue;
      } else if (!rec.ParseFromArray(f.payload, static_cast<int>(f.length))) {
        bad = "unparsable record";
        torn = is_last && ends_file;
      }
      if (!bad.empty()) {
        if (!torn) {
          return absl::DataLossError(absl::StrCat("journal segment ", path, " at byte offset ", off,
                                                  ": ", bad, "; refusing to start"));
        }
        spdlog::warn("journal: dropping torn last record in {} at byte offset {} ({}; {} bytes)",
                     path, off, bad, data.size() - off);
        DUET_RETURN_IF_ERROR(files_->Truncate(path, off, options_.fsync));
        break;
      }
      const uint64_t seq = rec.seq();
      if (seq <= snapshot_seq) {
        // Covered by the snapshot; the segment was not yet compacted.
      } else if (seq <= last) {
        return absl::DataLossError(absl::StrCat("journal segment ", path, " at byte offset ", off,
                                                ": record seq ", seq, " follows seq ", last,
                                                "; refusing to start"));
      } else {
        if (absl::Status s = ApplyRecord(rec, ledger_); !s.ok()) {
          return absl::DataLossError(absl::StrCat("journal segment ", path, " at byte offset ", off,
                                                  ": record seq ", seq,
                                                  " refused by the ledger: ", s.ToString(),
                                                  "; refusing to start"));
        }
        last = seq;
        ++replayed;
      }
      off = f.end;
    }
  }
  ledger_->RestoreSeq(last);
  // Read the ledger before taking mu_: OnChange takes mu_ under the ledger's
  // lock, so mu_ is never held while calling into the ledger.
  const uint64_t ledger_seq = ledger_->seq();
  const size_t nodes = ledger_->node_count();
  const size_t holdings = ledger_->holding_count();
  {
    absl::MutexLock lock(&mu_);
    appended_seq_ = durable_seq_ = ledger_seq;
    stats_.durable_seq = durable_seq_;
    stats_.recovered_records = replayed;
    stats_.recovered_holdings = holdings;
    // Everything before this point lives in old segments; new records go to
    // a new one, named after its first record.
    rotate_ = true;
  }
  spdlog::info(
      "journal {}: recovered {} nodes and {} holdings (snapshot seq {}, {} log records, last seq "
      "{}) in {:.3f} s",
      dir, nodes, holdings, snapshot_seq, replayed, last, SecondsSince(t0));
  return absl::OkStatus();
}

void Journal::OnChange(const Change& change) {
  const internal::JournalRecord rec = RecordOf(change);
  const std::string payload = rec.SerializeAsString();

  absl::MutexLock lock(&mu_);
  if (!AcceptLocked(change)) return;
  if (pending_.empty()) pending_first_seq_ = change.seq;
  AppendFrame(payload, &pending_);
  ++pending_records_;
  ++stats_.records;
}

Journal::Stats Journal::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::Status Journal::OpenSegment(uint64_t first_seq) {
  segment_.reset();  // every batch in it was already synced
  // Created empty (truncated): a file of that name can only be an empty or
  // torn leftover, since every record already recovered has a smaller seq.
  DUET_ASSIGN_OR_RETURN(segment_,
                        files_->NewWritableFile(options_.dir + "/" + SegmentName(first_seq)));
  segment_size_ = 0;
  // The new name must be durable before records in it are acknowledged.
  if (options_.fsync) DUET_RETURN_IF_ERROR(files_->SyncDir(options_.dir));
  return absl::OkStatus();
}

absl::Status Journal::WriteBatch(const std::string& batch, uint64_t first_seq, bool rotate) {
  if (segment_ == nullptr || rotate || segment_size_ >= options_.segment_bytes) {
    DUET_RETURN_IF_ERROR(OpenSegment(first_seq));
  }
  DUET_RETURN_IF_ERROR(segment_->Append(batch));
  segment_size_ += batch.size();
  if (options_.fsync) DUET_RETURN_IF_ERROR(segment_->SyncData());
  return absl::OkStatus();
}

void Journal::WriterLoop() {
  std::string batch;
  for (;;) {
    uint64_t first = 0, last = 0;
    size_t records = 0;
    bool rotate = false;
    {
      absl::MutexLock lock(&mu_);
      if (!AwaitBatchLocked()) return;
      batch.swap(pending_);
      first = pending_first_seq_;
      last = appended_seq_;
      records = pending_records_;
      pending_records_ = 0;
      rotate = rotate_;
      rotate_ = false;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const absl::Status s = WriteBatch(batch, first, rotate);
    const double seconds = SecondsSince(t0);
    if (!s.ok()) {
      Fail(absl::UnavailableError(absl::StrCat("journal cannot persist changes: ", s.message())),
           s.message());
    } else {
      NotifyObserver(seconds, records, batch.size());
      absl::MutexLock lock(&mu_);
      MarkDurableLocked(last, records);
      stats_.durable_seq = last;
      stats_.bytes += batch.size();
      ++stats_.batches;
      if (options_.fsync) ++stats_.fsyncs;
    }
    batch.clear();  // keeps its capacity for the next swap
  }
}

absl::Status Journal::WriteSnapshot() {
  absl::MutexLock snapshot_lock(&snapshot_mu_);
  const auto t0 = std::chrono::steady_clock::now();
  DUET_RETURN_IF_ERROR(BeginCapture());
  // Consistency without stopping writers. Ledger::Snapshot() gives every node
  // view exactly at seq S, so it says which (node, owner) holdings exist at S
  // and the node specs; but the views lack granted_at and the holding's
  // generation, and ListHoldings(), taken a moment later, may already miss a
  // holding released after S (or show a newer one for the same owner). While
  // capturing, OnChange keeps every released holding; for each (node, owner)
  // in the views at S, the first release after S is exactly the holding it
  // had at S, and with no release since S, ListHoldings() still shows it.
  // The alternative, stalling the record stream, would block the ledger
  // (OnChange runs under its lock) for the whole capture.
  LedgerSnapshot image = ledger_->Snapshot();
  std::vector<Holding> later = ledger_->ListHoldings();
  const std::vector<std::pair<uint64_t, Holding>> releases = EndCapture();
  const uint64_t seq = image.seq;
  DUET_ASSIGN_OR_RETURN(std::vector<internal::JournalSnapshot> chunks,
                        SnapshotChunks(image, later, releases));
  // The file is a frame per node (the node and its holdings, as a
  // JournalSnapshot chunk) and an end marker, so recovery parses one small
  // message at a time and a corrupt byte is located to its node.
  std::string data;
  size_t holdings = 0;
  for (const internal::JournalSnapshot& c : chunks) {
    holdings += static_cast<size_t>(c.holdings_size());
    AppendFrame(c.SerializeAsString(), &data);
  }
  internal::JournalSnapshot chunk;  // the end marker
  chunk.set_seq(seq);
  AppendFrame(chunk.SerializeAsString(), &data);

  const std::string name = SnapshotName(seq);
  const std::string path = options_.dir + "/" + name;
  const std::string tmp = path + kTmpSuffix;
  {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = files_->NewWritableFile(tmp);
    if (!file.ok()) return file.status();
    absl::Status s = (*file)->Append(data);
    if (s.ok() && options_.fsync) s = (*file)->Sync();
    file->reset();
    if (!s.ok()) {
      files_->Remove(tmp).IgnoreError();
      return s;
    }
  }
  if (absl::Status s = files_->Rename(tmp, path); !s.ok()) {
    files_->Remove(tmp).IgnoreError();
    return s;
  }
  if (options_.fsync) DUET_RETURN_IF_ERROR(files_->SyncDir(options_.dir));
  {
    absl::MutexLock lock(&mu_);
    ++stats_.snapshots;
    // Seal the active segment, so the next snapshot can delete it.
    rotate_ = true;
  }
  Compact(seq);
  spdlog::info("journal {}: snapshot {} ({} nodes, {} holdings, {} bytes) in {:.3f} s",
               options_.dir, name, image.nodes.size(), holdings, data.size(), SecondsSince(t0));
  return absl::OkStatus();
}

void Journal::Compact(uint64_t seq) {
  absl::StatusOr<DirListing> listing = ListDir(files_, options_.dir);
  if (!listing.ok()) {
    spdlog::warn("journal {}: compaction skipped: {}", options_.dir, listing.status().ToString());
    return;
  }
  // Segment i holds seqs [first_i, first_{i+1}); it is covered when
  // first_{i+1} - 1 <= seq. The last segment is never deleted, so a segment
  // the writer is still appending to is safe even if it was created after
  // the listing.
  const auto& segs = listing->segments;
  for (size_t i = 0; i + 1 < segs.size(); ++i) {
    if (segs[i + 1].first > seq + 1) break;
    if (absl::Status s = files_->Remove(options_.dir + "/" + segs[i].second); !s.ok()) {
      spdlog::warn("journal: {}", std::string(s.message()));
    }
  }
  for (const auto& [snap_seq, name] : listing->snapshots) {
    if (snap_seq >= seq) continue;
    if (absl::Status s = files_->Remove(options_.dir + "/" + name); !s.ok()) {
      spdlog::warn("journal: {}", std::string(s.message()));
    }
  }
}

}  // namespace duet
