#pragma once

// Helpers shared by the end-to-end tests on the real Slurm cluster
// (slurm_e2e_test.cc, pod_e2e_test.cc): a free loopback port, Slurm's
// device indices of a job, the ledger's holdings over gRPC, and the real
// duet-bridge binary as a child process.
//
// Thread-safety: not thread-safe; use from the test thread.

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "duet/v1/duet.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/fakes/free_port.h"
#include "tests/slurm/slurm_cluster_fixture.h"

#ifndef DUET_BRIDGE_BIN
#error "DUET_BRIDGE_BIN must name the duet-bridge binary"
#endif

namespace duet::testing {

using ::duet::fakes::FreePort;

// "0-2,5" -> {0,1,2,5}
inline std::set<uint32_t> ExpandIdx(const std::string& s) {
  std::set<uint32_t> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    std::vector<std::string> r = absl::StrSplit(part, '-');
    const uint32_t lo = static_cast<uint32_t>(std::stoul(r[0]));
    const uint32_t hi = r.size() > 1 ? static_cast<uint32_t>(std::stoul(r[1])) : lo;
    for (uint32_t i = lo; i <= hi; ++i) out.insert(i);
  }
  return out;
}

// A job's devices on one node, "gpu"/"tpu" -> indices.
using NodeDevices = std::map<std::string, std::set<uint32_t>>;

// The job's devices on each node per Slurm (`scontrol -d show job`). Slurm
// writes nodes that got the same devices on one line, as a host list
// ("Nodes=a,b" or "Nodes=n[1-2]"): each of them gets those devices.
inline std::map<std::string, NodeDevices> SlurmJobDevices(const TestSlurmCluster& c,
                                                          uint32_t job) {
  std::map<std::string, NodeDevices> out;
  const std::string text = c.Cli(absl::StrCat("scontrol -d show job ", job)).out;
  static const std::regex line_re(R"(Nodes=(\S+) .*GRES=(\S+))");
  static const std::regex gres_re(R"((gpu|tpu)[^(,]*\(IDX:([0-9,-]+)\))");
  for (absl::string_view l : absl::StrSplit(text, '\n')) {
    const std::string line(l);
    std::smatch m;
    if (!std::regex_search(line, m, line_re)) continue;
    const std::string list = m[1];
    const std::string gres = m[2];
    std::vector<std::string> nodes = {list};
    if (list.find_first_of(",[") != std::string::npos) {
      nodes = absl::StrSplit(c.Cli(absl::StrCat("scontrol show hostnames ", list)).out, '\n',
                             absl::SkipWhitespace());
    }
    for (const std::string& node : nodes) {
      for (auto it = std::sregex_iterator(gres.begin(), gres.end(), gres_re);
           it != std::sregex_iterator(); ++it) {
        for (uint32_t i : ExpandIdx((*it)[2])) out[node][(*it)[1]].insert(i);
      }
    }
  }
  return out;
}

struct LedgerHolding {
  std::string node;
  std::string kind;  // slurm_job | slurm_step | pod | placeholder
  uint32_t job_id = 0;
  uint32_t step_id = 0;  // kind slurm_step
  std::string pod;      // ns/name (kind pod)
  std::string pod_uid;  // kind pod or placeholder
  NodeDevices devices;
};

// One holding of ListHoldings as a LedgerHolding.
inline LedgerHolding ToLedgerHolding(const v1::Holding& h) {
  LedgerHolding l;
  l.node = h.node();
  switch (h.owner().kind_case()) {
    case v1::Owner::kSlurmJob:
      l.kind = "slurm_job";
      l.job_id = h.owner().slurm_job().job_id();
      break;
    case v1::Owner::kSlurmStep:
      l.kind = "slurm_step";
      l.job_id = h.owner().slurm_step().job_id();
      l.step_id = h.owner().slurm_step().step_id();
      break;
    case v1::Owner::kPlaceholder:
      l.kind = "placeholder";
      l.job_id = h.owner().placeholder().job_id();
      l.pod_uid = h.owner().placeholder().pod_uid();
      break;
    case v1::Owner::kPod:
      l.kind = "pod";
      l.pod = h.owner().pod().namespace_() + "/" + h.owner().pod().name();
      l.pod_uid = h.owner().pod().uid();
      break;
    case v1::Owner::kClaim:
      l.kind = "claim";
      l.job_id = h.owner().claim().job_id();
      l.pod = h.owner().claim().namespace_() + "/" + h.owner().claim().name();
      l.pod_uid = h.owner().claim().uid();
      break;
    case v1::Owner::kLend:
      l.kind = "lend";
      l.job_id = h.owner().lend().job_id();
      break;
    case v1::Owner::kGangSlot:
      l.kind = "gang_slot";
      l.job_id = h.owner().gang_slot().job_id();
      break;
    case v1::Owner::KIND_NOT_SET:
      break;
  }
  for (const v1::HeldDevice& d : h.devices()) {
    l.devices[d.kind() == v1::DEVICE_KIND_TPU ? "tpu" : "gpu"].insert(d.index());
  }
  return l;
}

// The ledger's holdings (ListHoldings); {} with a failed expectation on error.
inline std::vector<LedgerHolding> ListLedgerHoldings(v1::Ledger::Stub* stub) {
  std::vector<LedgerHolding> out;
  if (stub == nullptr) return out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListHoldingsResponse resp;
  grpc::Status s = stub->ListHoldings(&ctx, v1::ListHoldingsRequest(), &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  for (const v1::Holding& h : resp.holdings()) out.push_back(ToLedgerHolding(h));
  return out;
}

// The real duet-bridge as a child (dies with the test process:
// PR_SET_PDEATHSIG), stdout/stderr appended to `log`; SLURM_CONF is unset
// so the bridge finds the cluster through slurm.conf_path alone.
class BridgeProcess {
 public:
  BridgeProcess(std::string config, std::string log, std::string unix_socket)
      : config_(std::move(config)), log_(std::move(log)), socket_(std::move(unix_socket)) {}
  ~BridgeProcess() { Kill(SIGTERM); }

  // Starts it; returns once its gRPC unix socket serves.
  ::testing::AssertionResult Start() {
    const pid_t parent = getpid();
    exit_status_ = -1;
    pid_ = fork();
    if (pid_ < 0) return ::testing::AssertionFailure() << "fork failed";
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      unsetenv("SLURM_CONF");
      execl(DUET_BRIDGE_BIN, DUET_BRIDGE_BIN, "--config", config_.c_str(), (char*)nullptr);
      _exit(127);
    }
    auto channel = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                      std::chrono::milliseconds(200))) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return ::testing::AssertionFailure()
               << "duet-bridge exited (status " << status << "):\n" << Log();
      }
      if (std::chrono::steady_clock::now() > end) {
        return ::testing::AssertionFailure() << "duet-bridge did not come up:\n" << Log();
      }
    }
    channel_ = channel;
    return ::testing::AssertionSuccess();
  }

  void Kill(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    channel_.reset();
  }

  bool Running() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }
  // Its exit status (128 + the signal if a signal ended it) once it has
  // exited by itself; -1 while it runs or if it was never started.
  int ExitStatus() {
    if (pid_ <= 0) return exit_status_;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return -1;
    pid_ = -1;
    channel_.reset();
    exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return exit_status_;
  }
  pid_t pid() const { return pid_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  std::string Log(int lines = 60) const {
    return RunCmd(absl::StrCat("tail -n ", lines, " ", log_)).out;
  }

 private:
  const std::string config_;
  const std::string log_;
  const std::string socket_;
  pid_t pid_ = -1;
  int exit_status_ = -1;
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace duet::testing
