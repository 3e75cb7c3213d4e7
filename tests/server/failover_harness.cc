#include "tests/server/failover_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "bench/common/quantile.h"
#include "common/grpc/status.h"
#include "common/reason.h"
#include "duet/v1/duet.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "proto/duet/v1/reasons.h"
#include "tests/etcd/etcd_server.h"
#include "tests/fakes/free_port.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace failover {
namespace {

using k8s::testing::FakeApiServer;

// The embedded inventory's GPU nodes (8 H100 each).
const char* const kNodes[] = {"gke-h100-a", "gke-h100-b"};
constexpr absl::Duration kCallDeadline = absl::Seconds(2);

struct Replica {
  std::string name;
  std::atomic<int> port{0};
  pid_t pid = -1;
};

std::shared_ptr<grpc::Channel> NewChannel(int port) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials(), args);
}

void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
}

// "SERVING", "NOT_SERVING", or "error".
std::string Health(int port) {
  auto stub = grpc::health::v1::Health::NewStub(NewChannel(port));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  if (!stub->Check(&ctx, req, &resp).ok()) return "error";
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
}

using fakes::FreePort;

std::string DeviceKey(const std::string& node, const v1::HeldDevice& d) {
  return absl::StrCat(node, "/", d.kind(), "/", d.index());
}

// A holding as the driver knows it.
struct Held {
  std::string uid;
  std::string node;
  std::vector<std::string> devices;  // DeviceKey
};

struct Interval {
  std::string uid;
  absl::Time start;
  absl::Time end = absl::InfiniteFuture();  // the Release was first sent
};

// The load driver and the bookkeeping of what was acknowledged.
class Driver {
 public:
  Driver(const Options& o, Replica* replicas) : options_(o), replicas_(replicas) {}

