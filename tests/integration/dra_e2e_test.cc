// The DRA lending mode end to end (issue 26, docs/dra.md) with the real
// binaries: a real Slurm cluster on loopback (spank_duet.so in
// plugstack.conf), the real duet-bridge with dra.enabled (its admission
// webhook on HTTPS, its DeviceTaintRules, its lend jobs), the fake
// kube-apiserver at 1.37 (tests/fakes/fake_apiserver.py) calling that
// webhook on resourceclaims/status as kube-apiserver does, NVIDIA-shaped
// ResourceSlices from tests/fakes/fake_dra_driver.py, and the test scheduler
// (tests/fakes/test_scheduler.py) as a process: it allocates claims as
// kube-scheduler's DRA plugin does and places pods that name no
// schedulerName. Label: slurm.
//
// - a pod asking `nvidia.com/gpu: 2` (the DRA extended resource) beside a
//   running Slurm job: unschedulable at first (every device not lent is
//   tainted), duet lends two devices, the scheduler allocates them through
//   the webhook, the claim holds them in the ledger, disjoint from the job's;
// - a claim that tolerates duet's taint: the scheduler picks a device that
//   is not lent and the webhook refuses the write; nothing is allocated;
// - the pod and its claim go away: the devices go back to lent, then are
//   reclaimed (lend jobs cancelled, rules back) and a Slurm job that wants
//   every GPU starts;
// - duet-bridge restarts: the claim keeps its devices, the lend jobs stay.
//
// One cluster, one bridge, one fake apiserver per process; ctest runs each
// test in its own process.

#include <sys/types.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
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
#ifndef DUET_FAKES_DIR
#error "DUET_FAKES_DIR must name tests/fakes"
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

constexpr char kNode[] = "dra-gpu-1";
constexpr int kNodeIdx = 86;
constexpr char kGpuModel[] = "nvidia-h100-80gb";
constexpr char kPool[] = "lend-h100";
constexpr char kTaintKey[] = "duet.dev/not-lent";
constexpr char kDra[] = "/apis/resource.k8s.io/v1";
constexpr char kHookPath[] = "/validate-resourceclaim-status";

