// The agent path end to end (issue 28): spank_duet.so with plugstack
// agent=unix://... in real slurmstepds of a real Slurm cluster
// (slurm_cluster.sh), duet-node's step agent in a mount namespace of its own
// (tests/integration/pod_ns.sh) holding only what its pod mounts (the node's
// /run/duet, the one directory it shares with slurmd), and the real
// duet-bridge checking each step's credential (munge on 22.05, slurm.key
// where the cluster runs auth/slurm).
//
// plugstack's bridge= names a socket that does not exist: a GPU step that
// tried the gRPC path would be refused (on_unreachable=fail), so every step
// that runs here went through the agent.
//
// - a GPU step holds its GPUs in the ledger while it runs, sees them, and
//   releases them at its end; so does a batch job's step;
// - a GPU a pod holds refuses the step, naming the pod (the bridge's reason,
//   forwarded);
// - a credential the bridge does not accept refuses the step (the agent
//   forwards, it does not vouch);
// - a Slurm node the bridge does not know runs the step unregistered
//   (NODE_NOT_SHARED, forwarded and decided on the reason);
// - with duet-node down (its socket gone, or left behind by a killed agent),
//   plugstack on_unreachable decides: fail refuses the step, allow runs it;
// - a step's Release is off its path: the step ends while the bridge has not
//   answered it (stopped with SIGSTOP), and the agent's queued Release frees
//   the holding once the bridge runs again.
//
// Needs root (unshare, mount), slurmctld, slurmd, munged. Label: slurm.

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "duet/v1/duet.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/fakes/wait.h"
#include "tests/integration/e2e_helpers.h"
#include "tests/slurm/slurm_cluster_fixture.h"

#ifndef DUET_BRIDGE_BIN
#error "DUET_BRIDGE_BIN must name the duet-bridge binary"
#endif
#ifndef DUET_NODE_BIN
#error "DUET_NODE_BIN must name the duet-node binary"
#endif
#ifndef DUET_SPANK_SO
#error "DUET_SPANK_SO must name spank_duet.so"
#endif
#ifndef DUET_POD_NS_SH
#error "DUET_POD_NS_SH must name tests/integration/pod_ns.sh"
#endif

namespace duet {
namespace {

namespace fs = std::filesystem;
using ::duet::fakes::WaitFor;
using ::duet::testing::BridgeProcess;
using ::duet::testing::CmdResult;
using ::duet::testing::FreePort;
using ::duet::testing::LedgerHolding;
using ::duet::testing::RunCmd;
using ::duet::testing::TestSlurmCluster;

constexpr char kNode[] = "agent-gpu-a";
constexpr int kNodeIdx = 71;
constexpr char kGpuModel[] = "nvidia-h100-80gb";

bool Accepts(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// duet-node as its DaemonSet runs it: in a mount namespace with an empty
// /run and /tmp hidden, and the node's /run/duet (here `host_run_duet`)
// bound at /run/duet, its one shared directory. Dies with the test
// (PR_SET_PDEATHSIG).
class NodeProcess {
 public:
  NodeProcess(std::string host_run_duet, std::string bridge, std::string log)
      : host_run_duet_(std::move(host_run_duet)),
        bridge_(std::move(bridge)),
        log_(std::move(log)) {}
  ~NodeProcess() { Kill(SIGTERM); }

  ::testing::AssertionResult Start() {
    const std::string socket = host_run_duet_ + "/agent.sock";
    const pid_t parent = getpid();
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
      const std::string bind = host_run_duet_ + ":/run/duet";
      execl(DUET_POD_NS_SH, DUET_POD_NS_SH, "--hide", "/tmp", "--bind", bind.c_str(), "--",
            DUET_NODE_BIN, "--bridge", bridge_.c_str(), "--node-name", kNode, "--no-kubernetes",
            "--plugin-dir", "/run/pod/device-plugins", "--pod-resources-socket", "",
            "--step-agent-socket", "/run/duet/agent.sock", (char*)nullptr);
      _exit(127);
    }
    // Serving: a connection is accepted (a socket file left by an agent
    // that was killed is there at once, but refuses).
    return WaitFor([&] { return Accepts(socket) || !Running(); }, fakes::kWaitTimeout,
                   "duet-node's step agent socket") &&
                   Running()
               ? ::testing::AssertionSuccess()
               : ::testing::AssertionFailure() << "duet-node did not serve " << socket << ":\n"
                                               << Log();
  }

  void Kill(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  bool Running() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }
  std::string Log() const { return RunCmd("tail -n 40 " + log_).out; }

 private:
  const std::string host_run_duet_;
  const std::string bridge_;
  const std::string log_;
  pid_t pid_ = -1;
};

class World {
 public:
  static World* Get() {
    static World* w = new World();
    return w;
  }
  bool ok() const { return ok_; }
  TestSlurmCluster* cluster() const { return cluster_; }
  std::string grpc_address() const { return absl::StrCat("127.0.0.1:", grpc_port_); }
  std::string dir() const { return dir_.string(); }
  std::string host_run_duet() const { return (dir_ / "node-run-duet").string(); }
  std::string agent_socket() const { return host_run_duet() + "/agent.sock"; }