  void Start() {
    for (int i = 0; i < options_.workers; ++i) threads_.emplace_back([this, i] { Worker(i); });
  }
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      paused_ = false;
    }
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  // Every worker idle between calls.
  void Pause() {
    absl::MutexLock lock(&mu_);
    paused_ = true;
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return idle_ == options_.workers; };
    mu_.Await(absl::Condition(&idle));
  }
  void Resume() {
    absl::MutexLock lock(&mu_);
    paused_ = false;
  }
  // `killed` is the replica index about to be killed (or frozen).
  void MarkKill(absl::Time t, int killed) {
    absl::MutexLock lock(&mu_);
    kill_time_ = t;
    killed_ = killed;
    live_at_kills_ += live_.size();
    first_ok_after_kill_ = absl::InfiniteFuture();
  }
  // The first Hold acknowledged by the other replica after the last kill,
  // or InfiniteFuture.
  absl::Time FirstHoldAfterKill() {
    absl::MutexLock lock(&mu_);
    return first_ok_after_kill_;
  }
  int leader_hint() const { return hint_.load(); }

  // With the workers paused: every definitely-live holding must be on the
  // leader with the same devices.
  absl::Status CheckLive(int r, Figures* f) {
    std::map<std::string, std::vector<std::string>> on_leader;  // uid -> devices
    // A few tries: on a loaded machine one call can miss its deadline.
    v1::ListHoldingsResponse resp;
    grpc::Status s;
    for (int attempt = 0; attempt < 5; ++attempt) {
      auto stub = v1::Ledger::NewStub(NewChannel(replicas_[r].port.load()));
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      resp.Clear();
      s = stub->ListHoldings(&ctx, v1::ListHoldingsRequest(), &resp);
      if (s.ok()) break;
    }
    if (!s.ok()) return FromGrpc(s, "ListHoldings on the new leader");
    for (const v1::Holding& h : resp.holdings()) {
      if (!h.owner().has_pod()) continue;
      std::vector<std::string> devs;
      for (const auto& d : h.devices()) devs.push_back(DeviceKey(h.node(), d));
      std::sort(devs.begin(), devs.end());
      on_leader[h.owner().pod().uid()] = devs;
    }
    absl::MutexLock lock(&mu_);
    for (const auto& [uid, held] : live_) {
      ++f->live_checked;
      auto it = on_leader.find(uid);
      if ((it == on_leader.end() || it->second != held.devices) && lost_.insert(uid).second) {
        ++f->lost;
        if (f->findings.size() < 10) {
          f->findings.push_back(absl::StrCat(
              "lost: pod ", uid, " acknowledged on ", absl::StrJoin(held.devices, ","),
              it == on_leader.end() ? ", absent on the new leader"
                                    : ", the new leader shows " + absl::StrJoin(it->second, ",")));
        }
      }
    }
    return absl::OkStatus();
  }

  void Collect(Figures* f) {
    absl::MutexLock lock(&mu_);
    f->holds_acknowledged = holds_;
    f->releases_acknowledged = releases_;
    f->refused = refused_;
    f->uncertain = uncertain_;
    f->double_grants = double_grants_;
    f->live_at_kills = live_at_kills_;
    f->lost += lost_at_release_;
    for (const auto& l : lost_findings_) {
      if (f->findings.size() < 20) f->findings.push_back(l);
    }
    for (const auto& d : double_findings_) {
      if (f->findings.size() < 20) f->findings.push_back(d);
    }
  }

 private:
  enum class Outcome { kOk, kRefused, kUncertain };

  struct Stubs {
    int port = 0;
    std::unique_ptr<v1::Ledger::Stub> stub;
  };

  // Calls `fn` on the leader as the driver knows it; a standby's refusal
  // (reason STANDBY: nothing done) moves on to the other replica.
  template <typename Fn>
  Outcome Call(std::vector<Stubs>* stubs, Fn fn, int* served_by, std::mt19937* rng) {
    int first = hint_.load();
    if (static_cast<int>((*rng)() % 100) < options_.stale_client_percent) first = (first + 1) % 2;
    for (int k = 0; k < 2; ++k) {
      const int r = (first + k) % 2;
      Stubs& s = (*stubs)[static_cast<size_t>(r)];
      const int port = replicas_[r].port.load();
      if (s.stub == nullptr || s.port != port) {
        s.port = port;
        s.stub = v1::Ledger::NewStub(NewChannel(port));
      }
      grpc::ClientContext ctx;
      SetDeadline(&ctx);
      const grpc::Status st = fn(s.stub.get(), &ctx);
      if (st.ok()) {
        hint_ = r;
        *served_by = r;
        return Outcome::kOk;
      }
      const absl::Status as = FromGrpc(st, "call");
      if (ReasonOf(as) == v1::reason::kStandby) continue;
      s.stub.reset();
      switch (st.error_code()) {
        case grpc::StatusCode::RESOURCE_EXHAUSTED:
        case grpc::StatusCode::FAILED_PRECONDITION:
        case grpc::StatusCode::INVALID_ARGUMENT:
        case grpc::StatusCode::NOT_FOUND:
        case grpc::StatusCode::ALREADY_EXISTS:
        case grpc::StatusCode::ABORTED:
          hint_ = r;
          return Outcome::kRefused;
        default:
          // Down, dying, or an answer that may or may not have been applied.
          hint_ = (r + 1) % 2;
          return Outcome::kUncertain;
      }
    }
    return Outcome::kRefused;  // both standbys: nothing done anywhere
  }

  bool WaitWhilePaused() {
    absl::MutexLock lock(&mu_);
    if (paused_) {
      ++idle_;
      auto go = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !paused_ || stop_; };
      mu_.Await(absl::Condition(&go));
      --idle_;
    }
    return !stop_;
  }

  // Releases `uid` on `node` until a leader confirms (released or not).
  // `released` (if not null): whether the leader had a holding to release.
  bool Cleanup(std::vector<Stubs>* stubs, const std::string& node, const std::string& uid,
               std::mt19937* rng, bool* released = nullptr) {
    v1::ReleaseRequest req;
    req.set_node(node);
    req.mutable_owner()->mutable_pod()->set_uid(uid);
    req.mutable_owner()->mutable_pod()->set_namespace_("failover");
    req.mutable_owner()->mutable_pod()->set_name(uid);
    int served = 0;
    v1::ReleaseResponse resp;
    const Outcome o = Call(
        stubs,
        [&](v1::Ledger::Stub* s, grpc::ClientContext* c) { return s->Release(c, req, &resp); },
        &served, rng);
    if (released != nullptr) *released = resp.released();
    return o == Outcome::kOk;
  }

  void Worker(int w) {
    std::mt19937 rng(static_cast<uint32_t>(w * 7919 + 1));
    std::vector<Stubs> stubs(2);
    std::deque<Held> mine;
    std::deque<std::pair<std::string, std::string>> unsure;  // (node, uid)
    uint64_t n = 0;
    while (WaitWhilePaused()) {
      if (!unsure.empty()) {
        if (Cleanup(&stubs, unsure.front().first, unsure.front().second, &rng)) {
          unsure.pop_front();
        } else {
          absl::SleepFor(absl::Milliseconds(20));  // back-off while no leader answers
        }
        continue;
      }
      if (static_cast<int>(mine.size()) >= options_.holdings_per_worker) {
        Held h = std::move(mine.front());
        mine.pop_front();
        {
          absl::MutexLock lock(&mu_);
          const absl::Time now = absl::Now();
          for (const std::string& d : h.devices) {
            for (Interval& i : intervals_[d]) {
              if (i.uid == h.uid && i.end == absl::InfiniteFuture()) i.end = now;
            }
          }
          live_.erase(h.uid);
        }
        bool released = false;
        if (Cleanup(&stubs, h.node, h.uid, &rng, &released)) {
          absl::MutexLock lock(&mu_);
          ++releases_;
          // A definitely-live holding the leader does not have: lost (found
          // at its release rather than at a check).
          if (!released && lost_.insert(h.uid).second) {
            ++lost_at_release_;
            if (lost_findings_.size() < 10) {
              lost_findings_.push_back(absl::StrCat("lost: pod ", h.uid, " acknowledged on ",
                                                    absl::StrJoin(h.devices, ","),
                                                    ", nothing to release on the leader"));
            }
          }
        } else {
          absl::MutexLock lock(&mu_);
          ++uncertain_;
          unsure.emplace_back(h.node, h.uid);
        }
        continue;
      }
      Held h;
      h.uid = absl::StrCat("w", w, "-", n++);
      h.node = kNodes[rng() % 2];
      v1::HoldRequest req;
      req.set_node(h.node);
      req.mutable_owner()->mutable_pod()->set_uid(h.uid);
      req.mutable_owner()->mutable_pod()->set_namespace_("failover");
      req.mutable_owner()->mutable_pod()->set_name(h.uid);
      req.mutable_count()->set_kind(v1::DEVICE_KIND_GPU);
      req.mutable_count()->set_count(1);
      v1::HoldResponse resp;
      int served = 0;
      const Outcome o = Call(
          &stubs,
          [&](v1::Ledger::Stub* s, grpc::ClientContext* c) { return s->Hold(c, req, &resp); },
          &served, &rng);
      if (o == Outcome::kRefused) {
        absl::MutexLock lock(&mu_);
        ++refused_;
        continue;
      }
      if (o == Outcome::kUncertain) {
        absl::MutexLock lock(&mu_);
        ++uncertain_;
        unsure.emplace_back(h.node, h.uid);
        continue;
      }
      for (const auto& d : resp.holding().devices()) h.devices.push_back(DeviceKey(h.node, d));
      std::sort(h.devices.begin(), h.devices.end());
      absl::MutexLock lock(&mu_);
      const absl::Time now = absl::Now();
      ++holds_;
      if (served != killed_ && now > kill_time_ && first_ok_after_kill_ == absl::InfiniteFuture()) {
        first_ok_after_kill_ = now;
      }
      for (const std::string& d : h.devices) {
        std::vector<Interval>& on = intervals_[d];
        for (const Interval& i : on) {
          if (i.uid != h.uid && i.end > now) {
            ++double_grants_;
            if (double_findings_.size() < 10) {
              double_findings_.push_back(absl::StrCat("double grant: ", d, " acknowledged to pod ",
                                                      h.uid, " while pod ", i.uid,
                                                      " held it (acknowledged, not released)"));
            }
          }
        }
        // Closed intervals that ended before now can never overlap a later
        // grant: drop them.
        on.erase(
            std::remove_if(on.begin(), on.end(), [&](const Interval& i) { return i.end <= now; }),
            on.end());
        on.push_back(Interval{h.uid, now});
      }
      live_[h.uid] = h;
      mine.push_back(std::move(h));
    }
  }

  const Options options_;
  Replica* const replicas_;
  std::atomic<int> hint_{0};
  std::vector<std::thread> threads_;

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time kill_time_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time first_ok_after_kill_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  int killed_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t live_at_kills_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::string> lost_ ABSL_GUARDED_BY(mu_);  // uids counted lost (once each)
  uint64_t lost_at_release_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> lost_findings_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<Interval>> intervals_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Held> live_ ABSL_GUARDED_BY(mu_);  // definitely live, by uid
  uint64_t holds_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t releases_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t uncertain_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t double_grants_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> double_findings_ ABSL_GUARDED_BY(mu_);
};

