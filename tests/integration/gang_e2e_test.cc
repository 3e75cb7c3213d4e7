// Gangs end to end (docs/gangs.md, issue 27) with the real binaries: a real
// Slurm cluster on loopback (tests/integration/slurm_cluster.sh) with two
// 4-GPU nodes, the real duet-bridge (slurm.enabled, file inventory, the
// scheduler extender on HTTP, the pod watch and the gang registry against a
// fake kube-apiserver serving PodGroups, tests/fakes/fake_apiserver.py
// --gang-crds). The test plays kube-scheduler: it POSTs ExtenderArgs to
// <prefix>/filter and ExtenderBindingArgs to /bind for each member pod
// (label scheduling.x-k8s.io/pod-group).
//
// - a PodGroup of 4 x 2 GPUs: every member waits (GANG_WAITING k/4) until
//   the fourth is seen, then each passes exactly its node; the binds
//   succeed; Slurm runs ONE job duet-gang:podgroup/default/NAME over both
//   nodes with 4 GPUs on each; the ledger holds each pod's piece of that job
//   on its node; a Slurm job asking a GPU there waits;
// - a gang that cannot be placed whole holds nothing (GANG_NO_ROOM, a
//   Warning Event DuetGangUnplaceable, no Slurm job);
// - a member deleted while the gang gathers releases the gang (its Slurm
//   job is cancelled, the ledger holds nothing of it);
// - duet-bridge killed (SIGKILL) and started again keeps the gang: the same
//   job, the same holdings, no new job; the job ends only once every member
//   is gone and gang.idle_release has passed;
// - a slurmctld restart keeps the gang's job and holdings;
// - a JobSet's replicated job and a LeaderWorkerSet group (2 pods x 4 GPUs
//   each, their controllers' labels) are each one gang on ONE Slurm job over
//   both nodes, each member bound on its slot's node.
//
// One cluster, one bridge, one fake apiserver per process; ctest runs each
// test in its own process. Label: slurm.

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
using ::duet::testing::JobSet;
using ::duet::testing::JobSetPodLabels;
using ::duet::testing::LeaderWorkerSet;
using ::duet::testing::LwsPodAnnotations;
using ::duet::testing::LwsPodLabels;
using ::duet::testing::PodGroup;
using ::duet::testing::NodeDevices;
using ::duet::testing::RunCmd;
using ::duet::testing::TestSlurmCluster;
using ::duet::testing::WaitFor;
using json = nlohmann::json;

constexpr char kGpuModel[] = "nvidia-h100-80gb";
constexpr char kPrefix[] = "/duet";
constexpr char kPodGroupLabel[] = "scheduling.x-k8s.io/pod-group";
constexpr int kGpusPerNode = 4;

