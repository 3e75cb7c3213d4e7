// slurm_bench_tool: the client-side halves of bench/slurm/run_bench.sh.
//
//   slurm_bench_tool placeholders NODE N   grant latency of Placeholders-style
//                                          allocations through LibSlurmClient
//                                          (allocate + IDX read-back), each
//                                          cancelled before the next; prints
//                                          one latency in ms per line
//   slurm_bench_tool lendburst NODE N ROUNDS
//                                          N one-GPU lend-job allocations
//                                          one after the other vs N at once
//                                          (a thread each), per round; prints
//                                          "sequential_ms concurrent_ms"
//   slurm_bench_tool nodesync N PREFIX     N ledger nodes -> SlurmSync.RunOnce
//                                          until all N are visible in Slurm;
//                                          prints seconds
//   slurm_bench_tool serve SOCKET NODE...  a ledger gRPC service (8 GPUs per
//                                          node) for the SPANK overhead runs
//   slurm_bench_tool client SOCKET NODE N AUTH [ARG]
//                                          where a GPU step's bridge calls
//                                          spend their time: N fresh processes
//                                          (as each slurmstepd is) each make
//                                          the plugin's Hold then Release
//                                          (AUTH munge SOCKET | slurm_key KEY
//                                          | none); prints p50 ms per phase
//   slurm_bench_tool answer SOCKET         a step agent that answers every
//                                          request OK at once, on one thread,
//                                          without a bridge: the floor of the
//                                          agent path (what the plugin's own
//                                          side costs a step)
//   slurm_bench_tool agentcalls SOCKET NODE N GAP_MS
//                                          N Holds of GPU 0 by steps J.0 and
//                                          their Releases through a step
//                                          agent, no credential, GAP_MS apart;
//                                          prints p50, p99 and max ms of each
// SLURM_CONF must name the cluster's slurm.conf.

#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/common/quantile.h"
#include "bridge/slurm/libslurm_client.h"
#include "bridge/slurm/slurm_sync.h"
#include "common/daemon.h"
#include "common/step_agent/step_wire.h"
#include "slurm_plugin/bridge_client.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"
#include "tests/fakes/ledger_server.h"

