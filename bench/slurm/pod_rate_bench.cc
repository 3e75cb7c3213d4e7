// pod_rate_bench: pods per second through duet, end to end (issue 28 item 2).
//
// N pending one-GPU pods go through the real extender server over loopback
// HTTP as kube-scheduler drives it: /filter (every node's name), /prioritize
// (the names that passed), /bind to the best-scored node, from --clients
// clients at once (kube-scheduler binds in parallel). A bind that is refused
// (the node filled up between the filter and the bind) starts the pod over
// from the filter, as kube-scheduler's retry does. The Kubernetes side is an
// in-process PodApi that answers GETs and counts Binding POSTs.
//
// Configurations, run side by side in one process, each from a fresh ledger
// and an empty cluster:
//   ledger   duet without Slurm: the bind holds the devices in the ledger
//            only (no placeholder maker)
//   slurm    duet with Slurm: the bind's hold is a placeholder allocation
//            (bridge/slurm Placeholders + LibSlurmClient) on the real
//            slurmctld named by $SLURM_CONF, recorded in the ledger before
//            the bind answers
//   direct   no duet: --clients threads call LibSlurmClient::
//            AllocatePlaceholder for N one-GPU placeholders (round-robin over
//            the nodes), the same requests the slurm configuration makes:
//            what slurmctld alone allows at this concurrency
// After each slurm/direct run every placeholder job is cancelled and the
// run waits until Slurm has none left.
//
//   pod_rate_bench --nodes pr0,pr1,... [--gpus 128] [--pods 100,1000]
//                  [--reps 3] [--clients 16] [--threads 2]
//                  [--bind-threads 2,16] [--configs ledger,slurm,direct]
//
// --threads is the extender server's io threads; --bind-threads the sizes
// of the pool its binds run on (ServerOptions::bind_threads), each run as
// its own configuration for ledger and slurm; --clients a list too (each
// a configuration).
// Prints one JSON line per run, then a markdown table of medians over
// --reps (pods/s from the first filter to the last bind answer; /bind
// p50/p99 ms; retries; slurmctld's CPU ms per pod when
// $DUET_BENCH_CTLD_PID names it). Each node must exist in Slurm with --gpus GPUs (and
// CPUs and memory for as many one-CPU placeholders) for slurm/direct.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/common/quantile.h"
#include "bridge/slurm/libslurm_client.h"
#include "bridge/slurm/placeholders.h"
#include "k8s_adapter/extender/server.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "tests/k8s_adapter/extender/http_client.h"

namespace duet {
namespace {

using json = nlohmann::json;
using extender::testing::HttpClient;

constexpr char kNamespace[] = "bench";

std::string PodName(int i) { return absl::StrCat("p", i); }
std::string PodUid(int i) { return absl::StrCat("uid-", i); }

json PodJson(int i, const std::string& node) {
  json pod = {{"kind", "Pod"},
              {"apiVersion", "v1"},
              {"metadata", {{"name", PodName(i)}, {"namespace", kNamespace}, {"uid", PodUid(i)}}},
              {"spec",
               {{"schedulerName", "duet"},
                {"containers",
                 {{{"name", "c"},
                   {"image", "i"},
                   {"resources", {{"limits", {{"nvidia.com/gpu", "1"}, {"cpu", "1"}}}}}}}}}}};
  if (!node.empty()) pod["spec"]["nodeName"] = node;
  return pod;
}

// The API server: GETs of the bench's pods, Binding POSTs counted and
// remembered (a bound pod's GET names its node).
class CountingPodApi final : public extender::PodApi {
 public:
  absl::StatusOr<json> GetPod(const std::string& ns, const std::string& name) override {
    int i = 0;
    if (ns != kNamespace || name.size() < 2 || !absl::SimpleAtoi(name.substr(1), &i)) {
      return absl::NotFoundError(name);
    }
    std::string node;
    {
      absl::MutexLock l(&mu_);
      auto it = bound_.find(i);
      if (it != bound_.end()) node = it->second;
    }
    return PodJson(i, node);
  }
  absl::Status Bind(const std::string& ns, const std::string& name, const std::string&,
                    const std::string& node) override {
    int i = 0;
    if (ns != kNamespace || !absl::SimpleAtoi(name.substr(1), &i)) return absl::NotFoundError(name);
    absl::MutexLock l(&mu_);
    if (!bound_.emplace(i, node).second) return absl::AbortedError("already bound");
    ++binds_;
    return absl::OkStatus();
  }
  int binds() {
    absl::MutexLock l(&mu_);
    return binds_;
  }

