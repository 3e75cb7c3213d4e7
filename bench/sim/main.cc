// duet-sim: replays the Alibaba GPU trace through duet's ledger and placement
// library, per policy, and writes CSV + a gnuplot plot. See README.md.

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/common/quantile.h"
#include "bench/sim/replay.h"

namespace duet::sim {
namespace {

struct Flags {
  // Where the full trace is; --nodes and --pods default to its files.
  std::string trace_dir = DUET_TRACE_DIR;
  std::string nodes;
  std::string pods;
  uint64_t seed = 42;
  int runs = 1;
  double max_arrival = 1.3;
  double step = 0.05;
  std::string mapping = "default";
  std::string policies = "duet,fgd,best-fit,most-allocated,spread,static,static-duet";
  std::string out = "sim-out";
  double coverage = 0.95;
  std::string workload = "online";
  std::string ties = "first";
  double half_life = 0;
  size_t max_shapes = 128;
  double min_change = placement::WorkloadModelOptions().min_change;
  bool quick = false;
  // Keep every n-th node of the node list (--quick: 12).
  size_t node_stride = 1;
  bool plot = true;
  int jobs = 1;
  // ReplayOptions::score_memo and check_score_memo.
  bool score_memo = true;
  bool check_score_memo = false;
  // Gangs (issue 27): empty = off.
  std::string gangs;
  std::string gang_policies = "per-pod,duet,duet-flat";
  std::string topology = "4,16,64";
};

std::string Pct(double f) { return absl::StrFormat("%.2f", 100 * f); }

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  f.close();
  if (!f) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

const Row* RowAt(const ReplayResult& r, double target) {
  for (const Row& row : r.rows) {
    if (std::abs(row.arrived_target - target) < 1e-9) return &row;
  }
  return nullptr;
}

int Run(const Flags& flags) {
  absl::StatusOr<Mapping> mapping = ParseMapping(flags.mapping);
  if (!mapping.ok()) {
    std::cerr << mapping.status().message() << "\n";
    return 2;
  }
  std::vector<PolicySpec> policies;
  for (absl::string_view name : absl::StrSplit(flags.policies, ',', absl::SkipEmpty())) {
    absl::StatusOr<PolicySpec> p = ParsePolicySpec(name);
    if (!p.ok()) {
      std::cerr << "--policies: " << p.status().message() << "\n";
      return 2;
    }
    policies.push_back(*p);
  }
  // Gangs: every policy once per gang policy, named POLICY/GANG-POLICY.
  std::optional<GangMix> gang_mix;
  absl::StatusOr<SimTopology> topology = ParseSimTopology(flags.topology);
  if (!topology.ok()) {
    std::cerr << topology.status().message() << "\n";
    return 2;
  }
  if (!flags.gangs.empty()) {
    absl::StatusOr<GangMix> mix = ParseGangMix(flags.gangs);
    if (!mix.ok()) {
      std::cerr << mix.status().message() << "\n";
      return 2;
    }
    gang_mix = *mix;
    std::vector<PolicySpec> expanded;
    for (const PolicySpec& p : policies) {
      for (absl::string_view g : absl::StrSplit(flags.gang_policies, ',', absl::SkipEmpty())) {
        absl::StatusOr<GangPolicy> gp = ParseGangPolicy(g);
        if (!gp.ok()) {
          std::cerr << "--gang-policies: " << gp.status().message() << "\n";
          return 2;
        }
        PolicySpec e = p;
        e.gang = *gp;
        e.name = absl::StrCat(p.name, "/", GangPolicyName(*gp));
        expanded.push_back(std::move(e));
      }
    }
    policies = std::move(expanded);
  }
  if (policies.empty()) {
    std::cerr << "--policies / --gang-policies: no policy to run\n";
    return 2;
  }
  if (flags.workload != "online" && flags.workload != "oracle") {
    std::cerr << "--workload: must be online or oracle, got " << flags.workload << "\n";
    return 2;
  }
  const bool online = flags.workload == "online";
  if (flags.ties != "random" && flags.ties != "first") {
    std::cerr << "--ties: must be random or first, got " << flags.ties << "\n";
    return 2;
  }
  if (flags.step <= 0 || flags.max_arrival <= 0 || flags.runs < 1 || flags.jobs < 1) {
    std::cerr << "--step, --max-arrival, --runs and --jobs must be positive\n";
    return 2;
  }

  absl::StatusOr<Trace> trace = LoadTrace(flags.nodes, flags.pods, flags.node_stride);
  if (!trace.ok()) {
    std::cerr << trace.status().message() << "\n";
    return 1;
  }
  std::vector<placement::PodRequest> requests;
  for (const TracePod& p : trace->pods) requests.push_back(p.request);
  const placement::Workload workload = placement::Workload::FromPods(requests, flags.coverage);
  uint64_t gpus = 0;
  for (const NodeSpec& n : trace->nodes) gpus += n.devices.size();
  std::cout << "cluster: " << trace->nodes.size() << " nodes, " << gpus << " GPUs; trace: "
            << trace->pods.size() << " pods; workload: " << workload.shapes().size()
            << " shapes cover " << flags.coverage * 100 << "% of pods\n"
            << "workload the policies score against: "
            << (online ? absl::StrCat("online (a model learned from the arrivals so far, at most ",
                                      flags.max_shapes, " shapes covering ",
                                      flags.coverage * 100, "%, ",
                                      flags.half_life > 0
                                          ? absl::StrCat("half-life ", flags.half_life,
                                                         " arrivals")
                                          : std::string("no decay"),
                                      ", a new snapshot when the weights move by ",
                                      flags.min_change, ")")
                       : std::string("oracle (the whole trace's shapes, known in advance)"))
            << "\n"
            << "ties between equally scored nodes: " << flags.ties << "\n"
            << "mapping: " << mapping->Describe() << "\n";
  // The pod list's classes, so a list without a qos column shows as such.
  std::map<std::string, size_t> per_qos;
  for (const TracePod& p : trace->pods) ++per_qos[p.qos.empty() ? "none" : p.qos];
  std::cout << "pod list QoS:";
  for (const auto& [qos, count] : per_qos) std::cout << " " << qos << " " << count;
  std::cout << "\n";

  // Every (seed, policy) replay is independent: run them on --jobs threads.
  std::vector<uint64_t> seeds;
  for (int r = 0; r < flags.runs; ++r) seeds.push_back(flags.seed + r);
  std::vector<std::vector<Arrival>> arrivals;
  for (uint64_t s : seeds) {
    absl::StatusOr<std::vector<Arrival>> a = MakeArrivals(*trace, *mapping, s, flags.max_arrival);
    if (!a.ok()) {
      std::cerr << a.status().message() << "\n";
      return 2;
    }
    if (gang_mix.has_value()) {
      std::vector<Arrival> with_gangs = AddGangs(*trace, *a, *gang_mix, s, flags.max_arrival);
      uint64_t gangs = 0, members = 0;
      for (const Arrival& arr : with_gangs) {
        if (arr.gang == 0) continue;
        ++members;
        if (arr.member == 0) ++gangs;
      }
      std::cout << "seed " << s << ": " << gangs << " gangs (" << members << " members) among "
                << with_gangs.size() << " arrivals\n";
      if (gangs == 0) {
        std::cerr << "--gangs: no arrival became a gang (gangs are drawn from the multi-GPU "
                     "pods the mapping sends to Kubernetes)\n";
        return 2;
      }
      *a = std::move(with_gangs);
    }
    arrivals.push_back(*std::move(a));
  }
  ReplayOptions options;
  options.max_arrival = flags.max_arrival;
  options.step = flags.step;
  options.online_workload = online;
  options.random_ties = flags.ties == "random";
  options.score_memo = flags.score_memo;
  options.check_score_memo = flags.check_score_memo;
  options.half_life_arrivals = flags.half_life;
  options.max_shapes = flags.max_shapes;
  options.min_change = flags.min_change;
  options.coverage = flags.coverage;
  options.topology = *topology;
  if (gang_mix.has_value()) {
    std::cout << absl::StrFormat(
        "gangs: a share %.2f of the multi-GPU (whole-GPU) arrivals the mapping sends to "
        "Kubernetes start a gang of %d-%d copies of the pod, one member every %d arrivals; "
        "topology by node index: cliques of %d nodes, sub-blocks of %d, blocks of %d; a pool is "
        "a GPU model\n",
        gang_mix->share, gang_mix->min_size, gang_mix->max_size, gang_mix->gap, topology->clique,
        topology->subblock, topology->block);
  }
  const size_t tasks = seeds.size() * policies.size();
  std::vector<absl::StatusOr<ReplayResult>> results(tasks, absl::UnknownError("not run"));
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t t; (t = next.fetch_add(1)) < tasks;) {
      ReplayOptions o = options;
      o.tie_seed = seeds[t / policies.size()];
      results[t] = Replay(*trace, arrivals[t / policies.size()], workload,
                          policies[t % policies.size()], o);
    }
  };
  std::vector<std::thread> threads;
  for (int j = 0; j < flags.jobs; ++j) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  for (const auto& r : results) {
    if (!r.ok()) {
      std::cerr << "replay failed: " << r.status() << "\n";
      return 1;
    }
  }
  // What the mapping line says must be what the replays did (issue 28: "all ->
  // Kubernetes" was printed over replays that sent every pod to Slurm). A
  // one-world mapping is checked against its own promise, a split against the
  // worlds MakeArrivals gave the arrivals.
  for (size_t t = 0; t < tasks; ++t) {
    const ReplayResult& r = *results[t];
    const std::vector<Arrival>& seed_arrivals = arrivals[t / policies.size()];
    uint64_t to_k8s = 0;
    for (const Arrival& a : seed_arrivals) {
      const World w = mapping->every_pod.value_or(a.world);
      if (w == World::kKubernetes) ++to_k8s;
    }
    const uint64_t to_slurm = seed_arrivals.size() - to_k8s;
    const bool held_off_mapping = (to_k8s == 0 && r.pod_holdings > 0) ||
                                  (to_slurm == 0 && r.slurm_holdings > 0);
    if (r.kubernetes_arrivals != to_k8s || r.slurm_arrivals != to_slurm || held_off_mapping) {
      std::cerr << "replay " << r.policy << " (seed " << seeds[t / policies.size()]
                << ") does not follow the mapping " << mapping->Describe() << ": "
                << r.kubernetes_arrivals << " arrivals to Kubernetes and " << r.slurm_arrivals
                << " to Slurm where the mapping gives " << to_k8s << " and " << to_slurm
                << "; held by pods " << r.pod_holdings << ", by Slurm jobs " << r.slurm_holdings
                << "\n";
      return 1;
    }
  }

