// End to end, with the real binaries only: duet-bridge (slurm.enabled) and
// duetctl, a real Slurm 22.05 cluster on loopback (tests/integration/
// slurm_cluster.sh: munged, slurmctld, one slurmd per node) with spank_duet.so
// in plugstack.conf pointing at the bridge's unix socket, and Slurm's own CLI
// (sinfo, scontrol, squeue, sbatch, srun, scancel). Label: slurm.
//
// - duet-bridge creates the inventory's nodes in Slurm with their Gres;
// - an sbatch job is imported: duetctl shows its GPUs held by Slurm;
// - srun steps register through spank_duet.so, see exactly their devices, and
//   a step on a GPU a pod holds is refused with the pod's name;
// - kill -9 of duet-bridge while jobs run, changes in Slurm while it is down,
//   restart: the ledger agrees with Slurm after the next pass, nothing lost;
// - slurmctld down: health "duet.slurm" NOT_SERVING, duet_slurm_degraded 1,
//   the ledger keeps serving; back to SERVING once slurmctld returns;
// - Slurm's ordinary life: 100 GPU jobs back to back on one node (some with
//   srun steps inside the batch script), interleaved with array tasks, none
//   refused; steps inside a batch job register and see their devices; a
//   batch job's end reaches the ledger at its batch step's exit.
//
// One cluster and one bridge state directory per process (libslurm and the
// plugstack are per process); ctest runs each test in its own process.

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/credential/munge_payload.h"
#include "common/credential/request_digest.h"
#include "common/credential/slurm_key_cred.h"
#include "duet/v1/duet.grpc.pb.h"
#include "proto/duet/v1/error_reason.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "slurm_plugin/bridge_client.h"
#include "tests/integration/e2e_helpers.h"
#include "tests/slurm/slurm_cluster_fixture.h"

#ifndef DUET_BRIDGE_BIN
#error "DUET_BRIDGE_BIN must name the duet-bridge binary"
#endif
#ifndef DUETCTL_BIN
#error "DUETCTL_BIN must name the duetctl binary"
#endif
#ifndef DUET_SPANK_SO
#error "DUET_SPANK_SO must name spank_duet.so"
#endif

namespace duet {
namespace {

namespace fs = std::filesystem;
using ::duet::testing::BridgeProcess;
using ::duet::testing::CmdResult;
using ::duet::testing::FreePort;
using ::duet::testing::LedgerHolding;
using ::duet::testing::NodeDevices;
using ::duet::testing::RunCmd;
using ::duet::testing::TestSlurmCluster;
using ::duet::testing::WaitFor;

constexpr char kGpuModel[] = "nvidia-h100-80gb";
constexpr char kTpuModel[] = "tpu-v5-lite-podslice";

struct NodeDef {
  const char* name;
  int idx;  // slurmd on 127.0.0.idx
  int gpus;
  int tpus;
};
constexpr NodeDef kNodes[] = {
    {"e2e-gpu-a", 61, 8, 0},
    {"e2e-gpu-b", 62, 8, 0},
    {"e2e-tpu-a", 63, 0, 4},
};

// Everything one process shares: the bridge's directory, the cluster, the
// bridge process. Made on first use; stopped by a gtest Environment at exit
// (the bridge also dies with the test process: PR_SET_PDEATHSIG).
class World {
 public:
  static World* Get() {
    static World* w = new World();
    return w;
  }

  bool ok() const { return ok_; }
  TestSlurmCluster* cluster() const { return cluster_; }
  const fs::path& dir() const { return dir_; }
  std::string socket() const { return (dir_ / "bridge.sock").string(); }
  int metrics_port() const { return metrics_port_; }

  // slurmstepd reaches the bridge over TCP, as from a Slurm node (NodeSet
  // pod) to the bridge's Service: never through the bridge's own socket
  // file, which only the tests' operator side (duetctl, the stub) uses.
  std::string grpc_address() const { return absl::StrCat("127.0.0.1:", grpc_port_); }
  std::string PlugstackArgs(const std::string& extra = "") const {
    return absl::StrCat("bridge=", grpc_address(), " timeout_ms=2000 tpu=yes",
                        cluster_ && cluster_->ok() ? cluster_->PlugstackAuthArgs() : "", extra);
  }
  void SetPlugstack(const std::string& args) const {
    std::ofstream(cluster_->root() + "/etc/plugstack.conf")
        << "required " << DUET_SPANK_SO << " " << args << "\n";
  }

  // Starts duet-bridge on the state in dir(); waits until it serves.
  ::testing::AssertionResult StartBridge() {
    bridge_ = std::make_unique<BridgeProcess>((dir_ / "bridge.yaml").string(),
                                              (dir_ / "bridge.log").string(), socket());
    ::testing::AssertionResult r = bridge_->Start();
    if (!r) return r;
    stub_ = v1::Ledger::NewStub(bridge_->channel());
    health_ = grpc::health::v1::Health::NewStub(bridge_->channel());
    return ::testing::AssertionSuccess();
  }

  void KillBridge(int sig) {
    if (bridge_ != nullptr) bridge_->Kill(sig);
    stub_.reset();
    health_.reset();
  }

  bool BridgeRunning() const { return bridge_ != nullptr && bridge_->Running(); }

  v1::Ledger::Stub* stub() const { return stub_.get(); }
  grpc::health::v1::Health::Stub* health() const { return health_.get(); }

  std::string Log() const {
    return RunCmd("tail -n 60 " + (dir_ / "bridge.log").string()).out;
  }

  CmdResult Ctl(const std::string& args) const {
    return RunCmd(absl::StrCat(DUETCTL_BIN, " --server unix://", socket(), " ", args));
  }

  void Stop() {
    KillBridge(SIGTERM);
    if (cluster_ != nullptr) cluster_->Stop();
    if (!dir_.empty() && ::testing::UnitTest::GetInstance()->Passed()) {
      std::error_code ec;
      fs::remove_all(dir_, ec);
      if (cluster_ != nullptr && !cluster_->root().empty()) fs::remove_all(cluster_->root(), ec);
    } else if (!dir_.empty()) {
      std::cerr << "slurm_e2e_test: kept " << dir_ << " and " << (cluster_ ? cluster_->root() : "")
                << " for inspection\n";
    }
  }

 private:
  class Stopper : public ::testing::Environment {
   public:
    explicit Stopper(World* w) : w_(w) {}
    void TearDown() override { w_->Stop(); }

   private:
    World* w_;
  };

  // Fast passes for the tests (imports within 0.5 s); the back-to-back test
  // runs the defaults a user gets (10 s, 5 s), under which an ended job's
  // import outlives it by seconds. ctest runs each test in its own process,
  // so the first test of the process picks.
  static std::string SyncTimings() {
    const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
    if (t != nullptr && absl::StrContains(t->name(), "BackToBack")) {
      return "  sync_period: 10s\n  release_grace: 5s\n";
    }
    return "  sync_period: 500ms\n  release_grace: 1s\n";
  }