std::string Python(const std::string& code) {
  return absl::StrCat("/usr/bin/python3 -c 'import sys; sys.path.insert(0, \"", DUET_FAKES_DIR,
                      "\"); ", code, "'");
}

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
  std::string socket() const { return (dir_ / "bridge.sock").string(); }
  const fs::path& dir() const { return dir_; }
  std::string Log() const { return bridge_ ? bridge_->Log(120) : ""; }
  std::string SchedulerLog() const {
    std::ifstream f(dir_ / "scheduler.log");
    std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return all.size() > 6000 ? all.substr(all.size() - 6000) : all;
  }
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
  void StopBridge() {
    stub_.reset();
    bridge_.reset();  // SIGTERM
  }

  // The test scheduler as a process, its lines in scheduler.log; `extra`
  // are its flags (--stale-cache, --prebind-delay S).
  void StartScheduler(const std::vector<std::string>& extra = {}) {
    StopScheduler();
    const std::string log = (dir_ / "scheduler.log").string();
    std::vector<std::string> args = {"python3", absl::StrCat(DUET_FAKES_DIR, "/test_scheduler.py"),
                                     "--server", fake_->url(), "--interval", "0.2"};
    args.insert(args.end(), extra.begin(), extra.end());
    scheduler_pid_ = fork();
    if (scheduler_pid_ == 0) {
      FILE* f = freopen(log.c_str(), "a", stdout);
      (void)f;
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv("/usr/bin/python3", argv.data());
      _exit(127);
    }
  }
  void StopScheduler() {
    if (scheduler_pid_ > 0) {
      kill(scheduler_pid_, SIGTERM);
      waitpid(scheduler_pid_, nullptr, 0);
      scheduler_pid_ = -1;
    }
  }

  void Stop() {
    StopScheduler();
    StopBridge();
    fake_.reset();
    if (cluster_ != nullptr) cluster_->Stop();
    std::error_code ec;
    if (!dir_.empty() && ::testing::UnitTest::GetInstance()->Passed()) {
      fs::remove_all(dir_, ec);
      if (cluster_ != nullptr && !cluster_->root().empty()) fs::remove_all(cluster_->root(), ec);
    } else if (!dir_.empty()) {
      std::cerr << "dra_e2e_test: kept " << dir_ << " and " << (cluster_ ? cluster_->root() : "")
                << " for inspection\n";
    }
  }

  int webhook_port() const { return webhook_port_; }
  const std::string& ca_file() const { return tls_.ca; }

 private:
  class Stopper : public ::testing::Environment {
   public:
    explicit Stopper(World* w) : w_(w) {}
    void TearDown() override { w_->Stop(); }

   private:
    World* w_;
  };

  std::string grpc_address() const { return absl::StrCat("127.0.0.1:", grpc_port_); }

  World() {
    char tmpl[] = "/tmp/duet-dra-e2e.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      ADD_FAILURE() << "mkdtemp failed";
      return;
    }
    dir_ = tmpl;
    TestSlurmCluster::Options o;
    grpc_port_ = FreePort();
    o.spank = absl::StrCat(DUET_SPANK_SO, ":bridge=", grpc_address(), " timeout_ms=2000");
    cluster_ = TestSlurmCluster::Get(o);  // registers the cluster's Stopper first...
    ::testing::AddGlobalTestEnvironment(new Stopper(this));  // ...so this one runs first
    if (!cluster_->ok()) return;
    std::ofstream(cluster_->root() + "/etc/plugstack.conf")
        << "required " << DUET_SPANK_SO << " bridge=" << grpc_address() << " timeout_ms=2000"
        << cluster_->PlugstackAuthArgs() << "\n";

    fake_ = std::make_unique<FakeApiServer>(std::vector<std::string>{"--kube-version", "1.37"});
    if (!fake_->ok()) {
      ADD_FAILURE() << "the fake apiserver did not start";
      return;
    }
    k8s::testing::WriteKubeconfig((dir_ / "kubeconfig").string(), fake_->url());
    fs::create_directories(dir_ / "tls");
    tls_ = k8s::testing::MakeTestCerts((dir_ / "tls").string());

    // The GPUs' uuids as the fake NVIDIA driver publishes them, so the
    // inventory and the slices agree (duet checks them against each other).
    CmdResult ids = RunCmd(Python(absl::StrCat(
        "import fake_dra_driver as d; print(\",\".join(x[\"attributes\"][\"uuid\"][\"string\"] "
        "for x in d.nvidia_devices(\"",
        kNode, "\", 8)))")));
    if (ids.rc != 0) {
      ADD_FAILURE() << "uuids: " << ids.out;
      return;
    }
    std::vector<std::string> uuids = absl::StrSplit(absl::StripAsciiWhitespace(ids.out), ',');
    std::ofstream inv(dir_ / "nodes.yaml");
    inv << "nodes:\n"
        << "  - name: " << kNode << "\n"
        << "    cpus: 16\n    memory_mib: 16000\n    zone: us-central1-a\n"
        << "    pool: " << kPool << "\n"
        << "    labels: {duet.dev/slurm-node-addr: 127.0.0." << kNodeIdx
        << ", cloud.google.com/gke-accelerator: " << kGpuModel
        << ", cloud.google.com/gke-nodepool: " << kPool << "}\n"
        << "    gpus: {count: 8, model: " << kGpuModel << ", ids: [" << absl::StrJoin(uuids, ", ")
        << "]}\n";
    inv.close();
    metrics_port_ = FreePort();
    webhook_port_ = FreePort();
    std::ofstream cfg(dir_ / "bridge.yaml");
    cfg << "grpc: {listen: \"" << grpc_address() << "\", unix_socket: " << socket() << "}\n"
        << "metrics: {listen: \"127.0.0.1:" << metrics_port_ << "\"}\n"
        << "journal: {dir: " << (dir_ / "journal").string() << "}\n"
        << "inventory: {source: file, file: " << (dir_ / "nodes.yaml").string()
        << ", reload_period: 1s}\n"
        << "kubernetes:\n"
        << "  kubeconfig: " << (dir_ / "kubeconfig").string() << "\n"
        << "  watch_pods: true\n"
        << "  pod_release_grace: 5s\n"
        << "  pod_sweep_period: 500ms\n"
        << "dra:\n"
        << "  enabled: true\n"
        << "  pools: [" << kPool << "]\n"
        << "  drivers: [gpu.nvidia.com]\n"
        << "  taint_key: " << kTaintKey << "\n"
        << "  reclaim_after: 3s\n"
        << "  webhook:\n"
        << "    listen: \"127.0.0.1:" << webhook_port_ << "\"\n"
        << "    admission_grace: 2s\n"
        << "    tls: {cert_file: " << tls_.cert << ", key_file: " << tls_.key << "}\n"
        // The slurm section last: BridgeAuthYaml adds its credential keys.
        << "slurm:\n"
        << "  enabled: true\n"
        << "  conf_path: " << cluster_->conf() << "\n"
        << "  call_timeout: 3s\n"
        << "  sync_period: 500ms\n"
        << "  release_grace: 1s\n";
    cfg << cluster_->BridgeAuthYaml() << "log_level: info\n";
    cfg.close();
    ok_ = true;
  }

  bool ok_ = false;
  fs::path dir_;
  TestSlurmCluster* cluster_ = nullptr;
  std::unique_ptr<FakeApiServer> fake_;
  k8s::testing::TlsFiles tls_;
  int metrics_port_ = 0;
  int grpc_port_ = 0;
  int webhook_port_ = 0;
  pid_t scheduler_pid_ = -1;
  std::unique_ptr<BridgeProcess> bridge_;
  std::unique_ptr<v1::Ledger::Stub> stub_;
};

class DraChurn;

class DraE2eTest : public ::testing::Test {
 protected:
  friend class DraChurn;

