// Journal benchmarks: recovery time with many live holdings, and append
// throughput (Hold + WaitDurable) with fsync on and off.
//
// DUET_JOURNAL_BENCH_HOLDINGS sets the live holdings for the recovery
// benchmarks (default 100000: 12,500 nodes x 8 GPUs, one GPU per holding).
// DUET_JOURNAL_BENCH_DIR sets where journals are written (default: the
// system temp dir); it should be on the disk the daemon would use.

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "bench/common/h100_node.h"
#include "bridge/journal/journal.h"
#include "bridge/ledger/ledger.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace {

namespace fs = std::filesystem;

constexpr int kGpusPerNode = bench::kH100sPerNode;

int Holdings() {
  int n = 100000;
  const char* env = getenv("DUET_JOURNAL_BENCH_HOLDINGS");
  if (env != nullptr && !absl::SimpleAtoi(env, &n)) n = 100000;
  return std::max(n, kGpusPerNode);
}

std::string BaseDir() {
  const char* env = getenv("DUET_JOURNAL_BENCH_DIR");
  const fs::path base = env != nullptr ? fs::path(env) : fs::temp_directory_path();
  return (base / absl::StrCat("duet_journal_bench.", getpid())).string();
}


// Journals with Holdings() live holdings: "snapshot" holds them in one
// snapshot, "log" only in log records (no snapshot ever taken). Built once.
struct Fixture {
  std::string base;
  std::string snapshot_dir;
  std::string log_dir;
  Fixture() {
    base = BaseDir();
    snapshot_dir = base + "/snapshot";
    log_dir = base + "/log";
    Build(snapshot_dir, true);
    Build(log_dir, false);
  }
  ~Fixture() {
    std::error_code ec;
    fs::remove_all(base, ec);
  }
  static void Build(const std::string& dir, bool snapshot) {
    Ledger ledger;
    Journal::Options o;
    o.dir = dir;
    o.fsync = false;
    o.snapshot_every = 0;
    auto journal = Journal::Open(o, &ledger);
    if (!journal.ok()) {
      spdlog::error("bench: {}", journal.status().ToString());
      abort();
    }
    const int holdings = Holdings();
    const int nodes = (holdings + kGpusPerNode - 1) / kGpusPerNode;
    for (int i = 0; i < nodes; ++i) (void)ledger.UpsertNode(bench::H100Node(i));
    for (int h = 0; h < holdings; ++h) {
      HoldRequest r;
      r.node = bench::H100NodeName(h / kGpusPerNode);
      // Half Slurm jobs, half pods: pods carry the longer owner records.
      r.owner = h % 2 == 0 ? Owner::SlurmJob(static_cast<uint32_t>(h + 1))
                           : Owner::Pod(absl::StrCat("5f0c3c4e-8d0a-4b7e-9a55-", h), "team-ml",
                                        absl::StrCat("trainer-", h));
      r.devices = {HeldDevice{DeviceKind::kGpu, static_cast<uint32_t>(h % kGpusPerNode), 0}};
      if (!ledger.Hold(r).ok()) abort();
    }
    if (snapshot && !(*journal)->WriteSnapshot().ok()) abort();
    if (!(*journal)->Flush().ok()) abort();
  }
};

Fixture& GetFixture() {
  static Fixture* f = new Fixture();
  return *f;
}

void Recover(benchmark::State& state, const std::string& dir) {
  size_t holdings = 0;
  for (auto _ : state) {
    auto ledger = std::make_unique<Ledger>();
    Journal::Options o;
    o.dir = dir;
    auto journal = Journal::Open(o, ledger.get());
    if (!journal.ok()) {
      state.SkipWithError(journal.status().ToString().c_str());
      return;
    }
    holdings = ledger->holding_count();
    state.PauseTiming();
    journal->reset();
    ledger.reset();
    state.ResumeTiming();
  }
  state.counters["holdings"] = static_cast<double>(holdings);
}

// Daemon start-up: Journal::Open into an empty ledger, from one snapshot.
void BM_RecoverFromSnapshot(benchmark::State& state) {
  Recover(state, GetFixture().snapshot_dir);
}
BENCHMARK(BM_RecoverFromSnapshot)->Unit(benchmark::kMillisecond)->UseRealTime();

// The same holdings, replayed from log records only (no snapshot yet).
void BM_RecoverFromLog(benchmark::State& state) { Recover(state, GetFixture().log_dir); }
BENCHMARK(BM_RecoverFromLog)->Unit(benchmark::kMillisecond)->UseRealTime();

// Shared by the threads of one BM_Append run.
Ledger* g_ledger = nullptr;
std::unique_ptr<Journal> g_journal;
std::string g_append_dir;

void AppendSetup(const benchmark::State& state) {
  g_append_dir = BaseDir() + absl::StrCat("/append-", state.range(0), "-", state.threads());
  g_ledger = new Ledger();
  Journal::Options o;
  o.dir = g_append_dir;
  o.fsync = state.range(0) != 0;
  auto journal = Journal::Open(o, g_ledger);
  if (!journal.ok()) abort();
  g_journal = std::move(journal).value();
  for (int i = 0; i < state.threads(); ++i) (void)g_ledger->UpsertNode(bench::H100Node(i));
}

void AppendTeardown(const benchmark::State&) {
  g_journal.reset();
  delete g_ledger;
  g_ledger = nullptr;
  std::error_code ec;
  fs::remove_all(g_append_dir, ec);
}

// One granted holding per iteration, acknowledged only once durable (what
// the gRPC Hold does), then released (the release rides in a later batch).
void BM_Append(benchmark::State& state) {
  const std::string node = bench::H100NodeName(state.thread_index());
  const auto records0 = g_journal->stats();
  uint32_t i = 0;
  for (auto _ : state) {
    const Owner owner = Owner::SlurmJob(static_cast<uint32_t>(state.thread_index()) * 10000000 + ++i);
    HoldRequest r;
    r.node = node;
    r.owner = owner;
    r.count = CountSelector{DeviceKind::kGpu, 1, 0, ""};
    auto held = g_ledger->Hold(r);
    if (!held.ok() || !g_journal->WaitDurable(held->seq).ok()) {
      state.SkipWithError("hold failed");
      return;
    }
    (void)g_ledger->Release(node, owner);
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    const auto stats = g_journal->stats();
    const double fsyncs = static_cast<double>(stats.fsyncs - records0.fsyncs);
    const double batches = static_cast<double>(stats.batches - records0.batches);
    state.counters["records_per_batch"] =
        batches > 0 ? static_cast<double>(stats.records - records0.records) / batches : 0;
    state.counters["fsyncs"] = fsyncs;
  }
}
BENCHMARK(BM_Append)
    ->Setup(AppendSetup)
    ->Teardown(AppendTeardown)
    ->ArgName("fsync")
    ->Arg(0)
    ->Arg(1)
    ->Threads(1)
    ->Threads(16)
    ->UseRealTime();

}  // namespace

std::string BaseDirForCleanup() { return BaseDir(); }

}  // namespace duet

int main(int argc, char** argv) {
  // DUET_JOURNAL_BENCH_LOG=debug shows recovery's phase timings.
  const char* level = getenv("DUET_JOURNAL_BENCH_LOG");
  spdlog::set_level(level != nullptr ? spdlog::level::from_str(level) : spdlog::level::warn);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  // The fixture's journals are removed by the OS temp cleanup otherwise.
  std::error_code ec;
  std::filesystem::remove_all(duet::BaseDirForCleanup(), ec);
  return 0;
}
