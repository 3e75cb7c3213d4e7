// duet-bridge over gRPC on loopback: the cost of a holding register (Hold,
// durable before it answers) against an empty unary RPC on the same server.
//
// The server is the real one, duet::Bridge::Start, with its journal in a temp
// directory and a file inventory of --nodes nodes x 8 GPUs. The baseline is
// grpc.health.v1.Health/Check, served by the same server on the same threads.
// Every Hold is followed by a Release of the same holding (also durable), so
// the ledger never fills; each client slot works on its own node and alternates
// a Slurm step asking for any 2 GPUs (CountSelector) and a pod naming one GPU.
//
// Client modes: "sync1" and "sync4" (1 and 4 threads, one channel each,
// blocking calls), "async64" (64 calls always in flight on one channel, via
// the callback API; group commit shares one fsync among them). For each
// journal setting (fsync on / off) a bridge is started and, for each of --reps
// repetitions, every mode runs the baseline and then Hold+Release for
// --seconds each, so the two are measured side by side under the same load.
//
// Figures per (mode, RPC): medians over repetitions of RPC/s (every unary
// call counts, Hold and Release alike), and of each repetition's p50 / p99
// latency (Hold calls only for the Hold row). "ratio" is the median over
// repetitions of (Hold+Release RPC/s) / (Health RPC/s).
//
// Then, with --quiet-calls N (0: skipped), what a caller waits after a quiet
// spell: one channel, N calls of each of Health/Check, GetNode and Hold (its
// Release follows after another spell), each made --quiet-ms after the
// server last saw a call; p50, p99 and the slowest, in ms. A server whose
// threads sleep when idle shows it here and nowhere above.
//
//   grpc_benchmark [--seconds=2] [--reps=5] [--nodes=256]
//                  [--fsync=both|on|off] [--modes=sync1,sync4,async64]
//                  [--quiet-calls=0] [--quiet-ms=1050] [--dir=/var/tmp]
//                  [--unix-socket=PATH]
//   grpc_benchmark --server=ADDR [--quiet-calls=N] [--quiet-ms=1050]
//                  only the quiet-spell calls, against a running ledger
//                  service (node gke-a3-highgpu-pool-0; Slurm owners are
//                  sent with no credential): e.g. slurm_bench_tool serve
// Exit status 1 if any RPC failed.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "bench/common/quantile.h"
#include "bridge/config/config.h"
#include "bridge/server/bridge.h"
#include "duet/v1/duet.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using HealthStub = grpc::health::v1::Health::Stub;

constexpr int kGpus = 8;

std::string NodeName(int i) { return absl::StrCat("gke-a3-highgpu-pool-", i); }

std::string InventoryYaml(int nodes) {
  std::string y = "nodes:\n";
  for (int i = 0; i < nodes; ++i) {
    absl::StrAppend(&y, "  - name: ", NodeName(i),
                    "\n    cpus: 208\n    memory_mib: 1843200\n    pool: a3-highgpu\n",
                    "    gpus: {count: ", kGpus, ", model: nvidia-h100-80gb, nvlink_domain: clique-",
                    i / 18, "}\n");
  }
  return y;
}

// What one client slot (a thread, or one of the async calls in flight) does.
struct Work {
  v1::HoldRequest hold[2];  // [0] Slurm step, any 2 GPUs; [1] pod, one named GPU
  v1::ReleaseRequest release[2];

  explicit Work(int slot) {
    const std::string node = NodeName(slot);
    v1::HoldRequest& step = hold[0];
    step.set_node(node);
    step.mutable_owner()->mutable_slurm_step()->set_job_id(static_cast<uint32_t>(1000 + slot));
    step.mutable_owner()->mutable_slurm_step()->set_step_id(0);
    step.mutable_count()->set_kind(v1::DEVICE_KIND_GPU);
    step.mutable_count()->set_count(2);
    v1::HoldRequest& pod = hold[1];
    pod.set_node(node);
    v1::PodRef* ref = pod.mutable_owner()->mutable_pod();
    ref->set_uid(absl::StrCat("7c9e6679-7425-40de-944b-e07fc1f9", 10000000 + slot));
    ref->set_namespace_("team-ml");
    ref->set_name(absl::StrCat("trainer-", slot));
    v1::HeldDevice* d = pod.mutable_devices()->add_devices();
    d->set_kind(v1::DEVICE_KIND_GPU);
    d->set_index(static_cast<uint32_t>(slot % kGpus));
    for (int k = 0; k < 2; ++k) {
      release[k].set_node(node);
      *release[k].mutable_owner() = hold[k].owner();
    }
  }
};