struct NodeDef {
  const char* name;
  int idx;  // slurmd on 127.0.0.idx
};
constexpr NodeDef kNodes[] = {{"gang-gpu-a", 81}, {"gang-gpu-b", 82}};

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
  std::string Metrics() const {
    return RunCmd(absl::StrCat("curl -sf http://127.0.0.1:", metrics_port_, "/metrics"),
                  /*merge_stderr=*/false)
        .out;
  }
  CmdResult Ctl(const std::string& args) const {
    return RunCmd(absl::StrCat(DUETCTL_BIN, " --server unix://", socket(), " ", args));
  }

  ::testing::AssertionResult StartBridge() {
    stub_.reset();
    bridge_ = std::make_unique<BridgeProcess>((dir_ / "bridge.yaml").string(),
                                              (dir_ / "bridge.log").string(), socket());
    ::testing::AssertionResult r = bridge_->Start();
    if (r) stub_ = v1::Ledger::NewStub(bridge_->channel());
    return r;
  }
  // SIGKILL: nothing is flushed or handed over.
  void KillBridge() {
    stub_.reset();
    if (bridge_ != nullptr) bridge_->Kill(SIGKILL);
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
      std::cerr << "gang_e2e_test: kept " << dir_ << " and " << (cluster_ ? cluster_->root() : "")
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

  std::string grpc_address() const { return absl::StrCat("127.0.0.1:", grpc_port_); }

  World() {
    char tmpl[] = "/tmp/duet-gang-e2e.XXXXXX";
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
          << "    pool: gang-h100\n"
          << "    labels: {duet.dev/slurm-node-addr: 127.0.0." << n.idx
          << ", cloud.google.com/gke-accelerator: " << kGpuModel << "}\n"
          << "    gpus: {count: " << kGpusPerNode << ", model: " << kGpuModel << "}\n";
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
  int metrics_port_ = 0;
  int grpc_port_ = 0;
  std::unique_ptr<BridgeProcess> bridge_;
  std::unique_ptr<v1::Ledger::Stub> stub_;
};

// A gang member pod with `labels` (and `annotations`) besides app=trainer,
// as its controller writes it (before binding).
json GangPod(const std::string& name, const std::string& uid, json labels, json annotations,
             int gpus) {
  const std::string g = std::to_string(gpus);
  labels["app"] = "trainer";
  json meta = {{"name", name},
               {"namespace", "default"},
               {"uid", uid},
               {"labels", labels},
               {"creationTimestamp", "2026-12-05T18:00:00Z"}};
  if (annotations.is_object()) meta["annotations"] = annotations;
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", meta},
          {"spec",
           {{"schedulerName", "duet"},
            {"restartPolicy", "Never"},
            {"nodeSelector", {{"cloud.google.com/gke-accelerator", kGpuModel}}},
            {"containers",
             {{{"name", "trainer"},
               {"image", "nvcr.io/nvidia/pytorch:24.01-py3"},
               {"resources",
                {{"requests", {{"cpu", "2"}, {"memory", "4Gi"}, {"nvidia.com/gpu", g}}},
                 {"limits", {{"memory", "4Gi"}, {"nvidia.com/gpu", g}}}}}}}}}},
          {"status", {{"phase", "Pending"}, {"qosClass", "Burstable"}}}};
}

// A member pod of PodGroup `group` as a user writes it (before binding).
json MemberPod(const std::string& name, const std::string& uid, const std::string& group,
               int gpus) {
  return GangPod(name, uid, {{kPodGroupLabel, group}}, nullptr, gpus);
}

// A Slurm job per squeue.
struct SqueueJob {
  uint32_t id = 0;
  std::string name;
  std::string state;
  std::string nodes;
};

