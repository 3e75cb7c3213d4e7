// The issue's end-to-end scenario with the real binaries: a real Slurm 22.05
// cluster on loopback (tests/integration/slurm_cluster.sh, spank_duet.so in
// plugstack.conf), the real duet-bridge (slurm.enabled, file inventory, the
// scheduler extender on HTTP, the pod watch against a fake kube-apiserver,
// tests/fakes/fake_apiserver.py, reached through a kubeconfig file). The test
// plays kube-scheduler: it POSTs ExtenderArgs to <prefix>/filter and
// /prioritize and ExtenderBindingArgs to /bind, as kube-scheduler does for a
// pod whose profile names the extender. Label: slurm.
//
// - a pod bound beside a running Slurm job on one node gets a Slurm
//   placeholder job and devices disjoint from the job's;
// - Slurm cannot start a job on the pod's devices (it pends);
// - the pod ends (phase Succeeded): the pod watch cancels the placeholder and
//   the pending job starts, on devices disjoint from the first job's;
// - a deleted pod: the same, at once;
// - a node whose GPUs Slurm jobs hold is refused by filter, with the reason;
// - an admin's scancel of a bound pod's placeholder, and state=down of its
//   node: the pod keeps its devices, no Slurm job gets them, the placeholder
//   comes back on the same devices and an Event says so;
// - a node an admin drained in Slurm is dropped by filter with Slurm's
//   reason, and duetctl shows Slurm's state beside Kubernetes'.
//
// One cluster, one bridge, one fake apiserver per process; ctest runs each
// test in its own process.

#include <unistd.h>

#include <algorithm>
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
using ::duet::testing::NodeDevices;
using ::duet::testing::RunCmd;
using ::duet::testing::TestSlurmCluster;
using ::duet::testing::WaitFor;
using json = nlohmann::json;

constexpr char kGpuModel[] = "nvidia-h100-80gb";
constexpr char kPrefix[] = "/duet";

struct NodeDef {
  const char* name;
  int idx;  // slurmd on 127.0.0.idx
};
constexpr NodeDef kNodes[] = {{"pod-gpu-a", 71}, {"pod-gpu-b", 72}};
constexpr char kNodeA[] = "pod-gpu-a";

// The cluster, the fake apiserver and the bridge of this process; stopped by
// a gtest Environment at exit.
class World {
 public:
  static World* Get() {
    static World* w = new World();
    return w;
  }

  bool ok() const { return ok_; }
  TestSlurmCluster* cluster() const { return cluster_; }
  FakeApiServer* fake() const { return fake_.get(); }
  BridgeProcess* bridge() const { return bridge_.get(); }
  v1::Ledger::Stub* stub() const { return stub_.get(); }
  std::string extender_url() const {
    return absl::StrCat("http://127.0.0.1:", extender_port_, kPrefix);
  }
  std::string socket() const { return (dir_ / "bridge.sock").string(); }
  const fs::path& dir() const { return dir_; }
  std::string Log() const { return bridge_ ? bridge_->Log(80) : ""; }
  // duet-bridge's /metrics text.
  std::string Metrics() const {
    return RunCmd(absl::StrCat("curl -sf http://127.0.0.1:", metrics_port_, "/metrics"),
                  /*merge_stderr=*/false)
        .out;
  }
  CmdResult Ctl(const std::string& args) const {
    return RunCmd(absl::StrCat(DUETCTL_BIN, " --server unix://", socket(), " ", args));
  }

  ::testing::AssertionResult StartBridge() {
    bridge_ = std::make_unique<BridgeProcess>((dir_ / "bridge.yaml").string(),
                                              (dir_ / "bridge.log").string(), socket());
    ::testing::AssertionResult r = bridge_->Start();
    if (r) stub_ = v1::Ledger::NewStub(bridge_->channel());
    return r;
  }