class Scenario {
 public:
  explicit Scenario(const Options& o) : options_(o) {}
  ~Scenario() {
    for (Replica& r : replicas_) Kill(&r);
    if (own_dir_) k8s::testing::RemoveTree(dir_);
  }

  absl::StatusOr<Figures> Run() {
    if (!fake_.ok()) return absl::UnavailableError("the fake API server did not start");
    dir_ = options_.work_dir;
    if (dir_.empty()) {
      dir_ = k8s::testing::MakeTempDir();
      own_dir_ = true;
    } else {
      std::error_code ec;
      std::filesystem::create_directories(dir_, ec);
      if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir_, ": ", ec.message()));
    }
    k8s::testing::WriteKubeconfig(dir_ + "/kubeconfig", fake_.url(), "duet-system");
    if (options_.etcd) {
      if (!testing::EtcdServer::Available()) {
        return absl::FailedPreconditionError("/usr/bin/etcd is missing (etcd-server)");
      }
      etcd_ = std::make_unique<testing::EtcdServer>();
      if (absl::Status s = etcd_->Start(); !s.ok()) return s;
    }
    replicas_[0].name = "bridge-a";
    replicas_[1].name = "bridge-b";
    if (absl::Status s = StartReplica(&replicas_[0]); !s.ok()) return s;
    if (!k8s::testing::WaitFor([&] { return Health(replicas_[0].port) == "SERVING"; },
                               absl::Seconds(20))) {
      return absl::DeadlineExceededError("bridge-a did not start serving");
    }
    if (absl::Status s = StartReplica(&replicas_[1]); !s.ok()) return s;
    if (!k8s::testing::WaitFor([&] { return Health(replicas_[1].port) == "NOT_SERVING"; },
                               absl::Seconds(20))) {
      return absl::DeadlineExceededError("bridge-b did not start as a standby");
    }

    Figures f;
    Driver driver(options_, replicas_);
    const absl::Time load_start = absl::Now();
    driver.Start();
    absl::Status failed;
    for (int k = 0; k < options_.kills && failed.ok(); ++k) {
      absl::SleepFor(options_.load_before_kill);  // the load runs meanwhile
      const int leader = ServingReplica();
      if (leader < 0) {
        failed = absl::UnavailableError(
            absl::StrCat("no replica is serving before kill ", k + 1, ExitedReplicas()));
        break;
      }
      const absl::Time t0 = absl::Now();
      driver.MarkKill(t0, leader);
      if (options_.freeze) {
        ::kill(replicas_[leader].pid, SIGSTOP);
      } else {
        Kill(&replicas_[leader]);
      }
      if (!k8s::testing::WaitFor(
              [&] { return driver.FirstHoldAfterKill() != absl::InfiniteFuture(); },
              absl::Seconds(30))) {
        failed = absl::DeadlineExceededError("no Hold was acknowledged within 30 s of the kill");
        break;
      }
      const double took = absl::ToDoubleSeconds(driver.FirstHoldAfterKill() - t0);
      f.takeover_seconds.push_back(took);
      driver.Pause();
      const uint64_t lost_before = f.lost;
      failed = driver.CheckLive(1 - leader, &f);
      driver.Resume();
      if (options_.verbose) {
        std::fprintf(stderr, "kill %d of %s: takeover %.3f s, lost %llu\n", k + 1,
                     replicas_[leader].name.c_str(), took,
                     static_cast<unsigned long long>(f.lost - lost_before));
      }
      if (!failed.ok()) break;
      if (options_.freeze) {
        // The deposed leader wakes up believing it leads, under load from
        // clients that still send to it; then it must go.
        Replica& old = replicas_[leader];
        ::kill(old.pid, SIGCONT);
        int status = 0;
        const bool exited = k8s::testing::WaitFor(
            [&] { return ::waitpid(old.pid, &status, WNOHANG) == old.pid; }, absl::Seconds(20));
        f.deposed_exits.push_back(!exited             ? -1
                                  : WIFEXITED(status) ? WEXITSTATUS(status)
                                                      : 128 + WTERMSIG(status));
        if (exited) {
          old.pid = -1;
        } else {
          Kill(&old);
        }
        if (options_.verbose) {
          std::fprintf(stderr, "  deposed %s: exit %d\n", old.name.c_str(), f.deposed_exits.back());
        }
      }
      // The killed replica comes back as the standby, as a new pod would:
      // with an empty journal directory (the chart's emptyDir).
      k8s::testing::RemoveTree(absl::StrCat(dir_, "/", replicas_[leader].name, "-journal"));
      if (absl::Status s = StartReplica(&replicas_[leader]); !s.ok()) {
        failed = s;
        break;
      }
      if (!k8s::testing::WaitFor([&] { return Health(replicas_[leader].port) == "NOT_SERVING"; },
                                 absl::Seconds(20))) {
        failed = absl::DeadlineExceededError("the restarted replica did not become a standby");
      }
    }
    if (failed.ok()) {
      absl::SleepFor(options_.load_before_kill / 2);
      const int leader = ServingReplica();
      driver.Pause();
      // And once more, after the last takeover.
      failed = leader < 0 ? absl::UnavailableError(
                                absl::StrCat("no replica is serving at the end", ExitedReplicas()))
                          : driver.CheckLive(leader, &f);
    }
    driver.Stop();
    f.load_seconds = absl::ToDoubleSeconds(absl::Now() - load_start);
    driver.Collect(&f);
    if (!failed.ok()) return failed;
    return f;
  }

 private:
  absl::Status StartReplica(Replica* r) {
    r->port = FreePort();
    const std::string cfg = absl::StrCat(dir_, "/", r->name, ".yaml");
    std::ofstream out(cfg);
    out << "grpc: {listen: \"127.0.0.1:" << r->port.load() << "\", shutdown_grace: 1s}\n"
        << "metrics: {listen: \"\"}\n"
        << "journal:\n"
        << "  dir: " << dir_ << "/" << r->name << "-journal\n";
    if (etcd_ != nullptr) {
      out << "  etcd: {endpoints: [\"" << etcd_->endpoint()
          << "\"], prefix: /duet/failover, request_timeout: 1s, commit_timeout: 3s}\n";
    }
    out << "inventory: {source: embedded}\n"
        << "kubernetes:\n"
        << "  kubeconfig: " << dir_ << "/kubeconfig\n"
        << "  leader_election:\n"
        << "    enabled: true\n"
        << "    identity: " << r->name << "\n"
        << "    lease_duration: " << absl::FormatDuration(options_.lease_duration) << "\n"
        << "    renew_deadline: " << absl::FormatDuration(options_.renew_deadline) << "\n"
        << "    retry_period: " << absl::FormatDuration(options_.retry_period) << "\n"
        << "log_level: info\n";
    out.close();
    const std::string log = absl::StrCat(dir_, "/", r->name, ".log");
    const std::string bin = options_.bridge_binary;
    r->pid = fork();
    if (r->pid < 0) return absl::InternalError("fork failed");
    if (r->pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execl(bin.c_str(), bin.c_str(), "--config", cfg.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    return absl::OkStatus();
  }

  // The replica whose health is SERVING, waiting for one up to 15 s (a
  // health check can time out on a loaded machine); -1 if none.
  int ServingReplica() {
    int leader = -1;
    k8s::testing::WaitFor(
        [&] {
          for (int r = 0; r < 2; ++r) {
            if (Health(replicas_[r].port) == "SERVING") leader = r;
          }
          return leader >= 0;
        },
        absl::Seconds(15));
    return leader;
  }

  // "; bridge-a exited with status 3" for replicas that ended on their own.
  std::string ExitedReplicas() {
    std::string out;
    for (Replica& r : replicas_) {
      int status = 0;
      if (r.pid > 0 && ::waitpid(r.pid, &status, WNOHANG) == r.pid) {
        absl::StrAppend(&out, "; ", r.name, " exited with status ",
                        WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status),
                        " (log: ", dir_, "/", r.name, ".log)");
        r.pid = -1;
      }
    }
    return out;
  }

  static void Kill(Replica* r) {
    if (r->pid <= 0) return;
    ::kill(r->pid, SIGKILL);
    ::waitpid(r->pid, nullptr, 0);
    r->pid = -1;
  }

  const Options options_;
  FakeApiServer fake_;
  std::unique_ptr<testing::EtcdServer> etcd_;
  std::string dir_;
  bool own_dir_ = false;
  Replica replicas_[2];
};

}  // namespace

absl::StatusOr<Figures> Run(const Options& options) {
  Scenario s(options);
  return s.Run();
}

std::string Summary(const std::vector<double>& seconds) {
  if (seconds.empty()) return "no takeovers";
  return absl::StrFormat("median %.2f s, p99 %.2f s, max %.2f s (n=%d)",
                         bench::Quantile(seconds, 0.5), bench::Quantile(seconds, 0.99),
                         bench::Quantile(seconds, 1), seconds.size());
}

}  // namespace failover
}  // namespace duet