class GangE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    w_ = World::Get();
    ASSERT_TRUE(w_->ok());
    c_ = w_->cluster();
    ASSERT_TRUE(w_->StartBridge());
    for (const NodeDef& n : kNodes) {
      ASSERT_TRUE(WaitFor([&] {
        return c_->Cli(absl::StrCat("scontrol --future show node ", n.name)).rc == 0;
      })) << n.name
          << " was not created by duet-bridge\n"
          << w_->Log();
      c_->StartSlurmd(n.name, n.idx, 8, 16000, kGpusPerNode, kGpuModel);
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

  std::vector<LedgerHolding> Holdings() { return ::duet::testing::ListLedgerHoldings(w_->stub()); }

  // Holdings of Slurm job `job` (gang slots and member placeholders).
  std::vector<LedgerHolding> JobHoldings(uint32_t job) {
    std::vector<LedgerHolding> out;
    for (LedgerHolding& h : Holdings()) {
      if ((h.kind == "gang_slot" || h.kind == "placeholder") && h.job_id == job) {
        out.push_back(std::move(h));
      }
    }
    return out;
  }

  // Every holding that is a gang slot or a placeholder.
  int DuetHoldings() {
    int n = 0;
    for (const LedgerHolding& h : Holdings()) {
      if (h.kind == "gang_slot" || h.kind == "placeholder") ++n;
    }
    return n;
  }

  std::vector<SqueueJob> Squeue() {
    std::vector<SqueueJob> out;
    CmdResult r = c_->Cli("squeue -h -o '%i|%j|%T|%N'");
    for (absl::string_view l : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
      std::vector<std::string> f = absl::StrSplit(l, '|');
      if (f.size() != 4) continue;
      out.push_back({static_cast<uint32_t>(std::stoul(f[0])), f[1], f[2], f[3]});
    }
    return out;
  }
  // Jobs that duet made (gangs' and pods' placeholders), live or ending.
  std::vector<SqueueJob> DuetJobs() {
    std::vector<SqueueJob> out;
    for (SqueueJob& j : Squeue()) {
      if (absl::StartsWith(j.name, "duet-")) out.push_back(std::move(j));
    }
    return out;
  }
  // Live duet jobs (not ending).
  std::vector<SqueueJob> LiveDuetJobs() {
    std::vector<SqueueJob> out;
    for (SqueueJob& j : DuetJobs()) {
      if (j.state == "RUNNING" || j.state == "PENDING") out.push_back(std::move(j));
    }
    return out;
  }

  // POSTs `body` to the extender's `verb`; the HTTP status and the answer.
  std::pair<int, json> Extender(const std::string& verb, const json& body) {
    const fs::path file = w_->dir() / ("req-" + verb + ".json");
    std::ofstream(file) << body.dump();
    CmdResult r =
        RunCmd(absl::StrCat("curl -sS -o - -w '\\n%{http_code}' -X POST -H 'Content-Type: "
                            "application/json' --data-binary @",
                            file.string(), " ", w_->extender_url(), "/", verb),
               /*merge_stderr=*/false);
    const size_t nl = r.out.rfind('\n');
    if (r.rc != 0 || nl == std::string::npos) return {0, json(r.out)};
    const int code = std::atoi(r.out.c_str() + nl + 1);
    return {code, json::parse(r.out.substr(0, nl), nullptr, /*allow_exceptions=*/false)};
  }

  // The filter's answer for pod `name` (as the apiserver has it) over both nodes.
  json Filter(const std::string& name) {
    const json pod = ApiPod(name);
    EXPECT_TRUE(pod.is_object()) << name;
    auto [code, f] =
        Extender("filter", {{"Pod", pod}, {"NodeNames", {kNodes[0].name, kNodes[1].name}}});
    EXPECT_EQ(code, 200) << f.dump();
    return f;
  }

  // The filter's unresolvable reason for `node` ("" when none).
  static std::string Unresolvable(const json& f, const std::string& node) {
    if (!f.is_object() || !f.contains("FailedAndUnresolvableNodes")) return "";
    const json& u = f["FailedAndUnresolvableNodes"];
    if (!u.is_object() || !u.contains(node) || !u[node].is_string()) return "";
    return u[node].get<std::string>();
  }

  // Expects `f` to fail both nodes, unresolvable, with `reason` in the message.
  void ExpectRefusedEverywhere(const json& f, const std::string& reason) {
    EXPECT_TRUE(!f.contains("NodeNames") || f["NodeNames"].is_null() || f["NodeNames"].empty())
        << f.dump();
    for (const NodeDef& n : kNodes) {
      EXPECT_NE(Unresolvable(f, n.name).find(reason), std::string::npos)
          << n.name << ": " << f.dump();
    }
  }

  json ApiPod(const std::string& name) {
    CmdResult r = RunCmd(
        absl::StrCat("curl -sf ", w_->fake()->url(), "/api/v1/namespaces/default/pods/", name),
        /*merge_stderr=*/false);
    if (r.rc != 0) return nullptr;
    return json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  }

  // Events in namespace default with `reason` (and `type`, unless empty)
  // about pod `name`.
  int PodEvents(const std::string& name, const std::string& reason, const std::string& type = "") {
    auto body = w_->fake()->control()->Get("/api/v1/namespaces/default/events");
    if (!body.ok()) return -1;
    const json list = json::parse(*body, nullptr, /*allow_exceptions=*/false);
    if (!list.is_object() || !list["items"].is_array()) return -1;
    int n = 0;
    for (const json& e : list["items"]) {
      if (e["reason"] == reason && e["involvedObject"]["name"] == name &&
          (type.empty() || e["type"] == type)) {
        ++n;
      }
    }
    return n;
  }

  double Metric(const std::string& series) {
    for (absl::string_view l : absl::StrSplit(w_->Metrics(), '\n')) {
      if (absl::ConsumePrefix(&l, series) && absl::ConsumePrefix(&l, " ")) {
        return std::atof(std::string(l).c_str());
      }
    }
    return -1;
  }
  // Waits for `n` more Slurm sync passes of the running bridge.
  bool WaitSyncPasses(int n) {
    const double start = Metric("duet_slurm_sync_passes_total");
    return WaitFor([&] { return Metric("duet_slurm_sync_passes_total") >= start + n; },
                   absl::Seconds(20));
  }

  // Members of the 4 x 2-GPU gang `group`.
  struct Member {
    std::string name;
    std::string uid;
    std::string node;  // once placed
  };
  static std::vector<Member> Members(const std::string& group, int n) {
    std::vector<Member> out;
    for (int i = 0; i < n; ++i) {
      out.push_back({absl::StrCat(group, "-", i), absl::StrCat("uid-", group, "-", i), ""});
    }
    return out;
  }

  // Creates PodGroup `group` (minMember 4) and its 4 x 2-GPU members, and
  // runs the filter for each: the first three wait, the fourth completes
  // the gang. Then every member passes exactly one node, two per node.
  // Returns the members with their nodes.
  std::vector<Member> Gather(const std::string& group) {
    w_->fake()->Put(PodGroup(group, 4));
    std::vector<Member> members = Members(group, 4);
    for (const Member& m : members) w_->fake()->Put(MemberPod(m.name, m.uid, group, 2));
    for (int i = 0; i < 3; ++i) {
      const json f = Filter(members[i].name);
      ExpectRefusedEverywhere(f, absl::StrCat("GANG_WAITING: ", i + 1, "/4 members"));
    }
    // While gathering: the one job, nothing of it anyone's but the slots'.
    std::vector<SqueueJob> jobs = LiveDuetJobs();
    EXPECT_EQ(jobs.size(), 1u) << c_->Cli("squeue").out;
    for (const LedgerHolding& h : Holdings()) {
      EXPECT_NE(h.kind, "placeholder") << "no member holds before the gang is complete";
    }
    std::map<std::string, int> per_node;
    for (int i = 3; i >= 0; --i) {  // the last comer first, then the waiting ones again
      const json f = Filter(members[i].name);
      const bool one =
          f.contains("NodeNames") && f["NodeNames"].is_array() && f["NodeNames"].size() == 1;
      EXPECT_TRUE(one) << members[i].name << ": " << f.dump();
      if (!one) continue;
      members[i].node = f["NodeNames"][0].get<std::string>();
      ++per_node[members[i].node];
      const std::string other = members[i].node == kNodes[0].name ? kNodes[1].name : kNodes[0].name;
      EXPECT_NE(Unresolvable(f, other).find("GANG_NODE"), std::string::npos) << f.dump();
    }
    EXPECT_EQ(per_node, (std::map<std::string, int>{{kNodes[0].name, 2}, {kNodes[1].name, 2}}));
    return members;
  }

  // Binds every member to its node; each bind succeeds.
  void BindAll(const std::vector<Member>& members) {
    for (const Member& m : members) {
      auto [code, b] = Extender(
          "bind",
          {{"PodName", m.name}, {"PodNamespace", "default"}, {"PodUID", m.uid}, {"Node", m.node}});
      EXPECT_EQ(code, 200) << b.dump();
      EXPECT_TRUE(b["Error"].is_null() || b["Error"] == "") << m.name << ": " << b.dump();
      EXPECT_EQ(ApiPod(m.name)["spec"]["nodeName"], m.node);
    }
  }

  // The one gang job of `group` per squeue (0 with a failure when not one).
  uint32_t GangJob(const std::string& group) {
    std::vector<SqueueJob> jobs = LiveDuetJobs();
    EXPECT_EQ(jobs.size(), 1u) << c_->Cli("squeue").out;
    if (jobs.size() != 1) return 0;
    EXPECT_EQ(jobs[0].name, absl::StrCat("duet-gang:podgroup/default/", group));
    EXPECT_EQ(jobs[0].state, "RUNNING");
    return jobs[0].id;
  }

  // Each member's placeholder piece of `job` on its node: 2 GPUs, the
  // members' GPUs on a node disjoint and together Slurm's GPUs of the job
  // there. Returns uid -> GPUs.
  std::map<std::string, std::set<uint32_t>> ExpectMemberPieces(uint32_t job,
                                                               const std::vector<Member>& members) {
    std::map<std::string, NodeDevices> slurm = ::duet::testing::SlurmJobDevices(*c_, job);
    std::map<std::string, std::set<uint32_t>> pieces;
    std::map<std::string, std::set<uint32_t>> by_node;
    for (const LedgerHolding& h : JobHoldings(job)) {
      EXPECT_EQ(h.kind, "placeholder") << "a slot left unbound on " << h.node;
      for (const Member& m : members) {
        if (m.uid != h.pod_uid) continue;
        EXPECT_EQ(h.node, m.node) << m.name;
        const std::set<uint32_t>& gpus = h.devices.at("gpu");
        EXPECT_EQ(gpus.size(), 2u) << m.name;
        pieces[m.uid].insert(gpus.begin(), gpus.end());
        for (uint32_t g : gpus) EXPECT_TRUE(by_node[h.node].insert(g).second) << "gpu " << g;
      }
    }
    EXPECT_EQ(pieces.size(), members.size()) << w_->Ctl("holds").out;
    for (const NodeDef& n : kNodes) {
      EXPECT_EQ(by_node[n.name], slurm[n.name]["gpu"])
          << n.name << "\n"
          << c_->Cli(absl::StrCat("scontrol -d show job ", job)).out << w_->Ctl("holds").out;
    }
    return pieces;
  }

  // The whole of test 1: gather, bind, one job; returns the job.
  uint32_t PlaceGang(const std::string& group, std::vector<Member>* out) {
    std::vector<Member> members = Gather(group);
    if (::testing::Test::HasFailure()) return 0;
    BindAll(members);
    const uint32_t job = GangJob(group);
    *out = members;
    return job;
  }

  // A gang of two members of 4 GPUs (one per node), whose pods are in the
  // apiserver already: the first member waits (GANG_WAITING 1/2), the second
  // completes the gang and passes exactly its node, the first then passes
  // exactly the other; both bind. Expects ONE live Slurm job named
  // duet-gang:`key` over both nodes, each member holding its piece of it (4
  // GPUs, Slurm's GPUs of the job there) on its node. Returns the job.
  uint32_t PlaceTwoWholeNodeMembers(const std::string& key, std::vector<Member>* members) {
    ExpectRefusedEverywhere(Filter((*members)[0].name), "GANG_WAITING: 1/2 members");
    std::vector<SqueueJob> jobs = LiveDuetJobs();
    EXPECT_EQ(jobs.size(), 1u) << c_->Cli("squeue").out;
    if (jobs.size() != 1) return 0;
    EXPECT_EQ(jobs[0].name, absl::StrCat("duet-gang:", key));
    const uint32_t job = jobs[0].id;
    std::set<std::string> nodes;
    for (int i : {1, 0}) {
      Member& m = (*members)[i];
      const json f = Filter(m.name);
      const bool one =
          f.contains("NodeNames") && f["NodeNames"].is_array() && f["NodeNames"].size() == 1;
      EXPECT_TRUE(one) << m.name << ": " << f.dump();
      if (!one) return 0;
      m.node = f["NodeNames"][0].get<std::string>();
      nodes.insert(m.node);
    }
    EXPECT_EQ(nodes, (std::set<std::string>{kNodes[0].name, kNodes[1].name}));
    BindAll(*members);
    jobs = LiveDuetJobs();
    EXPECT_EQ(jobs.size(), 1u) << c_->Cli("squeue").out;
    EXPECT_TRUE(jobs.size() == 1 && jobs[0].id == job && jobs[0].state == "RUNNING")
        << c_->Cli("squeue").out;
    CmdResult show = c_->Cli(absl::StrCat("scontrol show job ", job));
    EXPECT_NE(show.out.find("NumNodes=2"), std::string::npos) << show.out;
    EXPECT_NE(show.out.find(absl::StrCat("Comment=duet-gang key=", key, " slots=2")),
              std::string::npos)
        << show.out;
    std::map<std::string, NodeDevices> slurm = ::duet::testing::SlurmJobDevices(*c_, job);
    int pieces = 0;
    for (const LedgerHolding& h : JobHoldings(job)) {
      EXPECT_EQ(h.kind, "placeholder") << "a slot left unbound on " << h.node;
      for (const Member& m : *members) {
        if (m.uid != h.pod_uid) continue;
        ++pieces;
        EXPECT_EQ(h.node, m.node) << m.name;
        EXPECT_EQ(h.devices.at("gpu").size(), static_cast<size_t>(kGpusPerNode)) << m.name;
        EXPECT_EQ(h.devices.at("gpu"), slurm[h.node]["gpu"])
            << c_->Cli(absl::StrCat("scontrol -d show job ", job)).out;
      }
    }
    EXPECT_EQ(pieces, 2) << w_->Ctl("holds").out;
    return job;
  }

  World* w_ = nullptr;
  TestSlurmCluster* c_ = nullptr;
};

