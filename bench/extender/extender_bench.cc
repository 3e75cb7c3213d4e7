// Scheduler extender over loopback HTTP: filter + prioritize per scheduling
// decision, against an echo of the same payload on the same server in the
// same run (what HTTP and the transfer alone cost).
//
// A ledger of --nodes H100 nodes (bench/common/h100_node.h) with Slurm jobs
// holding 0..8 GPUs per node (node i: i % 9), the golden v1.Pod of
// tests/k8s_adapter/extender/testdata/filter_args.json (4 H100s), and for each
// --names N a NodeNames list of N nodes spread over the cluster (what
// kube-scheduler sends with nodeCacheCapable; at 5,000 nodes its default
// percentageOfNodesToScore makes that about 500). A decision is one /filter
// with the N names and one /prioritize with the names that passed, as
// kube-scheduler does.
//
//   extender_bench [--nodes 5000] [--names 5000,500] [--decisions 2000]
//                  [--threads 2] [--clients 2] [--shapes 0]
//
// --shapes N > 0 scores against a workload of N pod shapes (Zipf-weighted:
// whole GPUs 1..8 and shares of one GPU, with CPU requests), as duet-bridge
// does with the workload it learns; 0 scores each pod against its own shape.
//
// --online MIN_CHANGE (with --shapes N) scores as duet-bridge does: against a
// WorkloadModel (the product's defaults: refresh 1 s, half-life 6 h) with
// placement.workload.min_change MIN_CHANGE, warmed with 20 N arrivals drawn
// from those N shapes, while a thread keeps observing one more such arrival
// every --arrival_us microseconds (default 1000: a busy cluster's pod
// stream) during the timed decisions. Compare --online 0 (a new snapshot,
// and an empty fragmentation memo, after every refresh) with --online 0.02
// (the default) run after run.
//
// Per configuration it prints one JSON line: per-call p50/p99 of filter,
// prioritize and echo (one client, closed loop), decisions/s with one
// client and with --clients clients at once.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/common/h100_node.h"
#include "bench/common/quantile.h"
#include "bridge/placement/workload_model.h"
#include "k8s_adapter/extender/server.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "tests/k8s_adapter/extender/http_client.h"

