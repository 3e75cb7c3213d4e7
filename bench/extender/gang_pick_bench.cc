// PickGangNodes (bridge/placement/topology.h) at cluster scale: the part of
// a gang's reservation that chooses its nodes, which the extender's filter
// runs once per gang (docs/gangs.md 2, 4).
//
// A cluster of --nodes H100 nodes (bench/common/h100_node.h: 8 GPUs, an
// NVLink clique per 18 nodes) laid out as GKE does: 36 nodes per sub-block,
// 4 sub-blocks per block, one pool. Node i has i % 9 GPUs in use, so most
// cliques are partly used and only some nodes take a whole-node member. Per
// run: the candidates are built as the extender builds them (TopologyOf on
// each ledger view, the members that fit, the free milli), then a gang of
// --members members of --member_gpus GPUs is picked.
//
//   gang_pick_bench [--nodes 500,5000] [--members 8] [--member_gpus 8]
//                   [--reps 500]
//
// Per node count it prints one JSON line: p50/p99/max of the pick and of
// the candidate build, in microseconds of wall time and of this thread's CPU
// time (the CPU figures hold on a loaded machine, where wall-time tails are
// other processes' time slices), and what was picked (level, nodes, per
// node). Exits 1 when a gang that should fit is refused.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/common/h100_node.h"
#include "bench/common/quantile.h"
#include "bridge/placement/topology.h"
#include "nlohmann/json.hpp"

namespace duet::bench {
namespace {

struct Flags {
  std::vector<int> nodes = {500, 5000};
  int members = 8;
  int member_gpus = 8;
  int reps = 500;
};

std::vector<std::shared_ptr<const NodeView>> Cluster(int n) {
  std::vector<std::shared_ptr<const NodeView>> out;
  out.reserve(n);
  for (int i = 0; i < n; ++i) {
    NodeSpec spec = H100Node(i);
    spec.labels["cloud.google.com/gce-topology-block"] = absl::StrCat("block-", i / 144);
    spec.labels["cloud.google.com/gce-topology-subblock"] = absl::StrCat("sub-", i / 36);
    spec.labels["cloud.google.com/gce-topology-host"] = absl::StrCat("host-", i);
    auto v = std::make_shared<NodeView>();
    for (DeviceSpec& d : spec.devices) {
      DeviceState s;
      s.used_milli = static_cast<int>(d.index) < i % 9 ? kWholeDevice : 0;
      s.spec = std::move(d);
      v->devices.push_back(std::move(s));
    }
    spec.devices.clear();
    v->spec = std::move(spec);
    out.push_back(std::move(v));
  }
  return out;
}

std::vector<placement::GangCandidate> Candidates(
    const std::vector<std::shared_ptr<const NodeView>>& views, uint64_t member_milli) {
  std::vector<placement::GangCandidate> out;
  out.reserve(views.size());
  for (const auto& v : views) {
    uint64_t free = 0;
    uint32_t free_whole = 0;
    for (const DeviceState& d : v->devices) {
      free += d.free_milli();
      free_whole += d.free_milli() == kWholeDevice ? 1 : 0;
    }
    const uint32_t fits = static_cast<uint32_t>(free_whole * kWholeDevice / member_milli);
    if (fits == 0) continue;
    placement::GangCandidate c;
    c.node = v->spec.name;
    c.pool = v->spec.pool;
    c.topology = placement::TopologyOf(*v);
    c.fits = fits;
    c.free_milli = free;
    c.member_milli = member_milli;
    out.push_back(std::move(c));
  }
  return out;
}

double ThreadCpuUs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

nlohmann::json Summary(const std::vector<double>& v);

nlohmann::json Summary(const std::vector<double>& v) {
  return {{"p50", Quantile(v, 0.5)}, {"p99", Quantile(v, 0.99)}, {"max", Quantile(v, 1.0)}};
}

int Run(const Flags& f) {
  using Clock = std::chrono::steady_clock;
  const uint64_t member_milli = uint64_t{kWholeDevice} * f.member_gpus;
  for (int n : f.nodes) {
    const auto views = Cluster(n);
    std::vector<double> build_us, pick_us, build_cpu_us, pick_cpu_us;
    std::optional<placement::GangPick> pick;
    std::string why;
    for (int r = 0; r < f.reps; ++r) {
      const double c0 = ThreadCpuUs();
      const auto t0 = Clock::now();
      std::vector<placement::GangCandidate> c = Candidates(views, member_milli);
      const double c1 = ThreadCpuUs();
      const auto t1 = Clock::now();
      pick = placement::PickGangNodes(c, static_cast<uint32_t>(f.members), &why);
      const double c2 = ThreadCpuUs();
      const auto t2 = Clock::now();
      build_cpu_us.push_back(c1 - c0);
      pick_cpu_us.push_back(c2 - c1);
      build_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      pick_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
    }
    nlohmann::json out;
    out["nodes"] = n;
    out["members"] = f.members;
    out["member_gpus"] = f.member_gpus;
    out["reps"] = f.reps;
    out["candidates"] = Candidates(views, member_milli).size();
    out["pick_us"] = Summary(pick_us);
    out["pick_cpu_us"] = Summary(pick_cpu_us);
    out["build_us"] = Summary(build_us);
    out["build_cpu_us"] = Summary(build_cpu_us);
    if (!pick.has_value()) {
      out["refused"] = why;
      std::printf("%s\n", out.dump().c_str());
      return 1;
    }
    out["level"] = placement::DomainLevelName(pick->level);
    out["picked_nodes"] = pick->nodes.size();
    out["per_node"] = pick->per_node;
    std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}

}  // namespace
}  // namespace duet::bench

int main(int argc, char** argv) {
  duet::bench::Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    bool ok = true;
    if (k == "--nodes") {
      f.nodes.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) {
        int n = 0;
        ok = ok && absl::SimpleAtoi(s, &n) && n > 0;
        f.nodes.push_back(n);
      }
    } else if (k == "--members") {
      ok = absl::SimpleAtoi(v, &f.members) && f.members > 0;
    } else if (k == "--member_gpus") {
      ok = absl::SimpleAtoi(v, &f.member_gpus) && f.member_gpus > 0 &&
           f.member_gpus <= duet::bench::kH100sPerNode;
    } else if (k == "--reps") {
      ok = absl::SimpleAtoi(v, &f.reps) && f.reps > 0;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "bad flag %s %s\n", k.c_str(), v.c_str());
      return 2;
    }
  }
  return duet::bench::Run(f);
}