  void Stop() {
    stub_.reset();
    bridge_.reset();  // SIGTERM
    fake_.reset();
    if (cluster_ != nullptr) cluster_->Stop();
    std::error_code ec;
    if (!dir_.empty() && ::testing::UnitTest::GetInstance()->Passed()) {
      fs::remove_all(dir_, ec);
      if (cluster_ != nullptr && !cluster_->root().empty()) fs::remove_all(cluster_->root(), ec);
    } else if (!dir_.empty()) {
      std::cerr << "pod_e2e_test: kept " << dir_ << " and " << (cluster_ ? cluster_->root() : "")
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

  // slurmstepd reaches the bridge over TCP, as from a Slurm node; the
  // socket file is the tests' operator side only.
  std::string grpc_address() const { return absl::StrCat("127.0.0.1:", grpc_port_); }
  std::string PlugstackArgs() const {
    return absl::StrCat("bridge=", grpc_address(), " timeout_ms=2000",
                        cluster_->PlugstackAuthArgs());
  }

  World() {
    char tmpl[] = "/tmp/duet-pod-e2e.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      ADD_FAILURE() << "mkdtemp failed";
      return;
    }
    dir_ = tmpl;
    // The eviction tests: Slurm preempts by partition priority (PreemptMode
    // CANCEL); placeholders go to a partition of their own that a job in
    // partition "high" may preempt, and the bridge runs slurm.preemption:
    // evict-pods.
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    evict_pods_ = absl::StrContains(test, "Evict");
    TestSlurmCluster::Options o;
    grpc_port_ = FreePort();
    o.spank = absl::StrCat(DUET_SPANK_SO, ":bridge=", grpc_address(), " timeout_ms=2000");
    if (evict_pods_) {
      o.extra_conf =
          "PreemptType=preempt/partition_prio\nPreemptMode=CANCEL\n"
          "PartitionName=duet Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 "
          "DefMemPerCPU=100\n"
          "PartitionName=duet-pods Nodes=ALL MaxTime=INFINITE State=UP Hidden=YES "
          "PriorityTier=1 DefMemPerCPU=100\n"
          "PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 "
          "DefMemPerCPU=100\n";
    }
    cluster_ = TestSlurmCluster::Get(o);  // registers the cluster's Stopper first...
    ::testing::AddGlobalTestEnvironment(new Stopper(this));  // ...so this one runs first
    if (!cluster_->ok()) return;
    std::ofstream(cluster_->root() + "/etc/plugstack.conf")
        << "required " << DUET_SPANK_SO << " " << PlugstackArgs() << "\n";

    fake_ = std::make_unique<FakeApiServer>();
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
          << "    pool: shared-h100\n"
          << "    labels: {duet.dev/slurm-node-addr: 127.0.0." << n.idx
          << ", cloud.google.com/gke-accelerator: " << kGpuModel << "}\n"
          << "    gpus: {count: 8, model: " << kGpuModel << "}\n";
    }
    inv.close();
    extender_port_ = FreePort();
    metrics_port_ = FreePort();
    std::ofstream cfg(dir_ / "bridge.yaml");
    cfg << "grpc: {listen: \"" << grpc_address() << "\", unix_socket: " << socket() << "}\n"
        << "metrics: {listen: \"127.0.0.1:" << metrics_port_ << "\"}\n"
        << "journal: {dir: " << (dir_ / "journal").string() << "}\n"
        << "inventory: {source: file, file: " << (dir_ / "nodes.yaml").string()
        << ", reload_period: 1s}\n"
        << "extender: {listen: \"127.0.0.1:" << extender_port_ << "\", url_prefix: \"" << kPrefix
        << "\"}\n"
        << "kubernetes:\n"
        << "  kubeconfig: " << (dir_ / "kubeconfig").string() << "\n"
        << "  watch_pods: true\n"
        << "  pod_release_grace: 5s\n"
        << "  pod_sweep_period: 500ms\n"
        << "slurm:\n"
        << "  enabled: true\n"
        << "  conf_path: " << cluster_->conf() << "\n"
        << "  call_timeout: 3s\n"
        << "  sync_period: 500ms\n"
        << "  release_grace: 1s\n";
    if (evict_pods_) {
      const bool budget = absl::StrContains(test, "Budget");
      cfg << "  placeholder_partition: duet-pods\n"
          << "  preemption: evict-pods\n"
          << "  preemption_wait: " << (budget ? "12s" : "60s") << "\n";
    }
    cfg << cluster_->BridgeAuthYaml() << "log_level: info\n";
    cfg.close();
    ok_ = true;
  }

  bool ok_ = false;
  bool evict_pods_ = false;
  fs::path dir_;
  TestSlurmCluster* cluster_ = nullptr;
  std::unique_ptr<FakeApiServer> fake_;
  int extender_port_ = 0;
  int metrics_port_ = 0;
  int grpc_port_ = 0;
  std::unique_ptr<BridgeProcess> bridge_;
  std::unique_ptr<v1::Ledger::Stub> stub_;
};

// A pod as a user writes it and the apiserver stores it (before binding).
json TrainingPod(const std::string& name, const std::string& uid, int gpus) {
  return json::parse(absl::StrCat(R"({
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {
      "name": ")", name, R"(", "namespace": "default", "uid": ")", uid, R"(",
      "labels": {"app": "trainer", "team": "ml"},
      "annotations": {"kubectl.kubernetes.io/last-applied-configuration": ""},
      "creationTimestamp": "2026-12-02T18:00:00Z"
    },
    "spec": {
      "schedulerName": "duet",
      "restartPolicy": "Never",
      "serviceAccountName": "default",
      "terminationGracePeriodSeconds": 30,
      "dnsPolicy": "ClusterFirst",
      "priority": 0,
      "enableServiceLinks": true,
      "preemptionPolicy": "PreemptLowerPriority",
      "nodeSelector": {"cloud.google.com/gke-accelerator": ")", kGpuModel, R"("},
      "tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 300}
      ],
      "containers": [{
        "name": "trainer",
        "image": "nvcr.io/nvidia/pytorch:24.01-py3",
        "command": ["python", "train.py", "--epochs", "1"],
        "resources": {
          "requests": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": ")", gpus, R"("},
          "limits": {"memory": "4Gi", "nvidia.com/gpu": ")", gpus, R"("}
        },
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent"
      }]
    },
    "status": {"phase": "Pending", "qosClass": "Burstable"}
  })"));
}

