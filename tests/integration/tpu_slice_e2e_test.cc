// Multi-host TPU slices end to end (docs/gangs.md 5, issue 27 section 2)
// with the real binaries: a real Slurm cluster on loopback
// (tests/integration/slurm_cluster.sh) with two 2x4 v5e slices of two
// 4-chip hosts each (node pools slice-a and slice-b), the real duet-bridge
// (slurm.enabled, file inventory, the scheduler extender, gangs against a
// fake kube-apiserver serving PodGroups) and spank_duet.so (tpu=yes). The
// test plays kube-scheduler: it POSTs ExtenderArgs to <prefix>/filter.
//
// A Slurm job and a gang never share a TPU slice:
// - every host carries the Slurm feature tpu-slice-POOL;
// - a Slurm job asks slice-a by that feature (-N2 --exclusive, every chip);
//   its step on both hosts gets TPU_WORKER_ID 0/1 and TPU_WORKER_HOSTNAMES;
// - a PodGroup of 2 pods x 4 chips selecting a 2x4 slice gets slice-b whole,
//   one member per host, in ONE Slurm job;
// - a second such gang: GANG_NO_ROOM (no slice is free whole); a Slurm job
//   asking a chip of slice-b waits (Resources); a single TPU pod fails
//   every slice host (TPU_SLICE_WHOLE).
//
// Label: slurm.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "duet/v1/duet.grpc.pb.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/e2e_helpers.h"
#include "tests/integration/gang_objects.h"
#include "tests/k8s_adapter/fake_server.h"
#include "tests/slurm/slurm_cluster_fixture.h"

#ifndef DUET_SPANK_SO
#error "DUET_SPANK_SO must name spank_duet.so"
#endif

namespace duet {
namespace {

namespace fs = std::filesystem;
using ::duet::k8s::testing::FakeApiServer;
using ::duet::testing::BridgeProcess;
using ::duet::testing::CmdResult;
using ::duet::testing::FreePort;
using ::duet::testing::LedgerHolding;
using ::duet::testing::PodGroup;
using ::duet::testing::RunCmd;
using ::duet::testing::TestSlurmCluster;
using ::duet::testing::WaitFor;
using json = nlohmann::json;

constexpr char kTpuModel[] = "tpu-v5-lite-podslice";
constexpr char kTopology[] = "2x4";  // 8 chips: 2 hosts of 4
constexpr char kPrefix[] = "/duet";
constexpr int kChips = 4;

struct NodeDef {
  const char* name;
  const char* pool;
  int idx;  // slurmd on 127.0.0.idx
};
constexpr NodeDef kNodes[] = {{"slice-a-0", "slice-a", 91},
                              {"slice-a-1", "slice-a", 92},
                              {"slice-b-0", "slice-b", 93},
                              {"slice-b-1", "slice-b", 94}};

// The cluster, the fake apiserver and the bridge of this process.
class World {
 public:
  static World* Get() {
    static World* w = new World();
    return w;
  }

  bool ok() const { return ok_; }
  TestSlurmCluster* cluster() const { return cluster_; }
  FakeApiServer* fake() const { return fake_.get(); }
  v1::Ledger::Stub* stub() const { return stub_.get(); }
  const fs::path& dir() const { return dir_; }
  std::string extender_url() const {
    return absl::StrCat("http://127.0.0.1:", extender_port_, kPrefix);
  }
  std::string Log() const { return bridge_ ? bridge_->Log(80) : ""; }
  CmdResult Ctl(const std::string& args) const {
    return RunCmd(absl::StrCat(DUETCTL_BIN, " --server unix://", socket(), " ", args));
  }

  ::testing::AssertionResult StartBridge() {
    if (bridge_ != nullptr) return ::testing::AssertionSuccess();
    bridge_ = std::make_unique<BridgeProcess>((dir_ / "bridge.yaml").string(),
                                              (dir_ / "bridge.log").string(), socket());
    ::testing::AssertionResult r = bridge_->Start();
    if (r) stub_ = v1::Ledger::NewStub(bridge_->channel());
    return r;
  }

