#include "bridge/journal/journal.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "journal_test.XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

NodeSpec MakeNode(const std::string& name, int gpus = 8) {
  NodeSpec spec;
  spec.name = name;
  spec.cpus = 64;
  spec.memory_mib = 512 * 1024;
  spec.pool = "a3";
  spec.zone = "us-central1-a";
  spec.labels["cloud.google.com/gke-accelerator"] = "nvidia-h100-80gb";
  for (int i = 0; i < gpus; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kGpu;
    d.index = static_cast<uint32_t>(i);
    d.id = absl::StrCat("GPU-", name, "-", i);
    d.model = "nvidia-h100-80gb";
    d.topology.nvlink_domain = "clique-1";
    spec.devices.push_back(d);
  }
  return spec;
}

Journal::Options Opts(const std::string& dir, bool fsync = true, uint64_t snapshot_every = 0) {
  Journal::Options o;
  o.dir = dir;
  o.fsync = fsync;
  o.snapshot_every = snapshot_every;
  return o;
}

std::unique_ptr<Journal> MustOpen(const Journal::Options& o, Ledger* ledger) {
  auto j = Journal::Open(o, ledger);
  EXPECT_TRUE(j.ok()) << j.status();
  return j.ok() ? std::move(j).value() : nullptr;
}

HoldRequest HoldCount(const std::string& node, const Owner& owner, uint32_t count,
                      uint32_t milli = 0) {
  HoldRequest r;
  r.node = node;
  r.owner = owner;
  r.count = CountSelector{DeviceKind::kGpu, count, milli, ""};
  return r;
}

std::string HoldingString(const Holding& h, bool with_generation) {
  std::string s = absl::StrCat(h.node, "|", h.owner.ToString(), "|",
                               absl::FormatTime(h.granted_at), "|");
  for (const HeldDevice& d : h.devices) absl::StrAppend(&s, d.index, "@", d.milli, ",");
  if (with_generation) absl::StrAppend(&s, "|g", h.generation);
  return s;
}

std::string NodeString(const NodeView& v, bool with_generation) {
  std::string s = absl::StrCat(v.spec.name, "|", v.spec.cpus, "|", v.spec.memory_mib, "|",
                               v.spec.pool, "|", v.spec.zone, "|", NodeStateName(v.spec.state));
  for (const auto& [k, val] : v.spec.labels) absl::StrAppend(&s, "|", k, "=", val);
  for (const DeviceState& d : v.devices) {
    absl::StrAppend(&s, "|", DeviceKindName(d.spec.kind), d.spec.index, ":", d.spec.id, ":",
                    d.spec.model, ":", d.spec.capacity_milli, ":", d.used_milli, "[");
    std::vector<std::string> uses;
    for (const DeviceUse& u : d.uses) uses.push_back(absl::StrCat(u.owner->ToString(), "@", u.milli));
    std::sort(uses.begin(), uses.end());
    for (const auto& u : uses) absl::StrAppend(&s, u, ";");
    absl::StrAppend(&s, "]");
  }
  if (with_generation) absl::StrAppend(&s, "|g", v.generation);
  return s;
}

// Everything a client can see, as comparable strings.
std::vector<std::string> Dump(const Ledger& ledger, bool with_generation) {
  std::vector<std::string> out;
  for (const auto& v : ledger.Snapshot().nodes) out.push_back(NodeString(*v, with_generation));
  for (const Holding& h : ledger.ListHoldings()) out.push_back(HoldingString(h, with_generation));
  return out;
}