  void SetUp() override {
    w_ = World::Get();
    ASSERT_TRUE(w_->ok());
    c_ = w_->cluster();
    // What the cluster has before duet: the device class that serves
    // nvidia.com/gpu from DRA (KEP-5004), the driver's slices, the webhook.
    Api("POST", absl::StrCat(kDra, "/deviceclasses"), json::parse(R"({
      "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
      "metadata": {"name": "gpu.nvidia.com"},
      "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.nvidia.com\""}}],
               "extendedResourceName": "nvidia.com/gpu"}})"));
    CmdResult pub = RunCmd(absl::StrCat("/usr/bin/python3 ", DUET_FAKES_DIR,
                                        "/fake_dra_driver.py publish --server ", w_->fake()->url(),
                                        " --shape nvidia --nodes 1 --devices 8 --node-prefix dra-gpu-"));
    ASSERT_EQ(pub.rc, 0) << pub.out;
    std::string ca;
    {
      std::ifstream f(w_->ca_file());
      ca.assign((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    }
    json vwc = {
        {"apiVersion", "admissionregistration.k8s.io/v1"},
        {"kind", "ValidatingWebhookConfiguration"},
        {"metadata", {{"name", "duet-dra"}}},
        {"webhooks",
         {{{"name", "resourceclaims.dra.duet.dev"},
           {"admissionReviewVersions", {"v1"}},
           {"sideEffects", "NoneOnDryRun"},
           {"failurePolicy", "Fail"},
           {"timeoutSeconds", 10},
           {"clientConfig",
            {{"url", absl::StrCat("https://127.0.0.1:", w_->webhook_port(), kHookPath)},
             {"caBundle", absl::Base64Escape(ca)}}},
           {"rules",
            {{{"apiGroups", {"resource.k8s.io"}},
              {"apiVersions", {"v1", "v1beta2"}},
              {"operations", {"UPDATE"}},
              {"resources", {"resourceclaims/status"}}}}}}}}};
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    // The mutation test runs without the fence: no webhook registered.
    const std::string vwcs = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
    if (!absl::StrContains(test, "WithoutTheWebhook")) {
      Api("POST", vwcs, vwc);
    } else {
      Api("DELETE", vwcs + "/duet-dra");  // left by an earlier test of this process
    }

    ASSERT_TRUE(w_->StartBridge());
    ASSERT_TRUE(WaitFor([&] {
      return c_->Cli(absl::StrCat("scontrol --future show node ", kNode)).rc == 0;
    })) << "duet-bridge did not create " << kNode << "\n" << w_->Log();
    c_->StartSlurmd(kNode, kNodeIdx, 16, 16000, 8, kGpuModel);
    ASSERT_TRUE(c_->WaitNodeState(kNode, "IDLE", absl::Seconds(30)))
        << c_->Cli(absl::StrCat("scontrol --future show node ", kNode)).out
        << c_->Log("slurmctld.log");
    // Nothing lent yet: every device carries duet's rule.
    ASSERT_TRUE(WaitFor([&] { return Rules().size() == 8; }, absl::Seconds(30)))
        << Rules().size() << " rules\n" << w_->Log();
    // The churn tests run a stale, slow scheduler of their own.
    if (!absl::StrContains(test, "Churn")) w_->StartScheduler();
  }

  void TearDown() override {
    if (c_ == nullptr || !w_->ok()) return;
    if (HasFailure()) {
      std::cerr << "== squeue\n" << c_->Cli("squeue -o '%i %j %T %b %N'").out
                << "== duetctl holds\n" << w_->Ctl("holds").out << "== duet-bridge log\n"
                << w_->Log() << "== scheduler log\n" << w_->SchedulerLog()
                << "== slurmctld.log\n" << c_->Log("slurmctld.log");
    }
    w_->StopScheduler();
    c_->Cli("squeue -h -o %i | xargs -r scancel");
  }

  json Api(const std::string& method, const std::string& path, const json& body = nullptr) {
    k8s::KubeClient* k = w_->fake()->control();
    absl::StatusOr<std::string> r =
        method == "GET"      ? k->Get(path)
        : method == "POST"   ? k->Post(path, body.dump())
        : method == "PUT"    ? k->Put(path, body.dump())
        : method == "DELETE" ? k->Delete(path)
                             : absl::InvalidArgumentError(method);
    if (!r.ok()) return json{{"error", std::string(r.status().message())}};
    return json::parse(*r, nullptr, /*allow_exceptions=*/false);
  }

  // duet's DeviceTaintRules: device name -> taint key.
  std::map<std::string, std::string> Rules() {
    std::map<std::string, std::string> out;
    json list = Api("GET", absl::StrCat(kDra, "/devicetaintrules"));
    if (!list.contains("items")) return out;
    for (const json& r : list["items"]) {
      out[r["spec"]["deviceSelector"].value("device", "")] =
          r["spec"]["taint"].value("key", "");
    }
    return out;
  }

  std::vector<LedgerHolding> Holdings() { return ::duet::testing::ListLedgerHoldings(w_->stub()); }

  // duet_slurm_sync_passes_total of the running bridge (-1 when unread).
  double SyncPasses() {
    for (absl::string_view l : absl::StrSplit(w_->Metrics(), '\n')) {
      if (absl::ConsumePrefix(&l, "duet_slurm_sync_passes_total ")) {
        double v = 0;
        if (absl::SimpleAtod(l, &v)) return v;
      }
    }
    return -1;
  }

  // The GPU indices the ledger's holdings of `kind` hold.
  std::set<uint32_t> LedgerGpus(const std::string& kind) {
    std::set<uint32_t> out;
    for (const LedgerHolding& h : Holdings()) {
      if (h.kind != kind || h.node != kNode) continue;
      auto it = h.devices.find("gpu");
      if (it != h.devices.end()) out.insert(it->second.begin(), it->second.end());
    }
    return out;
  }

  // Lend jobs in Slurm (squeue: name duet-lend:NODE).
  int LendJobs() {
    CmdResult r = c_->Cli("squeue -h -o '%j|%T'");
    int n = 0;
    for (absl::string_view l : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
      if (absl::StartsWith(l, absl::StrCat("duet-lend:", kNode, "|"))) ++n;
    }
    return n;
  }

  uint32_t RunningJob(const std::string& args) {
    const uint32_t id = c_->Sbatch(args + " --wrap 'sleep 300'");
    EXPECT_TRUE(c_->WaitJobState(id, "RUNNING"))
        << "job " << id << " is " << c_->JobState(id) << "\n"
        << c_->Cli(absl::StrCat("scontrol show job ", id)).out;
    return id;
  }

  // A pod as a user writes it for the default scheduler.
  json GpuPod(const std::string& name, int gpus) {
    return json::parse(absl::StrCat(R"({
      "apiVersion": "v1", "kind": "Pod",
      "metadata": {"name": ")", name, R"(", "namespace": "default"},
      "spec": {"containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.10-py3",
        "resources": {"limits": {"nvidia.com/gpu": ")", gpus, R"("},
                      "requests": {"nvidia.com/gpu": ")", gpus, R"("}}}]}})"));
  }

  json Pod(const std::string& name) {
    return Api("GET", absl::StrCat("/api/v1/namespaces/default/pods/", name));
  }

  // The GPU minors a claim was allocated (gpu-N).
  std::set<uint32_t> ClaimGpus(const std::string& claim) {
    std::set<uint32_t> out;
    json c = Api("GET", absl::StrCat(kDra, "/namespaces/default/resourceclaims/", claim));
    const json* results = nullptr;
    if (c.contains("status") && c["status"].contains("allocation")) {
      results = &c["status"]["allocation"]["devices"]["results"];
    }
    if (results == nullptr) return out;
    for (const json& r : *results) {
      const std::string d = r.value("device", "");
      if (absl::StartsWith(d, "gpu-")) out.insert(static_cast<uint32_t>(std::stoul(d.substr(4))));
    }
    return out;
  }

  // Waits for `name` to be bound; returns the extended-resource claim's name.
  std::string BoundWithClaim(const std::string& name) {
    std::string claim;
    const bool bound = WaitFor(
        [&] {
          json p = Pod(name);
          if (p.value("spec", json::object()).value("nodeName", "") != kNode) return false;
          claim = p["status"]["extendedResourceClaimStatus"].value("resourceClaimName", "");
          return !claim.empty();
        },
        absl::Seconds(45));
    EXPECT_TRUE(bound) << name << " was not bound: " << Pod(name).dump();
    return claim;
  }

  World* w_ = nullptr;
  TestSlurmCluster* c_ = nullptr;
};