class PodE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    w_ = World::Get();
    ASSERT_TRUE(w_->ok());
    c_ = w_->cluster();
    ASSERT_TRUE(w_->StartBridge());
    // The bridge created the nodes in Slurm (first pass before serving).
    for (const NodeDef& n : kNodes) {
      ASSERT_TRUE(WaitFor([&] {
        return c_->Cli(absl::StrCat("scontrol --future show node ", n.name)).rc == 0;
      })) << n.name << " was not created by duet-bridge\n"
          << w_->Log();
      c_->StartSlurmd(n.name, n.idx, 8, 16000, 8, kGpuModel);
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
      std::cerr << "== squeue\n" << c_->Cli("squeue").out << "== duetctl holds\n"
                << w_->Ctl("holds").out << "== duet-bridge log\n" << w_->Log()
                << "== slurmctld.log\n" << c_->Log("slurmctld.log");
    }
    c_->Cli("squeue -h -o %i | xargs -r scancel");
  }

  std::vector<LedgerHolding> Holdings() { return ::duet::testing::ListLedgerHoldings(w_->stub()); }

  std::map<std::string, NodeDevices> SlurmDevices(uint32_t job) {
    return ::duet::testing::SlurmJobDevices(*c_, job);
  }

  // `sbatch` a sleeping job; returns its id once it runs.
  uint32_t RunningJob(const std::string& args) {
    const uint32_t id = c_->Sbatch(args + " --wrap 'sleep 300'");
    EXPECT_TRUE(c_->WaitJobState(id, "RUNNING"))
        << "job " << id << " is " << c_->JobState(id) << "\n"
        << c_->Cli(absl::StrCat("scontrol show job ", id)).out;
    return id;
  }

  // The ledger's holding of Slurm job `job` on `node` ({} when none).
  NodeDevices LedgerJob(uint32_t job, const std::string& node) {
    for (const LedgerHolding& h : Holdings()) {
      if (h.kind == "slurm_job" && h.job_id == job && h.node == node) return h.devices;
    }
    return {};
  }

  // Waits until the ledger holds job `job` on `node` on Slurm's devices for
  // it; returns those devices ({} on timeout, with a failure).
  std::set<uint32_t> ImportedGpus(uint32_t job, const std::string& node) {
    NodeDevices want;
    const bool ok = WaitFor([&] {
      want = SlurmDevices(job)[node];
      return !want.empty() && LedgerJob(job, node) == want;
    });
    EXPECT_TRUE(ok) << "job " << job << " not imported with Slurm's devices\n"
                    << c_->Cli(absl::StrCat("scontrol -d show job ", job)).out
                    << w_->Ctl("holds").out;
    return ok ? want["gpu"] : std::set<uint32_t>{};
  }

  // POSTs `body` to the extender's `verb`; the HTTP status and the JSON answer.
  std::pair<int, json> Extender(const std::string& verb, const json& body) {
    const fs::path file = w_->dir() / ("req-" + verb + ".json");
    std::ofstream(file) << body.dump();
    CmdResult r = RunCmd(absl::StrCat(
        "curl -sS -o - -w '\\n%{http_code}' -X POST -H 'Content-Type: application/json' "
        "--data-binary @",
        file.string(), " ", w_->extender_url(), "/", verb),
        /*merge_stderr=*/false);
    const size_t nl = r.out.rfind('\n');
    if (r.rc != 0 || nl == std::string::npos) return {0, json(r.out)};
    const int code = std::atoi(r.out.c_str() + nl + 1);
    json answer = json::parse(r.out.substr(0, nl), nullptr, /*allow_exceptions=*/false);
    return {code, answer};
  }

  // The pod as the fake apiserver has it (null when gone).
  json ApiPod(const std::string& name) {
    CmdResult r = RunCmd(absl::StrCat("curl -sf ", w_->fake()->url(),
                                      "/api/v1/namespaces/default/pods/", name),
                         /*merge_stderr=*/false);
    if (r.rc != 0) return nullptr;
    return json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  }

  // The placeholder job of pod default/`name` per squeue: id and state.
  std::pair<uint32_t, std::string> PlaceholderJob(const std::string& name) {
    CmdResult r = c_->Cli("squeue -h -o '%i|%j|%T|%N'");
    for (absl::string_view l : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
      std::vector<std::string> f = absl::StrSplit(l, '|');
      if (f.size() == 4 && f[1] == "duet-pod:default/" + name) {
        return {static_cast<uint32_t>(std::stoul(f[0])), f[2] + "@" + f[3]};
      }
    }
    return {0, ""};
  }

  World* w_ = nullptr;
  TestSlurmCluster* c_ = nullptr;
};

std::set<uint32_t> Intersect(const std::set<uint32_t>& a, const std::set<uint32_t>& b) {
  std::set<uint32_t> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::inserter(out, out.end()));
  return out;
}