  // Oracle results get files of their own, so both can sit side by side.
  const std::string prefix = absl::StrCat("alibaba_", mapping->name, online ? "" : "_oracle",
                                          gang_mix.has_value() ? "_gangs" : "");
  const std::string workload_note =
      online ? "workload learned online" : "oracle workload (whole trace in advance)";
  std::string mkdir = absl::StrCat("mkdir -p '", flags.out, "'");
  if (std::system(mkdir.c_str()) != 0) {
    std::cerr << "cannot create " << flags.out << "\n";
    return 1;
  }
  const std::string header =
      "mapping,seed,policy,arrived_pct,allocated_pct,unallocated_pct,idle_gpus,fragmented_gpus,"
      "pods_arrived,pods_failed,gpu_pods_failed\n";
  // Per seed.
  for (size_t s = 0; s < seeds.size(); ++s) {
    std::string csv = header;
    for (size_t p = 0; p < policies.size(); ++p) {
      for (const Row& row : results[s * policies.size() + p]->rows) {
        absl::StrAppend(&csv, mapping->name, ",", seeds[s], ",", policies[p].name, ",",
                        Pct(row.arrived_target), ",", Pct(row.allocated), ",",
                        Pct(1 - row.allocated), ",", absl::StrFormat("%.1f", row.idle_gpus), ",",
                        absl::StrFormat("%.1f", row.fragmented_gpus), ",", row.pods_arrived, ",",
                        row.pods_failed, ",", row.gpu_pods_failed, "\n");
      }
    }
    absl::Status w = WriteFile(absl::StrCat(flags.out, "/", prefix, "_seed", seeds[s], ".csv"), csv);
    if (!w.ok()) {
      std::cerr << w.message() << "\n";
      return 1;
    }
  }
  // Gangs: one row per seed and policy (placed_* count placed gangs by the
  // tightest level their nodes share, not cumulative).
  if (gang_mix.has_value()) {
    std::string g_csv =
        "mapping,seed,policy,gangs,members,placed,waiting,never_placed,members_placed,"
        "mean_wait_arrivals,p99_wait_arrivals,idle_held_gpus,idle_gpu_arrivals,placed_node,"
        "placed_clique,placed_subblock,placed_block,placed_pool\n";
    for (size_t s = 0; s < seeds.size(); ++s) {
      for (size_t p = 0; p < policies.size(); ++p) {
        const GangStats& g = results[s * policies.size() + p]->gangs;
        absl::StrAppend(&g_csv, mapping->name, ",", seeds[s], ",", policies[p].name, ",", g.gangs,
                        ",", g.members, ",", g.placed, ",", g.waiting, ",", g.never_placed, ",",
                        g.members_placed, ",", absl::StrFormat("%.2f", g.mean_wait), ",",
                        absl::StrFormat("%.0f", g.p99_wait), ",",
                        absl::StrFormat("%.1f", g.idle_held_gpus), ",",
                        absl::StrFormat("%.0f", g.idle_gpu_arrivals));
        for (uint64_t c : g.placed_at_level) absl::StrAppend(&g_csv, ",", c);
        absl::StrAppend(&g_csv, "\n");
      }
    }
    absl::Status w = WriteFile(absl::StrCat(flags.out, "/", prefix, "_stats.csv"), g_csv);
    if (!w.ok()) {
      std::cerr << w.message() << "\n";
      return 1;
    }
  }
  // Medians over seeds, per policy and step.
  const auto steps = static_cast<size_t>(std::floor(flags.max_arrival / flags.step + 1e-9));
  std::string csv = absl::StrCat("# ", mapping->Describe(), "; seeds ", seeds.front(), "..",
                                 seeds.back(), "; medians over seeds; ", workload_note, "\n", header);
  std::string table;
  for (size_t p = 0; p < policies.size(); ++p) {
    for (size_t k = 1; k <= steps; ++k) {
      const double target = k * flags.step;
      std::vector<double> alloc, idle, frag, arrived, failed, gfailed;
      for (size_t s = 0; s < seeds.size(); ++s) {
        const Row* row = RowAt(*results[s * policies.size() + p], target);
        if (row == nullptr) continue;
        alloc.push_back(row->allocated);
        idle.push_back(row->idle_gpus);
        frag.push_back(row->fragmented_gpus);
        arrived.push_back(row->pods_arrived);
        failed.push_back(row->pods_failed);
        gfailed.push_back(row->gpu_pods_failed);
      }
      if (alloc.empty()) continue;
      absl::StrAppend(&csv, mapping->name, ",median,", policies[p].name, ",", Pct(target), ",",
                      Pct(bench::Median(alloc)), ",", Pct(1 - bench::Median(alloc)), ",",
                      absl::StrFormat("%.1f", bench::Median(idle)), ",",
                      absl::StrFormat("%.1f", bench::Median(frag)), ",", bench::Median(arrived),
                      ",", bench::Median(failed), ",", bench::Median(gfailed), "\n");
    }
  }
  absl::Status w = WriteFile(absl::StrCat(flags.out, "/", prefix, ".csv"), csv);
  if (!w.ok()) {
    std::cerr << w.message() << "\n";
    return 1;
  }