  void Stop() {
    stub_.reset();
    bridge_.reset();
    fake_.reset();
    if (cluster_ != nullptr) cluster_->Stop();
    std::error_code ec;
    if (!dir_.empty() && ::testing::UnitTest::GetInstance()->Passed()) {
      fs::remove_all(dir_, ec);
      if (cluster_ != nullptr && !cluster_->root().empty()) fs::remove_all(cluster_->root(), ec);
    } else if (!dir_.empty()) {
      std::cerr << "tpu_slice_e2e_test: kept " << dir_ << " and "
                << (cluster_ ? cluster_->root() : "") << " for inspection\n";
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

  std::string socket() const { return (dir_ / "bridge.sock").string(); }
  std::string grpc_address() const { return absl::StrCat("127.0.0.1:", grpc_port_); }

  World() {
    char tmpl[] = "/tmp/duet-tpu-slice-e2e.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      ADD_FAILURE() << "mkdtemp failed";
      return;
    }
    dir_ = tmpl;
    TestSlurmCluster::Options o;
    grpc_port_ = FreePort();
    o.spank = absl::StrCat(DUET_SPANK_SO, ":bridge=", grpc_address(), " timeout_ms=2000 tpu=yes");
    cluster_ = TestSlurmCluster::Get(o);
    ::testing::AddGlobalTestEnvironment(new Stopper(this));
    if (!cluster_->ok()) return;
    std::ofstream(cluster_->root() + "/etc/plugstack.conf")
        << "required " << DUET_SPANK_SO << " bridge=" << grpc_address()
        << " timeout_ms=2000 tpu=yes" << cluster_->PlugstackAuthArgs() << "\n";

    fake_ = std::make_unique<FakeApiServer>(std::vector<std::string>{"--gang-crds"});
    if (!fake_->ok()) {
      ADD_FAILURE() << "the fake apiserver did not start";
      return;
    }
    k8s::testing::WriteKubeconfig((dir_ / "kubeconfig").string(), fake_->url());

    std::ofstream inv(dir_ / "nodes.yaml");
    inv << "nodes:\n";
    for (const NodeDef& n : kNodes) {
      inv << "  - name: " << n.name << "\n"
          << "    cpus: 8\n    memory_mib: 16000\n    zone: us-central1-a\n"
          << "    pool: " << n.pool << "\n"
          << "    labels: {duet.dev/slurm-node-addr: 127.0.0." << n.idx
          << ", cloud.google.com/gke-tpu-accelerator: " << kTpuModel
          << ", cloud.google.com/gke-tpu-topology: " << kTopology << "}\n"
          << "    tpus: {count: " << kChips << ", model: " << kTpuModel
          << ", topology: " << kTopology << "}\n";
    }
    inv.close();
    extender_port_ = FreePort();
    std::ofstream cfg(dir_ / "bridge.yaml");
    cfg << "grpc: {listen: \"" << grpc_address() << "\", unix_socket: " << socket() << "}\n"
        << "metrics: {listen: \"127.0.0.1:" << FreePort() << "\"}\n"
        << "journal: {dir: " << (dir_ / "journal").string() << "}\n"
        << "inventory: {source: file, file: " << (dir_ / "nodes.yaml").string()
        << ", reload_period: 1s}\n"
        << "extender: {listen: \"127.0.0.1:" << extender_port_ << "\", url_prefix: \"" << kPrefix
        << "\"}\n"
        << "kubernetes:\n"
        << "  kubeconfig: " << (dir_ / "kubeconfig").string() << "\n"
        << "  watch_pods: true\n"
        << "slurm:\n"
        << "  enabled: true\n"
        << "  conf_path: " << cluster_->conf() << "\n"
        << "  call_timeout: 3s\n"
        << "  sync_period: 500ms\n"
        << "  release_grace: 1s\n"
        << cluster_->BridgeAuthYaml()
        << "gang: {reserve_timeout: 60s, idle_release: 3s, tick_period: 300ms}\n"
        << "log_level: info\n";
    cfg.close();
    ok_ = true;
  }

  bool ok_ = false;
  fs::path dir_;
  TestSlurmCluster* cluster_ = nullptr;
  std::unique_ptr<FakeApiServer> fake_;
  int extender_port_ = 0;
  int grpc_port_ = 0;
  std::unique_ptr<BridgeProcess> bridge_;
  std::unique_ptr<v1::Ledger::Stub> stub_;
};

// A pod asking every chip of a host, selecting a 2x4 slice as GKE's webhook
// demands; a member of `group` unless it is empty.
json TpuPod(const std::string& name, const std::string& uid, const std::string& group) {
  const std::string chips = std::to_string(kChips);
  json labels = {{"app", "jax"}};
  if (!group.empty()) labels["scheduling.x-k8s.io/pod-group"] = group;
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata",
           {{"name", name},
            {"namespace", "default"},
            {"uid", uid},
            {"labels", labels},
            {"creationTimestamp", "2026-12-05T18:00:00Z"}}},
          {"spec",
           {{"schedulerName", "duet"},
            {"restartPolicy", "Never"},
            {"nodeSelector",
             {{"cloud.google.com/gke-tpu-accelerator", kTpuModel},
              {"cloud.google.com/gke-tpu-topology", kTopology}}},
            {"containers",
             {{{"name", "jax"},
               {"image", "us-docker.pkg.dev/cloud-tpu-images/jax:latest"},
               {"resources",
                {{"requests", {{"cpu", "1"}, {"memory", "1Gi"}, {"google.com/tpu", chips}}},
                 {"limits", {{"google.com/tpu", chips}}}}}}}}}},
          {"status", {{"phase", "Pending"}, {"qosClass", "Burstable"}}}};
}

class TpuSliceE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    w_ = World::Get();
    ASSERT_TRUE(w_->ok());
    c_ = w_->cluster();
    ASSERT_TRUE(w_->StartBridge());
    for (const NodeDef& n : kNodes) {
      ASSERT_TRUE(WaitFor([&] {
        return c_->Cli(absl::StrCat("scontrol --future show node ", n.name)).rc == 0;
      })) << n.name << " was not created by duet-bridge\n"
          << w_->Log();
      c_->StartSlurmd(n.name, n.idx, 8, 16000, 0, "", kChips, kTpuModel);
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
    if (HasFailure()) {
      std::cerr << "== squeue\n"
                << c_->Cli("squeue").out << "== duetctl holds\n"
                << w_->Ctl("holds").out << "== duet-bridge log\n"
                << w_->Log() << "== slurmctld.log\n"
                << c_->Log("slurmctld.log");
    }
  }