TEST_F(PodE2eTest, PodBesideASlurmJobGetsDisjointGpusAndSlurmWaitsForThePodToEnd) {
  // 1. A Slurm job on 4 GPUs of node a, running and imported.
  const uint32_t job1 = RunningJob(absl::StrCat("-w ", kNodeA, " --gres=gpu:4"));
  ASSERT_NE(job1, 0u);
  const std::set<uint32_t> job1_gpus = ImportedGpus(job1, kNodeA);
  ASSERT_EQ(job1_gpus.size(), 4u);

  // 2. A 2-GPU pod, created in the apiserver, scheduled through the extender.
  const std::string name = "trainer-0";
  const std::string uid = "6f1e2d3c-4b5a-4978-8a6b-5c4d3e2f1a0b";
  json pod = TrainingPod(name, uid, 2);
  w_->fake()->Put(pod);
  pod = ApiPod(name);
  ASSERT_TRUE(pod.is_object()) << "the fake apiserver does not have the pod";
  ASSERT_EQ(pod["metadata"]["uid"], uid);
  const json nodes = json::array({kNodes[0].name, kNodes[1].name});
  auto [code, filter] = Extender("filter", {{"Pod", pod}, {"NodeNames", nodes}});
  ASSERT_EQ(code, 200) << filter.dump();
  EXPECT_EQ(filter["NodeNames"], nodes) << filter.dump();
  EXPECT_TRUE(filter["FailedNodes"].is_null() || filter["FailedNodes"].empty()) << filter.dump();
  EXPECT_TRUE(filter["Error"].is_null() || filter["Error"] == "") << filter.dump();

  auto [pcode, prio] = Extender("prioritize", {{"Pod", pod}, {"NodeNames", filter["NodeNames"]}});
  ASSERT_EQ(pcode, 200) << prio.dump();
  ASSERT_TRUE(prio.is_array() && prio.size() == 2) << prio.dump();
  std::string top;
  int top_score = -1;
  for (const json& hp : prio) {
    if (hp["Score"].get<int>() > top_score) {
      top_score = hp["Score"].get<int>();
      top = hp["Host"].get<std::string>();
    }
  }
  // Packing: the node the Slurm job half fills comes first.
  ASSERT_EQ(top, kNodeA) << prio.dump();

  auto [bcode, bind] = Extender("bind", {{"PodName", name},
                                         {"PodNamespace", "default"},
                                         {"PodUID", uid},
                                         {"Node", top}});
  ASSERT_EQ(bcode, 200) << bind.dump();
  ASSERT_TRUE(bind["Error"].is_null() || bind["Error"] == "") << bind.dump();

  // The apiserver has the pod bound to node a.
  EXPECT_EQ(ApiPod(name)["spec"]["nodeName"], kNodeA);
  // Slurm has the pod's placeholder job running on node a.
  auto [placeholder, ph_state] = PlaceholderJob(name);
  ASSERT_NE(placeholder, 0u) << c_->Cli("squeue").out;
  EXPECT_EQ(ph_state, absl::StrCat("RUNNING@", kNodeA));
  const std::set<uint32_t> ph_slurm = SlurmDevices(placeholder)[kNodeA]["gpu"];
  EXPECT_EQ(ph_slurm.size(), 2u) << c_->Cli(absl::StrCat("scontrol -d show job ", placeholder)).out;
  // The ledger: the placeholder holds exactly Slurm's 2 GPUs for it, disjoint
  // from the job's 4, which the job still holds.
  std::set<uint32_t> ph_ledger;
  for (const LedgerHolding& h : Holdings()) {
    if (h.kind == "placeholder" && h.pod_uid == uid) {
      EXPECT_EQ(h.node, kNodeA);
      EXPECT_EQ(h.job_id, placeholder);
      if (h.devices.count("gpu") != 0) ph_ledger = h.devices.at("gpu");
    }
  }
  EXPECT_EQ(ph_ledger, ph_slurm) << w_->Ctl("holds").out;
  EXPECT_EQ(ph_ledger.size(), 2u) << w_->Ctl("holds").out;
  EXPECT_TRUE(Intersect(ph_ledger, job1_gpus).empty()) << w_->Ctl("holds").out;
  EXPECT_EQ(LedgerJob(job1, kNodeA)["gpu"], job1_gpus);

  // 3. Another 4-GPU job on node a: only 2 GPUs are free, so it pends.
  const uint32_t job2 =
      c_->Sbatch(absl::StrCat("-w ", kNodeA, " --gres=gpu:4 --wrap 'sleep 300'"));
  ASSERT_NE(job2, 0u);
  EXPECT_TRUE(c_->WaitJobPending(job2, "Resources"))
      << c_->Cli(absl::StrCat("scontrol -d show job ", job2)).out;
  // Not even 3 GPUs can be had now.
  CmdResult r =
      c_->Cli(absl::StrCat("srun -w ", kNodeA, " --gres=gpu:3 --immediate=3 echo RAN"));
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.find("RAN"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Unable to allocate resources"), std::string::npos) << r.out;

  // 4. The pod ends (its containers exit 0): the pod watch cancels the
  // placeholder, and Slurm starts the pending job.
  json done = ApiPod(name);
  ASSERT_TRUE(done.is_object());
  done["status"]["phase"] = "Succeeded";
  w_->fake()->Put(done);
  EXPECT_TRUE(WaitFor([&] { return PlaceholderJob(name).first == 0; }, absl::Seconds(15)))
      << c_->Cli("squeue").out << w_->Log();
  EXPECT_TRUE(WaitFor(
      [&] {
        for (const LedgerHolding& h : Holdings()) {
          if (h.kind == "placeholder") return false;
        }
        return true;
      },
      absl::Seconds(15)))
      << w_->Ctl("holds").out;
  ASSERT_TRUE(c_->WaitJobState(job2, "RUNNING", absl::Seconds(30)))
      << c_->Cli(absl::StrCat("scontrol -d show job ", job2)).out;
  const std::set<uint32_t> job2_gpus = ImportedGpus(job2, kNodeA);
  EXPECT_EQ(job2_gpus.size(), 4u);
  EXPECT_TRUE(Intersect(job2_gpus, job1_gpus).empty())
      << c_->Cli(absl::StrCat("scontrol -d show job ", job2)).out;
  // The pod is still in the apiserver (finished pods stay until deleted).
  EXPECT_TRUE(ApiPod(name).is_object());
}

TEST_F(PodE2eTest, FilterRefusesANodeWhoseGpusSlurmJobsHold) {
  const uint32_t j1 = RunningJob(absl::StrCat("-w ", kNodeA, " --gres=gpu:4"));
  const uint32_t j2 = RunningJob(absl::StrCat("-w ", kNodeA, " --gres=gpu:4"));
  ASSERT_NE(j1, 0u);
  ASSERT_NE(j2, 0u);
  ASSERT_EQ(ImportedGpus(j1, kNodeA).size(), 4u);
  ASSERT_EQ(ImportedGpus(j2, kNodeA).size(), 4u);

  json pod = TrainingPod("trainer-1", "0a1b2c3d-4e5f-4071-8293-a4b5c6d7e8f9", 2);
  w_->fake()->Put(pod);
  pod = ApiPod("trainer-1");
  ASSERT_TRUE(pod.is_object());
  auto [code, filter] =
      Extender("filter", {{"Pod", pod}, {"NodeNames", {kNodes[0].name, kNodes[1].name}}});
  ASSERT_EQ(code, 200) << filter.dump();
  EXPECT_EQ(filter["NodeNames"], json::array({kNodes[1].name})) << filter.dump();
  ASSERT_TRUE(filter["FailedNodes"].is_object()) << filter.dump();
  ASSERT_TRUE(filter["FailedNodes"].contains(kNodeA)) << filter.dump();
  const std::string reason = filter["FailedNodes"][kNodeA].get<std::string>();
  EXPECT_NE(reason.find("gpu"), std::string::npos) << reason;
  EXPECT_NE(reason.find("2 requested"), std::string::npos) << reason;
  EXPECT_EQ(reason.find(kNodeA), std::string::npos) << "the reason names no node: " << reason;

  // A bind to the full node anyway (a stale scheduler cache) is refused and
  // leaves nothing behind: no placeholder, pod unbound.
  auto [bcode, bind] = Extender("bind", {{"PodName", "trainer-1"},
                                         {"PodNamespace", "default"},
                                         {"PodUID", pod["metadata"]["uid"]},
                                         {"Node", kNodeA}});
  ASSERT_EQ(bcode, 200) << bind.dump();
  EXPECT_TRUE(bind["Error"].is_string() && !bind["Error"].get<std::string>().empty())
      << bind.dump();
  EXPECT_EQ(PlaceholderJob("trainer-1").first, 0u) << c_->Cli("squeue").out;
  EXPECT_FALSE(ApiPod("trainer-1")["spec"].contains("nodeName")) << ApiPod("trainer-1").dump();
  for (const LedgerHolding& h : Holdings()) {
    EXPECT_TRUE(h.kind == "slurm_job" || h.kind == "slurm_step") << h.kind << " on " << h.node;
  }
}

// A Slurm job that holds most of a node's CPUs (but one GPU): the pod's
// GPUs would fit, its 2 CPUs do not. The filter says so by the next sync
// pass; the other node passes, and a bind to the full node is refused.
TEST_F(PodE2eTest, FilterRefusesANodeWhoseCpusSlurmJobsHold) {
  const uint32_t job = RunningJob(absl::StrCat("-w ", kNodeA, " -c 7 --gres=gpu:1"));
  ASSERT_NE(job, 0u);
  ASSERT_EQ(ImportedGpus(job, kNodeA).size(), 1u);

  w_->fake()->Put(TrainingPod("trainer-3", "3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b9a", 2));
  const json pod = ApiPod("trainer-3");
  ASSERT_TRUE(pod.is_object());
  json filter;
  const bool refused = WaitFor([&] {
    auto [code, f] = Extender("filter", {{"Pod", pod}, {"NodeNames", {kNodes[0].name, kNodes[1].name}}});
    filter = f;
    return code == 200 && f["FailedNodes"].is_object() && f["FailedNodes"].contains(kNodeA);
  }, absl::Seconds(15));
  ASSERT_TRUE(refused) << filter.dump() << "\n" << c_->Cli(absl::StrCat("scontrol show node ", kNodeA)).out;
  EXPECT_EQ(filter["NodeNames"], json::array({kNodes[1].name})) << filter.dump();
  const std::string reason = filter["FailedNodes"][kNodeA].get<std::string>();
  EXPECT_NE(reason.find("1000m cpu free, 2000m requested"), std::string::npos) << reason;

  auto [bcode, bind] = Extender("bind", {{"PodName", "trainer-3"},
                                         {"PodNamespace", "default"},
                                         {"PodUID", pod["metadata"]["uid"]},
                                         {"Node", kNodeA}});
  ASSERT_EQ(bcode, 200) << bind.dump();
  EXPECT_TRUE(bind["Error"].is_string() && !bind["Error"].get<std::string>().empty()) << bind.dump();
  EXPECT_EQ(PlaceholderJob("trainer-3").first, 0u) << c_->Cli("squeue").out;

  // The job ends: the CPUs are free again by the next pass.
  c_->Cli(absl::StrCat("scancel ", job));
  EXPECT_TRUE(WaitFor([&] {
    auto [code, f] = Extender("filter", {{"Pod", pod}, {"NodeNames", {kNodeA}}});
    filter = f;
    return code == 200 && f["NodeNames"] == json::array({kNodeA});
  }, absl::Seconds(15))) << filter.dump();
}

// The pod is deleted while it runs (not finished): the DELETED frame makes
// the pod watch cancel the placeholder at once, and a job waiting for the
// pod's GPUs starts.
TEST_F(PodE2eTest, DeletedPodsPlaceholderIsCancelledAndAWaitingJobStarts) {
  const uint32_t job1 = RunningJob(absl::StrCat("-w ", kNodeA, " --gres=gpu:6"));
  ASSERT_NE(job1, 0u);
  const std::set<uint32_t> job1_gpus = ImportedGpus(job1, kNodeA);
  ASSERT_EQ(job1_gpus.size(), 6u);

  const std::string name = "trainer-2";
  const std::string uid = "9c8b7a69-5847-4362-9150-0f1e2d3c4b5a";
  w_->fake()->Put(TrainingPod(name, uid, 2));
  json pod = ApiPod(name);
  ASSERT_TRUE(pod.is_object());
  auto [code, filter] = Extender("filter", {{"Pod", pod}, {"NodeNames", {kNodeA}}});
  ASSERT_EQ(code, 200) << filter.dump();
  ASSERT_EQ(filter["NodeNames"], json::array({kNodeA})) << filter.dump();
  auto [bcode, bind] = Extender(
      "bind", {{"PodName", name}, {"PodNamespace", "default"}, {"PodUID", uid}, {"Node", kNodeA}});
  ASSERT_EQ(bcode, 200) << bind.dump();
  ASSERT_TRUE(bind["Error"].is_null() || bind["Error"] == "") << bind.dump();
  const uint32_t placeholder = PlaceholderJob(name).first;
  ASSERT_NE(placeholder, 0u) << c_->Cli("squeue").out;
  const std::set<uint32_t> pod_gpus = SlurmDevices(placeholder)[kNodeA]["gpu"];
  EXPECT_EQ(pod_gpus.size(), 2u);
  EXPECT_TRUE(Intersect(pod_gpus, job1_gpus).empty());

  // Node a is full: a 1-GPU job waits.
  const uint32_t job2 = c_->Sbatch(absl::StrCat("-w ", kNodeA, " --gres=gpu:1 --wrap 'sleep 300'"));
  ASSERT_NE(job2, 0u);
  EXPECT_TRUE(c_->WaitJobPending(job2, "Resources"))
      << c_->Cli(absl::StrCat("scontrol -d show job ", job2)).out;

  w_->fake()->Delete("Pod", name);
  EXPECT_TRUE(WaitFor([&] { return PlaceholderJob(name).first == 0; }, absl::Seconds(15)))
      << c_->Cli("squeue").out << w_->Log();
  ASSERT_TRUE(c_->WaitJobState(job2, "RUNNING", absl::Seconds(30)))
      << c_->Cli(absl::StrCat("scontrol -d show job ", job2)).out;
  const std::set<uint32_t> job2_gpus = ImportedGpus(job2, kNodeA);
  ASSERT_EQ(job2_gpus.size(), 1u);
  EXPECT_TRUE(pod_gpus.count(*job2_gpus.begin()) == 1)
      << "the only free GPUs were the pod's; job2 got gpu " << *job2_gpus.begin();
  for (const LedgerHolding& h : Holdings()) {
    EXPECT_NE(h.kind, "placeholder") << w_->Ctl("holds").out;
  }
}

class PodLifeE2eTest : public PodE2eTest {
 protected:
  std::pair<uint32_t, std::set<uint32_t>> Bind(const std::string& name, const std::string& uid,
                                               int gpus) {
    w_->fake()->Put(TrainingPod(name, uid, gpus));
    json pod = ApiPod(name);
    EXPECT_TRUE(pod.is_object());
    auto [code, filter] = Extender("filter", {{"Pod", pod}, {"NodeNames", {kNodeA}}});
    EXPECT_EQ(filter["NodeNames"], json::array({kNodeA})) << filter.dump();
    auto [bcode, bind] = Extender(
        "bind",
        {{"PodName", name}, {"PodNamespace", "default"}, {"PodUID", uid}, {"Node", kNodeA}});
    EXPECT_EQ(bcode, 200) << bind.dump();
    EXPECT_TRUE(bind["Error"].is_null() || bind["Error"] == "") << bind.dump();
    const uint32_t job = PlaceholderJob(name).first;
    EXPECT_NE(job, 0u) << c_->Cli("squeue").out;
    return {job, SlurmDevices(job)[kNodeA]["gpu"]};
  }

  // The pod's GPUs in the ledger (all its placeholder holdings on node a).
  std::set<uint32_t> LedgerPodGpus(const std::string& uid) {
    std::set<uint32_t> out;
    for (const LedgerHolding& h : Holdings()) {
      if (h.kind == "placeholder" && h.pod_uid == uid && h.node == kNodeA) {
        for (uint32_t g : h.devices.at("gpu")) out.insert(g);
      }
    }
    return out;
  }

  // GPUs of node a that live Slurm jobs other than placeholders hold, per
  // `scontrol -d show job` (Slurm's own ground truth).
  std::set<uint32_t> SlurmJobGpus() {
    std::set<uint32_t> out;
    CmdResult r = c_->Cli("squeue -h -t running,completing -o '%i|%j'");
    for (absl::string_view l : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
      std::vector<std::string> f = absl::StrSplit(l, '|');
      if (f.size() != 2 || absl::StartsWith(f[1], "duet-pod:")) continue;
      std::map<std::string, NodeDevices> devices = SlurmDevices(std::stoul(f[0]));
      for (uint32_t g : devices[kNodeA]["gpu"]) out.insert(g);
    }
    return out;
  }

  // Polls until pod `name` has a running placeholder job other than `lost`;
  // at every poll the pod's GPUs are held in the ledger and no Slurm job but
  // a placeholder holds any of them (Slurm's own GRES detail). Returns the new
  // job (0 on timeout, with a failure), after checking it holds `pod_gpus`.
  uint32_t WaitForRepair(const std::string& name, const std::string& uid, uint32_t lost,
                         const std::set<uint32_t>& pod_gpus, absl::Duration timeout) {
    uint32_t repaired = 0;
    const bool ok = WaitFor(
        [&] {
          EXPECT_EQ(LedgerPodGpus(uid), pod_gpus) << "the pod's GPUs stay held";
          EXPECT_TRUE(Intersect(SlurmJobGpus(), pod_gpus).empty()) << c_->Cli("squeue").out;
          auto [job, state] = PlaceholderJob(name);
          if (job == 0 || job == lost || state.rfind("RUNNING", 0) != 0) return false;
          repaired = job;
          return true;
        },
        timeout);
    EXPECT_TRUE(ok) << w_->Log() << c_->Cli(absl::StrCat("scontrol show node ", kNodeA)).out;
    if (ok) {
      EXPECT_EQ(SlurmDevices(repaired)[kNodeA]["gpu"], pod_gpus);
    }
    return ok ? repaired : 0;
  }

  // Events in namespace default with `reason` about pod `name`.
  int PodEvents(const std::string& name, const std::string& reason) {
    auto body = w_->fake()->control()->Get("/api/v1/namespaces/default/events");
    if (!body.ok()) return -1;
    int n = 0;
    const json list = json::parse(*body, nullptr, /*allow_exceptions=*/false);
    if (!list.is_object() || !list["items"].is_array()) return -1;
    for (const json& e : list["items"]) {
      if (e["reason"] == reason && e["involvedObject"]["name"] == name) ++n;
    }
    return n;
  }
};

// An admin's scancel of a running pod's placeholder: the pod keeps its GPUs
// in the ledger, no Slurm job holds them meanwhile, and the bridge re-creates
// the placeholder on exactly those GPUs and posts an Event.
TEST_F(PodLifeE2eTest, ScancelOfABoundPodsPlaceholderIsRepairedOnTheSameGpus) {
  const uint32_t job1 = RunningJob(absl::StrCat("-w ", kNodeA, " --gres=gpu:4"));
  ASSERT_EQ(ImportedGpus(job1, kNodeA).size(), 4u);
  const std::string name = "infer-scancel";
  const std::string uid = "5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d";
  auto [placeholder, pod_gpus] = Bind(name, uid, 2);
  ASSERT_EQ(pod_gpus.size(), 2u);
  ASSERT_TRUE(WaitFor([&] { return LedgerPodGpus(uid) == pod_gpus; })) << w_->Ctl("holds").out;

  ASSERT_EQ(c_->Cli(absl::StrCat("scancel ", placeholder)).rc, 0);
  // Slurm now sees the pod's GPUs free; a job asking for every free GPU
  // must not get them: the bridge's repair wins or the fence refuses it.
  const uint32_t repaired = WaitForRepair(name, uid, placeholder, pod_gpus, absl::Seconds(20));
  ASSERT_NE(repaired, 0u);
  EXPECT_TRUE(WaitFor([&] { return LedgerPodGpus(uid) == pod_gpus; }));
  EXPECT_TRUE(WaitFor([&] { return PodEvents(name, "DuetPlaceholderRepaired") == 1; }))
      << w_->Log();
  // The rest of the node is Slurm's: a 2-GPU job runs beside the pod, on
  // other GPUs.
  const uint32_t job2 = RunningJob(absl::StrCat("-w ", kNodeA, " --gres=gpu:2"));
  EXPECT_TRUE(Intersect(ImportedGpus(job2, kNodeA), pod_gpus).empty());
  const std::string metrics = w_->Metrics();
  EXPECT_NE(metrics.find("duet_placeholder_losses_total{outcome=\"repaired\"} 1"),
            std::string::npos)
      << metrics;
  w_->fake()->Delete("Pod", name);
  EXPECT_TRUE(WaitFor([&] { return PlaceholderJob(name).first == 0; }, absl::Seconds(15)));
}

// state=down kills every job on node a, the pod's placeholder included. The
// pod keeps its GPUs in the ledger; when Slurm runs the node again, no Slurm
// job has the pod's GPUs and the placeholder is back on them.
TEST_F(PodLifeE2eTest, NodeDownKeepsThePodsGpusAwayFromSlurm) {
  const uint32_t job1 = RunningJob(absl::StrCat("-w ", kNodeA, " --gres=gpu:2"));
  ASSERT_EQ(ImportedGpus(job1, kNodeA).size(), 2u);
  const std::string name = "infer-down";
  const std::string uid = "6b5c4d3e-2f10-4b0a-9d8e-7f6a5b4c3d2e";
  auto [placeholder, pod_gpus] = Bind(name, uid, 2);
  ASSERT_EQ(pod_gpus.size(), 2u);
  ASSERT_TRUE(WaitFor([&] { return LedgerPodGpus(uid) == pod_gpus; }));

  ASSERT_EQ(
      c_->Cli(absl::StrCat("scontrol update nodename=", kNodeA, " state=down reason=maint")).rc, 0);
  const uint32_t repaired = WaitForRepair(name, uid, placeholder, pod_gpus, absl::Seconds(30));
  ASSERT_NE(repaired, 0u);
  // A job asking for all 8 GPUs can never start while the pod runs.
  const uint32_t big = c_->Sbatch(absl::StrCat("-w ", kNodeA, " --gres=gpu:8 --wrap 'sleep 1'"));
  ASSERT_TRUE(WaitFor([&] {
    return c_->Cli(absl::StrCat("squeue -h -j ", big, " -o %r")).out.find("Resources") !=
           std::string::npos;
  })) << c_->Cli(absl::StrCat("squeue -j ", big, " -o '%i %T %r'")).out;
  w_->fake()->Delete("Pod", name);
  EXPECT_TRUE(WaitFor([&] { return PlaceholderJob(name).first == 0; }, absl::Seconds(15)));
}

// An admin's drain in Slurm (which duet leaves alone): filter drops the
// node as unresolvable with Slurm's reason; duetctl shows Slurm's state
// beside Kubernetes'; after the resume the node passes again.
TEST_F(PodLifeE2eTest, FilterDropsANodeAnAdminDrainedInSlurm) {
  w_->fake()->Put(TrainingPod("trainer-drain", "7c6d5e4f-3a21-4c1b-8e9f-0a1b2c3d4e5f", 1));
  const json pod = ApiPod("trainer-drain");
  ASSERT_EQ(
      c_->Cli(absl::StrCat("scontrol update nodename=", kNodeA, " state=drain reason=maint-window"))
          .rc,
      0);
  json filter;
  ASSERT_TRUE(WaitFor([&] {
    filter =
        Extender("filter", {{"Pod", pod}, {"NodeNames", {kNodes[0].name, kNodes[1].name}}}).second;
    return filter["FailedAndUnresolvableNodes"].is_object() &&
           filter["FailedAndUnresolvableNodes"].contains(kNodeA);
  })) << filter.dump();
  EXPECT_EQ(filter["NodeNames"], json::array({kNodes[1].name})) << filter.dump();
  const std::string reason = filter["FailedAndUnresolvableNodes"][kNodeA].get<std::string>();
  EXPECT_NE(reason.find("drained in Slurm (maint-window)"), std::string::npos) << reason;
  CmdResult nodes = w_->Ctl("nodes");
  EXPECT_NE(nodes.out.find("SLURM-STATE"), std::string::npos) << nodes.out;
  EXPECT_NE(nodes.out.find("DRAIN"), std::string::npos) << nodes.out;
  CmdResult node = w_->Ctl(absl::StrCat("node ", kNodeA));
  EXPECT_NE(node.out.find("(maint-window)"), std::string::npos) << node.out;

  ASSERT_EQ(c_->Cli(absl::StrCat("scontrol update nodename=", kNodeA, " state=resume")).rc, 0);
  EXPECT_TRUE(WaitFor([&] {
    filter =
        Extender("filter", {{"Pod", pod}, {"NodeNames", {kNodes[0].name, kNodes[1].name}}}).second;
    return filter["NodeNames"].size() == 2;
  })) << filter.dump();
}

// slurm.preemption: evict-pods, with Slurm preempting by partition
// priority (World: PreemptMode=CANCEL, placeholders in partition duet-pods,
// tier 1; partition high, tier 10). A job in partition high that needs a
// pod's GPUs: Slurm cancels the pod's placeholder (PREEMPTED) and starts the
// job; its step's devices are still the pod's in the ledger, so spank_duet
// waits (POD_EVICTING) while the bridge evicts the pod through the Eviction
// API; the step runs once the pod has left.
class EvictPodsE2eTest : public PodLifeE2eTest {
 protected:
  // duet-bridge's /metrics value of the series `series` (-1: absent).
  double Metric(const std::string& series) {
    for (absl::string_view l : absl::StrSplit(w_->Metrics(), '\n')) {
      if (absl::ConsumePrefix(&l, series) && absl::ConsumePrefix(&l, " ")) {
        return std::atof(std::string(l).c_str());
      }
    }
    return -1;
  }
  int Evictions(const std::string& name) {
    int n = 0;
    for (const json& r : w_->fake()->Requests()) {
      if (r.value("method", "") == "POST" &&
          r.value("path", "") ==
              absl::StrCat("/api/v1/namespaces/default/pods/", name, "/eviction")) {
        ++n;
      }
    }
    return n;
  }
};

TEST_F(EvictPodsE2eTest, EvictPodsPreemptedPlaceholdersPodLeavesAndThePreemptorsStepRuns) {
  const std::string uid = "0d1c2b3a-4958-4a6b-8c7d-6e5f4a3b2c1d";
  auto [placeholder, pod_gpus] = Bind("server-0", uid, 4);
  ASSERT_NE(placeholder, 0u);
  ASSERT_EQ(pod_gpus.size(), 4u);
  // Every GPU of node a: only by preempting the placeholder.
  CmdResult r = c_->Cli(absl::StrCat("srun -p high -w ", kNodeA,
                                     " --gres=gpu:8 sh -c 'echo got $CUDA_VISIBLE_DEVICES'"));
  EXPECT_EQ(r.rc, 0) << r.out << w_->Log();
  EXPECT_NE(r.out.find("got 0,1,2,3,4,5,6,7"), std::string::npos) << r.out;
  // (Slurm has purged the preempted placeholder's record: MinJobAge=2.)
  EXPECT_TRUE(ApiPod("server-0").is_null()) << "the pod was not evicted";
  EXPECT_EQ(Evictions("server-0"), 1);
  EXPECT_EQ(Metric("duet_pod_evictions_total{result=\"evicted\"}"), 1) << w_->Metrics();
  EXPECT_TRUE(WaitFor([&] { return LedgerPodGpus(uid).empty(); })) << w_->Ctl("holds").out;
  EXPECT_EQ(Metric("duet_slurm_conflicts_total"), 0) << "a waiting preemptor is no conflict";
}

// A PodDisruptionBudget that allows no disruption: the eviction is refused
// (429) and retried, the pod stays, and the preemptor's step is refused at
// the end of the wait (12 s here) with a reason, never run on the pod's
// GPUs. The pod's placeholder is then re-made on the same GPUs.
TEST_F(EvictPodsE2eTest, EvictPodsABudgetKeepsThePodAndThePreemptorsStepIsRefusedAfterTheWait) {
  w_->fake()->Put(json::parse(R"({
    "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
    "metadata": {"name": "trainers", "namespace": "default"},
    "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "trainer"}}},
    "status": {"currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1,
               "disruptionsAllowed": 0, "observedGeneration": 1}
  })"));
  const std::string uid = "1e2d3c4b-5a69-4b7c-9d8e-7f6a5b4c3d2e";
  auto [placeholder, pod_gpus] = Bind("server-1", uid, 4);
  ASSERT_NE(placeholder, 0u);
  // Running and Ready, as the kubelet reports it: a budget protects only
  // such pods (the Eviction API lets a Pending one go).
  json pod = ApiPod("server-1");
  pod["status"] = json::parse(R"({"phase": "Running", "qosClass": "Burstable",
      "conditions": [{"type": "Ready", "status": "True"}]})");
  w_->fake()->Put(pod);
  const absl::Time t0 = absl::Now();
  CmdResult r = c_->Cli(absl::StrCat("srun -p high -w ", kNodeA,
                                     " --gres=gpu:8 sh -c 'echo got $CUDA_VISIBLE_DEVICES'"));
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.find("got "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("and the pod is still there"), std::string::npos) << r.out;
  EXPECT_GE(absl::Now() - t0, absl::Seconds(10)) << "the step did not wait";
  EXPECT_TRUE(ApiPod("server-1").is_object()) << "the budget did not keep the pod";
  EXPECT_GE(Evictions("server-1"), 2) << "refused evictions are retried";
  EXPECT_GE(Metric("duet_pod_evictions_total{result=\"blocked\"}"), 2) << w_->Metrics();
  EXPECT_EQ(Metric("duet_pod_evictions_total{result=\"evicted\"}"), 0);
  EXPECT_EQ(LedgerPodGpus(uid), pod_gpus) << "the pod keeps its GPUs";
  // The preemptor has ended: the pod's placeholder comes back on its GPUs.
  WaitForRepair("server-1", uid, placeholder, pod_gpus, absl::Seconds(30));
}

}  // namespace
}  // namespace duet