namespace duet {
namespace extender {
namespace {

using json = nlohmann::json;
using testing::HttpClient;

class NoApi final : public PodApi {
 public:
  absl::StatusOr<json> GetPod(const std::string&, const std::string&) override {
    return absl::UnimplementedError("benchmark");
  }
  absl::Status Bind(const std::string&, const std::string&, const std::string&, const std::string&) override {
    return absl::UnimplementedError("benchmark");
  }
};

struct Flags {
  int nodes = 5000;
  std::vector<int> names = {5000, 500};
  int decisions = 2000;
  int threads = 2;
  int clients = 2;
  int shapes = 0;
  double online = -1;  // min_change; < 0: a fixed workload (--shapes) or none
  int arrival_us = 1000;
};

// `n` distinct shapes, the i-th with weight 1 / (i + 1).
placement::Workload SyntheticWorkload(int n) {
  std::vector<placement::Workload::Shape> shapes;
  const uint32_t counts[] = {1, 2, 4, 8, 0, 3, 6};
  for (int i = 0; static_cast<int>(shapes.size()) < n; ++i) {
    placement::PodRequest r;
    r.kind = DeviceKind::kGpu;
    r.count = counts[i % 7];
    // Every third single-GPU shape is a share (100..900 milli).
    r.milli = r.count == 1 && (i / 7) % 3 == 1 ? 100 * (1 + (i / 21) % 9) : kWholeDevice;
    r.cpu_milli = 1000 * static_cast<uint64_t>(i / 7 % 24);
    shapes.push_back({r, 1.0 / (shapes.size() + 1)});
  }
  return placement::Workload(std::move(shapes));
}

std::string ReadGoldenPod() {
  FILE* f = std::fopen(DUET_EXTENDER_GOLDEN, "r");
  if (f == nullptr) return "";
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

double Micros(absl::Time start) { return absl::ToDoubleMicroseconds(absl::Now() - start); }

// One decision: filter, then prioritize the passing names. Returns false on
// any error.
bool Decide(HttpClient& c, const std::string& filter_body, const json& pod, double* filter_us,
            double* prio_us) {
  // Times are of the HTTP exchanges only, not of this client's JSON work.
  absl::Time t = absl::Now();
  auto r = c.Post("/duet/filter", filter_body);
  *filter_us = Micros(t);
  if (!r.ok() || r->status != 200) return false;
  json result = json::parse(r->body);
  json prio = {{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", std::move(result["NodeNames"])}};
  const std::string prio_body = prio.dump();
  t = absl::Now();
  r = c.Post("/duet/prioritize", prio_body);
  if (!r.ok() || r->status != 200) return false;
  *prio_us = Micros(t);
  return true;
}

int Run(const Flags& f) {
  spdlog::set_level(spdlog::level::warn);
  const std::string golden = ReadGoldenPod();
  if (golden.empty()) {
    std::fprintf(stderr, "cannot read %s\n", DUET_EXTENDER_GOLDEN);
    return 1;
  }
  const json pod = json::parse(golden)["Pod"];

  Ledger ledger;
  for (int i = 0; i < f.nodes; ++i) {
    if (!ledger.UpsertNode(bench::H100Node(i)).ok()) return 1;
    const uint32_t held = static_cast<uint32_t>(i % 9);
    if (held == 0) continue;
    HoldRequest h;
    h.node = bench::H100NodeName(i);
    h.owner = Owner::SlurmJob(static_cast<uint32_t>(1000 + i));
    for (uint32_t g = 0; g < held; ++g) h.devices.push_back({DeviceKind::kGpu, g, kWholeDevice});
    if (!ledger.Hold(h).ok()) return 1;
  }
  NoApi api;
  const auto workload =
      std::make_shared<const placement::Workload>(SyntheticWorkload(f.shapes));
  ExtenderOptions eo;
  if (f.shapes > 0 && f.online < 0) eo.workload = [workload] { return workload; };
  // --online: the learned model, fed a stream drawn from the same shapes.
  std::unique_ptr<placement::WorkloadModel> model;
  std::atomic<bool> stream_on{false}, stream_stop{false};
  std::thread stream;
  uint64_t arrivals = 0;
  if (f.shapes > 0 && f.online >= 0) {
    placement::WorkloadModelOptions mo;
    mo.min_change = f.online;
    model = std::make_unique<placement::WorkloadModel>(mo);
    std::vector<double> cumulative;
    for (const placement::Workload::Shape& sh : workload->shapes()) {
      cumulative.push_back((cumulative.empty() ? 0 : cumulative.back()) + sh.weight);
    }
    auto draw = [workload, cumulative](uint64_t i) {
      // A fixed low-discrepancy sequence: the same stream in every run.
      const double u = std::fmod(static_cast<double>(i) * 0.6180339887498949, 1.0) *
                       cumulative.back();
      const size_t k = std::upper_bound(cumulative.begin(), cumulative.end(), u) -
                       cumulative.begin();
      return workload->shapes()[std::min(k, cumulative.size() - 1)].request;
    };
    for (; arrivals < 20 * static_cast<uint64_t>(f.shapes); ++arrivals) {
      model->Observe(absl::StrCat("warm-", arrivals), draw(arrivals), absl::Now());
    }
    placement::WorkloadModel* m = model.get();
    eo.workload = [m] { return m->Current(absl::Now()); };
    stream = std::thread([&, m, draw] {
      uint64_t i = arrivals;
      while (!stream_stop) {
        if (stream_on) {
          m->Observe(absl::StrCat("pod-", i), draw(i), absl::Now());
          ++i;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(f.arrival_us));
      }
    });
  }
  // Stops the stream on every way out (the early returns on an error too).
  struct StreamStop {
    std::atomic<bool>* stop;
    std::thread* thread;
    ~StreamStop() {
      *stop = true;
      if (thread->joinable()) thread->join();
    }
  } stream_stopper{&stream_stop, &stream};
  Extender extender(&ledger, nullptr, &api, eo);
  ServerOptions so;
  so.threads = f.threads;
  so.enable_echo = true;
  auto server = ExtenderServer::Start(&extender, so);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  const int port = (*server)->port();

  for (int n : f.names) {
    n = std::min(n, f.nodes);
    json names = json::array();
    for (int k = 0; k < n; ++k) {
      names.push_back(bench::H100NodeName(static_cast<int>(static_cast<int64_t>(k) * f.nodes / n)));
    }
    const std::string filter_body = json{{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", names}}.dump();

    // Where a filter's server time goes, without HTTP (means over 50 runs).
    {
      const int kRuns = 50;
      const absl::StatusOr<ExtenderArgs> args0 = ParseExtenderArgs(json::parse(filter_body));
      if (!args0.ok()) return 1;
      double parse = 0, parse_fast = 0, logic = 0, serialize = 0, serialize_direct = 0,
             prio_logic = 0;
      for (int i = 0; i < kRuns; ++i) {
        absl::Time t = absl::Now();
        absl::StatusOr<ExtenderArgs> args = ParseExtenderArgs(json::parse(filter_body));
        parse += Micros(t);
        if (!args.ok()) return 1;
        t = absl::Now();
        // What the server uses for this shape of body (types.h).
        std::optional<ExtenderArgs> fast_args = ParseExtenderArgsFast(filter_body);
        parse_fast += Micros(t);
        if (!fast_args.has_value() || fast_args->node_names != args->node_names) return 1;
        t = absl::Now();
        FilterResult fr = extender.Filter(*args);
        logic += Micros(t);
        t = absl::Now();
        std::string out = FilterResultJson(fr, &*args).dump();
        serialize += Micros(t);
        t = absl::Now();
        // What the server uses (types.h): the same bytes without the DOM.
        std::string direct = FilterResultBody(fr, &*args);
        serialize_direct += Micros(t);
        if (direct != out) return 1;
        t = absl::Now();
        std::vector<HostPriority> pr = extender.Prioritize(*args);
        prio_logic += Micros(t);
        if (out.empty() || pr.size() != args->node_names.size()) return 1;
      }
      // Where a prioritize's server time goes, without HTTP: the body the
      // client sends after this filter (its passing names), through the
      // server's handler, and the handler's parts.
      FilterResult passing = extender.Filter(*args0);
      const std::string prio_body =
          json{{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", passing.node_names}}.dump();
      Handler handler(&extender, "/duet", false);
      double p_handler = 0, p_parse = 0, p_scores = 0, p_body = 0;
      for (int i = 0; i < kRuns; ++i) {
        absl::Time t = absl::Now();
        HttpReply reply = handler.Handle("POST", "/duet/prioritize", prio_body);
        p_handler += Micros(t);
        // The handler's path (server.cc): the names as views, the pod's
        // request from the extender's cache (the handler's call above read
        // this pod).
        t = absl::Now();
        std::optional<PrioritizeArgs> pa = ParsePrioritizeArgsFast(prio_body);
        p_parse += Micros(t);
        if (!pa.has_value()) return 1;
        t = absl::Now();
        std::optional<std::vector<int64_t>> cached =
            extender.PrioritizeScoresFromText(pa->pod_text, pa->node_names);
        p_scores += Micros(t);
        if (!cached.has_value()) return 1;
        const std::vector<int64_t>& scores = *cached;
        t = absl::Now();
        std::string b = PriorityListBodyOfViews(pa->node_names, scores);
        p_body += Micros(t);
        if (reply.status != 200 || b != reply.body) return 1;
      }
      std::printf("%s\n", json{{"names", n},
                               {"prioritize_names", passing.node_names.size()},
                               {"prioritize_handler_us", p_handler / kRuns},
                               {"prioritize_parse_us", p_parse / kRuns},
                               {"prioritize_scores_us", p_scores / kRuns},
                               {"prioritize_body_us", p_body / kRuns}}
                               .dump()
                               .c_str());
      std::printf("%s\n", json{{"names", n},
                               {"filter_parse_us", parse / kRuns},
                               {"filter_parse_fast_us", parse_fast / kRuns},
                               {"filter_logic_us", logic / kRuns},
                               {"filter_serialize_us", serialize / kRuns},
                               {"filter_serialize_direct_us", serialize_direct / kRuns},
                               {"prioritize_logic_us_all_names", prio_logic / kRuns}}
                               .dump()
                               .c_str());
    }

    // Warm-up, then one client: latencies.
    HttpClient c(port);
    double fu = 0, pu = 0;
    for (int i = 0; i < std::max(10, f.decisions / 20); ++i) {
      if (!Decide(c, filter_body, pod, &fu, &pu)) return 1;
    }
    std::vector<double> filter_us, prio_us, decision_us, echo_us;
    stream_on = true;
    absl::Time start = absl::Now();
    for (int i = 0; i < f.decisions; ++i) {
      if (!Decide(c, filter_body, pod, &fu, &pu)) return 1;
      filter_us.push_back(fu);
      prio_us.push_back(pu);
      decision_us.push_back(fu + pu);
    }
    const double one_client_rate = f.decisions / absl::ToDoubleSeconds(absl::Now() - start);
    stream_on = false;
    for (int i = 0; i < f.decisions; ++i) {
      absl::Time t = absl::Now();
      auto r = c.Post("/duet/_echo", filter_body);
      if (!r.ok() || r->status != 200 || r->body.size() != filter_body.size()) return 1;
      echo_us.push_back(Micros(t));
    }

    // --clients clients at once: throughput.
    std::atomic<int> left{f.decisions};
    std::atomic<bool> failed{false};
    start = absl::Now();
    std::vector<std::thread> threads;
    for (int t = 0; t < f.clients; ++t) {
      threads.emplace_back([&] {
        HttpClient cc(port);
        double a = 0, b = 0;
        while (left.fetch_sub(1) > 0) {
          if (!Decide(cc, filter_body, pod, &a, &b)) failed = true;
        }
      });
    }
    for (std::thread& t : threads) t.join();
    if (failed) return 1;
    const double multi_rate = f.decisions / absl::ToDoubleSeconds(absl::Now() - start);

    json out = {
        {"nodes", f.nodes},
        {"shapes", f.shapes},
        {"names", n},
        {"body_bytes", filter_body.size()},
        {"server_threads", f.threads},
        {"decisions", f.decisions},
        {"filter_us",
         {{"p50", bench::Quantile(filter_us, 0.5)}, {"p99", bench::Quantile(filter_us, 0.99)}}},
        {"prioritize_us",
         {{"p50", bench::Quantile(prio_us, 0.5)},
          {"p99", bench::Quantile(prio_us, 0.99)},
          {"p999", bench::Quantile(prio_us, 0.999)},
          {"max", bench::Quantile(prio_us, 1.0)}}},
        {"decision_us",
         {{"p50", bench::Quantile(decision_us, 0.5)}, {"p99", bench::Quantile(decision_us, 0.99)}}},
        {"echo_us",
         {{"p50", bench::Quantile(echo_us, 0.5)}, {"p99", bench::Quantile(echo_us, 0.99)}}},
        {"decisions_per_s_1_client", one_client_rate},
        {"decisions_per_s_clients", multi_rate},
        {"clients", f.clients}};
    if (model != nullptr) {
      out["online_min_change"] = f.online;
      out["arrival_us"] = f.arrival_us;
      out["model_shapes"] = model->stats(absl::Now()).exported;
    }
    std::printf("%s\n", out.dump().c_str());
    std::fflush(stdout);
  }
  (*server)->Stop();
  return 0;
}

}  // namespace
}  // namespace extender
}  // namespace duet

int main(int argc, char** argv) {
  duet::extender::Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    bool ok = true;
    if (k == "--nodes") {
      ok = absl::SimpleAtoi(v, &f.nodes);
    } else if (k == "--decisions") {
      ok = absl::SimpleAtoi(v, &f.decisions);
    } else if (k == "--threads") {
      ok = absl::SimpleAtoi(v, &f.threads);
    } else if (k == "--shapes") {
      ok = absl::SimpleAtoi(v, &f.shapes) && f.shapes >= 0;
    } else if (k == "--online") {
      ok = absl::SimpleAtod(v, &f.online) && f.online >= 0 && f.online <= 1;
    } else if (k == "--arrival_us") {
      ok = absl::SimpleAtoi(v, &f.arrival_us) && f.arrival_us > 0;
    } else if (k == "--clients") {
      ok = absl::SimpleAtoi(v, &f.clients);
    } else if (k == "--names") {
      f.names.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) {
        int n = 0;
        ok = ok && absl::SimpleAtoi(s, &n) && n > 0;
        f.names.push_back(n);
      }
    } else {
      ok = false;
    }
    if (!ok || f.nodes < 1 || f.decisions < 1 || f.threads < 1 || f.clients < 1) {
      std::fprintf(stderr, "bad flag %s %s\n", k.c_str(), v.c_str());
      return 2;
    }
  }
  if (f.online >= 0 && f.shapes == 0) {
    std::fprintf(stderr, "--online needs --shapes N > 0 (the shapes the pod stream draws from)\n");
    return 2;
  }
  return duet::extender::Run(f);
}