 private:
  absl::Mutex mu_;
  std::map<int, std::string> bound_ ABSL_GUARDED_BY(mu_);
  int binds_ ABSL_GUARDED_BY(mu_) = 0;
};

struct Flags {
  std::vector<std::string> nodes;
  int gpus = 128;
  std::vector<int> pods = {100, 1000};
  int reps = 3;
  std::vector<int> clients = {16};
  int threads = 2;
  std::vector<int> bind_threads = {16};
  std::vector<std::string> configs = {"ledger", "slurm", "direct"};
};

struct RunResult {
  double pods_per_s = 0;
  double bind_p50_ms = 0;
  double bind_p99_ms = 0;
  int retries = 0;
  double ctld_cpu_ms_per_pod = 0;  // slurmctld's CPU time over the run, per pod
  bool ok = false;
};

// slurmctld's CPU seconds so far ($DUET_BENCH_CTLD_PID's utime + stime), 0
// without one.
double CtldCpuSeconds() {
  const char* pid = std::getenv("DUET_BENCH_CTLD_PID");
  if (pid == nullptr) return 0;
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the ")" that ends the command name: state is field 3, utime 14, stime 15.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields = absl::StrSplit(text.substr(close + 2), ' ');
  double utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtod(fields[11], &utime) ||
      !absl::SimpleAtod(fields[12], &stime)) {
    return 0;
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

NodeSpec GpuNode(const std::string& name, int gpus) {
  NodeSpec s;
  s.name = name;
  s.cpus = static_cast<uint32_t>(gpus);
  s.memory_mib = 100ull * static_cast<uint64_t>(gpus) + 1024;
  s.pool = "bench";
  for (int i = 0; i < gpus; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kGpu;
    d.index = static_cast<uint32_t>(i);
    d.model = "h100";
    s.devices.push_back(d);
  }
  return s;
}

// Cancels every job in `jobs` (from --clients threads) and waits until
// Slurm runs none of them.
bool CancelAll(LibSlurmClient* slurm, const std::vector<uint32_t>& jobs, int clients) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < clients; ++t) {
    threads.emplace_back([&] {
      for (size_t i = next++; i < jobs.size(); i = next++) {
        if (absl::Status s = slurm->KillJob(jobs[i]); !s.ok()) {
          std::fprintf(stderr, "cancel %u: %s\n", jobs[i], s.ToString().c_str());
          failed = true;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  for (;;) {
    absl::StatusOr<std::vector<SlurmJobInfo>> all = slurm->ListJobs();
    if (all.ok() &&
        std::none_of(all->begin(), all->end(), [](const SlurmJobInfo& j) { return j.live(); })) {
      return !failed;
    }
    if (absl::Now() > deadline) {
      std::fprintf(stderr, "placeholder jobs still live after 120 s\n");
      return false;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// One pod from filter to bound; false on an error that is not a refusal.
bool Schedule(HttpClient& c, int i, const std::string& names, std::vector<double>* bind_ms,
              std::atomic<int>* retries) {
  const json pod = PodJson(i, "");
  const std::string filter_body =
      absl::StrCat(R"({"Pod":)", pod.dump(), R"(,"Nodes":null,"NodeNames":)", names, "}");
  for (int attempt = 0; attempt < 50; ++attempt) {
    if (attempt > 0) retries->fetch_add(1);
    auto r = c.Post("/duet/filter", filter_body);
    if (!r.ok() || r->status != 200) return false;
    json passed = json::parse(r->body)["NodeNames"];
    if (!passed.is_array() || passed.empty()) {
      std::fprintf(stderr, "pod %d: no node passes the filter: %s\n", i, r->body.c_str());
      return false;
    }
    json prio = {{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", passed}};
    r = c.Post("/duet/prioritize", prio.dump());
    if (!r.ok() || r->status != 200) return false;
    std::string best;
    int64_t best_score = -1;
    for (const json& h : json::parse(r->body)) {
      if (h["Score"].get<int64_t>() > best_score) {
        best_score = h["Score"].get<int64_t>();
        best = h["Host"].get<std::string>();
      }
    }
    json bind = {{"PodName", PodName(i)},
                 {"PodNamespace", kNamespace},
                 {"PodUID", PodUid(i)},
                 {"Node", best}};
    const absl::Time t = absl::Now();
    r = c.Post("/duet/bind", bind.dump());
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - t);
    if (!r.ok() || r->status != 200) return false;
    const json result = json::parse(r->body);
    bind_ms->push_back(ms);
    if (!result.contains("Error") || result["Error"].get<std::string>().empty()) return true;
  }
  std::fprintf(stderr, "pod %d: refused 50 times\n", i);
  return false;
}

RunResult RunStream(const Flags& f, const std::string& config, int n, int clients, int bind_threads,
                    LibSlurmClient* slurm) {
  RunResult out;
  Ledger ledger;
  for (const std::string& node : f.nodes) {
    if (!ledger.UpsertNode(GpuNode(node, f.gpus)).ok()) return out;
  }
  std::unique_ptr<Placeholders> placeholders;
  if (config == "slurm") placeholders = std::make_unique<Placeholders>(&ledger, slurm);
  CountingPodApi api;
  extender::Extender ext(&ledger, placeholders.get(), &api, extender::ExtenderOptions{});
  extender::ServerOptions so;
  so.threads = f.threads;
  so.bind_threads = bind_threads;
  auto server = extender::ExtenderServer::Start(&ext, so);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return out;
  }
  const std::string names = json(f.nodes).dump();

  std::atomic<int> next{0};
  std::atomic<int> retries{0};
  std::atomic<bool> failed{false};
  std::vector<std::vector<double>> per_client(static_cast<size_t>(clients));
  std::vector<std::thread> threads;
  const double cpu0 = CtldCpuSeconds();
  const absl::Time start = absl::Now();
  for (int t = 0; t < clients; ++t) {
    threads.emplace_back([&, t] {
      HttpClient c((*server)->port());
      for (int i = next++; i < n && !failed; i = next++) {
        if (!Schedule(c, i, names, &per_client[static_cast<size_t>(t)], &retries)) failed = true;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  out.ctld_cpu_ms_per_pod = (CtldCpuSeconds() - cpu0) * 1000 / n;
  (*server)->Stop();

  std::vector<double> bind_ms;
  for (const auto& v : per_client) bind_ms.insert(bind_ms.end(), v.begin(), v.end());
  // Every pod bound exactly once, each with its own holding in the ledger.
  size_t held = 0;
  std::vector<uint32_t> jobs;
  for (const std::string& node : f.nodes) {
    for (const Holding& h : ledger.ListHoldings(node)) {
      ++held;
      if (h.owner.kind == OwnerKind::kPlaceholder) jobs.push_back(h.owner.job_id);
    }
  }
  out.ok = !failed && api.binds() == n && held == static_cast<size_t>(n) &&
           (config != "slurm" || jobs.size() == static_cast<size_t>(n));
  if (!out.ok) {
    std::fprintf(stderr, "%s n=%d: binds %d, holdings %zu, placeholders %zu\n", config.c_str(), n,
                 api.binds(), held, jobs.size());
  }
  if (config == "slurm" && !CancelAll(slurm, jobs, 16)) out.ok = false;
  out.pods_per_s = n / seconds;
  out.bind_p50_ms = bench::Quantile(bind_ms, 0.5);
  out.bind_p99_ms = bench::Quantile(bind_ms, 0.99);
  out.retries = retries;
  return out;
}

// N placeholders straight through LibSlurmClient from --clients threads.
RunResult RunDirect(const Flags& f, int n, int clients, LibSlurmClient* slurm) {
  RunResult out;
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  std::vector<uint32_t> jobs;
  std::vector<double> ms;
  std::vector<std::thread> threads;
  const double cpu0 = CtldCpuSeconds();
  const absl::Time start = absl::Now();
  for (int t = 0; t < clients; ++t) {
    threads.emplace_back([&] {
      for (int i = next++; i < n && !failed; i = next++) {
        SlurmAllocRequest req;
        req.node = f.nodes[static_cast<size_t>(i) % f.nodes.size()];
        req.gpus = 1;
        req.cpus = 1;
        req.job_name = absl::StrCat(kPlaceholderJobPrefix, kNamespace, "/", PodName(i));
        req.comment = absl::StrCat(kPlaceholderCommentPrefix, "uid=", PodUid(i), " ns=", kNamespace,
                                   " name=", PodName(i));
        const absl::Time t0 = absl::Now();
        absl::StatusOr<SlurmAllocation> a = slurm->AllocatePlaceholder(req);
        const double one = absl::ToDoubleMilliseconds(absl::Now() - t0);
        if (!a.ok()) {
          std::fprintf(stderr, "allocate: %s\n", a.status().ToString().c_str());
          failed = true;
          continue;
        }
        absl::MutexLock l(&mu);
        jobs.push_back(a->job_id);
        ms.push_back(one);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  out.ctld_cpu_ms_per_pod = (CtldCpuSeconds() - cpu0) * 1000 / n;
  out.ok = !failed && CancelAll(slurm, jobs, 16);
  out.pods_per_s = n / seconds;
  out.bind_p50_ms = bench::Quantile(ms, 0.5);
  out.bind_p99_ms = bench::Quantile(ms, 0.99);
  return out;
}

int Run(const Flags& f) {
  std::unique_ptr<LibSlurmClient> slurm;
  for (const std::string& c : f.configs) {
    if (c != "ledger" && slurm == nullptr) slurm = std::make_unique<LibSlurmClient>();
  }
  // (n, config) -> runs
  std::map<std::pair<int, std::string>, std::vector<RunResult>> runs;
  for (int n : f.pods) {
    for (int rep = 0; rep < f.reps; ++rep) {
      for (int clients : f.clients) {
        for (const std::string& config : f.configs) {
          // The bind pool matters only where there is an extender.
          for (int bt : config == "direct" ? std::vector<int>{0} : f.bind_threads) {
            const std::string c = config == "direct"
                                      ? absl::StrCat(config, " (", clients, " clients)")
                                      : absl::StrCat(config, " (", clients, " clients, bind pool ",
                                                     bt > 0 ? bt : f.threads, ")");
            RunResult r = config == "direct" ? RunDirect(f, n, clients, slurm.get())
                                             : RunStream(f, config, n, clients, bt, slurm.get());
            if (!r.ok) return 1;
            std::printf("%s\n", json{{"config", c},
                                     {"pods", n},
                                     {"rep", rep},
                                     {"clients", clients},
                                     {"threads", f.threads},
                                     {"pods_per_s", r.pods_per_s},
                                     {"bind_ms", {{"p50", r.bind_p50_ms}, {"p99", r.bind_p99_ms}}},
                                     {"retries", r.retries},
                                     {"slurmctld_cpu_ms_per_pod", r.ctld_cpu_ms_per_pod}}
                                    .dump()
                                    .c_str());
            std::fflush(stdout);
            runs[{n, c}].push_back(r);
          }
        }
      }
    }
  }
  std::printf(
      "\n| pods | configuration | pods/s | /bind p50 ms | /bind p99 ms | retries | slurmctld CPU "
      "ms/pod |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const auto& [key, rs] : runs) {
    std::vector<double> rate, p50, p99, retries, cpu;
    for (const RunResult& r : rs) {
      rate.push_back(r.pods_per_s);
      p50.push_back(r.bind_p50_ms);
      p99.push_back(r.bind_p99_ms);
      retries.push_back(r.retries);
      cpu.push_back(r.ctld_cpu_ms_per_pod);
    }
    std::printf("| %d | %s | %.0f | %.2f | %.2f | %.0f | %.2f |\n", key.first, key.second.c_str(),
                bench::Median(rate), bench::Median(p50), bench::Median(p99), bench::Median(retries),
                bench::Median(cpu));
  }
  return 0;
}

}  // namespace
}  // namespace duet

int main(int argc, char** argv) {
  // Refused binds (a node filled up between filter and bind) are expected
  // here and counted as retries.
  spdlog::set_level(spdlog::level::err);
  duet::Flags f;
  auto ints = [](const std::string& v, std::vector<int>* out) {
    out->clear();
    for (absl::string_view s : absl::StrSplit(v, ',')) {
      int n = 0;
      if (!absl::SimpleAtoi(s, &n) || n < 1) return false;
      out->push_back(n);
    }
    return true;
  };
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    bool ok = true;
    if (k == "--nodes") {
      f.nodes = absl::StrSplit(v, ',', absl::SkipEmpty());
    } else if (k == "--gpus") {
      ok = absl::SimpleAtoi(v, &f.gpus) && f.gpus > 0;
    } else if (k == "--pods") {
      ok = ints(v, &f.pods);
    } else if (k == "--reps") {
      ok = absl::SimpleAtoi(v, &f.reps) && f.reps > 0;
    } else if (k == "--clients") {
      ok = ints(v, &f.clients);
    } else if (k == "--threads") {
      ok = absl::SimpleAtoi(v, &f.threads) && f.threads > 0;
    } else if (k == "--bind-threads") {
      ok = ints(v, &f.bind_threads);
    } else if (k == "--configs") {
      f.configs = absl::StrSplit(v, ',', absl::SkipEmpty());
      for (const std::string& c : f.configs)
        ok = ok && (c == "ledger" || c == "slurm" || c == "direct");
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "bad flag %s %s\n", k.c_str(), v.c_str());
      return 2;
    }
  }
  if (f.nodes.empty()) {
    std::fprintf(stderr, "usage: see the header of bench/slurm/pod_rate_bench.cc\n");
    return 2;
  }
  return duet::Run(f);
}
