// Ledger benchmarks, in process (no journal, no gRPC): Hold+Release pairs on
// one thread at 1k / 10k / 50k nodes, Snapshot() at 10k nodes (what the
// scheduler extender calls), and Hold+Release with many threads contending
// for the ledger's one mutex.
//
// Every node has 8 H100s; a Slurm job already holds GPUs 6 and 7 on every
// node (so Hold sees devices in use, as in a busy cluster). Pairs visit the
// nodes in a fixed pseudo-random order, so the working set grows with the
// node count and cache misses are part of the figure.
//
// DUET_LEDGER_BENCH_MAX_NODES caps every node count (the ctest uses 2000).

#include <stdlib.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "bench/common/h100_node.h"
#include "bridge/ledger/ledger.h"

namespace duet {
namespace {

constexpr int kGpusPerNode = bench::kH100sPerNode;
// GPUs 0..5 are free for the benchmarks; 6 and 7 are held by a background job.
constexpr int kFreeGpus = 6;

int CapNodes(int nodes) {
  int cap = 0;
  const char* env = getenv("DUET_LEDGER_BENCH_MAX_NODES");
  if (env != nullptr && absl::SimpleAtoi(env, &cap) && cap > 0) return std::min(nodes, cap);
  return nodes;
}


// A ledger of `nodes` nodes plus the requests the benchmarks replay. Built
// once per node count and kept (the benchmarks leave it as they found it).
struct World {
  Ledger ledger;
  std::vector<int> order;  // node visiting order, a fixed permutation
  // Per node: a Slurm step asking for any 4 GPUs, and a pod naming one GPU.
  std::vector<HoldRequest> step_count;
  std::vector<HoldRequest> pod_devices;

  explicit World(int nodes) {
    for (int i = 0; i < nodes; ++i) {
      if (!ledger.UpsertNode(bench::H100Node(i)).ok()) abort();
      HoldRequest bg;
      bg.node = bench::H100NodeName(i);
      bg.owner = Owner::SlurmJob(static_cast<uint32_t>(2000000 + i));
      bg.devices = {HeldDevice{DeviceKind::kGpu, 6, 0}, HeldDevice{DeviceKind::kGpu, 7, 0}};
      if (!ledger.Hold(bg).ok()) abort();

      HoldRequest step;
      step.node = bg.node;
      step.owner = Owner::SlurmStep(static_cast<uint32_t>(1000000 + i), 0);
      step.count = CountSelector{DeviceKind::kGpu, 4, 0, ""};
      step_count.push_back(std::move(step));

      HoldRequest pod;
      pod.node = bg.node;
      pod.owner = Owner::Pod(absl::StrCat("7c9e6679-7425-40de-944b-e07fc1f9", 10000000 + i),
                             "team-ml", absl::StrCat("trainer-", i));
      pod.devices = {HeldDevice{DeviceKind::kGpu, static_cast<uint32_t>(i % kFreeGpus), 0}};
      pod_devices.push_back(std::move(pod));
    }
    order.resize(nodes);
    for (int i = 0; i < nodes; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937(42));
  }
};

World& GetWorld(int nodes) {
  static std::mutex mu;
  static auto* worlds = new std::map<int, std::unique_ptr<World>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& w = (*worlds)[nodes];
  if (w == nullptr) w = std::make_unique<World>(nodes);
  return *w;
}

// One Hold then one Release of the same holding; `k` picks the node.
bool Pair(World& w, const std::vector<HoldRequest>& requests, size_t k) {
  const HoldRequest& r = requests[w.order[k % w.order.size()]];
  absl::StatusOr<HoldResult> held = w.ledger.Hold(r);
  if (!held.ok() || !held->created) return false;
  benchmark::DoNotOptimize(held->seq);
  absl::StatusOr<ReleaseResult> released = w.ledger.Release(r.node, r.owner);
  return released.ok() && released->released;
}

void HoldRelease(benchmark::State& state, bool step) {
  World& w = GetWorld(CapNodes(static_cast<int>(state.range(0))));
  const auto& requests = step ? w.step_count : w.pod_devices;
  size_t k = 0;
  for (auto _ : state) {
    if (!Pair(w, requests, k++)) {
      state.SkipWithError("hold/release failed");
      return;
    }
  }
  state.SetItemsProcessed(state.iterations());  // items: Hold+Release pairs
  state.counters["nodes"] = static_cast<double>(w.order.size());
}

// A Slurm step taking any 4 of the node's free GPUs (CountSelector).
void BM_HoldRelease_StepCount(benchmark::State& state) { HoldRelease(state, true); }
BENCHMARK(BM_HoldRelease_StepCount)->Arg(1000)->Arg(10000)->Arg(50000);

// A pod naming one GPU (explicit devices).
void BM_HoldRelease_PodDevices(benchmark::State& state) { HoldRelease(state, false); }
BENCHMARK(BM_HoldRelease_PodDevices)->Arg(1000)->Arg(10000)->Arg(50000);

// What the scheduler extender calls: a consistent image of every node.
void BM_Snapshot(benchmark::State& state) {
  World& w = GetWorld(CapNodes(static_cast<int>(state.range(0))));
  size_t nodes = 0;
  for (auto _ : state) {
    LedgerSnapshot snap = w.ledger.Snapshot();
    nodes = snap.nodes.size();
    benchmark::DoNotOptimize(snap.nodes.data());
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["nodes"] = static_cast<double>(nodes);
}
BENCHMARK(BM_Snapshot)->Arg(10000)->Unit(benchmark::kMicrosecond);

// Hold+Release pairs from many threads at once (each on its own nodes, so
// none is refused): they contend for the ledger's mutex. Items are pairs over
// all threads; wall time.
void BM_HoldRelease_Contended(benchmark::State& state) {
  World& w = GetWorld(CapNodes(10000));
  const size_t threads = static_cast<size_t>(state.threads());
  const size_t me = static_cast<size_t>(state.thread_index());
  const auto& requests = state.thread_index() % 2 == 0 ? w.step_count : w.pod_devices;
  size_t k = 0;
  for (auto _ : state) {
    if (!Pair(w, requests, k++ * threads + me)) {
      state.SkipWithError("hold/release failed");
      return;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_HoldRelease_Contended)->Threads(1)->Threads(2)->Threads(16)->UseRealTime();

}  // namespace
}  // namespace duet

BENCHMARK_MAIN();