  // Nodes where a holding of `kind` is, per the ledger.
  std::set<std::string> NodesHeldBy(const std::string& kind, uint32_t job = 0) {
    std::set<std::string> out;
    for (const LedgerHolding& h : ::duet::testing::ListLedgerHoldings(w_->stub())) {
      if (h.kind == kind && (job == 0 || h.job_id == job)) out.insert(h.node);
    }
    return out;
  }

  // The filter's answer for pod `name` (as the apiserver has it) over every node.
  json Filter(const std::string& name) {
    CmdResult pod = RunCmd(
        absl::StrCat("curl -sf ", w_->fake()->url(), "/api/v1/namespaces/default/pods/", name),
        /*merge_stderr=*/false);
    EXPECT_EQ(pod.rc, 0) << name;
    json nodes = json::array();
    for (const NodeDef& n : kNodes) nodes.push_back(n.name);
    const fs::path file = w_->dir() / "req-filter.json";
    std::ofstream(file) << json{{"Pod", json::parse(pod.out, nullptr, false)}, {"NodeNames", nodes}}.dump();
    CmdResult r = RunCmd(absl::StrCat("curl -sf -X POST -H 'Content-Type: application/json' "
                                      "--data-binary @",
                                      file.string(), " ", w_->extender_url(), "/filter"),
                         /*merge_stderr=*/false);
    EXPECT_EQ(r.rc, 0) << r.out;
    return json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  }

  static std::string Unresolvable(const json& f, const std::string& node) {
    if (!f.is_object() || !f.contains("FailedAndUnresolvableNodes")) return "";
    const json& u = f["FailedAndUnresolvableNodes"];
    if (!u.is_object() || !u.contains(node) || !u[node].is_string()) return "";
    return u[node].get<std::string>();
  }
  static std::vector<std::string> Passed(const json& f) {
    std::vector<std::string> out;
    if (f.is_object() && f.contains("NodeNames") && f["NodeNames"].is_array()) {
      for (const json& n : f["NodeNames"]) out.push_back(n.get<std::string>());
    }
    return out;
  }
  void ExpectRefusedEverywhere(const json& f, const std::string& reason) {
    EXPECT_TRUE(Passed(f).empty()) << f.dump();
    for (const NodeDef& n : kNodes) {
      EXPECT_NE(Unresolvable(f, n.name).find(reason), std::string::npos)
          << n.name << ": " << f.dump();
    }
  }

  World* w_ = nullptr;
  TestSlurmCluster* c_ = nullptr;
};