std::set<uint32_t> Intersect(const std::set<uint32_t>& a, const std::set<uint32_t>& b) {
  std::set<uint32_t> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::inserter(out, out.end()));
  return out;
}

TEST_F(DraE2eTest, PodAskingNvidiaGpuIsLentDevicesBesideASlurmJob) {
  const uint32_t job = RunningJob(absl::StrCat("-w ", kNode, " --gres=gpu:2"));
  const std::set<uint32_t> slurm_gpus =
      ::duet::testing::SlurmJobDevices(*c_, job)[kNode]["gpu"];
  ASSERT_EQ(slurm_gpus.size(), 2u);

  Api("POST", "/api/v1/namespaces/default/pods", GpuPod("infer", 2));
  const std::string claim = BoundWithClaim("infer");
  ASSERT_FALSE(claim.empty());

  const std::set<uint32_t> pod_gpus = ClaimGpus(claim);
  EXPECT_EQ(pod_gpus.size(), 2u);
  EXPECT_TRUE(Intersect(pod_gpus, slurm_gpus).empty())
      << "the pod's GPUs overlap the Slurm job's";
  // The ledger: the claim holds exactly what it was allocated, beside the job.
  EXPECT_TRUE(WaitFor([&] { return LedgerGpus("claim") == pod_gpus; }))
      << w_->Ctl("holds").out;
  EXPECT_EQ(LendJobs(), 2) << c_->Cli("squeue").out;
  // Not lent: 8 - 2 devices keep their rule (the job's two included).
  const std::map<std::string, std::string> rules = Rules();
  EXPECT_EQ(rules.size(), 6u);
  for (uint32_t g : pod_gpus) EXPECT_FALSE(rules.count(absl::StrCat("gpu-", g))) << g;
  for (uint32_t g : slurm_gpus) EXPECT_TRUE(rules.count(absl::StrCat("gpu-", g))) << g;
  // Slurm cannot start a job on the lent devices: one wanting every GPU waits.
  const uint32_t all = c_->Sbatch(absl::StrCat("-w ", kNode, " --gres=gpu:8 --wrap 'sleep 1'"));
  EXPECT_TRUE(c_->WaitJobPending(all, "Resources")) << c_->JobState(all);
  EXPECT_TRUE(absl::StrContains(w_->Metrics(), "duet_dra_admissions_total"));
}

TEST_F(DraE2eTest, PodWithAResourceClaimIsLentItsDeviceBesideASlurmJob) {
  const uint32_t job = RunningJob(absl::StrCat("-w ", kNode, " --gres=gpu:3"));
  const std::set<uint32_t> slurm_gpus =
      ::duet::testing::SlurmJobDevices(*c_, job)[kNode]["gpu"];
  ASSERT_EQ(slurm_gpus.size(), 3u);
  Api("POST", absl::StrCat(kDra, "/namespaces/default/resourceclaims"), json::parse(R"({
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
    "metadata": {"name": "two-gpus", "namespace": "default"},
    "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
      "deviceClassName": "gpu.nvidia.com", "count": 2}}]}}})"));
  Api("POST", "/api/v1/namespaces/default/pods", json::parse(R"({"apiVersion": "v1",
    "kind": "Pod", "metadata": {"name": "claimer", "namespace": "default"},
    "spec": {"resourceClaims": [{"name": "gpus", "resourceClaimName": "two-gpus"}],
             "containers": [{"name": "main", "image": "busybox",
                             "resources": {"claims": [{"name": "gpus"}]}}]}})"));
  ASSERT_TRUE(WaitFor([&] { return Pod("claimer")["spec"].value("nodeName", "") == kNode; },
                      absl::Seconds(45)))
      << Pod("claimer").dump();
  const std::set<uint32_t> pod_gpus = ClaimGpus("two-gpus");
  EXPECT_EQ(pod_gpus.size(), 2u);
  EXPECT_TRUE(Intersect(pod_gpus, slurm_gpus).empty()) << "the claim's GPUs overlap the job's";
  EXPECT_TRUE(WaitFor([&] { return LedgerGpus("claim") == pod_gpus; })) << w_->Ctl("holds").out;
  EXPECT_EQ(LendJobs(), 2) << c_->Cli("squeue").out;
}