// Test 1: a PodGroup of 4 x 2 GPUs on two 4-GPU nodes.
TEST_F(GangE2eTest, PodGroupGathersThenBindsOnOneSlurmJobOverBothNodes) {
  std::vector<Member> members = Gather("train");
  ASSERT_FALSE(HasFailure());
  // The gang is complete: duet annotated every member with its node.
  for (const Member& m : members) {
    EXPECT_TRUE(WaitFor([&] {
      const json p = ApiPod(m.name);
      if (!p.is_object() || !p["metadata"].contains("annotations")) return false;
      const json& a = p["metadata"]["annotations"];
      return a.is_object() && a.value("duet.io/gang-node", "") == m.node;
    })) << ApiPod(m.name).dump();
  }
  BindAll(members);

  // ONE Slurm job over both nodes, 4 GPUs on each.
  const uint32_t job = GangJob("train");
  ASSERT_NE(job, 0u);
  std::map<std::string, NodeDevices> slurm = ::duet::testing::SlurmJobDevices(*c_, job);
  for (const NodeDef& n : kNodes) {
    EXPECT_EQ(slurm[n.name]["gpu"].size(), static_cast<size_t>(kGpusPerNode))
        << c_->Cli(absl::StrCat("scontrol -d show job ", job)).out;
  }
  CmdResult show = c_->Cli(absl::StrCat("scontrol show job ", job));
  EXPECT_NE(show.out.find("NumNodes=2"), std::string::npos) << show.out;
  EXPECT_NE(show.out.find("Comment=duet-gang key=podgroup/default/train slots=4"),
            std::string::npos)
      << show.out;
  // The ledger: each pod's piece of the job on its node (after a sync pass
  // too: SlurmSync leaves the gang's job to the registry).
  ExpectMemberPieces(job, members);
  ASSERT_TRUE(WaitSyncPasses(2));
  ExpectMemberPieces(job, members);
  EXPECT_EQ(LiveDuetJobs().size(), 1u) << c_->Cli("squeue").out;

  // A Slurm job asking one GPU on either node waits: the gang holds them all.
  const uint32_t waiting = c_->Sbatch("--gres=gpu:1 --wrap 'sleep 1'");
  ASSERT_NE(waiting, 0u);
  EXPECT_TRUE(c_->WaitJobPending(waiting, "Resources"))
      << c_->Cli(absl::StrCat("scontrol -d show job ", waiting)).out;
  EXPECT_EQ(Metric("duet_gang_reservations_total"), 1) << w_->Metrics();
  EXPECT_EQ(Metric("duet_gangs{state=\"complete\"}"), 1) << w_->Metrics();
  c_->Cli(absl::StrCat("scancel ", waiting));
}