  // Summary on stdout.
  std::cout << absl::StrFormat("%-15s %12s %12s %12s %12s %10s %10s %9s\n", "policy",
                               "alloc@100%", "alloc@max", "frag@max", "failed@max",
                               "median_us", "p99_us", "replay_s");
  for (size_t p = 0; p < policies.size(); ++p) {
    std::vector<double> a100, amax, fmax, failmax, med, p99, wall;
    for (size_t s = 0; s < seeds.size(); ++s) {
      const ReplayResult& r = *results[s * policies.size() + p];
      if (const Row* row = RowAt(r, 1.0)) a100.push_back(row->allocated);
      if (!r.rows.empty()) {
        amax.push_back(r.rows.back().allocated);
        fmax.push_back(r.rows.back().fragmented_gpus);
        failmax.push_back(r.rows.back().pods_failed);
      }
      med.push_back(r.median_decision_us);
      p99.push_back(r.p99_decision_us);
      wall.push_back(r.wall_seconds);
    }
    std::cout << absl::StrFormat(
        "%-15s %11s%% %11s%% %12.1f %12.0f %10.1f %10.1f %9.2f\n", policies[p].name,
        Pct(bench::Median(a100)), Pct(bench::Median(amax)), bench::Median(fmax),
        bench::Median(failmax), bench::Median(med), bench::Median(p99), bench::Median(wall));
    const ReplayResult& r0 = *results[p];
    std::vector<double> k8s_used, slurm_used, cpu_full;
    for (size_t s = 0; s < seeds.size(); ++s) {
      const ReplayResult& r = *results[s * policies.size() + p];
      k8s_used.push_back(r.kubernetes_allocated_gpus);
      slurm_used.push_back(r.slurm_allocated_gpus);
      cpu_full.push_back(r.idle_gpus_cpu_full);
    }
    if (r0.kubernetes_gpus + r0.slurm_gpus > 0) {
      std::cout << absl::StrFormat(
          "    partition: %d GPUs Kubernetes (%.1f%% allocated), %d GPUs Slurm (%.1f%% "
          "allocated)\n",
          r0.kubernetes_gpus,
          100 * bench::Median(k8s_used) / std::max<double>(1, r0.kubernetes_gpus), r0.slurm_gpus,
          100 * bench::Median(slurm_used) / std::max<double>(1, r0.slurm_gpus));
    }
    std::cout << absl::StrFormat(
        "    idle GPUs on nodes with >= 90%% of CPU requested @max: %.1f\n",
        bench::Median(cpu_full));
    uint64_t k8s_arrivals = 0, slurm_arrivals = 0, pod_holdings = 0, slurm_holdings = 0;
    for (size_t s = 0; s < seeds.size(); ++s) {
      const ReplayResult& r = *results[s * policies.size() + p];
      k8s_arrivals += r.kubernetes_arrivals;
      slurm_arrivals += r.slurm_arrivals;
      pod_holdings += r.pod_holdings;
      slurm_holdings += r.slurm_holdings;
    }
    std::cout << absl::StrFormat(
        "    routed (all seeds): %d arrivals to Kubernetes (extender), %d to Slurm (first fit); "
        "held at the end: %d by pods, %d by Slurm jobs\n",
        k8s_arrivals, slurm_arrivals, pod_holdings, slurm_holdings);
    uint64_t memo_lookups = 0, memo_hits = 0, memo_fits = 0, memo_epochs = 0;
    for (size_t s = 0; s < seeds.size(); ++s) {
      const ReplayResult& r = *results[s * policies.size() + p];
      memo_lookups += r.score_memo_lookups;
      memo_hits += r.score_memo_hits;
      memo_fits += r.score_memo_fits;
      memo_epochs += r.score_memo_epochs;
    }
    if (memo_lookups > 0) {
      std::cout << absl::StrFormat(
          "    score memo (all seeds): %d of %d per-node answers from the memo (%.1f%%), "
          "%.1f%% fit, %d epochs%s\n",
          memo_hits, memo_lookups, 100.0 * static_cast<double>(memo_hits) / memo_lookups,
          100.0 * static_cast<double>(memo_fits) / memo_lookups, memo_epochs,
          flags.check_score_memo ? "; every decision checked against SelectNode" : "");
    }
    if (gang_mix.has_value()) {
      std::vector<double> gangs, placed, waiting, never, mean_wait, p99_wait, idle, idle_time;
      std::vector<double> level[5];
      for (size_t s = 0; s < seeds.size(); ++s) {
        const GangStats& g = results[s * policies.size() + p]->gangs;
        gangs.push_back(g.gangs);
        placed.push_back(g.placed);
        waiting.push_back(g.waiting);
        never.push_back(g.never_placed);
        mean_wait.push_back(g.mean_wait);
        p99_wait.push_back(g.p99_wait);
        idle.push_back(g.idle_held_gpus);
        idle_time.push_back(g.idle_gpu_arrivals);
        // Cumulative: a gang on one node is also within one clique, and so on.
        uint64_t within = 0;
        for (size_t l = 0; l < 5; ++l) {
          within += g.placed_at_level[l];
          level[l].push_back(g.placed == 0 ? 0 : 100.0 * within / g.placed);
        }
      }
      std::cout << absl::StrFormat(
          "    gangs (medians): %.0f gangs: %.0f placed, %.0f waiting, %.0f never placed; wait "
          "mean %.1f p99 %.0f arrivals; %.1f GPUs held by waiting gangs at the end; %.0f "
          "GPU-arrivals held before their gang ran\n"
          "    placed gangs within one node %.1f%%, one clique %.1f%%, one sub-block %.1f%%, one "
          "block %.1f%%, one pool %.1f%%\n",
          bench::Median(gangs), bench::Median(placed), bench::Median(waiting), bench::Median(never),
          bench::Median(mean_wait), bench::Median(p99_wait), bench::Median(idle),
          bench::Median(idle_time), bench::Median(level[0]), bench::Median(level[1]),
          bench::Median(level[2]), bench::Median(level[3]), bench::Median(level[4]));
    }
  }