// Latencies (microseconds) and counts of one client slot.
struct SlotStats {
  std::vector<double> lat_us;  // Health calls, or Hold calls
  uint64_t calls = 0;          // every RPC, Release included
  uint64_t errors = 0;
  std::string first_error;
  grpc::StatusCode first_code = grpc::StatusCode::OK;
  void Error(const grpc::Status& s) {
    if (errors++ > 0) return;
    first_error = absl::StrCat(s.error_code(), ": ", s.error_message());
    first_code = s.error_code();
  }
};

struct RunResult {
  double rpc_per_s = 0;
  double p50_us = 0;
  double p99_us = 0;
  uint64_t errors = 0;
  std::string first_error;
};

RunResult Summarize(std::vector<SlotStats>& slots, double seconds) {
  RunResult r;
  std::vector<double> all;
  uint64_t calls = 0;
  for (SlotStats& s : slots) {
    all.insert(all.end(), s.lat_us.begin(), s.lat_us.end());
    calls += s.calls;
    r.errors += s.errors;
    if (r.first_error.empty()) r.first_error = s.first_error;
  }
  r.rpc_per_s = seconds > 0 ? static_cast<double>(calls) / seconds : 0;
  r.p50_us = bench::Quantile(all, 0.50);
  r.p99_us = bench::Quantile(all, 0.99);
  return r;
}

double Micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

std::shared_ptr<grpc::Channel> NewChannel(const std::string& target, int id) {
  grpc::ChannelArguments args;
  // A distinct argument gives each channel its own connection.
  args.SetInt("duet.bench.channel", id);
  auto ch = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  ch->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return ch;
}

// Blocking calls from `threads` threads, each on its own channel and node.
RunResult RunSync(const std::string& target, bool hold, int threads, double seconds) {
  std::vector<SlotStats> stats(threads);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  Clock::time_point deadline;
  std::vector<double> elapsed(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto channel = NewChannel(target, t);
      auto ledger = v1::Ledger::NewStub(channel);
      auto health = grpc::health::v1::Health::NewStub(channel);
      Work work(t);
      SlotStats& st = stats[t];
      uint64_t i = 0;
      // One step: a Health call, or a Hold then its Release. Returns false on error.
      auto step = [&](bool record) {
        if (!hold) {
          grpc::ClientContext ctx;
          grpc::health::v1::HealthCheckRequest req;
          grpc::health::v1::HealthCheckResponse resp;
          const auto t0 = Clock::now();
          grpc::Status s = health->Check(&ctx, req, &resp);
          const auto t1 = Clock::now();
          if (!s.ok()) {
            st.Error(s);
            return false;
          }
          if (record) {
            st.lat_us.push_back(Micros(t0, t1));
            ++st.calls;
          }
          return true;
        }
        const int k = static_cast<int>(i++ % 2);
        grpc::ClientContext hctx;
        v1::HoldResponse hresp;
        const auto t0 = Clock::now();
        grpc::Status s = ledger->Hold(&hctx, work.hold[k], &hresp);
        const auto t1 = Clock::now();
        if (!s.ok()) {
          st.Error(s);
          return false;
        }
        grpc::ClientContext rctx;
        v1::ReleaseResponse rresp;
        s = ledger->Release(&rctx, work.release[k], &rresp);
        if (!s.ok() || !rresp.released()) {
          st.Error(s.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "nothing released") : s);
          return false;
        }
        if (record) {
          st.lat_us.push_back(Micros(t0, t1));
          st.calls += 2;
        }
        return true;
      };
      for (int w = 0; w < 20; ++w) {
        if (!step(false)) break;
      }
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      const auto start = Clock::now();
      while (Clock::now() < deadline) {
        if (!step(true)) break;
      }
      elapsed[t] = std::chrono::duration<double>(Clock::now() - start).count();
    });
  }
  while (ready.load() < threads) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(seconds));
  go.store(true);
  for (auto& th : pool) th.join();
  return Summarize(stats, *std::max_element(elapsed.begin(), elapsed.end()));
}