// Test 2: 3 members x 4 GPUs need 3 nodes of 4 GPUs; there are 2.
TEST_F(GangE2eTest, GangThatDoesNotFitHoldsNothing) {
  w_->fake()->Put(PodGroup("big", 3));
  std::vector<Member> members = Members("big", 3);
  for (const Member& m : members) w_->fake()->Put(MemberPod(m.name, m.uid, "big", 4));
  const json f = Filter(members[0].name);
  ExpectRefusedEverywhere(f, "GANG_NO_ROOM");
  EXPECT_TRUE(WaitFor([&] {
    return PodEvents(members[0].name, "DuetGangUnplaceable", "Warning") >= 1;
  })) << w_->fake()->control()->Get("/api/v1/namespaces/default/events").value_or("");
  // Another member asks: the same answer, still nothing held.
  ExpectRefusedEverywhere(Filter(members[1].name), "GANG_NO_ROOM");
  EXPECT_TRUE(DuetJobs().empty()) << c_->Cli("squeue").out;
  EXPECT_EQ(DuetHoldings(), 0) << w_->Ctl("holds").out;
  // The nodes are Slurm's whole: a job takes all 8 GPUs at once.
  CmdResult r = c_->Cli(absl::StrCat("srun -N 2 -w ", kNodes[0].name, ",", kNodes[1].name,
                                     " --gres=gpu:", kGpusPerNode, " --immediate=10 echo RAN"));
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(Metric("duet_gang_reservations_total"), 0) << w_->Metrics();
}