namespace duet {
namespace {

NodeSpec GpuNode(const std::string& name, int gpus) {
  NodeSpec s;
  s.name = name;
  s.cpus = 8;
  s.memory_mib = 16000;
  s.pool = "bench";
  for (int i = 0; i < gpus; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kGpu;
    d.index = i;
    d.model = "h100";
    s.devices.push_back(d);
  }
  return s;
}

int PlaceholderGrants(const std::string& node, int n) {
  LibSlurmClient client;
  for (int i = 0; i < n; ++i) {
    SlurmAllocRequest req;
    req.node = node;
    req.gpus = 1;
    req.job_name = "duet-pod:bench/p";
    req.comment = absl::StrCat("duet-pod uid=bench-", i, " ns=bench name=p");
    const absl::Time start = absl::Now();
    auto a = client.AllocatePlaceholder(req);
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    if (!a.ok()) {
      fprintf(stderr, "allocate: %s\n", a.status().ToString().c_str());
      return 1;
    }
    printf("%.3f\n", ms);
    if (auto s = client.KillJob(a->job_id); !s.ok()) {
      fprintf(stderr, "kill: %s\n", s.ToString().c_str());
      return 1;
    }
    // Wait out COMPLETING so every grant starts from the same free node.
    for (int k = 0; k < 1000; ++k) {
      auto j = client.GetJob(a->job_id);
      if (j.ok() && (!j->has_value() || !(*j)->live())) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  return 0;
}

// Waits until job `id` is neither running nor completing (the next
// allocation starts from a free node).
void AwaitGone(LibSlurmClient* client, uint32_t id) {
  for (int k = 0; k < 1000; ++k) {
    auto j = client->GetJob(id);
    if (j.ok() && (!j->has_value() || !(*j)->live())) return;
    absl::SleepFor(absl::Milliseconds(5));
  }
}

// Lender::Lend's lend jobs on a real slurmctld: N one-GPU allocations on
// NODE made one after the other, then N at once (a thread each, as
// Lender::Lend asks them), ROUNDS times; each round cancels them and waits
// them out between the two. Prints "sequential_ms concurrent_ms" per round:
// the wall time from the first ask to the last grant.
int LendBurst(const std::string& node, int n, int rounds) {
  LibSlurmClient client;
  auto ask = [&](int i) {
    SlurmAllocRequest req;
    req.node = node;
    req.gpus = 1;
    req.cpus = 1;
    req.memory_mib = 1;
    req.job_name = absl::StrCat("duet-lend:", node);
    req.comment = absl::StrCat("duet-lend node=", node, " bench=", i);
    return client.AllocatePlaceholder(req);
  };
  auto done = [&](const std::vector<absl::StatusOr<SlurmAllocation>>& made) {
    bool ok = true;
    for (const auto& a : made) {
      if (!a.ok()) {
        fprintf(stderr, "allocate: %s\n", a.status().ToString().c_str());
        ok = false;
        continue;
      }
      (void)client.KillJob(a->job_id);
    }
    for (const auto& a : made) {
      if (a.ok()) AwaitGone(&client, a->job_id);
    }
    return ok;
  };
  for (int r = 0; r < rounds; ++r) {
    std::vector<absl::StatusOr<SlurmAllocation>> made;
    absl::Time start = absl::Now();
    for (int i = 0; i < n; ++i) made.push_back(ask(i));
    const double seq = absl::ToDoubleMilliseconds(absl::Now() - start);
    if (!done(made)) return 1;
    made.assign(n, absl::UnknownError("not asked"));
    std::vector<std::thread> threads;
    start = absl::Now();
    for (int i = 0; i < n; ++i) threads.emplace_back([&, i] { made[i] = ask(i); });
    for (std::thread& t : threads) t.join();
    const double conc = absl::ToDoubleMilliseconds(absl::Now() - start);
    if (!done(made)) return 1;
    printf("%.3f %.3f\n", seq, conc);
    fflush(stdout);
  }
  return 0;
}

int NodeSync(int n, const std::string& prefix) {
  Ledger ledger;
  for (int i = 0; i < n; ++i) {
    if (!ledger.UpsertNode(GpuNode(absl::StrCat(prefix, i), 8)).ok()) return 1;
  }
  LibSlurmClient client;
  SlurmSyncOptions o;
  o.import_jobs = false;
  SlurmSync sync(o, &ledger, &client, Clock::Real());
  const absl::Time start = absl::Now();
  absl::Status s = sync.RunOnce();
  for (;;) {
    auto nodes = client.ListNodes();
    if (!nodes.ok()) return 1;
    int seen = 0;
    for (const auto& node : *nodes) seen += node.name.rfind(prefix, 0) == 0;
    if (seen >= n) break;
    if (absl::Now() - start > absl::Seconds(120)) {
      fprintf(stderr, "only %d of %d visible: %s\n", seen, n, s.ToString().c_str());
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  printf("%.3f\n", absl::ToDoubleSeconds(absl::Now() - start));
  return 0;
}

// One step's calls in this (fresh) process; ms per phase.
std::vector<double> OneStep(const std::string& socket, const std::string& node, uint32_t job,
                            spank::StepAuth auth, const std::string& arg) {
  std::vector<double> ms;
  absl::Time t = absl::Now();
  auto lap = [&] {
    const absl::Time now = absl::Now();
    ms.push_back(absl::ToDoubleMilliseconds(now - t));
    t = now;
  };
  spank::StepDevices devices;
  devices.gpus = {0};
  // As the plugin makes one per callback.
  auto client = [&] {
    auto c = std::make_unique<spank::BridgeClient>("unix://" + socket, 2000);
    c->UseAuth(auth, auth == spank::StepAuth::kMunge ? arg : "",
               auth == spank::StepAuth::kSlurmKey ? arg : "");
    return c;
  };
  {
    auto c = client();
    lap();  // channel
    if (!c->HoldStep(node, job, 0, devices).ok()) return {};
    lap();  // Hold (credential + RPC, first connect)
  }
  lap();  // channel gone (gRPC shut down)
  {
    auto c = client();
    if (!c->ReleaseStep(node, job, 0).ok()) return {};
    lap();  // second channel + Release
  }
  lap();  // gone again
  return ms;
}

int Client(const std::string& socket, const std::string& node, int n, const std::string& how,
           const std::string& arg) {
  const spank::StepAuth auth = how == "munge"       ? spank::StepAuth::kMunge
                               : how == "slurm_key" ? spank::StepAuth::kSlurmKey
                                                    : spank::StepAuth::kNone;
  const char* names[] = {"channel", "hold", "teardown", "release", "teardown2"};
  std::vector<std::vector<double>> per(5);
  for (int i = 0; i < n; ++i) {
    int fds[2];
    if (pipe(fds) != 0) return 1;
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      std::vector<double> ms = OneStep(socket, node, 900000 + i, auth, arg);
      const ssize_t want = static_cast<ssize_t>(ms.size() * sizeof(double));
      _exit(ms.size() == 5 && write(fds[1], ms.data(), want) == want ? 0 : 1);
    }
    close(fds[1]);
    double ms[5];
    const ssize_t got = read(fds[0], ms, sizeof ms);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (got != sizeof ms || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "round %d failed\n", i);
      return 1;
    }
    for (int k = 0; k < 5; ++k) per[k].push_back(ms[k]);
  }
  for (int k = 0; k < 5; ++k) printf("%s %.2f\n", names[k], bench::Median(per[k]));
  return 0;
}

int Serve(const std::string& socket, int argc, char** argv) {
  SkipMutexDeadlockDetection();  // as duet-bridge does
  Ledger ledger;
  for (int i = 0; i < argc; ++i) {
    if (!ledger.UpsertNode(GpuNode(argv[i], 8)).ok()) return 1;
  }
  fakes::LedgerServer server(&ledger, "unix://" + socket);
  if (!server.ok()) return 1;
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  int sig = 0;
  sigwait(&set, &sig);
  return 0;
}

bool ReadFull(int fd, uint8_t* buf, size_t n) {
  for (size_t got = 0; got < n;) {
    const ssize_t m = read(fd, buf + got, n - got);
    if (m <= 0) return false;
    got += static_cast<size_t>(m);
  }
  return true;
}

// Reads one step-agent frame (header and body) into `frame`, which holds
// DUET_WIRE_MAX_FRAME bytes; returns its length, 0 on a short or bad frame.
size_t ReadFrame(int fd, std::vector<uint8_t>* frame) {
  char err[256];
  uint8_t type = 0;
  uint32_t body = 0;
  if (!ReadFull(fd, frame->data(), DUET_WIRE_HEADER) ||
      duet_wire_parse_header(frame->data(), DUET_WIRE_HEADER, &type, &body, err, sizeof(err)) !=
          0 ||
      !ReadFull(fd, frame->data() + DUET_WIRE_HEADER, body)) {
    return 0;
  }
  return DUET_WIRE_HEADER + body;
}

// One request per connection, as spank_duet sends them.
int Answer(const std::string& socket_path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof(addr.sun_path)) return 2;
  memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  unlink(socket_path.c_str());
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 128) != 0) {
    perror(socket_path.c_str());
    return 1;
  }
  std::vector<uint8_t> frame(DUET_WIRE_MAX_FRAME);
  auto request = std::make_unique<duet_wire_request>();
  auto reply = std::make_unique<duet_wire_reply>();
  for (;;) {
    const int conn = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    char err[256] = "short frame";
    const size_t len = ReadFrame(conn, &frame);
    if (len > 0 &&
        duet_wire_decode_request(frame.data(), len, request.get(), err, sizeof(err)) == 0) {
      *reply = duet_wire_reply{};
      if (request->type != DUET_WIRE_HOLD_STEP) {
        snprintf(reply->meta[0].key, sizeof(reply->meta[0].key), "queued");
        snprintf(reply->meta[0].value, sizeof(reply->meta[0].value), "1");
        reply->n_meta = 1;
      }
      const long n =
          duet_wire_encode_reply(reply.get(), frame.data(), frame.size(), err, sizeof(err));
      if (n > 0 && write(conn, frame.data(), static_cast<size_t>(n)) != n) perror("write");
    } else {
      fprintf(stderr, "answer: bad request: %s\n", err);
    }
    close(conn);
  }
}

// One request and its reply on a fresh connection, as spank_duet makes them.
bool AgentCall(const std::string& socket_path, const duet_wire_request& r, duet_wire_reply* reply) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  std::vector<uint8_t> frame(DUET_WIRE_MAX_FRAME);
  char err[256];
  const long n = duet_wire_encode_request(&r, frame.data(), frame.size(), err, sizeof(err));
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool ok = n > 0 && fd >= 0 &&
            connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
            write(fd, frame.data(), static_cast<size_t>(n)) == n;
  const size_t len = ok ? ReadFrame(fd, &frame) : 0;
  ok = len > 0 && duet_wire_decode_reply(frame.data(), len, reply, err, sizeof(err)) == 0;
  if (fd >= 0) close(fd);
  return ok;
}