// `inflight` calls always outstanding on one channel (callback API): each slot
// issues its next call from the previous one's completion.
class AsyncRun {
 public:
  AsyncRun(const std::string& target, bool hold, int inflight)
      : hold_(hold),
        channel_(NewChannel(target, 1000)),
        ledger_(v1::Ledger::NewStub(channel_)),
        health_(grpc::health::v1::Health::NewStub(channel_)) {
    for (int s = 0; s < inflight; ++s) slots_.push_back(std::make_unique<Slot>(s));
  }

  RunResult Run(double seconds) {
    Go(std::min(0.2, seconds / 4), false);  // warm-up, not recorded
    const auto start = Clock::now();
    Go(seconds, true);
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    std::vector<SlotStats> stats;
    for (auto& s : slots_) stats.push_back(std::move(s->stats));
    return Summarize(stats, elapsed);
  }

 private:
  struct Slot {
    explicit Slot(int id) : work(id) {}
    Work work;
    uint64_t i = 0;
    bool releasing = false;
    std::unique_ptr<grpc::ClientContext> ctx;
    Clock::time_point t0;
    grpc::health::v1::HealthCheckRequest hreq;
    grpc::health::v1::HealthCheckResponse hresp;
    v1::HoldResponse hold_resp;
    v1::ReleaseResponse release_resp;
    SlotStats stats;
  };

  void Go(double seconds, bool record) {
    record_ = record;
    deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(seconds));
    active_ = static_cast<int>(slots_.size());
    for (auto& s : slots_) Issue(s.get());
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return active_ == 0; });
  }

  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--active_ == 0) cv_.notify_all();
  }

  void Issue(Slot* s) {
    // A slot stops between pairs, never holding a device.
    if (!s->releasing && Clock::now() >= deadline_) return Stop();
    s->ctx = std::make_unique<grpc::ClientContext>();
    s->t0 = Clock::now();
    if (!hold_) {
      health_->async()->Check(s->ctx.get(), &s->hreq, &s->hresp,
                              [this, s](grpc::Status st) { Done(s, st); });
    } else if (!s->releasing) {
      ledger_->async()->Hold(s->ctx.get(), &s->work.hold[s->i % 2], &s->hold_resp,
                             [this, s](grpc::Status st) { Done(s, st); });
    } else {
      ledger_->async()->Release(s->ctx.get(), &s->work.release[s->i % 2], &s->release_resp,
                                [this, s](grpc::Status st) { Done(s, st); });
    }
  }

  void Done(Slot* s, const grpc::Status& st) {
    const auto t1 = Clock::now();
    if (!st.ok()) {
      s->stats.Error(st);
      return Stop();
    }
    if (record_) {
      ++s->stats.calls;
      if (!s->releasing) s->stats.lat_us.push_back(Micros(s->t0, t1));
    }
    if (hold_) {
      if (s->releasing) ++s->i;
      s->releasing = !s->releasing;
    }
    Issue(s);
  }

  const bool hold_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Ledger::Stub> ledger_;
  std::unique_ptr<HealthStub> health_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::atomic<bool> record_{false};
  Clock::time_point deadline_;
  std::mutex mu_;
  std::condition_variable cv_;
  int active_ = 0;
};

RunResult RunMode(const std::string& target, const std::string& mode, bool hold, double seconds) {
  if (mode == "sync1") return RunSync(target, hold, 1, seconds);
  if (mode == "sync4") return RunSync(target, hold, 4, seconds);
  AsyncRun run(target, hold, 64);
  return run.Run(seconds);
}

// One call at a time on one channel, each `quiet_ms` after the last answer:
// latencies of `rpc` (Health/Check, GetNode or Hold; a Hold's Release
// is made after another quiet spell and not recorded).
SlotStats RunQuiet(const std::string& target, const std::string& rpc, int calls, int quiet_ms) {
  auto channel = NewChannel(target, 2000);
  auto ledger = v1::Ledger::NewStub(channel);
  auto health = grpc::health::v1::Health::NewStub(channel);
  Work work(0);
  SlotStats st;
  auto quiet = [&] { std::this_thread::sleep_for(std::chrono::milliseconds(quiet_ms)); };
  for (int i = 0; i < calls; ++i) {
    quiet();
    grpc::ClientContext ctx;
    grpc::Status s;
    const auto t0 = Clock::now();
    if (rpc == "Health/Check") {
      grpc::health::v1::HealthCheckRequest req;
      grpc::health::v1::HealthCheckResponse resp;
      s = health->Check(&ctx, req, &resp);
    } else if (rpc == "GetNode") {
      v1::GetNodeRequest req;
      req.set_name(NodeName(0));
      v1::Node resp;
      s = ledger->GetNode(&ctx, req, &resp);
    } else {
      v1::HoldResponse resp;
      s = ledger->Hold(&ctx, work.hold[0], &resp);
    }
    const auto t1 = Clock::now();
    if (!s.ok()) {
      st.Error(s);
      break;
    }
    st.lat_us.push_back(Micros(t0, t1));
    ++st.calls;
    if (rpc != "Hold") continue;
    quiet();
    grpc::ClientContext rctx;
    v1::ReleaseResponse rresp;
    s = ledger->Release(&rctx, work.release[0], &rresp);
    if (!s.ok() || !rresp.released()) {
      st.Error(s.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "nothing released") : s);
      break;
    }
  }
  return st;
}