// Test 3: 2 of 4 members seen, then one is deleted at the apiserver: the
// registry's tick (gang.tick_period 300ms here) finds it gone and releases
// the whole gang.
TEST_F(GangE2eTest, MemberDeletedWhileGatheringReleasesTheGang) {
  w_->fake()->Put(PodGroup("half", 4));
  std::vector<Member> members = Members("half", 4);
  for (const Member& m : members) w_->fake()->Put(MemberPod(m.name, m.uid, "half", 2));
  ExpectRefusedEverywhere(Filter(members[0].name), "GANG_WAITING: 1/4 members");
  ExpectRefusedEverywhere(Filter(members[1].name), "GANG_WAITING: 2/4 members");
  std::vector<SqueueJob> jobs = LiveDuetJobs();
  ASSERT_EQ(jobs.size(), 1u) << c_->Cli("squeue").out;
  const uint32_t job = jobs[0].id;
  EXPECT_EQ(jobs[0].name, "duet-gang:podgroup/default/half");
  ASSERT_EQ(JobHoldings(job).size(), 4u) << w_->Ctl("holds").out;  // 4 slots

  w_->fake()->Delete("Pod", members[1].name);
  EXPECT_TRUE(WaitFor([&] { return c_->JobEnded(job); }, absl::Seconds(15)))
      << c_->Cli("squeue").out << w_->Log();
  EXPECT_TRUE(WaitFor([&] { return DuetHoldings() == 0; })) << w_->Ctl("holds").out;
  EXPECT_TRUE(LiveDuetJobs().empty()) << c_->Cli("squeue").out;
  EXPECT_TRUE(WaitFor([&] { return PodEvents(members[0].name, "DuetGangReleased") >= 1; }));
  EXPECT_EQ(Metric("duet_gang_releases_total{reason=\"member-deleted\"}"), 1) << w_->Metrics();
  // The nodes are Slurm's whole again.
  CmdResult r = c_->Cli(absl::StrCat("srun -N 2 -w ", kNodes[0].name, ",", kNodes[1].name,
                                     " --gres=gpu:", kGpusPerNode, " --immediate=10 echo RAN"));
  EXPECT_EQ(r.rc, 0) << r.out;
}

