// The DRA lending mode's end-to-end world, shared by dra_e2e_test.cc and
// dra_gang_e2e_test.cc: a real Slurm cluster on loopback (spank_duet.so in
// plugstack.conf), the real duet-bridge with dra.enabled (its admission
// webhook on HTTPS, its DeviceTaintRules, its lend jobs), the fake
// kube-apiserver at 1.37 (tests/fakes/fake_apiserver.py) calling that
// webhook on resourceclaims/status as kube-apiserver does, NVIDIA-shaped
// ResourceSlices from tests/fakes/fake_dra_driver.py, and the test scheduler
// (tests/fakes/test_scheduler.py) as a process.
//
// DraWorld: one per test process (DraWorld::Get), stopped by a gtest
// Environment at exit; its directory is kept when a test failed.
// DraE2eBase: a fixture whose SetUp makes the cluster's DRA objects (the
// DeviceClass serving nvidia.com/gpu, the driver's slices, the webhook's
// ValidatingWebhookConfiguration), starts the bridge and the nodes' slurmds
// and waits until every device carries duet's rule; and the helpers both
// tests read the world with.
//
// Not thread-safe: the test's thread only.
#ifndef DUET_TESTS_INTEGRATION_DRA_WORLD_H_
#define DUET_TESTS_INTEGRATION_DRA_WORLD_H_

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
#ifndef DUETCTL_BIN
#error "DUETCTL_BIN must name duetctl"
#endif

namespace duet::testing {

inline constexpr char kDraGpuModel[] = "nvidia-h100-80gb";
inline constexpr char kDraPool[] = "lend-h100";
inline constexpr char kDraTaintKey[] = "duet.dev/not-lent";
inline constexpr char kDraApi[] = "/apis/resource.k8s.io/v1";
inline constexpr char kDraHookPath[] = "/validate-resourceclaim-status";
// The fake driver names its nodes PREFIX1, PREFIX2, ... (and each node's
// pool after the node).
inline constexpr char kDraNodePrefix[] = "dra-gpu-";

inline std::string DraPython(const std::string& code) {
  return absl::StrCat("/usr/bin/python3 -c 'import sys; sys.path.insert(0, \"", DUET_FAKES_DIR,
                      "\"); ", code, "'");
}

struct DraWorldOptions {
  // Nodes dra-gpu-1.. of 8 GPUs, slurmd i on 127.0.0.(first_addr + i).
  int nodes = 1;
  int first_addr = 86;
  // Added to the fake apiserver's flags (beside --kube-version 1.37).
  std::vector<std::string> fake_args;
  // Added to bridge.yaml before the slurm section (e.g. a gang: line).
  std::string extra_yaml;
  // The temporary directory's name: /tmp/<tag>.XXXXXX.
  std::string tag = "duet-dra-e2e";
};

class DraWorld {
 public:
  // The world of this process, made with `o` by the first call.
  static DraWorld* Get(const DraWorldOptions& o = {}) {
    static DraWorld* w = new DraWorld(o);
    return w;
  }

  bool ok() const { return ok_; }
  TestSlurmCluster* cluster() const { return cluster_; }
  k8s::testing::FakeApiServer* fake() const { return fake_.get(); }
  v1::Ledger::Stub* stub() const { return stub_.get(); }
  std::string socket() const { return (dir_ / "bridge.sock").string(); }
  const std::filesystem::path& dir() const { return dir_; }
  const std::vector<std::string>& nodes() const { return nodes_; }
  int addr(size_t i) const { return opts_.first_addr + static_cast<int>(i); }
  std::string Log() const { return bridge_ ? bridge_->Log(120) : ""; }
  // The scheduler's log: its last `max` characters.
  std::string SchedulerLog(size_t max = 6000) const {
    std::ifstream f(dir_ / "scheduler.log");
    std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return all.size() > max ? all.substr(all.size() - max) : all;
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
      std::filesystem::remove_all(dir_, ec);
      if (cluster_ != nullptr && !cluster_->root().empty()) {
        std::filesystem::remove_all(cluster_->root(), ec);
      }
    } else if (!dir_.empty()) {
      std::cerr << opts_.tag << ": kept " << dir_ << " and " << (cluster_ ? cluster_->root() : "")
                << " for inspection\n";
    }
  }