// The quiet-spell table; returns the failed calls. A server without the
// health service (UNIMPLEMENTED) gets no Health/Check row.
uint64_t PrintQuiet(const std::string& target, int calls, int quiet_ms) {
  uint64_t errors = 0;
  printf("\nafter %d ms quiet, one call at a time (%d calls each), ms\n", quiet_ms, calls);
  printf("%-14s %10s %10s %10s\n", "rpc", "p50", "p99", "max");
  for (const char* rpc : {"Health/Check", "GetNode", "Hold"}) {
    SlotStats st = RunQuiet(target, rpc, calls, quiet_ms);
    if (st.errors > 0 && st.lat_us.empty() && st.first_code == grpc::StatusCode::UNIMPLEMENTED) {
      printf("%-14s %10s\n", rpc, "not served");
      continue;
    }
    if (st.errors > 0) {
      fprintf(stderr, "quiet %s: %s\n", rpc, st.first_error.c_str());
      errors += st.errors;
      continue;
    }
    printf("%-14s %10.2f %10.2f %10.2f\n", rpc, bench::Quantile(st.lat_us, 0.5) / 1000,
           bench::Quantile(st.lat_us, 0.99) / 1000, bench::Quantile(st.lat_us, 1) / 1000);
  }
  fflush(stdout);
  return errors;
}

struct Series {
  std::vector<double> rps, p50, p99;
  void Add(const RunResult& r) {
    rps.push_back(r.rpc_per_s);
    p50.push_back(r.p50_us);
    p99.push_back(r.p99_us);
  }
};