  // The plugstack line's arguments: the agent, and a bridge= that does not
  // exist (no step here may take the gRPC path).
  std::string PlugstackArgs(const std::string& extra = "") const {
    return absl::StrCat("agent=unix://", agent_socket(),
                        " bridge=unix:///nonexistent/bridge.sock timeout_ms=2000 tpu=no",
                        cluster_ && cluster_->ok() ? cluster_->PlugstackAuthArgs() : "", extra);
  }
  void SetPlugstack(const std::string& args) const {
    std::ofstream(cluster_->root() + "/etc/plugstack.conf")
        << "required " << DUET_SPANK_SO << " " << args << "\n";
  }

  ::testing::AssertionResult StartBridge() {
    bridge_ = std::make_unique<BridgeProcess>((dir_ / "bridge.yaml").string(),
                                              (dir_ / "bridge.log").string(),
                                              (dir_ / "bridge.sock").string());
    ::testing::AssertionResult r = bridge_->Start();
    if (r) stub_ = v1::Ledger::NewStub(bridge_->channel());
    return r;
  }
  ::testing::AssertionResult StartNode() {
    node_ = std::make_unique<NodeProcess>(host_run_duet(), grpc_address(),
                                          (dir_ / "node.log").string());
    return node_->Start();
  }
  void KillNode(int sig) {
    if (node_ != nullptr) node_->Kill(sig);
  }
  bool NodeRunning() const { return node_ != nullptr && node_->Running(); }
  std::string NodeLog() const { return node_ ? node_->Log() : ""; }
  std::string BridgeLog() const { return RunCmd("tail -n 40 " + (dir_ / "bridge.log").string()).out; }
  v1::Ledger::Stub* stub() const { return stub_.get(); }
  pid_t bridge_pid() const { return bridge_ != nullptr ? bridge_->pid() : -1; }

  void Stop() {
    node_.reset();
    stub_.reset();
    bridge_.reset();
    if (cluster_ != nullptr) cluster_->Stop();
    std::error_code ec;
    if (!dir_.empty() && ::testing::UnitTest::GetInstance()->Passed()) fs::remove_all(dir_, ec);
  }

 private:
  class Stopper : public ::testing::Environment {
   public:
    explicit Stopper(World* w) : w_(w) {}
    void TearDown() override { w_->Stop(); }

   private:
    World* w_;
  };

  World() {
    char tmpl[] = "/tmp/duet-agent-e2e.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return;
    dir_ = tmpl;
    fs::create_directories(host_run_duet());
    grpc_port_ = FreePort();
    TestSlurmCluster::Options o;
    o.spank = absl::StrCat(DUET_SPANK_SO, ":", PlugstackArgs());
    cluster_ = TestSlurmCluster::Get(o);
    ::testing::AddGlobalTestEnvironment(new Stopper(this));
    if (!cluster_->ok()) return;
    SetPlugstack(PlugstackArgs());  // now with the cluster's credential
    std::ofstream inv(dir_ / "nodes.yaml");
    inv << "nodes:\n  - name: " << kNode << "\n    cpus: 8\n    memory_mib: 16000\n"
        << "    zone: us-central1-a\n    pool: shared-h100\n"
        << "    labels: {duet.dev/slurm-node-addr: 127.0.0." << kNodeIdx
        << ", cloud.google.com/gke-accelerator: " << kGpuModel << "}\n"
        << "    gpus: {count: 8, model: " << kGpuModel << "}\n";
    inv.close();
    std::ofstream cfg(dir_ / "bridge.yaml");
    cfg << "grpc: {listen: \"" << grpc_address() << "\", unix_socket: "
        << (dir_ / "bridge.sock").string() << "}\n"
        << "metrics: {listen: \"127.0.0.1:" << FreePort() << "\"}\n"
        << "journal: {dir: " << (dir_ / "journal").string() << "}\n"
        << "inventory: {source: file, file: " << (dir_ / "nodes.yaml").string()
        << ", reload_period: 1s}\n"
        << "slurm:\n  enabled: true\n  conf_path: " << cluster_->conf() << "\n"
        << "  call_timeout: 3s\n  sync_period: 500ms\n  release_grace: 1s\n"
        << cluster_->BridgeAuthYaml() << "log_level: info\n";
    cfg.close();
    ok_ = true;
  }