// Test 4: duet-bridge SIGKILLed after the binds and started again: the same
// gang job, the same holdings, no new job. Then the members are deleted:
// the job stays while any member is left, and ends once none is and
// gang.idle_release (3 s here) has passed.
TEST_F(GangE2eTest, BridgeRestartKeepsTheGangUntilItsMembersAreGone) {
  std::vector<Member> members;
  const uint32_t job = PlaceGang("keep", &members);
  ASSERT_NE(job, 0u);
  const std::map<std::string, std::set<uint32_t>> before = ExpectMemberPieces(job, members);

  w_->KillBridge();
  ASSERT_TRUE(w_->StartBridge());
  ASSERT_TRUE(WaitSyncPasses(3));
  EXPECT_EQ(GangJob("keep"), job) << "the same job, no other";
  EXPECT_EQ(ExpectMemberPieces(job, members), before);
  EXPECT_EQ(Metric("duet_gangs{state=\"complete\"}"), 1) << w_->Metrics();

  // Three members go: their pieces go back to their slots; the job stays.
  for (int i = 0; i < 3; ++i) w_->fake()->Delete("Pod", members[i].name);
  ASSERT_TRUE(WaitFor([&] {
    int slots = 0;
    for (const LedgerHolding& h : JobHoldings(job)) slots += h.kind == "gang_slot";
    return slots == 3;
  })) << w_->Ctl("holds").out;
  // Longer than idle_release with a member left: the job is kept.
  const absl::Time t0 = absl::Now();
  WaitFor(
      [&] {
        EXPECT_EQ(c_->JobState(job), "RUNNING");
        return absl::Now() - t0 > absl::Seconds(4);
      },
      absl::Seconds(6));
  EXPECT_EQ(JobHoldings(job).size(), 4u) << w_->Ctl("holds").out;

  // The last member goes: after idle_release the gang is released.
  const absl::Time gone = absl::Now();
  w_->fake()->Delete("Pod", members[3].name);
  EXPECT_TRUE(WaitFor([&] { return c_->JobEnded(job); }, absl::Seconds(20)))
      << c_->Cli("squeue").out << w_->Log();
  EXPECT_GE(absl::Now() - gone, absl::Seconds(3)) << "released before idle_release";
  EXPECT_TRUE(WaitFor([&] { return DuetHoldings() == 0; })) << w_->Ctl("holds").out;
  EXPECT_TRUE(LiveDuetJobs().empty()) << c_->Cli("squeue").out;
  EXPECT_EQ(Metric("duet_gang_releases_total{reason=\"idle\"}"), 1) << w_->Metrics();
}