TEST_F(DraE2eTest, ClaimToleratingDuetsTaintIsRefusedByTheWebhook) {
  // Slurm holds gpu 0 and 1 (its lowest free): the devices a scheduler that
  // ignores duet's taint picks first.
  const uint32_t job = RunningJob(absl::StrCat("-w ", kNode, " --gres=gpu:2"));
  const std::set<uint32_t> slurm_gpus =
      ::duet::testing::SlurmJobDevices(*c_, job)[kNode]["gpu"];
  ASSERT_EQ(slurm_gpus, (std::set<uint32_t>{0, 1}));
  Api("POST", absl::StrCat(kDra, "/namespaces/default/resourceclaims"), json::parse(absl::StrCat(R"({
    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
    "metadata": {"name": "sneaky", "namespace": "default"},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
      "deviceClassName": "gpu.nvidia.com", "count": 1,
      "tolerations": [{"key": ")", kTaintKey, R"(", "operator": "Exists"}]}}]}}})")));
  json pod = json::parse(R"({"apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "sneaky", "namespace": "default"},
    "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "sneaky"}],
             "containers": [{"name": "main", "image": "busybox",
                             "resources": {"claims": [{"name": "gpu"}]}}]}})");
  Api("POST", "/api/v1/namespaces/default/pods", pod);
  // The scheduler ignores the taint and picks gpu-0, Slurm's; the webhook
  // refuses the allocation every time (duet lends the pod a device meanwhile,
  // which this scheduler does not prefer).
  auto denials = [&] {
    const std::string log = w_->SchedulerLog();
    int n = 0;
    for (size_t at = log.find("is not lent to Kubernetes"); at != std::string::npos;
         at = log.find("is not lent to Kubernetes", at + 1)) {
      ++n;
    }
    return n;
  };
  ASSERT_TRUE(WaitFor([&] { return denials() >= 3; }, absl::Seconds(45))) << w_->SchedulerLog();
  EXPECT_TRUE(absl::StrContains(w_->SchedulerLog(), "denied the request: node dra-gpu-1 gpu 0"))
      << w_->SchedulerLog();
  EXPECT_TRUE(ClaimGpus("sneaky").empty());
  EXPECT_TRUE(LedgerGpus("claim").empty()) << w_->Ctl("holds").out;
  EXPECT_EQ(Pod("sneaky")["spec"].value("nodeName", ""), "");
  EXPECT_EQ(::duet::testing::SlurmJobDevices(*c_, job)[kNode]["gpu"], slurm_gpus);
  EXPECT_TRUE(absl::StrContains(w_->Metrics(), "duet_dra_admissions_total{reason=\"NOT_LENT\""))
      << w_->Metrics();
}

TEST_F(DraE2eTest, DevicesComeBackToSlurmWhenThePodAndItsClaimAreGone) {
  Api("POST", "/api/v1/namespaces/default/pods", GpuPod("short", 2));
  const std::string claim = BoundWithClaim("short");
  ASSERT_FALSE(claim.empty());
  ASSERT_TRUE(WaitFor([&] { return LedgerGpus("claim").size() == 2; })) << w_->Ctl("holds").out;
  // A job wanting every GPU waits for the pod.
  const uint32_t all = c_->Sbatch(absl::StrCat("-w ", kNode, " --gres=gpu:8 --wrap 'sleep 300'"));
  // The pod ends: the resourceclaim controller deallocates, then deletes
  // its claim (as for a claim made for an extended resource).
  w_->StopScheduler();
  Api("DELETE", "/api/v1/namespaces/default/pods/short");
  json c = Api("GET", absl::StrCat(kDra, "/namespaces/default/resourceclaims/", claim));
  c["status"] = json::object();
  Api("PUT", absl::StrCat(kDra, "/namespaces/default/resourceclaims/", claim, "/status"), c);
  Api("DELETE", absl::StrCat(kDra, "/namespaces/default/resourceclaims/", claim));
  // Lent and free again, then reclaimed: the lend jobs end, the job starts.
  EXPECT_TRUE(WaitFor([&] { return LedgerGpus("claim").empty(); }, absl::Seconds(20)))
      << w_->Ctl("holds").out;
  EXPECT_TRUE(c_->WaitJobState(all, "RUNNING", absl::Seconds(45)))
      << c_->JobState(all) << "\n" << c_->Cli("squeue").out;
  EXPECT_EQ(LendJobs(), 0);
  EXPECT_TRUE(WaitFor([&] { return Rules().size() == 8; }, absl::Seconds(20))) << Rules().size();
}