  int webhook_port() const { return webhook_port_; }
  const std::string& ca_file() const { return tls_.ca; }

 private:
  class Stopper : public ::testing::Environment {
   public:
    explicit Stopper(DraWorld* w) : w_(w) {}
    void TearDown() override { w_->Stop(); }

   private:
    DraWorld* w_;
  };

  std::string grpc_address() const { return absl::StrCat("127.0.0.1:", grpc_port_); }

  explicit DraWorld(const DraWorldOptions& o) : opts_(o) {
    std::string tmpl = absl::StrCat("/tmp/", o.tag, ".XXXXXX");
    if (mkdtemp(tmpl.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp failed";
      return;
    }
    dir_ = tmpl;
    for (int i = 0; i < o.nodes; ++i) nodes_.push_back(absl::StrCat(kDraNodePrefix, i + 1));
    TestSlurmCluster::Options co;
    grpc_port_ = FreePort();
    co.spank = absl::StrCat(DUET_SPANK_SO, ":bridge=", grpc_address(), " timeout_ms=2000");
    cluster_ = TestSlurmCluster::Get(co);  // registers the cluster's Stopper first...
    ::testing::AddGlobalTestEnvironment(new Stopper(this));  // ...so this one runs first
    if (!cluster_->ok()) return;
    std::ofstream(cluster_->root() + "/etc/plugstack.conf")
        << "required " << DUET_SPANK_SO << " bridge=" << grpc_address() << " timeout_ms=2000"
        << cluster_->PlugstackAuthArgs() << "\n";

    std::vector<std::string> fake_args = {"--kube-version", "1.37"};
    fake_args.insert(fake_args.end(), o.fake_args.begin(), o.fake_args.end());
    fake_ = std::make_unique<k8s::testing::FakeApiServer>(fake_args);
    if (!fake_->ok()) {
      ADD_FAILURE() << "the fake apiserver did not start";
      return;
    }
    k8s::testing::WriteKubeconfig((dir_ / "kubeconfig").string(), fake_->url());
    std::filesystem::create_directories(dir_ / "tls");
    tls_ = k8s::testing::MakeTestCerts((dir_ / "tls").string());

    std::ofstream inv(dir_ / "nodes.yaml");
    inv << "nodes:\n";
    for (size_t i = 0; i < nodes_.size(); ++i) {
      const std::string& node = nodes_[i];
      // The GPUs' uuids as the fake NVIDIA driver publishes them, so the
      // inventory and the slices agree (duet checks them against each other).
      CmdResult ids = RunCmd(DraPython(absl::StrCat(
          "import fake_dra_driver as d; print(\",\".join(x[\"attributes\"][\"uuid\"][\"string\"] "
          "for x in d.nvidia_devices(\"",
          node, "\", 8)))")));
      if (ids.rc != 0) {
        ADD_FAILURE() << "uuids: " << ids.out;
        return;
      }
      std::vector<std::string> uuids = absl::StrSplit(absl::StripAsciiWhitespace(ids.out), ',');
      inv << "  - name: " << node << "\n"
          << "    cpus: 16\n    memory_mib: 16000\n    zone: us-central1-a\n"
          << "    pool: " << kDraPool << "\n"
          << "    labels: {duet.dev/slurm-node-addr: 127.0.0." << addr(i)
          << ", cloud.google.com/gke-accelerator: " << kDraGpuModel
          << ", cloud.google.com/gke-nodepool: " << kDraPool << "}\n"
          << "    gpus: {count: 8, model: " << kDraGpuModel << ", ids: ["
          << absl::StrJoin(uuids, ", ") << "]}\n";
    }
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
        << "  pools: [" << kDraPool << "]\n"
        << "  drivers: [gpu.nvidia.com]\n"
        << "  taint_key: " << kDraTaintKey << "\n"
        << "  reclaim_after: 3s\n"
        << "  webhook:\n"
        << "    listen: \"127.0.0.1:" << webhook_port_ << "\"\n"
        << "    admission_grace: 2s\n"
        << "    tls: {cert_file: " << tls_.cert << ", key_file: " << tls_.key << "}\n"
        << o.extra_yaml
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

  const DraWorldOptions opts_;
  bool ok_ = false;
  std::filesystem::path dir_;
  std::vector<std::string> nodes_;
  TestSlurmCluster* cluster_ = nullptr;
  std::unique_ptr<k8s::testing::FakeApiServer> fake_;
  k8s::testing::TlsFiles tls_;
  int metrics_port_ = 0;
  int grpc_port_ = 0;
  int webhook_port_ = 0;
  pid_t scheduler_pid_ = -1;
  std::unique_ptr<BridgeProcess> bridge_;
  std::unique_ptr<v1::Ledger::Stub> stub_;
};

inline std::set<uint32_t> Intersect(const std::set<uint32_t>& a, const std::set<uint32_t>& b) {
  std::set<uint32_t> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::inserter(out, out.end()));
  return out;
}

class DraE2eBase : public ::testing::Test {
 public:
  using json = nlohmann::json;