int AgentCalls(const std::string& socket_path, const std::string& node, int n, int gap_ms) {
  if (socket_path.size() >= sizeof(sockaddr_un{}.sun_path) || node.size() > DUET_WIRE_MAX_NODE) {
    return 2;
  }
  auto r = std::make_unique<duet_wire_request>();
  auto reply = std::make_unique<duet_wire_reply>();
  std::vector<double> hold, release;
  // Job ids of this run only: a ledger that outlived an earlier run may
  // still hold that run's last GPU 0 (a Release its agent never sent).
  const uint32_t base = 1000000 + static_cast<uint32_t>(getpid() % 1000) * 10000;
  auto failed = [&](const char* what, int i) {
    fprintf(stderr, "%s %d: %s\n", what, i,
            reply->code != 0 ? reply->message : "no answer from the agent");
    return 1;
  };
  for (int i = 0; i < n; ++i) {
    *r = duet_wire_request{};
    r->type = DUET_WIRE_HOLD_STEP;
    memcpy(r->node, node.c_str(), node.size() + 1);
    r->job_id = base + static_cast<uint32_t>(i);
    r->n_gpus = 1;
    absl::Time t = absl::Now();
    *reply = duet_wire_reply{};
    if (!AgentCall(socket_path, *r, reply.get()) || reply->code != 0) return failed("Hold", i);
    hold.push_back(absl::ToDoubleMilliseconds(absl::Now() - t));
    absl::SleepFor(absl::Milliseconds(gap_ms));
    r->type = DUET_WIRE_RELEASE_STEP;
    t = absl::Now();
    *reply = duet_wire_reply{};
    if (!AgentCall(socket_path, *r, reply.get()) || reply->code != 0) {
      return failed("Release", i);
    }
    release.push_back(absl::ToDoubleMilliseconds(absl::Now() - t));
    absl::SleepFor(absl::Milliseconds(gap_ms));
  }
  // p50, p99 and the slowest of each.
  printf("hold %.3f %.3f %.3f\nrelease %.3f %.3f %.3f\n", bench::Quantile(hold, 0.5),
         bench::Quantile(hold, 0.99), bench::Quantile(hold, 1), bench::Quantile(release, 0.5),
         bench::Quantile(release, 0.99), bench::Quantile(release, 1));
  return 0;
}

}  // namespace
}  // namespace duet

int main(int argc, char** argv) {
  // Figures go to stdout (run_bench.sh reads them), log lines to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("slurm_bench_tool"));
  spdlog::set_level(spdlog::level::warn);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "placeholders" && argc == 4) return duet::PlaceholderGrants(argv[2], atoi(argv[3]));
  if (mode == "lendburst" && argc == 5) {
    return duet::LendBurst(argv[2], atoi(argv[3]), atoi(argv[4]));
  }
  if (mode == "nodesync" && argc == 4) return duet::NodeSync(atoi(argv[2]), argv[3]);
  if (mode == "serve" && argc >= 3) return duet::Serve(argv[2], argc - 3, argv + 3);
  if (mode == "agentcalls" && argc == 6 && atoi(argv[4]) > 0) {
    return duet::AgentCalls(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]));
  }
  if (mode == "answer" && argc == 3) return duet::Answer(argv[2]);
  if (mode == "client" && (argc == 6 || argc == 7)) {
    return duet::Client(argv[2], argv[3], atoi(argv[4]), argv[5], argc == 7 ? argv[6] : "");
  }
  fprintf(stderr, "usage: see the header of bench/slurm/slurm_bench_tool.cc\n");
  return 2;
}