  bool ok_ = false;
  fs::path dir_;
  int grpc_port_ = 0;
  TestSlurmCluster* cluster_ = nullptr;
  std::unique_ptr<BridgeProcess> bridge_;
  std::unique_ptr<NodeProcess> node_;
  std::unique_ptr<v1::Ledger::Stub> stub_;
};

class StepAgentE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    w_ = World::Get();
    ASSERT_TRUE(w_->ok());
    c_ = w_->cluster();
    if (w_->stub() == nullptr) {
      ASSERT_TRUE(w_->StartBridge());
    }
    static bool slurmd_started = false;
    if (!slurmd_started) {
      slurmd_started = true;
      ASSERT_TRUE(WaitFor([&] {
        return c_->Cli(absl::StrCat("scontrol --future show node ", kNode)).rc == 0;
      })) << w_->BridgeLog();
      c_->StartSlurmd(kNode, kNodeIdx, 8, 16000, 8, kGpuModel);
    }
    ASSERT_TRUE(c_->WaitNodeState(kNode, "IDLE", absl::Seconds(30))) << c_->Log("slurmctld.log");
    if (!w_->NodeRunning()) {
      ASSERT_TRUE(w_->StartNode());
    }
    w_->SetPlugstack(w_->PlugstackArgs());
  }
  void TearDown() override {
    if (c_ == nullptr || !w_->ok()) return;
    c_->Cli("squeue -h -o %i | xargs -r scancel");
    EXPECT_TRUE(WaitFor([&] { return c_->Cli("squeue -h -o %i").out.empty(); }))
        << "jobs left after the test: " << c_->Cli("squeue").out;
    if (HasFailure()) {
      std::cerr << "== duet-node log\n" << w_->NodeLog() << "== duet-bridge log\n"
                << w_->BridgeLog();
    }
  }