int Main(int argc, char** argv) {
  CLI::App app{"duet-bridge Hold over gRPC vs an empty unary RPC (Health/Check)"};
  double seconds = 2;
  int reps = 5;
  int nodes = 256;
  std::string fsync = "both";
  std::string modes_flag = "sync1,sync4,async64";
  std::string base_dir = fs::temp_directory_path().string();
  app.add_option("--seconds", seconds, "measured seconds per (mode, RPC, repetition)");
  app.add_option("--reps", reps, "repetitions (figures are medians)");
  app.add_option("--nodes", nodes, "inventory nodes (8 GPUs each; at least 64)");
  app.add_option("--fsync", fsync, "journal fsync: both, on or off")
      ->check(CLI::IsMember({"both", "on", "off"}));
  app.add_option("--modes", modes_flag, "comma-separated: sync1, sync4, async64");
  app.add_option("--dir", base_dir, "where the journal is written (the disk matters for fsync)");
  std::string unix_socket;
  app.add_option("--unix-socket", unix_socket,
                 "call the bridge on this unix socket (grpc.unix_socket) instead of TCP on "
                 "loopback");
  int quiet_calls = 0;
  // In the middle of the 100 ms that gRPC's callback threads sleep after
  // waiting 1 s for work that did not come (bench/grpc/RESULTS.md, "After a
  // quiet spell").
  int quiet_ms = 1050;
  app.add_option("--quiet-calls", quiet_calls,
                 "calls of each RPC made one at a time after a quiet spell (0: none)")
      ->check(CLI::Range(0, 100000));
  app.add_option("--quiet-ms", quiet_ms, "the quiet spell before each of those calls, ms")
      ->check(CLI::Range(1, 60000));
  std::string server;
  app.add_option("--server", server,
                 "make only the quiet-spell calls, against this running ledger service "
                 "(node " +
                     NodeName(0) +
                     ", Slurm owners without a credential), e.g. "
                     "slurm_bench_tool serve's unix:PATH");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);
  if (!server.empty()) return PrintQuiet(server, std::max(quiet_calls, 1), quiet_ms) > 0 ? 1 : 0;
  nodes = std::max(nodes, 64);
  const std::vector<std::string> modes = absl::StrSplit(modes_flag, ',');
  for (const std::string& m : modes) {
    if (m != "sync1" && m != "sync4" && m != "async64") {
      fprintf(stderr, "unknown mode %s\n", m.c_str());
      return 2;
    }
  }

  const fs::path dir = fs::path(base_dir) / absl::StrCat("duet_grpc_bench.", getpid());
  fs::create_directories(dir);
  std::ofstream(dir / "nodes.yaml") << InventoryYaml(nodes);
  printf("grpc_benchmark: %d nodes x %d GPUs, %.2f s per run, %d repetitions, journal under %s\n",
         nodes, kGpus, seconds, reps, dir.c_str());
  uint64_t errors = 0;
  std::vector<bool> fsyncs;
  if (fsync != "off") fsyncs.push_back(true);
  if (fsync != "on") fsyncs.push_back(false);
  for (bool on : fsyncs) {
    Config config;
    config.grpc.listen = "127.0.0.1:0";
    config.grpc.unix_socket = unix_socket;
    config.metrics.listen = "";
    config.journal.dir = (dir / (on ? "journal-fsync" : "journal-nofsync")).string();
    config.journal.fsync = on;
    config.inventory.source = "file";
    config.inventory.file = (dir / "nodes.yaml").string();
    config.inventory.reload_period = absl::Hours(1);
    // The Slurm steps hold with no credential (loopback only): the benchmark
    // measures the ledger, not munge.
    config.slurm.credential = "none";
    absl::StatusOr<std::unique_ptr<Bridge>> bridge = Bridge::Start(config);
    if (!bridge.ok()) {
      fprintf(stderr, "bridge: %s\n", bridge.status().ToString().c_str());
      return 1;
    }
    const std::string target = unix_socket.empty()
                                   ? absl::StrCat("127.0.0.1:", (*bridge)->grpc_port())
                                   : absl::StrCat("unix:", unix_socket);
    std::vector<Series> base(modes.size()), held(modes.size());
    std::vector<std::vector<double>> ratios(modes.size());
    for (int r = 0; r < reps; ++r) {
      for (size_t m = 0; m < modes.size(); ++m) {
        for (bool hold : {false, true}) {
          RunResult res = RunMode(target, modes[m], hold, seconds);
          if (res.errors > 0) {
            fprintf(stderr, "%s %s: %llu errors, first: %s\n", modes[m].c_str(),
                    hold ? "Hold" : "Health", static_cast<unsigned long long>(res.errors),
                    res.first_error.c_str());
            errors += res.errors;
          }
          (hold ? held : base)[m].Add(res);
        }
        const double b = base[m].rps.back();
        ratios[m].push_back(b > 0 ? held[m].rps.back() / b : 0);
      }
    }
    if ((*bridge)->ledger()->holding_count() != 0) {
      fprintf(stderr, "holdings left behind: %zu\n", (*bridge)->ledger()->holding_count());
      ++errors;
    }
    printf("\njournal fsync %s (medians of %d)\n", on ? "ON" : "OFF", reps);
    printf("%-8s %-14s %10s %10s %10s %8s\n", "mode", "rpc", "RPC/s", "p50 us", "p99 us", "ratio");
    for (size_t m = 0; m < modes.size(); ++m) {
      printf("%-8s %-14s %10.0f %10.1f %10.1f %8s\n", modes[m].c_str(), "Health/Check",
             bench::Median(base[m].rps), bench::Median(base[m].p50), bench::Median(base[m].p99),
             "1");
      printf("%-8s %-14s %10.0f %10.1f %10.1f %8.3f\n", modes[m].c_str(), "Hold+Release",
             bench::Median(held[m].rps), bench::Median(held[m].p50), bench::Median(held[m].p99),
             bench::Median(ratios[m]));
    }
    if (quiet_calls > 0) errors += PrintQuiet(target, quiet_calls, quiet_ms);
    fflush(stdout);
    (*bridge)->Shutdown();
  }
  printf("\nRPC/s counts every unary call (a pair is 2); p50/p99 of Hold only; ratio = median "
         "over repetitions of Hold+Release RPC/s over Health RPC/s.\n");
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (errors > 0) {
    fprintf(stderr, "grpc_benchmark: %llu failed RPCs\n", static_cast<unsigned long long>(errors));
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace duet

int main(int argc, char** argv) { return duet::Main(argc, argv); }