// One random change: holds (by count, by device, shares), releases, cordons,
// node removal (GONE with holdings) and re-adding.
void RandomChange(Ledger* ledger, std::mt19937* rng, int nodes, uint32_t* next_job) {
  std::uniform_int_distribution<int> pick_node(0, nodes - 1);
  const std::string node = absl::StrCat("node-", pick_node(*rng));
  const int what = std::uniform_int_distribution<int>(0, 99)(*rng);
  if (what < 45) {
    Owner owner = what % 3 == 0 ? Owner::Pod(absl::StrCat("uid-", (*next_job)++), "default", "p")
                                : Owner::SlurmJob((*next_job)++);
    HoldRequest r = HoldCount(node, owner, 1 + what % 2, what % 5 == 0 ? 250 : 0);
    (void)ledger->Hold(r);
  } else if (what < 50) {
    HoldRequest r;
    r.node = node;
    r.owner = Owner::SlurmStep((*next_job)++, 0);
    r.devices = {HeldDevice{DeviceKind::kGpu, static_cast<uint32_t>(what % 8), 0}};
    (void)ledger->Hold(r);
  } else if (what < 85) {
    std::vector<Holding> held = ledger->ListHoldings(node);
    if (!held.empty()) {
      const Holding& h = held[std::uniform_int_distribution<size_t>(0, held.size() - 1)(*rng)];
      ASSERT_TRUE(ledger->Release(h.node, h.owner).ok());
    }
  } else if (what < 92) {
    NodeSpec spec = MakeNode(node);
    spec.state = what % 2 == 0 ? NodeState::kCordoned : NodeState::kReady;
    if (what == 91) spec.state = NodeState::kNotReady;
    (void)ledger->UpsertNode(spec);
  } else if (what < 96) {
    (void)ledger->RemoveNode(node);
  } else {
    (void)ledger->UpsertNode(MakeNode(node));
  }
}

void AddNodes(Ledger* ledger, int nodes) {
  for (int i = 0; i < nodes; ++i) ASSERT_TRUE(ledger->UpsertNode(MakeNode(absl::StrCat("node-", i))).ok());
}

std::vector<std::string> FilesWithPrefix(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Byte offsets of every frame in a segment.
std::vector<size_t> FrameOffsets(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<size_t> out;
  size_t off = 0;
  while (off + 8 <= data.size()) {
    const auto* p = reinterpret_cast<const unsigned char*>(data.data() + off);
    const uint32_t len = p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24;
    out.push_back(off);
    off += 8 + len;
  }
  return out;
}

// Every file of `dir` (name -> content), to show that nothing changed.
std::map<std::string, std::string> DirContents(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream in(e.path(), std::ios::binary);
    out[e.path().filename().string()] =
        std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  return out;
}

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Captures log lines for the duration of a test.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(100)) {
    old_ = spdlog::default_logger();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink_));
  }
  ~LogCapture() { spdlog::set_default_logger(old_); }
  std::string Text() const {
    std::string s;
    for (const auto& l : sink_->last_formatted()) s += l;
    return s;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> old_;
};