TEST_F(DraE2eTest, BridgeRestartKeepsTheClaimsDevicesAndTheLendJobs) {
  Api("POST", "/api/v1/namespaces/default/pods", GpuPod("long", 1));
  const std::string claim = BoundWithClaim("long");
  ASSERT_FALSE(claim.empty());
  const std::set<uint32_t> pod_gpus = ClaimGpus(claim);
  ASSERT_TRUE(WaitFor([&] { return LedgerGpus("claim") == pod_gpus; })) << w_->Ctl("holds").out;
  w_->StopBridge();
  ASSERT_TRUE(w_->StartBridge());
  EXPECT_TRUE(WaitFor([&] { return LedgerGpus("claim") == pod_gpus; })) << w_->Ctl("holds").out;
  EXPECT_EQ(LendJobs(), 1);
  // Two more sync passes of the new bridge leave the claim as it was.
  const double passes = SyncPasses();
  ASSERT_TRUE(WaitFor([&] { return SyncPasses() >= passes + 2; })) << w_->Log();
  EXPECT_EQ(LedgerGpus("claim"), pod_gpus);
  EXPECT_EQ(Rules().size(), 7u);
  // Slurm still cannot have the pod's GPU: a job wanting every GPU waits.
  const uint32_t all = c_->Sbatch(absl::StrCat("-w ", kNode, " --gres=gpu:8 --wrap 'sleep 1'"));
  EXPECT_TRUE(c_->WaitJobPending(all, "Resources")) << c_->JobState(all);
}

TEST_F(DraE2eTest, NodeWithMigDevicesLendsNothingAndSaysWhy) {
  // The driver republishes the node with MIG devices beside the whole GPUs:
  // a taint on gpu-N does not cover gpu-N-mig-*, so duet lends nothing there.
  CmdResult pub = RunCmd(absl::StrCat("/usr/bin/python3 ", DUET_FAKES_DIR,
                                      "/fake_dra_driver.py publish --server ", w_->fake()->url(),
                                      " --shape nvidia --nodes 1 --devices 8 --mig",
                                      " --node-prefix dra-gpu-"));
  ASSERT_EQ(pub.rc, 0) << pub.out;
  auto refused = [&] {
    json events = Api("GET", "/api/v1/namespaces/default/events");
    for (const json& e : events.value("items", json::array())) {
      if (e.value("reason", "") == "DuetLendRefused" &&
          e["involvedObject"].value("name", "") == kNode) {
        return e.value("message", "");
      }
    }
    return std::string();
  };
  ASSERT_TRUE(WaitFor([&] { return !refused().empty(); }, absl::Seconds(20))) << w_->Log();
  EXPECT_TRUE(absl::StrContains(refused(), "mig_devices")) << refused();
  Api("POST", "/api/v1/namespaces/default/pods", GpuPod("waits", 1));
  // Unschedulable, and nothing is lent for it.
  // Three scheduling attempts, each marking it Unschedulable: duet's demand
  // loop (every 200 ms) saw it meanwhile.
  auto attempts = [&] {
    const std::string log = w_->SchedulerLog();
    int n = 0;
    for (size_t at = log.find("default/waits"); at != std::string::npos;
         at = log.find("default/waits", at + 1)) {
      ++n;
    }
    return n;
  };
  ASSERT_TRUE(WaitFor([&] { return attempts() >= 3; }, absl::Seconds(30))) << w_->SchedulerLog();
  EXPECT_EQ(LendJobs(), 0) << c_->Cli("squeue").out;
  EXPECT_EQ(Pod("waits")["spec"].value("nodeName", ""), "");
  EXPECT_TRUE(absl::StrContains(w_->Metrics(), "duet_dra_unmappable_nodes{reason=\"mig_devices\"} 1"))
      << w_->Metrics();
}

// An admin cancels the lend job under a claim's GPU: the claim keeps the
// GPU in the ledger (Kubernetes still uses it), the bridge says so, and a
// Slurm step asking for every GPU is refused by spank_duet (the second
// level of the rule). Last among the tests that need a slurmctld restart's
// aftermath to be absent.
TEST_F(DraE2eTest, CancelledLendJobLeavesTheClaimItsGpuAndSlurmStepsOffIt) {
  Api("POST", "/api/v1/namespaces/default/pods", GpuPod("kept", 1));
  const std::string claim = BoundWithClaim("kept");
  ASSERT_FALSE(claim.empty());
  const std::set<uint32_t> pod_gpus = ClaimGpus(claim);
  ASSERT_EQ(pod_gpus.size(), 1u);
  ASSERT_TRUE(WaitFor([&] { return LedgerGpus("claim") == pod_gpus; })) << w_->Ctl("holds").out;
  // scancel the lend job.
  CmdResult q = c_->Cli(absl::StrCat("squeue -h -n duet-lend:", kNode, " -o %i"));
  const std::string lend = std::string(absl::StripAsciiWhitespace(q.out));
  ASSERT_FALSE(lend.empty()) << c_->Cli("squeue").out;
  c_->Cli(absl::StrCat("scancel ", lend));
  EXPECT_TRUE(WaitFor([&] {
    return absl::StrContains(w_->Metrics(), "\nduet_dra_claims_without_lend_job 1\n");
  }, absl::Seconds(20))) << w_->Log();
  EXPECT_EQ(LedgerGpus("claim"), pod_gpus) << w_->Ctl("holds").out;
  // Slurm may start a job on that GPU now; spank_duet refuses its batch
  // step (which holds every GPU of the job), so the script never runs.
  const fs::path out = w_->dir() / "step.out";
  const uint32_t job = c_->Sbatch(absl::StrCat("-w ", kNode, " --gres=gpu:8 --wrap 'echo ran > ",
                                               out.string(), "'"));
  EXPECT_TRUE(WaitFor([&] { return c_->JobEnded(job); }, absl::Seconds(30)))
      << c_->JobState(job) << "\n" << c_->Cli(absl::StrCat("scontrol show job ", job)).out;
  EXPECT_FALSE(fs::exists(out)) << "a Slurm job ran on the claim's GPU";
}