// Test 6: a JobSet's replicated job of 2 Jobs x 1 pod x 4 GPUs (the
// labels the JobSet controller sets; its size from the JobSet object) is one
// gang: one Slurm job over both nodes, each pod on its node.
TEST_F(GangE2eTest, JobSetReplicatedJobIsOneGangOnOneSlurmJob) {
  w_->fake()->Put(JobSet("js", "workers", /*replicas=*/2, /*parallelism=*/1));
  std::vector<Member> members;
  for (int i = 0; i < 2; ++i) {
    members.push_back({absl::StrCat("js-workers-", i, "-0-x7k2p"), absl::StrCat("uid-js-", i), ""});
    w_->fake()->Put(GangPod(members[i].name, members[i].uid,
                            JobSetPodLabels("js", "workers", i, 2), nullptr, kGpusPerNode));
  }
  ASSERT_NE(PlaceTwoWholeNodeMembers("jobset/default/js/workers", &members), 0u);
  EXPECT_EQ(Metric("duet_gang_reservations_total"), 1) << w_->Metrics();
}

// Test 7: a LeaderWorkerSet group of 2 (the leader and one worker, 4 GPUs
// each; its size from the annotation on the pods) is one gang: one Slurm
// job over both nodes, each pod on its node.
TEST_F(GangE2eTest, LeaderWorkerSetGroupIsOneGangOnOneSlurmJob) {
  w_->fake()->Put(LeaderWorkerSet("lws", 2));
  std::vector<Member> members = {{"lws-0", "uid-lws-0", ""}, {"lws-0-1", "uid-lws-0-1", ""}};
  for (int i = 0; i < 2; ++i) {
    w_->fake()->Put(GangPod(members[i].name, members[i].uid, LwsPodLabels("lws", 0, i),
                            LwsPodAnnotations(2), kGpusPerNode));
  }
  ASSERT_NE(PlaceTwoWholeNodeMembers("lws/default/lws/0", &members), 0u);
  EXPECT_EQ(Metric("duet_gang_reservations_total"), 1) << w_->Metrics();
}

// Test 5: slurmctld stopped and started again (it recovers its jobs): the
// gang's job and every holding are kept, and the gang still holds the GPUs.
TEST_F(GangE2eTest, SlurmctldRestartKeepsTheGangsJobAndHoldings) {
  std::vector<Member> members;
  const uint32_t job = PlaceGang("ctld", &members);
  ASSERT_NE(job, 0u);
  const std::map<std::string, std::set<uint32_t>> before = ExpectMemberPieces(job, members);

  c_->CtldStop();
  ASSERT_TRUE(c_->CtldStart()) << c_->Log("slurmctld.log");
  ASSERT_TRUE(WaitFor([&] { return Metric("duet_slurm_degraded") == 0; }, absl::Seconds(20)));
  ASSERT_TRUE(WaitSyncPasses(3));
  EXPECT_EQ(GangJob("ctld"), job);
  EXPECT_EQ(ExpectMemberPieces(job, members), before);
  const uint32_t waiting = c_->Sbatch("--gres=gpu:1 --wrap 'sleep 1'");
  ASSERT_NE(waiting, 0u);
  EXPECT_TRUE(c_->WaitJobPending(waiting, "Resources"))
      << c_->Cli(absl::StrCat("scontrol -d show job ", waiting)).out;
  c_->Cli(absl::StrCat("scancel ", waiting));
}

}  // namespace
}  // namespace duet