TEST(JournalTest, RefusesANonEmptyLedger) {
  TempDir dir;
  Ledger ledger;
  ASSERT_TRUE(ledger.UpsertNode(MakeNode("n")).ok());
  auto j = Journal::Open(Opts(dir.path()), &ledger);
  EXPECT_EQ(j.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(JournalTest, RoundTripAcrossReopenIsExact) {
  TempDir dir;
  std::mt19937 rng(1);
  uint32_t next_job = 1;
  std::vector<std::string> before;
  uint64_t seq_before = 0;
  {
    Ledger ledger;
    auto journal = MustOpen(Opts(dir.path()), &ledger);
    ASSERT_NE(journal, nullptr);
    AddNodes(&ledger, 20);
    for (int i = 0; i < 3000; ++i) RandomChange(&ledger, &rng, 20, &next_job);
    ASSERT_TRUE(journal->Flush().ok());
    EXPECT_EQ(journal->stats().durable_seq, ledger.seq());
    EXPECT_GT(ledger.holding_count(), 20u);
    before = Dump(ledger, /*with_generation=*/true);
    seq_before = ledger.seq();
  }
  {
    // Replaying the log alone reproduces generations too.
    Ledger ledger;
    auto journal = MustOpen(Opts(dir.path()), &ledger);
    ASSERT_NE(journal, nullptr);
    EXPECT_EQ(Dump(ledger, true), before);
    EXPECT_EQ(ledger.seq(), seq_before);
    EXPECT_TRUE(ledger.CheckInvariants().ok());
    // Keep going after a reopen: numbering continues, new records append.
    for (int i = 0; i < 500; ++i) RandomChange(&ledger, &rng, 20, &next_job);
    EXPECT_GT(ledger.seq(), seq_before);
    before = Dump(ledger, true);
    seq_before = ledger.seq();
  }
  Ledger ledger;
  auto journal = MustOpen(Opts(dir.path()), &ledger);
  ASSERT_NE(journal, nullptr);
  EXPECT_EQ(Dump(ledger, true), before);
  EXPECT_EQ(ledger.seq(), seq_before);
  EXPECT_EQ(journal->stats().recovered_records, seq_before);
}

// Ledger::Rebind (the DRA lending mode) is a release and a hold in the log:
// replay reproduces the claim's holding, the lend owner's absence and the
// generations.
TEST(JournalTest, RebindReplaysAsAReleaseThenAHold) {
  TempDir dir;
  std::vector<std::string> before;
  uint64_t seq_before = 0;
  {
    Ledger ledger;
    auto journal = MustOpen(Opts(dir.path()), &ledger);
    ASSERT_NE(journal, nullptr);
    AddNodes(&ledger, 1);
    HoldRequest lend;
    lend.node = "node-0";
    lend.owner = Owner::Lend(11, "node-0");
    lend.devices = {HeldDevice{DeviceKind::kGpu, 3, 0}};
    ASSERT_TRUE(ledger.Hold(lend).ok());
    ASSERT_TRUE(ledger.Hold(HoldCount("node-0", Owner::Lend(12, "node-0"), 1)).ok());
    const Owner claim = Owner::Claim(11, "claim-uid", "ns", "c");
    ASSERT_TRUE(ledger.Rebind("node-0", Owner::Lend(11, "node-0"), claim).ok());
    ASSERT_TRUE(journal->Flush().ok());
    EXPECT_EQ(journal->stats().durable_seq, ledger.seq());
    before = Dump(ledger, /*with_generation=*/true);
    seq_before = ledger.seq();
  }
  Ledger ledger;
  auto journal = MustOpen(Opts(dir.path()), &ledger);
  ASSERT_NE(journal, nullptr);
  EXPECT_EQ(Dump(ledger, true), before);
  EXPECT_EQ(ledger.seq(), seq_before);
  EXPECT_TRUE(ledger.FindHolding("node-0", Owner::Claim(11, "claim-uid")).has_value());
  EXPECT_FALSE(ledger.FindHolding("node-0", Owner::Lend(11, "node-0")).has_value());
  EXPECT_TRUE(ledger.FindHolding("node-0", Owner::Lend(12, "node-0")).has_value());
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

// Gangs: a slot, its rebind to a member's placeholder and another slot
// replay exactly (the log carries GangSlot owners through the proto).
TEST(JournalTest, GangSlotsAndTheirRebindsReplay) {
  TempDir dir;
  std::vector<std::string> before;
  const Owner slot0 = Owner::GangSlot(21, "podgroup/ml/train", 0);
  const Owner slot1 = Owner::GangSlot(21, "podgroup/ml/train", 1);
  const Owner member = Owner::Placeholder(21, "uid-m");
  {
    Ledger ledger;
    auto journal = MustOpen(Opts(dir.path()), &ledger);
    ASSERT_NE(journal, nullptr);
    AddNodes(&ledger, 1);
    ASSERT_TRUE(ledger.Hold(HoldCount("node-0", slot0, 2)).ok());
    ASSERT_TRUE(ledger.Hold(HoldCount("node-0", slot1, 2)).ok());
    ASSERT_TRUE(ledger.Rebind("node-0", slot0, member).ok());
    ASSERT_TRUE(journal->Flush().ok());
    before = Dump(ledger, /*with_generation=*/true);
  }
  Ledger ledger;
  auto journal = MustOpen(Opts(dir.path()), &ledger);
  ASSERT_NE(journal, nullptr);
  EXPECT_EQ(Dump(ledger, true), before);
  EXPECT_FALSE(ledger.FindHolding("node-0", slot0).has_value());
  EXPECT_TRUE(ledger.FindHolding("node-0", slot1).has_value());
  EXPECT_TRUE(ledger.FindHolding("node-0", member).has_value());
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

TEST(JournalTest, TornLastRecordIsDroppedAndLogged) {
  TempDir dir;
  {
    Ledger ledger;
    auto journal = MustOpen(Opts(dir.path()), &ledger);
    AddNodes(&ledger, 4);
    for (uint32_t job = 1; job <= 20; ++job) {
      ASSERT_TRUE(ledger.Hold(HoldCount(absl::StrCat("node-", job % 4), Owner::SlurmJob(job), 1)).ok());
    }
  }
  auto segments = FilesWithPrefix(dir.path(), "wal-");
  ASSERT_EQ(segments.size(), 1u);
  const std::vector<size_t> frames = FrameOffsets(segments[0]);
  ASSERT_EQ(frames.size(), 24u);
  // Cut the last record (job 20's hold) in the middle of its payload.
  const size_t cut = frames.back() + 13;
  fs::resize_file(segments[0], cut);
  {
    LogCapture log;
    Ledger ledger;
    auto journal = MustOpen(Opts(dir.path()), &ledger);
    ASSERT_NE(journal, nullptr);
    EXPECT_EQ(ledger.holding_count(), 19u);
    EXPECT_FALSE(ledger.FindHolding("node-0", Owner::SlurmJob(20)).has_value());
    EXPECT_TRUE(ledger.FindHolding("node-3", Owner::SlurmJob(19)).has_value());
    EXPECT_THAT(log.Text(), HasSubstr("torn"));
    EXPECT_THAT(log.Text(), HasSubstr(absl::StrCat("offset ", frames.back())));
    EXPECT_EQ(fs::file_size(segments[0]), frames.back());
    // The journal goes on after the repair.
    ASSERT_TRUE(ledger.Hold(HoldCount("node-0", Owner::SlurmJob(21), 1)).ok());
  }
  // A zero-filled tail (a file extended but never written) is torn as well.
  segments = FilesWithPrefix(dir.path(), "wal-");
  ASSERT_EQ(segments.size(), 2u);
  fs::resize_file(segments.back(), fs::file_size(segments.back()) + 4096);
  Ledger ledger;
  auto journal = MustOpen(Opts(dir.path()), &ledger);
  ASSERT_NE(journal, nullptr);
  EXPECT_EQ(ledger.holding_count(), 20u);
  EXPECT_TRUE(ledger.FindHolding("node-0", Owner::SlurmJob(21)).has_value());
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

TEST(JournalTest, CorruptMiddleRecordRefusesToStartNamingFileAndOffset) {
  TempDir dir;
  {
    Ledger ledger;
    auto journal = MustOpen(Opts(dir.path()), &ledger);
    AddNodes(&ledger, 2);
    for (uint32_t job = 1; job <= 10; ++job) {
      ASSERT_TRUE(ledger.Hold(HoldCount(absl::StrCat("node-", job % 2), Owner::SlurmJob(job), 1)).ok());
    }
  }
  const auto segments = FilesWithPrefix(dir.path(), "wal-");
  ASSERT_EQ(segments.size(), 1u);
  const std::vector<size_t> frames = FrameOffsets(segments[0]);
  ASSERT_EQ(frames.size(), 12u);
  const size_t victim = frames[6];
  {
    std::fstream f(segments[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(victim + 10));
    char c;
    f.read(&c, 1);
    c ^= 0x20;
    f.seekp(static_cast<std::streamoff>(victim + 10));
    f.write(&c, 1);
  }
  const auto size_before = fs::file_size(segments[0]);
  Ledger ledger;
  auto journal = Journal::Open(Opts(dir.path()), &ledger);
  ASSERT_FALSE(journal.ok());
  EXPECT_EQ(journal.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(journal.status().message(), HasSubstr(segments[0]));
  EXPECT_THAT(journal.status().message(), HasSubstr(absl::StrCat("byte offset ", victim)));
  EXPECT_THAT(journal.status().message(), HasSubstr("crc"));
  // Nothing was "repaired" away.
  EXPECT_EQ(fs::file_size(segments[0]), size_before);
}

TEST(JournalTest, CorruptSnapshotRefusesToStart) {
  TempDir dir;
  {
    Ledger ledger;
    auto journal = MustOpen(Opts(dir.path()), &ledger);
    AddNodes(&ledger, 2);
    ASSERT_TRUE(ledger.Hold(HoldCount("node-0", Owner::SlurmJob(1), 1)).ok());
    ASSERT_TRUE(journal->WriteSnapshot().ok());
  }
  const auto snaps = FilesWithPrefix(dir.path(), "snapshot-");
  ASSERT_EQ(snaps.size(), 1u);
  {
    std::fstream f(snaps[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.write("\xff", 1);
  }
  Ledger ledger;
  auto journal = Journal::Open(Opts(dir.path()), &ledger);
  ASSERT_FALSE(journal.ok());
  EXPECT_EQ(journal.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(journal.status().message(), HasSubstr(snaps[0]));
  EXPECT_THAT(journal.status().message(), HasSubstr("byte offset"));
}

TEST(JournalTest, GroupCommitSharesFsyncsAmongConcurrentCallers) {
  TempDir dir;
  constexpr int kThreads = 16;
  constexpr int kPerThread = 40;
  std::vector<std::string> before;
  Journal::Stats stats;
  {
    Ledger ledger;
    auto journal = MustOpen(Opts(dir.path(), /*fsync=*/true), &ledger);
    AddNodes(&ledger, kThreads * 3);  // room for the holdings kept
    ASSERT_TRUE(journal->Flush().ok());
    const Journal::Stats start = journal->stats();
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) {
          const std::string node = absl::StrCat("node-", t * 3 + i % 3);
          const Owner owner = Owner::SlurmJob(static_cast<uint32_t>(t * 1000 + i + 1));
          auto held = ledger.Hold(HoldCount(node, owner, 1));
          if (!held.ok() || !journal->WaitDurable(held->seq).ok()) ++failures;
          if (i % 2 == 0) {
            auto rel = ledger.Release(node, owner);
            if (!rel.ok() || !journal->WaitDurable(rel->seq).ok()) ++failures;
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(failures.load(), 0);
    stats = journal->stats();
    stats.records -= start.records;
    stats.fsyncs -= start.fsyncs;
    before = Dump(ledger, true);
  }
  EXPECT_EQ(stats.records, static_cast<uint64_t>(kThreads * kPerThread * 3 / 2));
  // 16 callers at a time share each fsync; one fsync per record would be 960.
  EXPECT_LT(stats.fsyncs * 4, stats.records)
      << stats.fsyncs << " fsyncs for " << stats.records << " records";
  std::cout << "[ info ] " << stats.records << " records, " << stats.fsyncs << " fsyncs\n";
  Ledger ledger;
  auto journal = MustOpen(Opts(dir.path()), &ledger);
  EXPECT_EQ(Dump(ledger, true), before);
}

TEST(JournalTest, FsyncObserverSeesEveryBatch) {
  TempDir dir;
  Ledger ledger;
  auto journal = MustOpen(Opts(dir.path()), &ledger);
  std::atomic<size_t> records{0}, calls{0};
  journal->SetFsyncObserver([&](double seconds, size_t n, size_t bytes) {
    EXPECT_GE(seconds, 0.0);
    EXPECT_GT(bytes, n * 8);
    records += n;
    ++calls;
  });
  AddNodes(&ledger, 3);
  ASSERT_TRUE(journal->Flush().ok());
  EXPECT_EQ(records.load(), 3u);
  EXPECT_EQ(calls.load(), journal->stats().fsyncs);
}

TEST(JournalTest, SnapshotCompactsAndReopenEqualsThePreCloseLedger) {
  TempDir dir;
  std::mt19937 rng(7);
  uint32_t next_job = 1;
  std::vector<std::string> before;
  std::map<std::string, uint64_t> generations;
  {
    Ledger ledger;
    // Automatic snapshots every 200 records, on top of explicit ones.
    auto journal = MustOpen(Opts(dir.path(), true, 200), &ledger);
    AddNodes(&ledger, 30);
    for (int round = 0; round < 4; ++round) {
      for (int i = 0; i < 1500; ++i) RandomChange(&ledger, &rng, 30, &next_job);
      ASSERT_TRUE(journal->Flush().ok());
      ASSERT_TRUE(journal->WriteSnapshot().ok());
    }
    // Some records after the last snapshot, so recovery needs both.
    for (int i = 0; i < 300; ++i) RandomChange(&ledger, &rng, 30, &next_job);
    EXPECT_GE(journal->stats().snapshots, 4u);
    before = Dump(ledger, false);
    for (const auto& v : ledger.Snapshot().nodes) generations[v->spec.name] = v->generation;
    // GONE and cordoned nodes with holdings are part of what is compared.
    bool gone = false, cordoned = false;
    for (const auto& v : ledger.Snapshot().nodes) {
      gone = gone || v->spec.state == NodeState::kGone;
      cordoned = cordoned || (v->spec.state == NodeState::kCordoned && !ledger.ListHoldings(v->spec.name).empty());
    }
    EXPECT_TRUE(gone);
    EXPECT_TRUE(cordoned);
  }
  // Compaction: one snapshot, and only the segments written since it.
  EXPECT_EQ(FilesWithPrefix(dir.path(), "snapshot-").size(), 1u);
  EXPECT_LE(FilesWithPrefix(dir.path(), "wal-").size(), 2u);
  Ledger ledger;
  auto journal = MustOpen(Opts(dir.path()), &ledger);
  ASSERT_NE(journal, nullptr);
  // Holdings' grant generations are not compared (a rebuilt node takes fewer
  // steps); node generations are restored at least to what clients saw.
  EXPECT_EQ(Dump(ledger, false), before);
  for (const auto& v : ledger.Snapshot().nodes) {
    EXPECT_GE(v->generation, generations[v->spec.name]) << v->spec.name;
  }
  EXPECT_TRUE(ledger.CheckInvariants().ok());
  EXPECT_LT(journal->stats().recovered_records, 1000u);
}

TEST(JournalTest, SnapshotTakenWhileWritersRunIsConsistent) {
  TempDir dir;
  std::vector<std::string> before;
  {
    Ledger ledger;
    auto journal = MustOpen(Opts(dir.path(), /*fsync=*/false), &ledger);
    AddNodes(&ledger, 8);
    std::atomic<bool> stop{false};
    std::vector<std::thread> writers;
    for (int t = 0; t < 4; ++t) {
      writers.emplace_back([&, t] {
        std::mt19937 rng(100 + t);
        // Owners recur, so a holding is often released and granted again
        // (with a new grant time) while a snapshot is being captured.
        for (uint32_t i = 0; !stop.load(); ++i) {
          const std::string node = absl::StrCat("node-", rng() % 8);
          const Owner owner = Owner::SlurmJob(static_cast<uint32_t>(t * 100 + rng() % 20 + 1));
          if (rng() % 2 == 0) {
            (void)ledger.Hold(HoldCount(node, owner, 1));
          } else {
            (void)ledger.Release(node, owner);
          }
        }
      });
    }
    for (int i = 0; i < 30; ++i) ASSERT_TRUE(journal->WriteSnapshot().ok());
    stop = true;
    for (auto& w : writers) w.join();
    // The last snapshot alone (no records after it) must equal the ledger.
    ASSERT_TRUE(journal->WriteSnapshot().ok());
    before = Dump(ledger, false);
  }
  Ledger ledger;
  auto journal = MustOpen(Opts(dir.path(), false), &ledger);
  EXPECT_EQ(journal->stats().recovered_records, 0u);
  EXPECT_EQ(Dump(ledger, false), before);
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

// The review's hole: two journals on one directory both started, numbered
// records from the same seq and gave one GPU to two owners. The second must
// be refused before it reads, truncates or deletes anything, naming the
// holder; the first must not notice.
TEST(JournalLockTest, ASecondJournalOnTheDirectoryIsRefusedAndTouchesNothing) {
  TempDir dir;
  Ledger ledger;
  auto first = MustOpen(Opts(dir.path()), &ledger);
  ASSERT_NE(first, nullptr);
  AddNodes(&ledger, 2);
  ASSERT_TRUE(ledger.Hold(HoldCount("node-0", Owner::SlurmJob(1), 2)).ok());
  ASSERT_TRUE(first->WriteSnapshot().ok());  // a snapshot, and a sealed segment
  ASSERT_TRUE(ledger.Hold(HoldCount("node-1", Owner::SlurmJob(2), 1)).ok());
  ASSERT_TRUE(first->Flush().ok());
  // A leftover a recovery would delete, and the first journal ignores.
  std::ofstream(dir.path() + "/snapshot-00000000000000000099.pb.tmp") << "half a snapshot";
  const std::map<std::string, std::string> before = DirContents(dir.path());
  ASSERT_EQ(FilesWithPrefix(dir.path(), "snapshot-").size(), 2u);  // .pb and .pb.tmp
  ASSERT_GE(FilesWithPrefix(dir.path(), "wal-").size(), 1u);
  EXPECT_EQ(before.count("LOCK"), 1u);

  Ledger other;
  absl::StatusOr<std::unique_ptr<Journal>> second = Journal::Open(Opts(dir.path()), &other);
  EXPECT_FALSE(second.ok());
  if (second.ok()) {
    // What a second daemon does next (the old behavior): grant, and so write
    // over the first one's numbering. Lets the comparison below show it.
    (void)other.Hold(HoldCount("node-0", Owner::SlurmJob(99), 1));
    (void)(*second)->Flush();
    second->reset();
  } else {
    EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
    const std::string msg(second.status().message());
    EXPECT_THAT(msg, HasSubstr(absl::StrCat("journal ", dir.path(), " is in use")));
    EXPECT_THAT(msg,
                HasSubstr(absl::StrCat(dir.path(), "/LOCK held by pid ", getpid(), " on host ")));
  }
  // Nothing was read into the refused ledger, and no file changed: not the
  // log, the snapshot, the leftover, nor the lock file.
  EXPECT_EQ(other.node_count(), 0u);
  EXPECT_EQ(DirContents(dir.path()), before);

  // The first goes on, and everything it acknowledged survives a reopen.
  ASSERT_TRUE(ledger.Hold(HoldCount("node-1", Owner::SlurmJob(3), 1)).ok());
  ASSERT_TRUE(first->Flush().ok());
  const std::vector<std::string> state = Dump(ledger, true);
  const uint64_t seq = ledger.seq();
  first.reset();
  Ledger again;
  auto reopened = MustOpen(Opts(dir.path()), &again);
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(Dump(again, true), state);
  EXPECT_EQ(again.seq(), seq);
  EXPECT_EQ(again.holding_count(), 3u);
}

// The lock dies with its holder; the name left in the file does not block.
TEST(JournalLockTest, AStaleLockFileDoesNotBlockTheNextOpen) {
  TempDir dir;
  {
    Ledger ledger;
    auto j = MustOpen(Opts(dir.path()), &ledger);
    ASSERT_NE(j, nullptr);
    AddNodes(&ledger, 1);
  }
  // As a crashed holder on another host would leave it.
  const std::string lock = dir.path() + "/LOCK";
  EXPECT_TRUE(fs::exists(lock));
  std::ofstream(lock, std::ios::trunc) << "pid 999999 on host elsewhere\n";
  Ledger ledger;
  auto j = MustOpen(Opts(dir.path()), &ledger);
  ASSERT_NE(j, nullptr);
  EXPECT_EQ(ledger.node_count(), 1u);
  // Rewritten with the new holder, the old name gone entirely.
  EXPECT_EQ(ReadWhole(lock).rfind(absl::StrCat("pid ", getpid(), " on host "), 0), 0u)
      << ReadWhole(lock);
  EXPECT_THAT(ReadWhole(lock), ::testing::Not(HasSubstr("999999")));
  EXPECT_EQ(ReadWhole(lock).back(), '\n');
}

// Across processes: the refused opener names the other process's pid (read
// from the lock file, not its own), and the lock goes when that process is
// SIGKILLed, without any cleanup.
TEST(JournalLockTest, AnotherProcessHoldingTheJournalIsNamedAndItsDeathFreesIt) {
  TempDir dir;
  int ready[2], release[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(release), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(ready[0]);
    close(release[1]);
    Ledger ledger;
    auto opened = Journal::Open(Opts(dir.path()), &ledger);
    if (!opened.ok()) _exit(2);
    if (!ledger.UpsertNode(MakeNode("node-0")).ok() || !(*opened)->Flush().ok()) _exit(3);
    const char c = 'r';
    if (write(ready[1], &c, 1) != 1) _exit(4);
    char unused;
    (void)read(release[0], &unused, 1);  // until the parent kills it
    _exit(0);
  }
  close(ready[1]);
  close(release[0]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1) << "the child could not open the journal";
  {
    Ledger ledger;
    auto refused = Journal::Open(Opts(dir.path()), &ledger);
    EXPECT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(refused.status().message()),
                HasSubstr(absl::StrCat("LOCK held by pid ", pid, " on host ")));
  }
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  close(ready[0]);
  close(release[1]);
  Ledger ledger;
  auto j = MustOpen(Opts(dir.path()), &ledger);
  ASSERT_NE(j, nullptr);
  EXPECT_EQ(ledger.node_count(), 1u);
}

// A child process grants holdings as fast as it can and reports each one on a
// pipe only after WaitDurable; the parent SIGKILLs it at a random moment.
TEST(JournalTest, EveryAcknowledgedHoldingSurvivesSigkill) {
  TempDir dir;
  constexpr int kNodes = 200;  // 1600 GPUs: room for every hold
  {
    Ledger ledger;
    auto journal = MustOpen(Opts(dir.path()), &ledger);
    AddNodes(&ledger, kNodes);
  }
  std::random_device rd;
  const unsigned seed = rd();
  std::mt19937 rng(seed);
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  const int kill_after = std::uniform_int_distribution<int>(20, 600)(rng);

  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    Ledger ledger;
    auto opened = Journal::Open(Opts(dir.path(), true, /*snapshot_every=*/97), &ledger);
    if (!opened.ok()) _exit(2);
    auto journal = std::move(opened).value();
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (uint32_t i = 0;; ++i) {
          const uint32_t job = static_cast<uint32_t>(t) * 100000 + i + 1;
          auto held = ledger.Hold(HoldCount(absl::StrCat("node-", job % kNodes), Owner::SlurmJob(job), 1));
          if (!held.ok()) _exit(3);
          if (!journal->WaitDurable(held->seq).ok()) _exit(4);
          if (write(fds[1], &job, sizeof(job)) != sizeof(job)) _exit(5);
        }
      });
    }
    for (auto& t : threads) t.join();
    _exit(0);
  }
  close(fds[1]);
  std::vector<uint32_t> acked;
  uint32_t job;
  while (static_cast<int>(acked.size()) < kill_after && read(fds[0], &job, sizeof(job)) == sizeof(job)) {
    acked.push_back(job);
  }
  // A little more random delay, so the kill lands anywhere in a write.
  std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  // Whatever the child wrote before it died was acknowledged as well.
  while (read(fds[0], &job, sizeof(job)) == sizeof(job)) acked.push_back(job);
  close(fds[0]);
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(wstatus)) << "child exited with " << WEXITSTATUS(wstatus);
  ASSERT_GE(static_cast<int>(acked.size()), kill_after);

  Ledger ledger;
  auto journal = Journal::Open(Opts(dir.path()), &ledger);
  ASSERT_TRUE(journal.ok()) << journal.status();
  EXPECT_TRUE(ledger.CheckInvariants().ok()) << ledger.CheckInvariants();
  int missing = 0;
  for (uint32_t j : acked) {
    if (!ledger.FindHolding(absl::StrCat("node-", j % kNodes), Owner::SlurmJob(j)).has_value()) ++missing;
  }
  EXPECT_EQ(missing, 0) << "of " << acked.size() << " acknowledged holdings";
  EXPECT_GE(ledger.holding_count(), acked.size());
}

}  // namespace
}  // namespace duet