  // gnuplot script and PNG.
  const std::string gp_path = absl::StrCat(flags.out, "/", prefix, ".gp");
  const std::string png_path = absl::StrCat(flags.out, "/", prefix, ".png");
  std::string gp = absl::StrCat(
      "set terminal pngcairo size 900,640 noenhanced\n", "set output '", png_path, "'\n",
      "set datafile separator ','\n",
      "set title \"Alibaba GPU trace, ", trace->nodes.size(), " nodes: allocated GPU share vs arrivals\\n",
      mapping->Describe(), "; seeds ", seeds.front(), "..", seeds.back(), " (median)\\n",
      workload_note, "\"\n",
      "set xlabel 'GPU requests arrived (% of cluster capacity)'\n",
      "set ylabel 'GPUs allocated (% of capacity)'\n", "set key bottom right\n", "set grid\n",
      "set xrange [50:", 100 * flags.max_arrival, "]\n", "set yrange [50:100]\n", "plot ");
  for (size_t p = 0; p < policies.size(); ++p) {
    absl::StrAppend(&gp, p == 0 ? "" : ", \\\n     ", "'", flags.out, "/", prefix,
                    ".csv' using (strcol(3) eq '", policies[p].name, "' ? $4 : NaN):5 with lines lw 2 title '",
                    policies[p].name, "'");
  }
  absl::StrAppend(&gp, ", \\\n     x with lines dt 2 lc 'gray' title 'arrived'\n");
  w = WriteFile(gp_path, gp);
  if (!w.ok()) {
    std::cerr << w.message() << "\n";
    return 1;
  }
  if (flags.plot) {
    const std::string cmd = absl::StrCat("gnuplot '", gp_path, "'");
    if (std::system(cmd.c_str()) != 0) {
      std::cerr << "warning: gnuplot failed; the script is " << gp_path << "\n";
    } else {
      std::cout << "plot: " << png_path << "\n";
    }
  }
  std::cout << "csv: " << flags.out << "/" << prefix << ".csv\n";
  return 0;
}

}  // namespace
}  // namespace duet::sim