  std::vector<LedgerHolding> Holdings() {
    return ::duet::testing::ListLedgerHoldings(w_->stub());
  }
  bool StepHolds(size_t gpus) {
    for (const LedgerHolding& h : Holdings()) {
      const auto g = h.devices.find("gpu");
      if (h.kind == "slurm_step" && h.node == kNode && g != h.devices.end() &&
          g->second.size() == gpus) {
        return true;
      }
    }
    return false;
  }
  bool HoldsStep(uint32_t job, uint32_t step) {
    for (const LedgerHolding& h : Holdings()) {
      if (h.kind == "slurm_step" && h.job_id == job && h.step_id == step) return true;
    }
    return false;
  }
  bool NoSlurmStep() {
    for (const LedgerHolding& h : Holdings()) {
      if (h.kind == "slurm_step") return false;
    }
    return true;
  }
  void HoldPodGpu(const std::string& name, uint32_t gpu) {
    grpc::ClientContext ctx;
    v1::HoldRequest req;
    req.set_node(kNode);
    auto* pod = req.mutable_owner()->mutable_pod();
    pod->set_uid("uid-" + name);
    pod->set_namespace_("default");
    pod->set_name(name);
    auto* d = req.mutable_devices()->add_devices();
    d->set_kind(v1::DEVICE_KIND_GPU);
    d->set_index(gpu);
    v1::HoldResponse resp;
    grpc::Status s = w_->stub()->Hold(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  void ReleasePod(const std::string& name) {
    grpc::ClientContext ctx;
    v1::ReleaseRequest req;
    req.set_node(kNode);
    req.mutable_owner()->mutable_pod()->set_uid("uid-" + name);
    v1::ReleaseResponse resp;
    EXPECT_TRUE(w_->stub()->Release(&ctx, req, &resp).ok());
  }

  World* w_ = nullptr;
  TestSlurmCluster* c_ = nullptr;
};

TEST_F(StepAgentE2eTest, AGpuStepHoldsThroughTheAgentWhileItRunsAndReleasesAtItsEnd) {
  auto run = std::async(std::launch::async, [&] {
    return c_->Cli(absl::StrCat("srun -w ", kNode,
                                " --gres=gpu:2 sh -c 'echo RAN CVD=$CUDA_VISIBLE_DEVICES; sleep 2'"));
  });
  const bool seen = static_cast<bool>(WaitFor([&] { return StepHolds(2); }));
  CmdResult r = run.get();
  EXPECT_TRUE(seen) << "the step never held its 2 GPUs in the ledger";
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("RAN CVD=0,1\n"), std::string::npos) << r.out;
  EXPECT_TRUE(WaitFor([&] { return NoSlurmStep(); })) << "the step's holding outlived it";

  // A batch job's steps (the batch step, then an srun step inside it) hold
  // and release through the agent too.
  const uint32_t job = c_->Sbatch(absl::StrCat(
      "-w ", kNode, " --gres=gpu:1 --wrap 'srun --gres=gpu:1 sh -c \"sleep 1\"'"));
  EXPECT_TRUE(WaitFor([&] { return StepHolds(1); })) << "job " << job;
  EXPECT_TRUE(WaitFor([&] { return c_->Cli("squeue -h -o %i").out.empty(); }));
  EXPECT_TRUE(WaitFor([&] { return NoSlurmStep(); })) << "a step's holding outlived it";
}

TEST_F(StepAgentE2eTest, AGpuHeldByAPodRefusesTheStepNamingThePod) {
  HoldPodGpu("web-1", 0);
  const std::string cmd =
      absl::StrCat("srun -w ", kNode, " --gres=gpu:1 sh -c 'echo RAN CVD=$CUDA_VISIBLE_DEVICES'");
  CmdResult r = c_->Cli(cmd);
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.find("RAN"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(absl::StrCat("refused on node ", kNode)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gpu 0 is held by pod default/web-1"), std::string::npos) << r.out;
  ReleasePod("web-1");
  r = c_->Cli(cmd);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("RAN CVD=0\n"), std::string::npos) << r.out;
}

// The agent forwards the step's credential; the bridge decides. A step that
// sends none (plugstack auth=none) is refused by the bridge, through the agent.
TEST_F(StepAgentE2eTest, TheBridgeNotTheAgentJudgesTheCredential) {
  w_->SetPlugstack(absl::StrCat("agent=unix://", w_->agent_socket(),
                                " bridge=unix:///nonexistent/bridge.sock timeout_ms=2000 tpu=no "
                                "auth=none"));
  CmdResult r = c_->Cli(absl::StrCat("srun -w ", kNode, " --gres=gpu:1 echo RAN"));
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.find("RAN"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("duet-bridge refused this step's credential (why=missing"),
            std::string::npos)
      << r.out;
}

// A Slurm node the bridge does not know (not shared with Kubernetes): the
// bridge answers NODE_NOT_SHARED through the agent, and the step runs
// unregistered with its GPUs exported.
TEST_F(StepAgentE2eTest, AStepOnANodeTheBridgeDoesNotKnowRuns) {
  CmdResult r = RunCmd(c_->Script(absl::StrCat("create ", c_->root(),
                                               " agent-plain 72 'CPUs=8 RealMemory=16000 "
                                               "Gres=gpu:h100:2'")));
  ASSERT_EQ(r.rc, 0) << r.out;
  c_->StartSlurmd("agent-plain", 72, 8, 16000, 2, "h100");
  ASSERT_TRUE(c_->WaitNodeState("agent-plain", "IDLE")) << c_->Log("slurmctld.log");
  r = c_->Cli("srun -w agent-plain --gres=gpu:2 sh -c 'echo RAN CVD=$CUDA_VISIBLE_DEVICES'");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("RAN CVD=0,1\n"), std::string::npos) << r.out;
  EXPECT_TRUE(NoSlurmStep());
}

TEST_F(StepAgentE2eTest, WithTheAgentDownOnUnreachableDecides) {
  const std::string cmd = absl::StrCat("srun -w ", kNode, " --gres=gpu:1 echo RAN");
  // Killed outright: its socket file stays, nobody listens (ECONNREFUSED).
  w_->KillNode(SIGKILL);
  ASSERT_EQ(access(w_->agent_socket().c_str(), F_OK), 0);
  CmdResult r = c_->Cli(cmd);
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.find("RAN"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("unreachable"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("plugstack on_unreachable=fail"), std::string::npos) << r.out;
  // Stopped: its socket is gone (ENOENT); allow runs the step unregistered.
  ASSERT_TRUE(w_->StartNode());
  w_->KillNode(SIGTERM);
  ASSERT_NE(access(w_->agent_socket().c_str(), F_OK), 0);
  w_->SetPlugstack(w_->PlugstackArgs(" on_unreachable=allow"));
  r = c_->Cli(cmd);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("RAN"), std::string::npos) << r.out;
  EXPECT_TRUE(NoSlurmStep());
  w_->SetPlugstack(w_->PlugstackArgs());
  r = c_->Cli(cmd);
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("connect"), std::string::npos) << r.out;
}