// slurmctld stops and starts: the lend jobs survive in its state, the claim
// keeps its GPU, and lending goes on for the next pod.
TEST_F(DraE2eTest, SlurmctldRestartKeepsLendJobsAndLendingGoesOn) {
  Api("POST", "/api/v1/namespaces/default/pods", GpuPod("before", 1));
  const std::string claim = BoundWithClaim("before");
  ASSERT_FALSE(claim.empty());
  const std::set<uint32_t> pod_gpus = ClaimGpus(claim);
  ASSERT_TRUE(WaitFor([&] { return LedgerGpus("claim") == pod_gpus; })) << w_->Ctl("holds").out;
  c_->CtldStop();
  ASSERT_TRUE(c_->CtldStart());
  ASSERT_TRUE(WaitFor([&] { return LendJobs() == 1; }, absl::Seconds(30))) << c_->Cli("squeue").out;
  EXPECT_EQ(LedgerGpus("claim"), pod_gpus) << w_->Ctl("holds").out;
  // Slurm 22.05 refuses new GRES allocations on recovered dynamic nodes for
  // a while after a restart (slurm_e2e_test's SlurmctldDownIsReportedAndRecovered
  // says so; also without duet): there, only what survived is checked.
  if (absl::StrContains(c_->Cli("scontrol --version").out, "slurm 22.05")) {
    std::cerr << "Slurm 22.05: the lend after the restart is not checked\n";
    return;
  }
  Api("POST", "/api/v1/namespaces/default/pods", GpuPod("after", 1));
  const std::string next = BoundWithClaim("after");
  ASSERT_FALSE(next.empty()) << w_->Log();
  EXPECT_TRUE(Intersect(ClaimGpus(next), pod_gpus).empty());
  EXPECT_TRUE(WaitFor([&] { return LendJobs() == 2; }, absl::Seconds(20))) << c_->Cli("squeue").out;
}

// Churn: pods and Slurm jobs come and go on one node for a while, the
// scheduler decides on a stale cache and writes its allocations late, and a
// claim that tolerates duet's taint keeps asking. A sampler compares, as often
// as its calls allow, the devices the API server's claims are allocated with the
// devices Slurm's running jobs hold (scontrol -d show job): any overlap is a
// violation of I1. Every Slurm job runs a step (srun, through spank_duet);
// a refused step leaves a marker file.
struct ChurnResult {
  int violations = 0;
  std::string first_violation;
  int pods = 0;
  int bound = 0;
  int jobs = 0;
  int refused_steps = 0;
  int samples = 0;
};

class DraChurn {
 public:
  DraChurn(DraE2eTest* t, World* w, TestSlurmCluster* c) : t_(t), w_(w), c_(c) {}

