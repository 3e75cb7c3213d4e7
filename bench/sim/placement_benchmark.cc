// Time per placement decision on the full Alibaba cluster (1,213 nodes):
// the extender's filter + prioritize (SelectNode) over every node, per
// policy, on a cluster half full (arrivals up to 50% of capacity placed with
// duet's policy), and one node's Slurm weight.

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/sim/replay.h"
#include "benchmark/benchmark.h"
#include "bridge/ledger/ledger.h"
#include "bridge/placement/node_free.h"
#include "bridge/placement/placement.h"

namespace duet::sim {
namespace {

struct Fixture {
  Trace trace;
  placement::Workload workload;
  Ledger ledger;
  std::vector<std::shared_ptr<const NodeView>> views;
  std::vector<placement::NodeLoad> loads;
  std::vector<placement::PodRequest> probes;  // requests to time, in arrival order
};

Fixture* g_fixture = nullptr;

bool Setup() {
  // The trace next to the source tree, or where DUET_TRACE_DIR says (a
  // worktree outside the usual layout).
  const char* env_dir = std::getenv("DUET_TRACE_DIR");
  const std::string dir = env_dir != nullptr && *env_dir != '\0' ? env_dir : DUET_TRACE_DIR;
  absl::StatusOr<Trace> trace = LoadTrace(dir + "/openb_node_list_gpu_node.csv",
                                          dir + "/openb_pod_list_default.csv");
  if (!trace.ok()) {
    std::fprintf(stderr, "%s\n", std::string(trace.status().message()).c_str());
    return false;
  }
  auto* f = new Fixture;
  f->trace = std::move(*trace);
  std::vector<placement::PodRequest> requests;
  for (const TracePod& p : f->trace.pods) requests.push_back(p.request);
  f->workload = placement::Workload::FromPods(requests);
  for (const NodeSpec& n : f->trace.nodes) {
    if (!f->ledger.UpsertNode(n).ok()) return false;
    f->views.push_back(f->ledger.GetNode(n.name));
  }
  f->loads.resize(f->views.size());
  absl::StatusOr<std::vector<Arrival>> made =
      MakeArrivals(f->trace, *ParseMapping("all-k8s"), 42, 1.3);
  if (!made.ok()) return false;
  const std::vector<Arrival>& arrivals = *made;
  const placement::Scorer duet(placement::Policy::kDuet, &f->workload);
  uint64_t capacity = 0;
  for (const NodeSpec& n : f->trace.nodes) capacity += n.devices.size() * kWholeDevice;
  uint64_t requested = 0;
  size_t a = 0;
  for (; a < arrivals.size() && requested < capacity / 2; ++a) {
    const placement::PodRequest& r = f->trace.pods[arrivals[a].pod].request;
    requested += r.device_milli();
    auto choice = placement::SelectNode(f->views, f->loads, r, duet);
    if (!choice.has_value()) continue;
    const size_t i = choice->node;
    if (!choice->placement.devices.empty()) {
      HoldRequest hold;
      hold.node = f->trace.nodes[i].name;
      hold.owner = Owner::Pod(absl::StrCat("uid-", a));
      hold.devices = choice->placement.devices;
      if (!f->ledger.Hold(hold).ok()) return false;
      f->views[i] = f->ledger.GetNode(hold.node);
    }
    f->loads[i].Add(r);
  }
  for (; a < arrivals.size() && f->probes.size() < 1024; ++a) {
    f->probes.push_back(f->trace.pods[arrivals[a].pod].request);
  }
  g_fixture = f;
  return true;
}

// range(1): how the workload's fragmentation memo (Workload::memo) stands.
enum Memo { kWarm = 0, kNone = 1, kCold = 2 };

void BM_SelectNode(benchmark::State& state) {
  const auto policy = static_cast<placement::Policy>(state.range(0));
  const auto memo = static_cast<Memo>(state.range(1));
  // kWarm: the fixture's workload, its memo filled by earlier decisions (a
  // steady workload, as the extender's between model snapshots). kNone:
  // every node measured afresh (the scoring before the memo). kCold: a new
  // workload with an empty memo per decision (duet-sim's online model, which
  // publishes a new snapshot after every arrival).
  placement::Workload none = g_fixture->workload;
  none.DisableMemo();
  placement::Workload cold;
  const placement::Workload* w = memo == kNone ? &none : &g_fixture->workload;
  size_t k = 0;
  for (auto _ : state) {
    if (memo == kCold) {
      state.PauseTiming();
      cold = placement::Workload(g_fixture->workload.shapes());
      w = &cold;
      state.ResumeTiming();
    }
    const placement::Scorer scorer(policy, w);
    const placement::PodRequest& r = g_fixture->probes[k++ % g_fixture->probes.size()];
    benchmark::DoNotOptimize(placement::SelectNode(g_fixture->views, g_fixture->loads, r, scorer));
  }
  const bool fragmentation = policy == placement::Policy::kDuet ||
                             policy == placement::Policy::kFgd;
  state.SetLabel(absl::StrCat(placement::PolicyName(policy), ", ", g_fixture->views.size(),
                              " nodes, half full",
                              !fragmentation ? ""
                              : memo == kWarm ? ", memo warm"
                              : memo == kNone ? ", no memo"
                                              : ", memo cold"));
}
BENCHMARK(BM_SelectNode)
    ->Args({static_cast<int>(placement::Policy::kDuet), kWarm})
    ->Args({static_cast<int>(placement::Policy::kDuet), kCold})
    ->Args({static_cast<int>(placement::Policy::kDuet), kNone})
    ->Args({static_cast<int>(placement::Policy::kFgd), kWarm})
    ->Args({static_cast<int>(placement::Policy::kFgd), kNone})
    ->Args({static_cast<int>(placement::Policy::kBestFit), kWarm})
    ->Args({static_cast<int>(placement::Policy::kLeastAllocated), kWarm})
    ->Unit(benchmark::kMicrosecond);

void BM_SlurmWeight(benchmark::State& state) {
  const placement::Scorer scorer(placement::Policy::kDuet, &g_fixture->workload);
  size_t k = 0;
  for (auto _ : state) {
    const size_t i = k++ % g_fixture->views.size();
    benchmark::DoNotOptimize(scorer.SlurmWeight(*g_fixture->views[i], g_fixture->loads[i]));
  }
}
BENCHMARK(BM_SlurmWeight)->Unit(benchmark::kMicrosecond);

// A workload of the trace's `n` most frequent shapes.
placement::Workload TopShapes(size_t n) {
  std::vector<placement::PodRequest> requests;
  for (const TracePod& p : g_fixture->trace.pods) requests.push_back(p.request);
  std::vector<placement::Workload::Shape> shapes =
      placement::Workload::FromPods(requests, 1.0).shapes();
  if (shapes.size() > n) shapes.resize(n);
  return placement::Workload(std::move(shapes));
}

// One node's fragmentation against an n-shape workload, over every node in
// turn: what scoring runs (shapes grouped by per-device demand, the node's
// devices scanned once per group) against the definition it replaced (each
// shape on its own, the devices scanned once per shape), side by side.
void BM_Fragmentation(benchmark::State& state) {
  const placement::Workload w = TopShapes(static_cast<size_t>(state.range(0)));
  const bool grouped = state.range(1) == 1;
  std::vector<placement::internal::NodeFree> nodes;
  for (size_t i = 0; i < g_fixture->views.size(); ++i) {
    nodes.push_back(placement::internal::Summarize(*g_fixture->views[i], g_fixture->loads[i]));
  }
  size_t k = 0;
  for (auto _ : state) {
    const placement::internal::NodeFree& n = nodes[k++ % nodes.size()];
    double f = 0;
    if (grouped) {
      f = placement::internal::WorkloadFragmentation(n, w);
    } else {
      for (const placement::Workload::Shape& s : w.shapes()) {
        f += s.weight * placement::internal::ShapeFragmentation(n, s.request);
      }
    }
    benchmark::DoNotOptimize(f);
  }
  state.SetLabel(absl::StrCat(w.shapes().size(), " shapes in ", w.groups().size(), " groups, ",
                              grouped ? "grouped" : "per shape"));
}
BENCHMARK(BM_Fragmentation)
    ->Args({35, 0})
    ->Args({35, 1})
    ->Args({128, 0})
    ->Args({128, 1})
    ->Unit(benchmark::kNanosecond);

}  // namespace
}  // namespace duet::sim

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!duet::sim::Setup()) return 77;  // trace absent: ctest skips
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