// Issue 28: the step does not wait for the bridge's Release. A batch job's
// srun step holds its GPU; the bridge is then stopped (SIGSTOP: it answers
// nothing, as a slow bridge); the step ends (srun returns and slurmctld
// lists the step no more), and its job goes on, while the bridge is still
// stopped. Once the bridge runs again, the agent's queued
// Release frees the step's holding while the job still runs (job import
// releases only the holdings of jobs that have ended, so it was not that).
// plugstack timeout_ms=60000: a plugin that waited for the bridge would hold
// the step far beyond the wait below.
TEST_F(StepAgentE2eTest, TheStepEndsBeforeTheBridgeAnswersItsReleaseWhichStillLands) {
  w_->SetPlugstack(w_->PlugstackArgs(" timeout_ms=60000"));
  const std::string go = w_->dir() + "/release-go";
  const std::string done = w_->dir() + "/release-step-done";
  const std::string end = w_->dir() + "/release-end";
  const std::string started = w_->dir() + "/release-step-started";
  const uint32_t job = c_->Sbatch(absl::StrCat(
      "-w ", kNode, " --gres=gpu:1 --wrap \"srun --gres=gpu:1 sh -c 'touch ", started,
      "; until [ -e ", go, " ]; do sleep 0.05; done' && touch ", done, "; until [ -e ", end,
      " ]; do sleep 0.1; done\""));
  ASSERT_NE(job, 0u);
  ASSERT_TRUE(WaitFor([&] { return HoldsStep(job, 0); })) << "step " << job << ".0 never held";
  // The ledger shows the Hold before its answer reaches the plugin: stop the
  // bridge only once the step's task runs, so the Hold has been answered and
  // only the Release can meet a stopped bridge.
  ASSERT_TRUE(WaitFor([&] { return access(started.c_str(), F_OK) == 0; }))
      << "step " << job << ".0 held but its task never started";
  const pid_t bridge = w_->bridge_pid();
  ASSERT_GT(bridge, 0);
  ASSERT_EQ(kill(bridge, SIGSTOP), 0);
  struct Continue {
    pid_t pid;
    ~Continue() { kill(pid, SIGCONT); }
  } resume{bridge};
  std::ofstream(go).put('1');
  // Ended for Slurm: srun has returned, and slurmctld no longer lists the
  // step (slurmstepd reports it complete after slurm_spank_exit, so a
  // plugin waiting there for the bridge keeps it listed, and a next step
  // on its GPUs waiting).
  const std::string step = absl::StrCat(job, ".0");
  const bool ended = static_cast<bool>(WaitFor(
      [&] {
        return access(done.c_str(), F_OK) == 0 &&
               c_->Cli(absl::StrCat("squeue -h -s -j ", job, " -o %i")).out.find(step) ==
                   std::string::npos;
      },
      absl::Seconds(20), "the srun step to end while the bridge is stopped"));
  EXPECT_TRUE(ended) << "the step waited for the bridge's Release: "
                     << c_->Cli(absl::StrCat("squeue -s -j ", job)).out;
  kill(bridge, SIGCONT);
  EXPECT_TRUE(WaitFor([&] { return !HoldsStep(job, 0); }))
      << "the queued Release never freed step " << job << ".0";
  EXPECT_EQ(c_->JobState(job), "RUNNING") << "the job ended: job import may have released it";
  std::ofstream(end).put('1');
  EXPECT_TRUE(WaitFor([&] { return c_->JobEnded(job); })) << "job " << job;
}

}  // namespace
}  // namespace duet