TEST_F(TpuSliceE2eTest, ASlurmJobAndAGangNeverShareATpuSlice) {
  // Every host names its slice.
  for (const NodeDef& n : kNodes) {
    CmdResult r = c_->Cli(absl::StrCat("scontrol show node ", n.name));
    EXPECT_NE(r.out.find(absl::StrCat("tpu-slice-", n.pool)), std::string::npos) << r.out;
  }

  // A Slurm job takes slice-a by feature, every chip of both hosts; its
  // step on both hosts learns its worker id and the slice's hosts.
  const fs::path env_file = w_->dir() / "worker-env.txt";
  const fs::path script = w_->dir() / "slice-job.sh";
  std::ofstream(script) << "#!/bin/bash\n"
                        << "srun bash -c 'echo \"$SLURMD_NODENAME $TPU_WORKER_ID "
                           "$TPU_WORKER_HOSTNAMES\"' > "
                        << env_file.string() << "\nsleep 300\n";
  const uint32_t slurm_job = c_->Sbatch(absl::StrCat(
      "-N2 --constraint=tpu-slice-slice-a --gres=tpu:", kChips, " --exclusive ", script.string()));
  ASSERT_NE(slurm_job, 0u);
  ASSERT_TRUE(c_->WaitJobState(slurm_job, "RUNNING"))
      << c_->Cli(absl::StrCat("scontrol show job ", slurm_job)).out;
  EXPECT_EQ(c_->Cli(absl::StrCat("squeue -h -j ", slurm_job, " -o %N")).out, "slice-a-[0-1]\n");
  ASSERT_TRUE(WaitFor([&] {
    return NodesHeldBy("slurm_job", slurm_job) == std::set<std::string>{"slice-a-0", "slice-a-1"};
  })) << w_->Ctl("holds").out;
  std::string lines;
  EXPECT_TRUE(WaitFor([&] {
    std::ifstream in(env_file);
    lines.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return absl::StrContains(lines, "slice-a-0 ") && absl::StrContains(lines, "slice-a-1 ");
  })) << lines;
  EXPECT_TRUE(absl::StrContains(lines, "slice-a-0 0 slice-a-0,slice-a-1\n")) << lines;
  EXPECT_TRUE(absl::StrContains(lines, "slice-a-1 1 slice-a-0,slice-a-1\n")) << lines;

  // A gang of 2 x 4 chips selecting a 2x4 slice gets slice-b whole: one
  // member per host, one Slurm job over both.
  w_->fake()->Put(PodGroup("jax", 2));
  w_->fake()->Put(TpuPod("jax-0", "uid-jax-0", "jax"));
  w_->fake()->Put(TpuPod("jax-1", "uid-jax-1", "jax"));
  ExpectRefusedEverywhere(Filter("jax-0"), "GANG_WAITING: 1/2 members");
  const json f1 = Filter("jax-1");
  const json f0 = Filter("jax-0");
  ASSERT_EQ(Passed(f0).size(), 1u) << f0.dump();
  ASSERT_EQ(Passed(f1).size(), 1u) << f1.dump();
  EXPECT_EQ((std::set<std::string>{Passed(f0)[0], Passed(f1)[0]}),
            (std::set<std::string>{"slice-b-0", "slice-b-1"}));
  CmdResult gang_jobs = c_->Cli("squeue -h -n duet-gang:podgroup/default/jax -o '%i|%N|%b'");
  std::vector<std::string> rows = absl::StrSplit(gang_jobs.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(rows.size(), 1u) << gang_jobs.out;
  EXPECT_TRUE(absl::StrContains(rows[0], "|slice-b-[0-1]|")) << rows[0];
  EXPECT_EQ(NodesHeldBy("gang_slot"), (std::set<std::string>{"slice-b-0", "slice-b-1"}))
      << w_->Ctl("holds").out;

  // Nothing is left whole: a second gang holds nothing, a Slurm job asking
  // a chip of slice-b waits, a single TPU pod is refused on every host.
  w_->fake()->Put(PodGroup("late", 2));
  w_->fake()->Put(TpuPod("late-0", "uid-late-0", "late"));
  const json late = Filter("late-0");
  ExpectRefusedEverywhere(late, "GANG_NO_ROOM");
  EXPECT_NE(Unresolvable(late, "slice-a-0").find("no 2x4 slice of tpu-v5-lite-podslice is free whole"),
            std::string::npos)
      << late.dump();
  const uint32_t waiting = c_->Sbatch("-N1 --constraint=tpu-slice-slice-b --gres=tpu:1 --wrap 'sleep 1'");
  ASSERT_NE(waiting, 0u);
  EXPECT_TRUE(c_->WaitJobPending(waiting, "Resources"))
      << c_->Cli(absl::StrCat("scontrol -d show job ", waiting)).out;
  c_->Cli(absl::StrCat("scancel ", waiting));
  w_->fake()->Put(TpuPod("single", "uid-single", ""));
  ExpectRefusedEverywhere(Filter("single"), "TPU_SLICE_WHOLE");
  c_->Cli(absl::StrCat("scancel ", slurm_job));
}

}  // namespace
}  // namespace duet