  World() {
    char tmpl[] = "/tmp/duet-e2e.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      ADD_FAILURE() << "mkdtemp failed";
      return;
    }
    dir_ = tmpl;
    grpc_port_ = FreePort();
    TestSlurmCluster::Options o;
    o.spank = absl::StrCat(DUET_SPANK_SO, ":", PlugstackArgs());
    cluster_ = TestSlurmCluster::Get(o);  // registers the cluster's Stopper first...
    ::testing::AddGlobalTestEnvironment(new Stopper(this));  // ...so this one runs first
    if (!cluster_->ok()) return;
    SetPlugstack(PlugstackArgs());  // now with the cluster's credential
    metrics_port_ = FreePort();

    std::ofstream inv(dir_ / "nodes.yaml");
    inv << "nodes:\n";
    for (const NodeDef& n : kNodes) {
      inv << "  - name: " << n.name << "\n"
          << "    cpus: 8\n    memory_mib: 16000\n    zone: us-central1-a\n";
      if (n.gpus > 0) {
        inv << "    pool: shared-h100\n"
            << "    labels: {duet.dev/slurm-node-addr: 127.0.0." << n.idx
            << ", cloud.google.com/gke-accelerator: " << kGpuModel << "}\n"
            << "    gpus: {count: " << n.gpus << ", model: " << kGpuModel << "}\n";
      } else {
        inv << "    pool: shared-v5e\n"
            << "    labels: {duet.dev/slurm-node-addr: 127.0.0." << n.idx
            << ", cloud.google.com/gke-tpu-accelerator: " << kTpuModel << "}\n"
            << "    tpus: {count: " << n.tpus << ", model: " << kTpuModel
            << ", host_bounds: 2x2, topology: 2x2}\n";
      }
    }
    inv.close();
    std::ofstream cfg(dir_ / "bridge.yaml");
    cfg << "grpc: {listen: \"" << grpc_address() << "\", unix_socket: " << socket() << "}\n"
        << "metrics: {listen: \"127.0.0.1:" << metrics_port_ << "\"}\n"
        << "journal: {dir: " << (dir_ / "journal").string() << "}\n"
        << "inventory: {source: file, file: " << (dir_ / "nodes.yaml").string()
        << ", reload_period: 1s}\n"
        << "slurm:\n"
        << "  enabled: true\n"
        << "  conf_path: " << cluster_->conf() << "\n"
        << "  call_timeout: 3s\n"
        << SyncTimings() << cluster_->BridgeAuthYaml()
        << "log_level: info\n";
    cfg.close();
    ok_ = true;
  }

  bool ok_ = false;
  fs::path dir_;
  TestSlurmCluster* cluster_ = nullptr;
  int metrics_port_ = 0;
  int grpc_port_ = 0;
  std::unique_ptr<BridgeProcess> bridge_;
  std::unique_ptr<v1::Ledger::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

class SlurmE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    w_ = World::Get();
    ASSERT_TRUE(w_->ok());
    c_ = w_->cluster();
    if (!w_->BridgeRunning()) {
      ASSERT_TRUE(w_->StartBridge());
    }
    // The bridge created the nodes (first pass before serving): start their
    // slurmds once.
    static bool slurmds_started = false;
    if (!slurmds_started) {
      slurmds_started = true;
      for (const NodeDef& n : kNodes) {
        ASSERT_TRUE(WaitFor([&] {
          return c_->Cli(absl::StrCat("scontrol --future show node ", n.name)).rc == 0;
        })) << n.name << " was not created by duet-bridge\n"
            << w_->Log();
        c_->StartSlurmd(n.name, n.idx, 8, 16000, n.gpus, kGpuModel, n.tpus, kTpuModel);
      }
    }
    for (const NodeDef& n : kNodes) {
      ASSERT_TRUE(c_->WaitNodeState(n.name, "IDLE", absl::Seconds(30)))
          << n.name << "\n"
          << c_->Cli(absl::StrCat("scontrol --future show node ", n.name)).out
          << c_->Log("slurmctld.log");
    }
  }

  void TearDown() override {
    if (c_ == nullptr || !w_->ok()) return;
    // Leave an empty cluster and ledger for the next test of this process.
    c_->Cli("squeue -h -o %i | xargs -r scancel");
    WaitFor([&] { return c_->Cli("squeue -h -o %i").out.empty(); });
    if (w_->BridgeRunning()) WaitFor([&] { return Holdings().empty(); });
    if (HasFailure()) {
      std::cerr << "== duet-bridge log\n" << w_->Log() << "== slurmctld.log\n"
                << c_->Log("slurmctld.log");
    }
  }

  // `sbatch` a sleeping job; returns its id once it runs.
  uint32_t RunningJob(const std::string& args) {
    const uint32_t id = c_->Sbatch(args + " --wrap 'sleep 300'");
    EXPECT_TRUE(c_->WaitJobState(id, "RUNNING"))
        << "job " << id << " is " << c_->JobState(id) << "\n"
        << c_->Cli(absl::StrCat("scontrol show job ", id)).out;
    return id;
  }

  // The job's devices on each node per Slurm (`scontrol -d show job`).
  std::map<std::string, NodeDevices> SlurmDevices(uint32_t job) {
    return ::duet::testing::SlurmJobDevices(*c_, job);
  }

  std::vector<LedgerHolding> Holdings() { return ::duet::testing::ListLedgerHoldings(w_->stub()); }

  // The ledger's job holding of `job` on `node` ({} when none).
  NodeDevices LedgerJob(uint32_t job, const std::string& node) {
    for (const LedgerHolding& h : Holdings()) {
      if (h.kind == "slurm_job" && h.job_id == job && h.node == node) return h.devices;
    }
    return {};
  }

  // "" when the ledger and Slurm agree: every running job is held in the
  // ledger on exactly its devices, and every Slurm-side holding (job or step)
  // belongs to a live job and stays within that job's devices.
  std::string LedgerVsSlurm() {
    std::map<uint32_t, std::map<std::string, NodeDevices>> live;
    const std::string q = c_->Cli("squeue -h -o '%i %T'").out;
    for (absl::string_view l : absl::StrSplit(q, '\n', absl::SkipEmpty())) {
      std::vector<std::string> f = absl::StrSplit(l, ' ', absl::SkipEmpty());
      if (f.size() != 2) continue;
      if (f[1] != "RUNNING" && f[1] != "COMPLETING" && f[1] != "SUSPENDED") continue;
      const uint32_t id = static_cast<uint32_t>(std::stoul(f[0]));
      live[id] = SlurmDevices(id);
    }
    const std::vector<LedgerHolding> holdings = Holdings();
    std::string diff;
    for (const auto& [job, nodes] : live) {
      for (const auto& [node, devices] : nodes) {
        bool found = false;
        for (const LedgerHolding& h : holdings) {
          if (h.kind != "slurm_job" || h.job_id != job || h.node != node) continue;
          found = true;
          if (h.devices != devices) {
            absl::StrAppend(&diff, "job ", job, " on ", node, ": ledger devices differ\n");
          }
        }
        if (!found) absl::StrAppend(&diff, "job ", job, " on ", node, ": not in the ledger\n");
      }
    }
    for (const LedgerHolding& h : holdings) {
      if (h.kind == "pod") continue;
      auto it = live.find(h.job_id);
      if (it == live.end()) {
        absl::StrAppend(&diff, h.kind, " of job ", h.job_id, " on ", h.node,
                        ": job not live in Slurm\n");
        continue;
      }
      const NodeDevices& job_devices = it->second[h.node];
      for (const auto& [kind, idx] : h.devices) {
        for (uint32_t i : idx) {
          if (job_devices.count(kind) == 0 || job_devices.at(kind).count(i) == 0) {
            absl::StrAppend(&diff, h.kind, " of job ", h.job_id, " on ", h.node, " holds ", kind,
                            i, " Slurm did not give it\n");
          }
        }
      }
    }
    return diff;
  }