  // The world's DRA objects, the bridge, the slurmds; every device tainted.
  // `webhook`: register the ValidatingWebhookConfiguration (else delete one
  // an earlier test left). `scheduler`: start the test scheduler.
  void SetUpWorld(const DraWorldOptions& o, bool webhook, bool scheduler) {
    w_ = DraWorld::Get(o);
    ASSERT_TRUE(w_->ok());
    c_ = w_->cluster();
    // What the cluster has before duet: the device class that serves
    // nvidia.com/gpu from DRA (KEP-5004), the driver's slices, the webhook.
    Api("POST", absl::StrCat(kDraApi, "/deviceclasses"), json::parse(R"({
      "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
      "metadata": {"name": "gpu.nvidia.com"},
      "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.nvidia.com\""}}],
               "extendedResourceName": "nvidia.com/gpu"}})"));
    CmdResult pub = RunCmd(absl::StrCat(
        "/usr/bin/python3 ", DUET_FAKES_DIR, "/fake_dra_driver.py publish --server ",
        w_->fake()->url(), " --shape nvidia --nodes ", w_->nodes().size(),
        " --devices 8 --node-prefix ", kDraNodePrefix));
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
            {{"url", absl::StrCat("https://127.0.0.1:", w_->webhook_port(), kDraHookPath)},
             {"caBundle", absl::Base64Escape(ca)}}},
           {"rules",
            {{{"apiGroups", {"resource.k8s.io"}},
              {"apiVersions", {"v1", "v1beta2"}},
              {"operations", {"UPDATE"}},
              {"resources", {"resourceclaims/status"}}}}}}}}};
    const std::string vwcs =
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";
    if (webhook) {
      Api("POST", vwcs, vwc);
    } else {
      Api("DELETE", vwcs + "/duet-dra");  // left by an earlier test of this process
    }

    ASSERT_TRUE(w_->StartBridge());
    for (size_t i = 0; i < w_->nodes().size(); ++i) {
      const std::string& node = w_->nodes()[i];
      ASSERT_TRUE(WaitFor([&] {
        return c_->Cli(absl::StrCat("scontrol --future show node ", node)).rc == 0;
      })) << "duet-bridge did not create " << node << "\n" << w_->Log();
      c_->StartSlurmd(node, w_->addr(i), 16, 16000, 8, kDraGpuModel);
    }
    for (const std::string& node : w_->nodes()) {
      ASSERT_TRUE(c_->WaitNodeState(node, "IDLE", absl::Seconds(30)))
          << c_->Cli(absl::StrCat("scontrol --future show node ", node)).out
          << c_->Log("slurmctld.log");
    }
    // Nothing lent yet: every device carries duet's rule.
    const size_t all = 8 * w_->nodes().size();
    ASSERT_TRUE(WaitFor([&] { return Rules().size() == all; }, absl::Seconds(30)))
        << Rules().size() << " rules\n" << w_->Log();
    if (scheduler) w_->StartScheduler();
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

  // duet's DeviceTaintRules: device name -> taint key, of `node` (its pool)
  // or, when empty, of every node (a device name of several nodes once).
  std::map<std::string, std::string> Rules(const std::string& node = "") {
    std::map<std::string, std::string> out;
    json list = Api("GET", absl::StrCat(kDraApi, "/devicetaintrules"));
    if (!list.contains("items")) return out;
    for (const json& r : list["items"]) {
      const json& sel = r["spec"]["deviceSelector"];
      std::string key = sel.value("device", "");
      if (!node.empty() && sel.value("pool", "") != node) continue;
      if (node.empty()) key = absl::StrCat(sel.value("pool", ""), "/", key);
      out[key] = r["spec"]["taint"].value("key", "");
    }
    if (node.empty() && w_->nodes().size() == 1) {
      // One node: keyed by the device name alone.
      std::map<std::string, std::string> plain;
      for (auto& [k, v] : out) plain[k.substr(k.find('/') + 1)] = v;
      return plain;
    }
    return out;
  }

  std::vector<LedgerHolding> Holdings() { return ListLedgerHoldings(w_->stub()); }

  // duet_slurm_sync_passes_total of the running bridge (-1 when unread).
  double SyncPasses() { return Metric("duet_slurm_sync_passes_total"); }

  // A series' value in the bridge's metrics (-1 when absent).
  double Metric(const std::string& series) {
    for (absl::string_view l : absl::StrSplit(w_->Metrics(), '\n')) {
      if (absl::ConsumePrefix(&l, series) && absl::ConsumePrefix(&l, " ")) {
        double v = 0;
        if (absl::SimpleAtod(l, &v)) return v;
      }
    }
    return -1;
  }

  // The GPU indices the ledger's holdings of `kind` hold on `node` (the
  // first node when empty).
  std::set<uint32_t> LedgerGpus(const std::string& kind, std::string node = "") {
    if (node.empty()) node = w_->nodes()[0];
    std::set<uint32_t> out;
    for (const LedgerHolding& h : Holdings()) {
      if (h.kind != kind || h.node != node) continue;
      auto it = h.devices.find("gpu");
      if (it != h.devices.end()) out.insert(it->second.begin(), it->second.end());
    }
    return out;
  }

  // Lend jobs in Slurm on `node` (squeue: name duet-lend:NODE; the first
  // node when empty).
  int LendJobs(std::string node = "") {
    if (node.empty()) node = w_->nodes()[0];
    CmdResult r = c_->Cli("squeue -h -o '%j|%T'");
    int n = 0;
    for (absl::string_view l : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
      if (absl::StartsWith(l, absl::StrCat("duet-lend:", node, "|"))) ++n;
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

  // The GPU minors a claim was allocated (gpu-N), and (when `node` is not
  // null) the node its allocation names.
  std::set<uint32_t> ClaimGpus(const std::string& claim, std::string* node = nullptr) {
    std::set<uint32_t> out;
    json c = Api("GET", absl::StrCat(kDraApi, "/namespaces/default/resourceclaims/", claim));
    const json* results = nullptr;
    if (c.contains("status") && c["status"].contains("allocation")) {
      results = &c["status"]["allocation"]["devices"]["results"];
    }
    if (results == nullptr) return out;
    for (const json& r : *results) {
      const std::string d = r.value("device", "");
      if (absl::StartsWith(d, "gpu-")) out.insert(static_cast<uint32_t>(std::stoul(d.substr(4))));
      if (node != nullptr) *node = r.value("pool", "");  // the fake driver's pool is its node
    }
    return out;
  }

  // Waits for `name` to be bound (to `node`; the first node when empty);
  // returns the extended-resource claim's name.
  std::string BoundWithClaim(const std::string& name, std::string node = "") {
    if (node.empty()) node = w_->nodes()[0];
    std::string claim;
    const bool bound = WaitFor(
        [&] {
          json p = Pod(name);
          if (p.value("spec", json::object()).value("nodeName", "") != node) return false;
          claim = p["status"]["extendedResourceClaimStatus"].value("resourceClaimName", "");
          return !claim.empty();
        },
        absl::Seconds(45));
    EXPECT_TRUE(bound) << name << " was not bound to " << node << ": " << Pod(name).dump();
    return claim;
  }

  DraWorld* w_ = nullptr;
  TestSlurmCluster* c_ = nullptr;
};

}  // namespace duet::testing

#endif  // DUET_TESTS_INTEGRATION_DRA_WORLD_H_