  ChurnResult Run(absl::Duration length, bool stop_at_violation) {
    ChurnResult r;
    const fs::path marks = w_->dir() / absl::StrCat("refused-", getpid());
    fs::create_directories(marks);
    std::mt19937 rng(20261205);
    std::map<std::string, absl::Time> pods;  // name -> when to delete
    // A Slurm job holds the two lowest GPUs for the whole churn: the devices
    // a scheduler that ignores duet's taint picks first for the tolerating
    // claim below. With the fence it is refused every time; without it, the
    // overlap is certain, not left to the churn's timing.
    const uint32_t holder = t_->RunningJob(absl::StrCat("-w ", kNode, " --gres=gpu:2"));
    EXPECT_EQ(::duet::testing::SlurmJobDevices(*c_, holder)[kNode]["gpu"],
              (std::set<uint32_t>{0, 1}));
    // The claim that tolerates duet's taint, and its pod: always there.
    t_->Api("POST", absl::StrCat(kDra, "/namespaces/default/resourceclaims"),
            json::parse(absl::StrCat(R"({
      "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
      "metadata": {"name": "tolerant", "namespace": "default"},
      "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "count": 1,
        "tolerations": [{"key": ")", kTaintKey, R"(", "operator": "Exists"}]}}]}}})")));
    t_->Api("POST", "/api/v1/namespaces/default/pods", json::parse(R"({"apiVersion": "v1",
      "kind": "Pod", "metadata": {"name": "tolerant", "namespace": "default"},
      "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "tolerant"}],
               "containers": [{"name": "main", "image": "busybox",
                               "resources": {"claims": [{"name": "gpu"}]}}]}})"));
    const absl::Time end = absl::Now() + length;
    absl::Time next_job = absl::Now();
    int seq = 0;
    while (absl::Now() < end) {
      const absl::Time now = absl::Now();
      // A pod every ~1.5 s, asking 1 or 2 GPUs, living 0 to 6 s (0: deleted
      // while duet may still be lending for it).
      if (pods.size() < 3 && std::uniform_int_distribution<int>(0, 2)(rng) == 0) {
        const std::string name = absl::StrCat("churn-", ++seq);
        t_->Api("POST", "/api/v1/namespaces/default/pods",
                t_->GpuPod(name, 1 + std::uniform_int_distribution<int>(0, 1)(rng)));
        pods[name] = now + absl::Milliseconds(std::uniform_int_distribution<int>(0, 6000)(rng));
        ++r.pods;
      }
      for (auto it = pods.begin(); it != pods.end();) {
        if (it->second > now) {
          ++it;
          continue;
        }
        if (!t_->Pod(it->first)["spec"].value("nodeName", "").empty()) ++r.bound;
        EndPod(it->first);
        it = pods.erase(it);
      }
      // Back-to-back Slurm jobs of 1 or 2 GPUs, each with a step.
      if (now >= next_job) {
        const int gpus = 1 + std::uniform_int_distribution<int>(0, 1)(rng);
        c_->Sbatch(absl::StrCat("-w ", kNode, " --gres=gpu:", gpus, " --wrap 'srun true || touch ",
                                marks.string(), "/$SLURM_JOB_ID; sleep 2'"));
        ++r.jobs;
        next_job = now + absl::Milliseconds(1500);
      }
      ++r.samples;
      std::string what;
      if (Overlap(&what)) {
        if (r.violations++ == 0) r.first_violation = what;
        if (stop_at_violation) break;
      }
      // No pause: the sampler's own Slurm and API calls pace the loop.
    }
    for (const auto& [name, when] : pods) EndPod(name);
    EndPod("tolerant", /*claim=*/"tolerant");
    c_->Cli(absl::StrCat("scancel ", holder));
    r.refused_steps = static_cast<int>(
        std::distance(fs::directory_iterator(marks), fs::directory_iterator()));
    return r;
  }

 private:
  // The pod ends; the resourceclaim controller deallocates its claim and
  // deletes it (the extended-resource claim, or `claim`).
  void EndPod(const std::string& name, std::string claim = "") {
    json p = t_->Pod(name);
    if (claim.empty() && p.contains("status") && p["status"].contains("extendedResourceClaimStatus")) {
      claim = p["status"]["extendedResourceClaimStatus"].value("resourceClaimName", "");
    }
    t_->Api("DELETE", absl::StrCat("/api/v1/namespaces/default/pods/", name));
    if (claim.empty()) return;
    const std::string path = absl::StrCat(kDra, "/namespaces/default/resourceclaims/", claim);
    json c = t_->Api("GET", path);
    if (c.contains("metadata")) {
      c["status"] = json::object();
      t_->Api("PUT", path + "/status", c);
    }
    t_->Api("DELETE", path);
  }

  // Whether a claim's allocated GPU is one a running Slurm job holds.
  bool Overlap(std::string* what) {
    std::map<uint32_t, std::string> pod_gpus;
    json list = t_->Api("GET", absl::StrCat(kDra, "/namespaces/default/resourceclaims"));
    for (const json& c : list.value("items", json::array())) {
      for (uint32_t g : t_->ClaimGpus(c["metadata"].value("name", ""))) {
        pod_gpus[g] = c["metadata"].value("name", "");
      }
    }
    if (pod_gpus.empty()) return false;
    CmdResult q = c_->Cli("squeue -h -t R -o %i");
    for (absl::string_view id : absl::StrSplit(q.out, '\n', absl::SkipEmpty())) {
      uint32_t job = 0;
      if (!absl::SimpleAtoi(id, &job)) continue;
      std::map<std::string, NodeDevices> held = ::duet::testing::SlurmJobDevices(*c_, job);
      for (uint32_t g : held[kNode]["gpu"]) {
        auto it = pod_gpus.find(g);
        if (it == pod_gpus.end()) continue;
        // A lend job holds the devices it lends: not a violation.
        const std::string name = c_->Cli(absl::StrCat("squeue -h -j ", job, " -o %j")).out;
        if (absl::StartsWith(name, "duet-lend:")) continue;
        *what = absl::StrCat("gpu ", g, ": claim ", it->second, " and Slurm job ", job);
        return true;
      }
    }
    return false;
  }

  DraE2eTest* t_;
  World* w_;
  TestSlurmCluster* c_;
};

absl::Duration ChurnLength() {
  const char* s = getenv("DUET_DRA_CHURN_SECONDS");
  return absl::Seconds(s != nullptr ? std::max(1, atoi(s)) : 45);
}

TEST_F(DraE2eTest, ChurnWithAStaleSlowSchedulerKeepsSlurmAndPodsApart) {
  w_->StartScheduler({"--stale-cache", "--refresh-every", "5", "--prebind-delay", "0.3"});
  DraChurn churn(this, w_, c_);
  const ChurnResult r = churn.Run(ChurnLength(), /*stop_at_violation=*/false);
  std::cerr << "churn: " << r.pods << " pods (" << r.bound << " bound), " << r.jobs
            << " Slurm jobs, " << r.samples << " samples, " << r.violations << " violations, "
            << r.refused_steps << " refused steps\n";
  EXPECT_EQ(r.violations, 0) << r.first_violation;
  EXPECT_EQ(r.refused_steps, 0);
  EXPECT_GT(r.bound, 0) << "no pod was ever placed: the churn tested nothing";
  EXPECT_GT(r.jobs, 5);
}

// The same churn with the webhook removed (not registered): the tolerating
// claim lands on a GPU the holding Slurm job has (certain, not timing-bound:
// CI on 24.11 once saw the churn alone miss for 60 s). Shows the sampler sees
// what the fence prevents.
TEST_F(DraE2eTest, ChurnWithoutTheWebhookPutsPodsOnSlurmsDevices) {
  w_->StartScheduler({"--stale-cache", "--refresh-every", "5", "--prebind-delay", "0.3"});
  DraChurn churn(this, w_, c_);
  const ChurnResult r = churn.Run(absl::Seconds(60), /*stop_at_violation=*/true);
  EXPECT_GT(r.violations, 0) << "without the webhook no overlap was seen in " << r.samples
                             << " samples";
  std::cerr << "without the webhook: " << r.first_violation << "\n";
}

}  // namespace
}  // namespace duet