  void ExpectLedgerAgreesWithSlurm(const std::string& when) {
    std::string diff;
    EXPECT_TRUE(WaitFor(
        [&] {
          diff = LedgerVsSlurm();
          return diff.empty();
        },
        absl::Seconds(20)))
        << when << ":\n"
        << diff << c_->Cli("squeue").out << w_->Ctl("holds").out;
  }

  // The row of `duetctl nodes` for (node, kind): TOTAL SLURM PODS FREE.
  std::vector<std::string> CtlNodeRow(const std::string& out, const std::string& node,
                                      const std::string& kind) {
    for (absl::string_view l : absl::StrSplit(out, '\n')) {
      std::vector<std::string> f = absl::StrSplit(l, ' ', absl::SkipEmpty());
      // With the Slurm side on, SLURM-STATE follows STATE.
      if (f.size() == 9) f.erase(f.begin() + 2);
      if (f.size() == 8 && f[0] == node && f[2] == kind) return {f[4], f[5], f[6], f[7]};
    }
    return {};
  }

  // A pod (as duet-node or the extender would) holds GPU `gpu` of `node`.
  void HoldPodGpu(const std::string& node, const std::string& name, uint32_t gpu) {
    grpc::ClientContext ctx;
    v1::HoldRequest req;
    req.set_node(node);
    auto* pod = req.mutable_owner()->mutable_pod();
    pod->set_uid("uid-" + name);
    pod->set_namespace_("default");
    pod->set_name(name);
    auto* d = req.mutable_devices()->add_devices();
    d->set_kind(v1::DEVICE_KIND_GPU);
    d->set_index(gpu);
    v1::HoldResponse resp;
    grpc::Status s = w_->stub()->Hold(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message() << "\n" << w_->Ctl("holds").out;
  }
  void ReleasePod(const std::string& node, const std::string& name) {
    grpc::ClientContext ctx;
    v1::ReleaseRequest req;
    req.set_node(node);
    req.mutable_owner()->mutable_pod()->set_uid("uid-" + name);
    v1::ReleaseResponse resp;
    EXPECT_TRUE(w_->stub()->Release(&ctx, req, &resp).ok());
  }

  // The nodes on which the ledger held step `step` of `job` at any poll
  // until `done` holds (polled every 50 ms, at most `timeout`).
  template <typename Done>
  std::map<std::string, NodeDevices> StepHoldingsUntil(uint32_t job, uint32_t step, Done done,
                                                       absl::Duration timeout = absl::Seconds(60)) {
    std::map<std::string, NodeDevices> seen;
    WaitFor(
        [&] {
          for (const LedgerHolding& h : Holdings()) {
            if (h.kind == "slurm_step" && h.job_id == job && h.step_id == step) {
              seen[h.node] = h.devices;
            }
          }
          return done();
        },
        timeout);
    return seen;
  }

  // A batch script in the test's directory; returns its path.
  std::string Script(const std::string& name, const std::string& text) {
    const fs::path p = w_->dir() / name;
    std::ofstream(p) << text;
    ::chmod(p.c_str(), 0755);
    return p.string();
  }

  static std::string ReadFile(const fs::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  World* w_ = nullptr;
  TestSlurmCluster* c_ = nullptr;
};

TEST_F(SlurmE2eTest, BridgeCreatesTheNodesAndImportsABatchJob) {
  // Nodes: created by duet-bridge with their Gres and the managed feature.
  CmdResult r = c_->Cli("sinfo -h -N -o '%N|%G|%f|%t'");
  EXPECT_NE(r.out.find("e2e-gpu-a|gpu:nvidia-h100-80gb:8|duet,"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("e2e-gpu-b|gpu:nvidia-h100-80gb:8|duet,"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("e2e-tpu-a|tpu:tpu-v5-lite-podslice:4|duet,"), std::string::npos) << r.out;
  r = c_->Cli("scontrol show node e2e-gpu-b");
  EXPECT_NE(r.out.find("NodeAddr=127.0.0.62"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CPUTot=8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("RealMemory=16000"), std::string::npos) << r.out;

  // A batch job on 2 GPUs: imported into the ledger with Slurm's indices.
  const uint32_t job = RunningJob("-w e2e-gpu-a --gres=gpu:2");
  ASSERT_NE(job, 0u);
  const NodeDevices want = SlurmDevices(job)["e2e-gpu-a"];
  ASSERT_EQ(want.count("gpu"), 1u) << c_->Cli(absl::StrCat("scontrol -d show job ", job)).out;
  ASSERT_EQ(want.at("gpu").size(), 2u);
  EXPECT_TRUE(WaitFor([&] { return LedgerJob(job, "e2e-gpu-a") == want; }))
      << w_->Ctl("holds").out << w_->Log();

  r = w_->Ctl("nodes");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(CtlNodeRow(r.out, "e2e-gpu-a", "gpu"),
            (std::vector<std::string>{"8", "2", "0", "6"}))
      << r.out;
  EXPECT_EQ(CtlNodeRow(r.out, "e2e-gpu-b", "gpu"),
            (std::vector<std::string>{"8", "0", "0", "8"}))
      << r.out;
  EXPECT_EQ(CtlNodeRow(r.out, "e2e-tpu-a", "tpu"),
            (std::vector<std::string>{"4", "0", "0", "4"}))
      << r.out;
  r = w_->Ctl("holds --node e2e-gpu-a");
  EXPECT_EQ(r.rc, 0) << r.out;
  const std::string devs = absl::StrCat("gpu", *want.at("gpu").begin(), "-",
                                        *want.at("gpu").rbegin());
  EXPECT_TRUE(std::regex_search(
      r.out, std::regex(absl::StrCat("e2e-gpu-a +job ", job, " +", devs, " "))))
      << r.out;
  ExpectLedgerAgreesWithSlurm("while the batch job runs");
  // Weights fed back: free GPU milli + 1, so the fuller node comes first.
  EXPECT_TRUE(WaitFor([&] {
    return c_->Cli("sinfo -h -N -n e2e-gpu-a,e2e-gpu-b -o '%N|%w'").out ==
           "e2e-gpu-a|6001\ne2e-gpu-b|8001\n";
  })) << c_->Cli("sinfo -h -N -o '%N|%w'").out;

  // Health and metrics of the Slurm side.
  {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service("duet.slurm");
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(w_->health()->Check(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  r = RunCmd(absl::StrCat("curl -sf http://127.0.0.1:", w_->metrics_port(), "/metrics"));
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("\nduet_slurm_degraded 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nduet_slurm_sync_passes_total "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\nduet_slurm_sync_passes_total 0\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nduet_slurm_conflicts_total 0\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nduet_slurm_reconfigures_total "), std::string::npos) << r.out;

  // The job ends: its holdings go (release_grace 1s, period 500ms).
  ASSERT_EQ(c_->Cli(absl::StrCat("scancel ", job)).rc, 0);
  EXPECT_TRUE(WaitFor([&] { return Holdings().empty(); })) << w_->Ctl("holds").out;
}

TEST_F(SlurmE2eTest, StepsRegisterWithTheBridgeAndAPodsGpuIsRefused) {
  // A GPU step: registered with the bridge while it runs, exactly its GPU.
  auto run = std::async(std::launch::async, [&] {
    return c_->Cli(
        "srun -w e2e-gpu-b --gres=gpu:1 --duet-show sh -c 'echo CVD=$CUDA_VISIBLE_DEVICES; "
        "sleep 3'");
  });
  bool step_seen = false;
  WaitFor([&] {
    for (const LedgerHolding& h : Holdings()) {
      if (h.kind == "slurm_step" && h.node == "e2e-gpu-b" &&
          h.devices == NodeDevices{{"gpu", {0}}}) {
        step_seen = true;
      }
    }
    return step_seen;
  });
  CmdResult r = run.get();
  EXPECT_TRUE(step_seen) << "the step never showed in the ledger\n" << w_->Log();
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("CVD=0\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("on e2e-gpu-b got gpu 0"), std::string::npos) << r.out;
  // The step released itself, the job import released the job: the node is free.
  EXPECT_TRUE(WaitFor([&] { return Holdings().empty(); })) << w_->Ctl("holds").out;

  // A TPU step sees its chips.
  r = c_->Cli("srun -w e2e-tpu-a --gres=tpu:2 env");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("TPU_VISIBLE_CHIPS=0,1\n"), std::string::npos) << r.out;

  // A pod holds GPU 0 of e2e-gpu-b in the ledger (Slurm does not know).
  {
    grpc::ClientContext ctx;
    v1::HoldRequest req;
    req.set_node("e2e-gpu-b");
    auto* pod = req.mutable_owner()->mutable_pod();
    pod->set_uid("uid-web-1");
    pod->set_namespace_("default");
    pod->set_name("web-1");
    auto* d = req.mutable_devices()->add_devices();
    d->set_kind(v1::DEVICE_KIND_GPU);
    d->set_index(0);
    v1::HoldResponse resp;
    grpc::Status s = w_->stub()->Hold(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message() << "\n" << w_->Ctl("holds").out;
  }
  r = w_->Ctl("nodes e2e-gpu-b");
  EXPECT_EQ(CtlNodeRow(r.out, "e2e-gpu-b", "gpu"),
            (std::vector<std::string>{"8", "0", "1", "7"}))
      << r.out;
  // Slurm gives the next step GPU 0: spank_duet.so refuses it, naming the pod.
  r = c_->Cli("srun -w e2e-gpu-b --gres=gpu:1 sh -c 'echo RAN CVD=$CUDA_VISIBLE_DEVICES'");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.find("RAN"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("refused on node e2e-gpu-b"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gpu 0 is held by pod default/web-1"), std::string::npos) << r.out;
  // Only the pod holds anything on e2e-gpu-b once the refused job is gone.
  EXPECT_TRUE(WaitFor([&] {
    std::vector<LedgerHolding> h = Holdings();
    return h.size() == 1 && h[0].kind == "pod" && h[0].pod == "default/web-1";
  })) << w_->Ctl("holds").out;

  // The pod lets go; the same request runs.
  {
    grpc::ClientContext ctx;
    v1::ReleaseRequest req;
    req.set_node("e2e-gpu-b");
    req.mutable_owner()->mutable_pod()->set_uid("uid-web-1");
    v1::ReleaseResponse resp;
    ASSERT_TRUE(w_->stub()->Release(&ctx, req, &resp).ok());
  }
  r = c_->Cli("srun -w e2e-gpu-b --gres=gpu:1 sh -c 'echo RAN CVD=$CUDA_VISIBLE_DEVICES'");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("RAN CVD=0\n"), std::string::npos) << r.out;
}

// DESIGN.md §9: a Slurm-owned Hold/Release needs a credential for that node,
// job and step (spank_duet's steps above carried theirs): munge on an
// auth/munge cluster (Slurm 22.05 here), the slurm.key credential on an
// auth/slurm one (24.11 and 26.05 here, as Slinky runs them). Forged,
// replayed and other jobs' credentials are refused, the ledger is not
// touched, and refusals are counted by reason.
TEST_F(SlurmE2eTest, SlurmOwnedCallsNeedACredentialForThatStep) {
  const bool key = c_->slurm_auth();
  const char* metadata = key ? slurm_key::kMetadataKey : slurm_munge::kMetadataKey;
  auto hold = [&](const std::string& credential, uint32_t step) {
    grpc::ClientContext ctx;
    if (!credential.empty()) ctx.AddMetadata(metadata, credential);
    v1::HoldRequest req;
    req.set_node("e2e-gpu-a");
    req.mutable_owner()->mutable_slurm_step()->set_job_id(999001);
    req.mutable_owner()->mutable_slurm_step()->set_step_id(step);
    auto* d = req.mutable_devices()->add_devices();
    d->set_kind(v1::DEVICE_KIND_GPU);
    d->set_index(5);
    v1::HoldResponse resp;
    return w_->stub()->Hold(&ctx, req, &resp);
  };
  // A credential made as the plugin makes it: for the Binding of the request
  // it goes with (request_digest.h), here a Hold of GPU 5 or a Release.
  auto binding = [](uint32_t job, uint32_t step, const char* method) {
    v1::Owner owner;
    owner.mutable_slurm_step()->set_job_id(job);
    owner.mutable_slurm_step()->set_step_id(step);
    if (std::string(method) == "Release") {
      v1::ReleaseRequest r;
      r.set_node("e2e-gpu-a");
      *r.mutable_owner() = owner;
      return *slurm_munge::BindingOf(r);
    }
    v1::HoldRequest r;
    r.set_node("e2e-gpu-a");
    *r.mutable_owner() = owner;
    auto* d = r.mutable_devices()->add_devices();
    d->set_kind(v1::DEVICE_KIND_GPU);
    d->set_index(5);
    return *slurm_munge::BindingOf(r);
  };
  auto cred_with = [&](const std::string& key_file, uint32_t job, uint32_t step,
                       const char* method) {
    const std::string payload = slurm_munge::Payload(binding(job, step, method));
    absl::StatusOr<std::string> c = key ? spank::SlurmKeyCredential(key_file, payload)
                                        : spank::MungeEncode(c_->munge_socket(), payload);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : std::string();
  };
  auto cred = [&](uint32_t job, uint32_t step, const char* method = "Hold") {
    return cred_with(c_->slurm_key(), job, step, method);
  };
  auto held = [&] {
    for (const LedgerHolding& h : Holdings()) {
      if (h.job_id == 999001) return true;
    }
    return false;
  };
  // The other job's and step's refusals: a valid credential for another
  // request is PERMISSION_DENIED with either kind (the slurm.key credential
  // carries its signed payload, so the bridge can tell it from a forgery).
  const grpc::StatusCode other = grpc::StatusCode::PERMISSION_DENIED;
  grpc::Status s = hold("", 0);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  EXPECT_NE(s.error_message().find(key ? "has no slurm.key credential" : "has no munge credential"),
            std::string::npos)
      << s.error_message();
  std::string forged;
  if (key) {  // made with another cluster's key
    const std::string other_key = (w_->dir() / "other.key").string();
    std::ofstream(other_key) << std::string(64, 'z');
    chmod(other_key.c_str(), 0600);
    forged = cred_with(other_key, 999001, 0, "Hold");
  } else {
    forged = cred(999001, 0);
    forged[forged.size() / 2] = forged[forged.size() / 2] == 'A' ? 'B' : 'A';
  }
  s = hold(forged, 0);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  s = hold(cred(999002, 0), 0);  // another job's credential
  EXPECT_EQ(s.error_code(), other) << s.error_message();
  s = hold(cred(999001, 1), 0);  // another step's credential
  EXPECT_EQ(s.error_code(), other) << s.error_message();
  EXPECT_FALSE(held()) << "a refused credential changed the ledger";
  const std::string good = cred(999001, 0);
  s = hold(good, 0);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(held());
  s = hold(good, 0);  // replayed
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  // Release: the same rule.
  auto release = [&](const std::string& credential) {
    grpc::ClientContext ctx;
    if (!credential.empty()) ctx.AddMetadata(metadata, credential);
    v1::ReleaseRequest req;
    req.set_node("e2e-gpu-a");
    req.mutable_owner()->mutable_slurm_step()->set_job_id(999001);
    req.mutable_owner()->mutable_slurm_step()->set_step_id(0);
    v1::ReleaseResponse resp;
    grpc::Status st = w_->stub()->Release(&ctx, req, &resp);
    return std::make_pair(st, resp.released());
  };
  auto [rs, released] = release("");
  EXPECT_EQ(rs.error_code(), grpc::StatusCode::UNAUTHENTICATED) << rs.error_message();
  EXPECT_TRUE(held());
  // A Hold's credential does not serve the Release (issue 25: munge too).
  std::tie(rs, released) = release(cred(999001, 0, "Hold"));
  EXPECT_EQ(rs.error_code(), grpc::StatusCode::PERMISSION_DENIED) << rs.error_message();
  EXPECT_EQ(v1::ReasonOf(rs), v1::reason::kCredentialRefused);
  EXPECT_TRUE(held());
  std::tie(rs, released) = release(cred(999001, 0, "Release"));
  EXPECT_TRUE(rs.ok()) << rs.error_message();
  EXPECT_TRUE(released);
  EXPECT_FALSE(held());
  // Refused Holds are counted by status code, and every refusal by why.
  CmdResult m = RunCmd(absl::StrCat("curl -sf http://127.0.0.1:", w_->metrics_port(), "/metrics"));
  const std::string k = key ? "slurm_key" : "munge";
  const std::vector<std::string> want = {
      "duet_holdings_refused_total{reason=\"unauthenticated\"} 3",
      "duet_holdings_refused_total{reason=\"permission_denied\"} 2",
      "duet_slurm_credential_refusals_total{credential=\"" + k + "\",why=\"missing\"} 2",
      "duet_slurm_credential_refusals_total{credential=\"" + k + "\",why=\"bad_signature\"} 1",
      "duet_slurm_credential_refusals_total{credential=\"" + k + "\",why=\"wrong_request\"} 2",
      "duet_slurm_credential_refusals_total{credential=\"" + k + "\",why=\"wrong_method\"} 1",
      "duet_slurm_credential_refusals_total{credential=\"" + k + "\",why=\"replayed\"} 1"};
  for (const std::string& line : want) EXPECT_NE(m.out.find(line), std::string::npos) << line << "\n" << m.out;
}

// A job of a non-root user: slurmstepd runs user_init with the user's
// effective uid, yet the step reaches the bridge (a root-only socket here)
// with its credential (munge: root's; slurm.key: read as root); the tasks
// still run as the user.
TEST_F(SlurmE2eTest, NonRootJobRegistersWithRootsCredentialAndRunsAsTheUser) {
  const std::string out = absl::StrCat("/tmp/duet-e2e-nobody-", getpid(), ".out");
  // Submitted by nobody itself, as a user would. (root's `sbatch --uid` is
  // no test of this: on auth/slurm, Slurm 24.11 runs such a job's batch
  // script as root, with or without duet's plugin; under auth/slurm, nobody's
  // sbatch authenticates through slurmd's sack socket.)
  CmdResult r = c_->Cli(absl::StrCat(
      "setpriv --reuid=65534 --regid=65534 --clear-groups sbatch --parsable --chdir=/tmp -o ", out,
                                     " -w e2e-gpu-a --gres=gpu:1 --wrap 'id -u; sleep 2'"));
  uint32_t job = 0;
  ASSERT_EQ(r.rc, 0) << r.out;
  ASSERT_EQ(sscanf(r.out.c_str(), "%u", &job), 1) << r.out;
  bool seen = WaitFor([&] {
    for (const LedgerHolding& h : Holdings()) {
      if (h.kind == "slurm_step" && h.job_id == job) return true;
    }
    return false;
  });
  EXPECT_TRUE(seen) << "the nobody job's batch step never registered\n" << w_->Log();
  EXPECT_TRUE(WaitFor([&] { return c_->JobEnded(job); }));
  EXPECT_TRUE(WaitFor([&] { return RunCmd("cat " + out).out == "65534\n"; }))
      << RunCmd("cat " + out).out;
  unlink(out.c_str());
  CmdResult m = RunCmd(absl::StrCat("curl -sf http://127.0.0.1:", w_->metrics_port(), "/metrics"));
  // No Hold was refused for want of a (root) credential: those reasons only
  // appear once counted.
  ASSERT_NE(m.out.find("duet_holdings_refused_total"), std::string::npos) << m.out;
  EXPECT_EQ(m.out.find("duet_holdings_refused_total{reason=\"permission_denied\"}"),
            std::string::npos)
      << m.out;
  EXPECT_EQ(m.out.find("duet_holdings_refused_total{reason=\"unauthenticated\"}"),
            std::string::npos)
      << m.out;
}

TEST_F(SlurmE2eTest, Kill9WhileJobsRunThenRestartAgreesWithSlurm) {
  const uint32_t kept = RunningJob("-w e2e-gpu-a --gres=gpu:2");
  const uint32_t ends = RunningJob("-w e2e-gpu-a --gres=gpu:3");
  ASSERT_NE(kept, 0u);
  ASSERT_NE(ends, 0u);
  ExpectLedgerAgreesWithSlurm("before the kill");
  const NodeDevices kept_devices = LedgerJob(kept, "e2e-gpu-a");
  ASSERT_EQ(kept_devices.count("gpu"), 1u) << w_->Ctl("holds").out;
  ASSERT_EQ(kept_devices.at("gpu").size(), 2u);
  // The batch step registered itself through spank_duet.so; no job import
  // makes step holdings, so after the restart only the journal can have it.
  auto kept_holdings = [&] {
    std::set<std::string> out;
    for (const LedgerHolding& h : Holdings()) {
      if (h.job_id != kept) continue;
      std::string d;
      for (const auto& [kind, idx] : h.devices) absl::StrAppend(&d, kind, absl::StrJoin(idx, ","));
      out.insert(absl::StrCat(h.kind, " ", h.node, " ", d));
    }
    return out;
  };
  const std::set<std::string> before = kept_holdings();
  ASSERT_EQ(before.size(), 2u) << "want the job and its batch step\n" << w_->Ctl("holds").out;

  w_->KillBridge(SIGKILL);

  // While the bridge is down: one job ends, a step is refused (plugstack
  // on_unreachable=fail), and with on_unreachable=allow a job starts
  // unregistered.
  ASSERT_EQ(c_->Cli(absl::StrCat("scancel ", ends)).rc, 0);
  ASSERT_TRUE(WaitFor([&] { return c_->JobEnded(ends); }));
  CmdResult r = c_->Cli("srun -w e2e-gpu-b --gres=gpu:1 true");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("unreachable"), std::string::npos) << r.out;
  w_->SetPlugstack(w_->PlugstackArgs(" on_unreachable=allow"));
  const std::string marker = (w_->dir() / "started.marker").string();
  const uint32_t started =
      c_->Sbatch(absl::StrCat("-w e2e-gpu-b --gres=gpu:3 --wrap 'touch ", marker, "; sleep 300'"));
  ASSERT_NE(started, 0u);
  // The batch script runs: its step got past spank_duet.so unregistered.
  const bool script_ran = WaitFor([&] { return fs::exists(marker); });
  w_->SetPlugstack(w_->PlugstackArgs());
  ASSERT_TRUE(script_ran) << c_->Cli(absl::StrCat("scontrol show job ", started)).out;

  ASSERT_TRUE(w_->StartBridge());
  // Nothing lost: the job that kept running holds the same GPUs (recovered
  // from the journal, then confirmed by the sync).
  EXPECT_EQ(LedgerJob(kept, "e2e-gpu-a"), kept_devices) << w_->Ctl("holds").out;
  EXPECT_EQ(kept_holdings(), before) << w_->Ctl("holds").out;
  ExpectLedgerAgreesWithSlurm("after the restart");
  EXPECT_EQ(kept_holdings(), before) << w_->Ctl("holds").out;
  // The job that ran unregistered was imported with Slurm's devices.
  EXPECT_EQ(LedgerJob(started, "e2e-gpu-b"), SlurmDevices(started)["e2e-gpu-b"]);
  for (const LedgerHolding& h : Holdings()) {
    EXPECT_NE(h.job_id, ends) << "job " << ends << " ended while the bridge was down";
  }
  r = w_->Ctl("nodes");
  EXPECT_EQ(CtlNodeRow(r.out, "e2e-gpu-a", "gpu"),
            (std::vector<std::string>{"8", "2", "0", "6"}))
      << r.out;
  EXPECT_EQ(CtlNodeRow(r.out, "e2e-gpu-b", "gpu"),
            (std::vector<std::string>{"8", "3", "0", "5"}))
      << r.out;
  // Slurm's nodes were left alone across the restart.
  r = c_->Cli("sinfo -h -N -o '%N|%t'");
  EXPECT_NE(r.out.find("e2e-gpu-a|mix"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("e2e-tpu-a|idle"), std::string::npos) << r.out;
}

// slurmctld down: the bridge keeps serving the ledger, reports itself
// degraded (health "duet.slurm", duet_slurm_degraded), and recovers.
// Last in this file: after a slurmctld restart, Slurm 22.05 refuses GRES
// steps on dynamic nodes for a while ("Invalid generic resource (gres)
// specification", also without duet), which would break a later test run in
// the same process (ctest runs each test in its own).
TEST_F(SlurmE2eTest, SlurmctldDownIsReportedAndRecovered) {
  auto health = [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service("duet.slurm");
    grpc::health::v1::HealthCheckResponse resp;
    if (!w_->health()->Check(&ctx, req, &resp).ok()) return std::string("error");
    return std::string(grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()));
  };
  auto metric = [&](const std::string& line) {
    return RunCmd(absl::StrCat("curl -sf http://127.0.0.1:", w_->metrics_port(), "/metrics"))
               .out.find("\n" + line + "\n") != std::string::npos;
  };
  const uint32_t job = RunningJob("-w e2e-gpu-a --gres=gpu:1");
  ASSERT_NE(job, 0u);
  ASSERT_TRUE(WaitFor([&] { return !LedgerJob(job, "e2e-gpu-a").empty(); }));
  EXPECT_EQ(health(), "SERVING");

  c_->CtldStop();
  EXPECT_TRUE(WaitFor([&] { return health() == "NOT_SERVING"; })) << health();
  EXPECT_TRUE(metric("duet_slurm_degraded 1"));
  // The ledger still serves, and releases nothing on a guess.
  CmdResult r = w_->Ctl("nodes e2e-gpu-a");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(CtlNodeRow(r.out, "e2e-gpu-a", "gpu"),
            (std::vector<std::string>{"8", "1", "0", "7"}))
      << r.out;

  ASSERT_TRUE(c_->CtldStart());
  EXPECT_TRUE(WaitFor([&] { return health() == "SERVING"; })) << health() << w_->Log();
  EXPECT_TRUE(metric("duet_slurm_degraded 0"));
  // A slurmctld just started may not answer scontrol for a moment.
  EXPECT_TRUE(WaitFor([&] { return c_->JobState(job) == "RUNNING"; })) << c_->JobState(job);
  ExpectLedgerAgreesWithSlurm("after slurmctld came back");
}

// The metric sample `series` (name and labels as exposed) in `text`; -1 if absent.
double Sample(const std::string& text, const std::string& series) {
  for (absl::string_view l : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(l, series + " "))
      return std::stod(std::string(l.substr(series.size() + 1)));
  }
  return -1;
}

// Back-to-back jobs: each takes all 8 GPUs of one node for about a second;
// Slurm starts the next one on the same GPUs within milliseconds of the last
// one's end, long before a sync pass (the defaults: every 10 s, 5 s grace)
// releases the ended job's import. Every 10th batch job runs an srun step
// inside its script; two 5-task arrays and five salloc allocations (no
// batch step: their end is caught on conflict, by asking slurmctld) are
// interleaved. All 100 run (each leaves a mark); the bridge counts no
// conflict and refuses nothing.
TEST_F(SlurmE2eTest, HundredBackToBackGpuJobsAndArrayTasksAreNeverRefused) {
  const fs::path marks = w_->dir() / "marks";
  fs::create_directories(marks);
  const std::string node = kNodes[0].name;
  int expected = 0;
  for (int i = 0; i < 85; ++i) {
    const std::string work = i % 10 == 0 ? "srun -n1 --gres=gpu:8 true && sleep 1" : "sleep 1";
    ASSERT_NE(c_->Sbatch(absl::StrCat("-w ", node, " --gres=gpu:8 --wrap '", work, " && touch ",
                                      marks.string(), "/$SLURM_JOB_ID'")),
              0u);
    ++expected;
    if (i == 30 || i == 60) {
      ASSERT_NE(c_->Sbatch(absl::StrCat("-w ", node,
                                        " --gres=gpu:8 --array=0-4 --wrap 'sleep 1 "
                                        "&& touch ",
                                        marks.string(),
                                        "/${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}'")),
                0u);
      expected += 5;
    }
    if (i % 17 == 5) {
      // An interactive allocation with one step, queued like the rest.
      ASSERT_EQ(c_->Cli(absl::StrCat("setsid salloc -w ", node,
                                     " --gres=gpu:8 srun -n1 "
                                     "--gres=gpu:8 sh -c 'sleep 1; touch ",
                                     marks.string(),
                                     "/salloc.$SLURM_JOB_ID' >/dev/null 2>&1 </dev/null &"))
                    .rc,
                0);
      ++expected;
    }
  }
  ASSERT_EQ(expected, 100);
  ASSERT_TRUE(WaitFor([&] { return c_->Cli("squeue -h -o %i").out.empty(); }, absl::Seconds(360)))
      << c_->Cli("squeue").out;
  int ran = 0;
  for (const auto& e : fs::directory_iterator(marks)) {
    (void)e;
    ++ran;
  }
  EXPECT_EQ(ran, 100) << "jobs refused: see the bridge log\n" << w_->Log();
  const std::string m =
      RunCmd(absl::StrCat("curl -sf http://127.0.0.1:", w_->metrics_port(), "/metrics")).out;
  EXPECT_EQ(Sample(m, "duet_holdings_conflicts_total{holder=\"slurm\"}"), 0) << m;
  EXPECT_EQ(Sample(m, "duet_holdings_conflicts_total{holder=\"pod\"}"), 0);
  EXPECT_EQ(Sample(m, "duet_holdings_refused_total{reason=\"resource_exhausted\"}"), 0);
  EXPECT_EQ(Sample(m, "duet_holdings_stale_retries_total{result=\"refused\"}"), 0);
  std::cout << "stale holdings met and released on conflict: "
            << Sample(m, "duet_holdings_stale_retries_total{result=\"granted\"}") << "\n";
  ExpectLedgerAgreesWithSlurm("after the stream");
}

// srun inside sbatch, the most common Slurm pattern: the step registers with
// the bridge as slurm_step{job, 0} on a subset of the job's GPUs and sees
// exactly them.
TEST_F(SlurmE2eTest, StepsInsideABatchJobRegisterAndSeeTheirGpus) {
  const fs::path out = w_->dir() / "inside.out";
  const std::string node = kNodes[1].name;
  const uint32_t job = c_->Sbatch(
      absl::StrCat("-w ", node, " --gres=gpu:4 --wrap 'srun -o ", out.string(),
                   " --gres=gpu:2 sh -c \"echo step=\\$CUDA_VISIBLE_DEVICES; sleep 3\"'"));
  ASSERT_NE(job, 0u);
  LedgerHolding step;
  ASSERT_TRUE(WaitFor([&] {
    for (const LedgerHolding& h : Holdings()) {
      if (h.kind == "slurm_step" && h.job_id == job && h.step_id == 0) {
        step = h;
        return true;
      }
    }
    return false;
  })) << w_->Ctl("holds").out
      << w_->Log();
  EXPECT_EQ(step.node, node);
  ASSERT_EQ(step.devices.count("gpu"), 1u);
  EXPECT_EQ(step.devices["gpu"].size(), 2u);
  const std::set<uint32_t> job_gpus = SlurmDevices(job)[node]["gpu"];
  for (uint32_t g : step.devices["gpu"]) EXPECT_EQ(job_gpus.count(g), 1u) << g;
  ASSERT_TRUE(WaitFor([&] { return c_->JobEnded(job); }, absl::Seconds(30)));
  std::string text;
  std::getline(std::ifstream(out), text);
  EXPECT_EQ(text.rfind("step=", 0), 0u) << text;
  EXPECT_EQ(std::vector<std::string>(absl::StrSplit(text.substr(5), ',')).size(), 2u) << text;
}

// A batch job's end reaches the ledger when its batch step exits (the SPANK
// plugin releases the job's import then), not at the next sync pass. Prints
// the lag from the script's last instruction to the release, per job.
TEST_F(SlurmE2eTest, ABatchJobsEndReachesTheLedgerAtItsBatchStepsExit) {
  const std::string node = kNodes[1].name;
  std::vector<double> lags_ms;
  for (int i = 0; i < 10; ++i) {
    const fs::path end = w_->dir() / absl::StrCat("end.", i);
    const fs::path go = w_->dir() / absl::StrCat("go.", i);
    const uint32_t job =
        c_->Sbatch(absl::StrCat("-w ", node, " --gres=gpu:2 --wrap 'while [ ! -e ", go.string(),
                                " ]; do sleep 0.05; done; date +%s.%N > ", end.string(), "'"));
    ASSERT_NE(job, 0u);
    // Imported by a sync pass first (what a refused next job would meet).
    ASSERT_TRUE(WaitFor([&] { return !LedgerJob(job, node).empty(); })) << w_->Log();
    std::ofstream(go).put('\n');
    ASSERT_TRUE(WaitFor([&] { return LedgerJob(job, node).empty(); }, absl::Seconds(20)));
    const double released = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    std::ifstream in(end);
    double ended = 0;
    ASSERT_TRUE(WaitFor([&] {
      std::ifstream f(end);
      return static_cast<bool>(f >> ended);
    }));
    lags_ms.push_back((released - ended) * 1000);
  }
  std::sort(lags_ms.begin(), lags_ms.end());
  std::cout << "lag from a batch script's end to the ledger's release (ms, 10 jobs, polled every "
               "50 ms): median "
            << lags_ms[lags_ms.size() / 2] << ", max " << lags_ms.back()
            << " (the sync pass alone: up to sync_period 500 ms + release_grace 1 s)\n";
}

// Issue 24: a step knows where it runs from slurmstepd, never from the job's
// environment. Multi-node GPU steps inside a two-node batch job (distributed
// training's shape) inherit the batch script's SLURMD_NODENAME; each node's
// part of the step must be registered on that node, beside pods that hold a
// GPU on both nodes. (Each part registered on the batch node: the second one
// was refused, "already holds gpu0,gpu1,gpu2 ... release it first".)
TEST_F(SlurmE2eTest, MultiNodeStepsInABatchJobRegisterOnTheNodeEachPartRunsOn) {
  HoldPodGpu("e2e-gpu-a", "pod-a", 7);
  HoldPodGpu("e2e-gpu-b", "pod-b", 7);
  const fs::path out = w_->dir() / "multi.out";
  const fs::path rc = w_->dir() / "multi.rc";
  const uint32_t job = c_->Sbatch(absl::StrCat(
      "-N2 -w e2e-gpu-a,e2e-gpu-b --gres=gpu:3 --wrap 'srun -N2 --ntasks-per-node=1 "
      "--gres=gpu:3 -o ", out.string(),
      " sh -c \"echo part \\$SLURMD_NODENAME \\$CUDA_VISIBLE_DEVICES; sleep 3\"; echo $? > ",
      rc.string(), "'"));
  ASSERT_NE(job, 0u);
  const auto seen = StepHoldingsUntil(job, 0, [&] { return c_->JobEnded(job); });
  EXPECT_EQ(absl::StripAsciiWhitespace(ReadFile(rc)), "0") << ReadFile(out) << w_->Log();
  const NodeDevices three{{"gpu", {0, 1, 2}}};
  ASSERT_EQ(seen.size(), 2u) << ReadFile(out) << w_->Log();
  EXPECT_EQ(seen.at("e2e-gpu-a"), three);
  EXPECT_EQ(seen.at("e2e-gpu-b"), three);
  const std::string text = ReadFile(out);
  EXPECT_NE(text.find("part e2e-gpu-a 0,1,2"), std::string::npos) << text;
  EXPECT_NE(text.find("part e2e-gpu-b 0,1,2"), std::string::npos) << text;
  ReleasePod("e2e-gpu-a", "pod-a");
  ReleasePod("e2e-gpu-b", "pod-b");
}

// A user's SLURMD_NODENAME must not move a step's registration: this step
// runs on e2e-gpu-a; registered on e2e-gpu-b it would both leave a's GPU
// unfenced and be refused on b's, which a pod holds.
TEST_F(SlurmE2eTest, AUserSetSlurmdNodenameDoesNotMoveTheStep) {
  HoldPodGpu("e2e-gpu-b", "pod-b0", 0);
  auto run = std::async(std::launch::async, [&] {
    return c_->Cli(
        "env SLURMD_NODENAME=e2e-gpu-b srun -w e2e-gpu-a --gres=gpu:1 sh -c "
        "'echo RAN $CUDA_VISIBLE_DEVICES; sleep 3'");
  });
  std::map<std::string, NodeDevices> seen;
  WaitFor([&] {
    for (const LedgerHolding& h : Holdings()) {
      if (h.kind == "slurm_step") seen[h.node] = h.devices;
    }
    return run.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  });
  CmdResult r = run.get();
  EXPECT_EQ(r.rc, 0) << r.out << w_->Log();
  EXPECT_NE(r.out.find("RAN 0"), std::string::npos) << r.out;
  ASSERT_EQ(seen.size(), 1u) << w_->Ctl("holds").out;
  EXPECT_EQ(seen.begin()->first, "e2e-gpu-a");
  EXPECT_EQ(seen.begin()->second, (NodeDevices{{"gpu", {0}}}));
  ReleasePod("e2e-gpu-b", "pod-b0");
}

// Heterogeneous jobs: each component's steps, and a step across both
// components, register on the node each part runs on. The batch script runs
// on component 0's node, whose name its steps inherit.
TEST_F(SlurmE2eTest, HetJobStepsRegisterOnEachComponentsNode) {
  const fs::path out = w_->dir() / "het.out";
  const std::string script = Script("het.sh", absl::StrCat(
      "#!/bin/sh\n"
      "#SBATCH -w e2e-gpu-a --gres=gpu:1\n"
      "#SBATCH hetjob\n"
      "#SBATCH -w e2e-gpu-b --gres=gpu:2\n"
      "exec >", out.string(), " 2>&1\n"
      "srun --het-group=1 sh -c 'echo g1 $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES; sleep 2'\n"
      "echo rc1=$?\n"
      // srun returns when the tasks exit, before slurmctld has always ended
      // the step. A step asked for then is "temporarily disabled" and srun
      // retries with a growing backoff while its other component's
      // credential ages: in CI (Slurm 22.05, under load) it expired after
      // 120 s. Wait until slurmctld lists no numbered step.
      "i=0; while squeue -h -s -o %i | grep -Eq '[.][0-9]+$' && [ $i -lt 60 ]; do\n"
      "  i=$((i+1)); sleep 1; done\n"
      "srun --het-group=0,1 sh -c 'echo g01 $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES; sleep 2'\n"
      "echo rc01=$?\n"));
  const uint32_t job = c_->Sbatch(script);
  ASSERT_NE(job, 0u);
  std::map<std::string, NodeDevices> steps;  // "node" -> devices, any step of the job
  WaitFor(
      [&] {
        for (const LedgerHolding& h : Holdings()) {
          if (h.kind == "slurm_step" && h.job_id >= job && h.job_id <= job + 1) {
            steps[h.node] = h.devices;
          }
        }
        return c_->JobEnded(job);
      },
      // Only Slurm's backfill starts a hetjob (every 30 s by default).
      absl::Seconds(180));
  const std::string text = ReadFile(out);
  EXPECT_NE(text.find("rc1=0"), std::string::npos) << text << w_->Log();
  EXPECT_NE(text.find("rc01=0"), std::string::npos) << text << w_->Log();
  EXPECT_NE(text.find("g1 e2e-gpu-b 0,1"), std::string::npos) << text;
  EXPECT_NE(text.find("g01 e2e-gpu-a 0"), std::string::npos) << text;
  EXPECT_NE(text.find("g01 e2e-gpu-b 0,1"), std::string::npos) << text;
  EXPECT_EQ(steps.count("e2e-gpu-b"), 1u) << w_->Ctl("holds").out;
}

// A GPU job that submits a GPU job to another node: the second job inherits
// the first one's SLURMD_NODENAME. Its steps must register on their own node
// (they were registered on the first job's node, on the GPU the first job
// holds there, and refused).
TEST_F(SlurmE2eTest, AGpuJobSubmittedFromAGpuJobRegistersOnItsOwnNode) {
  const fs::path out = w_->dir() / "chain.out";
  const fs::path id = w_->dir() / "chain.id";
  const std::string inner = Script("chain-inner.sh",
                                   "#!/bin/sh\n"
                                   "srun --gres=gpu:1 sh -c 'echo chained $SLURMD_NODENAME "
                                   "$CUDA_VISIBLE_DEVICES'\n"
                                   "echo rc=$?\n");
  const uint32_t job = c_->Sbatch(absl::StrCat(
      "-w e2e-gpu-a --gres=gpu:1 --wrap 'sbatch --parsable -w e2e-gpu-b --gres=gpu:1 -o ",
      out.string(), " ", inner, " > ", id.string(), "; sleep 20'"));
  ASSERT_NE(job, 0u);
  uint32_t second = 0;
  ASSERT_TRUE(WaitFor([&] {
    std::ifstream in(id);
    return static_cast<bool>(in >> second) && second != 0;
  })) << c_->Cli("squeue").out;
  ASSERT_TRUE(WaitFor([&] { return c_->JobEnded(second); }, absl::Seconds(60)));
  const std::string text = ReadFile(out);
  EXPECT_NE(text.find("chained e2e-gpu-b 0"), std::string::npos) << text << w_->Log();
  EXPECT_NE(text.find("rc=0"), std::string::npos) << text;
  c_->Cli(absl::StrCat("scancel ", job));
}

// --gpu-bind=none with several tasks: Slurm leaves each task's
// CUDA_VISIBLE_DEVICES unset, so without a device cgroup every task would
// see every GPU of the node, the pods' too. The plugin gives each task the
// step's GPUs.
TEST_F(SlurmE2eTest, GpuBindNoneTasksStillSeeOnlyTheStepsGpus) {
  CmdResult r = c_->Cli(
      "srun -w e2e-gpu-a -n2 --gres=gpu:2 --gpu-bind=none sh -c "
      "'echo task$SLURM_PROCID=${CUDA_VISIBLE_DEVICES-unset}'");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("task0=0,1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("task1=0,1"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("unset"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace duet