int main(int argc, char** argv) {
  duet::sim::Flags flags;
  CLI::App app{"duet-sim: replay a GPU trace through duet's ledger and placement policies"};
  app.add_option("--trace-dir", flags.trace_dir, "the full trace's folder")->capture_default_str();
  app.add_option("--nodes", flags.nodes, "node list CSV (default: in --trace-dir)");
  app.add_option("--pods", flags.pods, "pod list CSV (default: in --trace-dir)");
  app.add_option("--seed", flags.seed, "first shuffle seed")->capture_default_str();
  app.add_option("--runs", flags.runs, "seeds seed..seed+runs-1; results are medians")
      ->capture_default_str();
  app.add_option("--max-arrival", flags.max_arrival, "stop when requests reach this x capacity")
      ->capture_default_str();
  app.add_option("--step", flags.step, "record every step x capacity")->capture_default_str();
  app.add_option("--mapping", flags.mapping,
                 "default | all-k8s | all-slurm | k8s=QOS[+QOS...]; a pod with no QoS (blank, "
                 "or no qos column): all-k8s and all-slurm send it with the rest, default and "
                 "k8s=... refuse the pod list unless k8s= lists none (then Kubernetes)")
      ->capture_default_str();
  app.add_option("--policies", flags.policies,
                 "comma list: duet, fgd, best-fit, most-allocated, spread, static, static-duet, "
                 "static-k8s:POLICY, static-duet-slurm, static-duet-own")
      ->capture_default_str();
  app.add_option("--out", flags.out, "output directory")->capture_default_str();
  app.add_option("--coverage", flags.coverage, "workload shapes cover this share of pods")
      ->capture_default_str();
  app.add_option("--workload", flags.workload,
                 "online: the policies score against a model learned from the arrivals so far "
                 "(what duet-bridge does); oracle: against the whole trace's shapes")
      ->capture_default_str();
  app.add_option("--ties", flags.ties,
                 "Kubernetes pods: first (the lowest node index wins a tie) or random (drawn, as "
                 "kube-scheduler draws among equal totals)")
      ->capture_default_str();
  app.add_option("--half-life", flags.half_life,
                 "online model: half-life in arrivals (0: no decay)")
      ->capture_default_str();
  app.add_option("--max-shapes", flags.max_shapes, "online model: shapes exported at most")
      ->capture_default_str();
  app.add_option("--min-change", flags.min_change,
                 "online model: a new snapshot only when the weights move by this much (0: "
                 "after every arrival)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--jobs", flags.jobs, "replays run in parallel")->capture_default_str();
  app.add_flag("--quick", flags.quick,
               "CI size: every 12th node, one seed; without the full trace, the excerpt in "
               "bench/sim/testdata");
  app.add_flag("!--no-plot", flags.plot, "skip running gnuplot");
  app.add_flag("!--no-score-memo", flags.score_memo,
               "ask the extender's SelectNode about every node at every decision (its own cost), "
               "instead of reusing a node's answer while the node and the workload are unchanged "
               "(the same decisions)");
  app.add_flag("--check-score-memo", flags.check_score_memo,
               "also ask SelectNode at every decision and fail on any difference (tests)");
  app.add_option("--gangs", flags.gangs,
                 "SHARE,MIN-MAX[,GAP]: that share of the multi-GPU arrivals the mapping sends to "
                 "Kubernetes each start a gang of MIN..MAX members (copies of the pod), one "
                 "every GAP arrivals (default 1); off when empty (README)");
  app.add_option("--gang-policies", flags.gang_policies,
                 "with --gangs: per-pod, duet, duet-flat (duet without topology); each policy "
                 "runs once per gang policy, named POLICY/GANG-POLICY")
      ->capture_default_str();
  app.add_option("--topology", flags.topology,
                 "with --gangs: CLIQUE,SUBBLOCK,BLOCK nodes each, by node index")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const bool trace_files = flags.nodes.empty() && flags.pods.empty();
  if (flags.nodes.empty()) flags.nodes = flags.trace_dir + "/openb_node_list_gpu_node.csv";
  if (flags.pods.empty()) flags.pods = flags.trace_dir + "/openb_pod_list_default.csv";
  if (flags.quick) {
    flags.runs = 1;
    flags.node_stride = 12;
    // A fresh clone has no full trace: the excerpt shipped in the repository
    // is already the quick cluster (every 12th node), taken whole.
    if (trace_files && !std::filesystem::exists(flags.nodes)) {
      std::cout << "no trace at " << flags.nodes << "; replaying the excerpt in "
                << DUET_SIM_TESTDATA << "\n";
      flags.nodes = DUET_SIM_TESTDATA "/openb_node_list_gpu_node.csv";
      flags.pods = DUET_SIM_TESTDATA "/openb_pod_list_default.csv";
      flags.node_stride = 1;
    }
  }
  return duet::sim::Run(flags);
}
