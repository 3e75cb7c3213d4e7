// duet-soak: randomized operations against the real duet-bridge, a real
// Slurm cluster (tests/integration/slurm_cluster.sh) and the fake Kubernetes
// API server (tests/fakes/fake_apiserver.py), with faults injected on a
// schedule and an online checker of DESIGN.md's invariants.
//
// The world: NODES Kubernetes nodes of 8 GPUs in the fake API server (the
// bridge's inventory is the Node watch), each a Slurm dynamic node the bridge
// creates, with its slurmd on 127.0.0.(80+i); spank_duet.so in plugstack.conf;
// duet-bridge with the extender, the pod watch and Slurm sync on.
//
// Operations (one operation = one client request that changes or probes
// state, counted when it got an answer or failed; the checker's own reads are
// not counted), chosen by a seeded RNG:
//   k8s.pod_create        PUT a pending GPU pod into the fake API server
//   extender.filter/.prioritize/.bind   kube-scheduler's three calls (bind
//                         makes the Slurm placeholder)
//   grpc.pod_hold         duet-node's Allocate: Hold(pod) on its placeholder's
//                         devices; grpc.pod_release: Release(pod)
//   grpc.steal_probe      Hold(another pod) on a bound pod's devices: must be
//                         refused, a grant is an I1 violation
//   grpc.list_holdings, grpc.list_nodes   probes
//   k8s.pod_finish (phase Succeeded), k8s.pod_delete (kubelet done)
//   k8s.node_cordon/uncordon, k8s.node_delete/add (with the node's pods)
//   slurm.sbatch (GPU jobs, some running an srun step), slurm.scancel,
//   slurm.requeue: at most one Slurm operation every --slurm_op_ms
// Faults, in turn, every --fault_every: bridge kill -9 (and restart),
// slurmctld restart, watch drop, watch 410, duplicated watch events,
// reordered watch events, journal ENOSPC, journal EIO (the bridge's
// test-only DUET_TEST_JOURNAL_FAULT_FILE seam; the journal then stays failed,
// so the soak restarts the bridge, as an operator would).
//
// The checker (every --check_every operations, and after each fault until it
// converges) reads ListHoldings, `scontrol -d show job` and the API server's
// pods:
//   I1  no device has two different live owners, in the ledger alone or
//       across the ledger, Slurm's jobs (IDX) and live pods; a pod nests in
//       its placeholder, a step in its job. Must never fail.
//   I2  a live bound pod has a live placeholder (ledger and Slurm, the same
//       devices); a placeholder's pod exists and is live; a pod's own
//       holding belongs to a live pod.
//   I4  the ledger mirrors Slurm: every Slurm job with devices is held by it
//       on exactly Slurm's devices; every ledger job holding is a live job.
// An I2/I4 discrepancy is a violation only when it persists longer than
// --bound after it was first seen and after the last fault healed. After each
// fault heals, operations stop until the checker sees no discrepancy; that
// time is the fault's time to converge.
//
// Exit status: 0 when there were no violations and every fault kind was
// injected at least once (when --require_all_faults); 1 otherwise.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/common/quantile.h"
#include "duet/v1/duet.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/integration/e2e_helpers.h"
#include "tests/k8s_adapter/extender/http_client.h"
#include "tests/k8s_adapter/fake_server.h"
#include "tests/slurm/slurm_cluster_fixture.h"

#ifndef DUET_SPANK_SO
#error "DUET_SPANK_SO must name spank_duet.so"
#endif

namespace duet {
namespace soak {
namespace {

namespace fs = std::filesystem;
using ::duet::k8s::testing::FakeApiServer;
using ::duet::testing::BridgeProcess;
using ::duet::testing::CmdResult;
using ::duet::testing::ExpandIdx;
using ::duet::testing::FreePort;
using ::duet::testing::RunCmd;
using ::duet::testing::TestSlurmCluster;
using ::duet::testing::WaitFor;
using json = nlohmann::json;

constexpr char kGpuModel[] = "nvidia-h100-80gb";
constexpr char kPrefix[] = "/duet";
constexpr int kGpusPerNode = 8;

struct Options {
  uint64_t ops = 1000000;
  double duration_s = 0;  // 0: until `ops`
  uint64_t seed = 1;
  int nodes = 3;
  int max_pods = 12;
  int slurm_op_ms = 1000;
  double fault_every_s = 30;
  double bound_s = 20;
  int check_every = 300;
  bool require_all_faults = false;
  std::string json_out;
  std::string keep_dir;
};

const std::vector<std::string>& FaultKinds() {
  static const std::vector<std::string> kinds = {
      "bridge_kill9",    "slurmctld_restart", "watch_drop",     "watch_410",
      "watch_duplicate", "watch_reorder",     "journal_enospc", "journal_eio"};
  return kinds;
}

// A pod the soak made, as the soak knows it.
struct Pod {
  std::string name;
  std::string uid;
  int gpus = 1;
  std::string node;       // bound to (bind answered OK)
  bool finished = false;  // phase Succeeded
  bool hold = false;      // its own (duet-node) holding was granted
};

// What the checker reads.
struct SlurmJob {
  uint32_t id = 0;
  std::string name;
  std::string state;
  std::map<std::string, std::set<uint32_t>> gpus;  // node -> IDX
};

struct Snapshot {
  bool ok = false;
  std::vector<duet::testing::LedgerHolding> holdings;
  std::map<uint32_t, SlurmJob> jobs;
  std::map<std::string, json> pods;  // name -> pod
};

std::vector<SlurmJob> ParseScontrolJobs(const std::string& text) {
  std::vector<SlurmJob> out;
  static const std::regex id_re(R"(JobId=(\d+) JobName=(\S*))");
  static const std::regex state_re(R"(JobState=(\S+))");
  static const std::regex node_re(R"(^\s+Nodes=(\S+) .*GRES=(\S+))");
  static const std::regex gres_re(R"(gpu[^(,]*\(IDX:([0-9,-]+)\))");
  for (absl::string_view l : absl::StrSplit(text, '\n')) {
    const std::string line(l);
    std::smatch m;
    if (std::regex_search(line, m, id_re)) {
      SlurmJob j;
      j.id = static_cast<uint32_t>(std::stoul(m[1]));
      j.name = m[2];
      out.push_back(j);
      continue;
    }
    if (out.empty()) continue;
    if (std::regex_search(line, m, state_re)) out.back().state = m[1];
    if (std::regex_search(line, m, node_re)) {
      const std::string node = m[1];
      const std::string gres = m[2];
      for (auto it = std::sregex_iterator(gres.begin(), gres.end(), gres_re);
           it != std::sregex_iterator(); ++it) {
        for (uint32_t i : ExpandIdx((*it)[1])) out.back().gpus[node].insert(i);
      }
    }
  }
  return out;
}

// A quantile of seconds as the report prints it; "-" for none.
std::string Percentile(const std::vector<double>& v, double p) {
  return v.empty() ? "-" : absl::StrCat(absl::SixDigits(bench::Quantile(v, p)));
}

class Soak {
 public:
  explicit Soak(Options o) : o_(std::move(o)), rng_(o_.seed) {}

  // Sets up the world; false (with a message on stderr) when it cannot.
  bool Setup();
  // Runs the operations and faults; then the final check.
  void Run();
  bool SelfCheckPublic() { return SelfCheck(); }
  // Prints the summary; returns the exit status.
  int Report();
  void Teardown();

 private:
  // ---- world ----
  std::string NodeName(int i) const { return std::string("soak-") + static_cast<char>('a' + i); }
  json NodeObject(int i, bool unschedulable) const;
  bool StartBridge();
  void ConnectClients();

  // ---- operations ----
  void Count(const std::string& kind, bool ok, const std::string& error = "") {
    if (!ok && !error.empty() && error_sample_[kind].size() < 3) error_sample_[kind].insert(error);
    ++ops_;
    ++ops_by_kind_[kind];
    // The time since the previous mark: this request and what prepared it.
    const absl::Time now = absl::Now();
    seconds_by_kind_[kind] += absl::ToDoubleSeconds(now - mark_);
    mark_ = now;
    if (!ok) ++errors_by_kind_[kind];
  }
  void OneOp();
  void OpPodCreate();
  void OpPodSchedule();
  void OpPodHold();
  void OpPodRelease();
  void OpStealProbe();
  void OpPodFinish();
  void OpPodDelete(const std::string& name);
  void OpListHoldings();
  void OpListNodes();
  void OpFilterProbe();
  void OpNodeCordon();
  void OpSlurm();
  void OpNodeDeleteAdd();
  std::optional<std::pair<int, json>> Extender(const std::string& verb, const json& body);
  json ApiPod(const std::string& name);
  grpc::Status Hold(const Pod& as, const std::string& node, const std::set<uint32_t>& gpus);
  // Release of what pod `as` holds on `node`; *released: whether anything was.
  grpc::Status Release(const Pod& as, const std::string& node, bool* released = nullptr);
  std::set<uint32_t> PlaceholderGpus(const Pod& p, bool refresh);
  Pod* RandomPod(const std::function<bool(const Pod&)>& pred);

  // ---- faults ----
  // False when the fault could not be injected now (then it is retried).
  bool InjectFault(const std::string& kind);
  bool JournalFault(const std::string& word, const std::string& kind);

  // ---- checker ----
  Snapshot Read();
  // Checks I1 (violations counted at once) and returns the I2/I4
  // discrepancies (keys describing them).
  std::set<std::string> Check(const Snapshot& s);
  void CheckNow();
  // The checker on made-up snapshots: a double-booked device, an orphan
  // placeholder, a job the ledger misses. False if it misses any.
  bool SelfCheck();
  void Violation(const std::string& what);
  // Waits, without operations, until Check sees no discrepancy; the time
  // from `healed`, or a violation after --bound.
  void Converge(const std::string& kind, absl::Time healed);

  Options o_;
  std::mt19937_64 rng_;
  fs::path dir_;
  TestSlurmCluster* cluster_ = nullptr;
  std::unique_ptr<FakeApiServer> fake_;
  std::unique_ptr<BridgeProcess> bridge_;
  std::unique_ptr<v1::Ledger::Stub> stub_;
  std::unique_ptr<extender::testing::HttpClient> http_;
  int extender_port_ = 0;
  std::string fault_file_;

  std::map<std::string, Pod> pods_;  // by name
  std::map<std::string, std::string> node_gone_;  // deleted k8s nodes
  std::set<std::string> cordoned_;
  std::set<uint32_t> jobs_;  // Slurm jobs the soak submitted, maybe live
  uint64_t next_pod_ = 0;
  Snapshot last_;

  uint64_t ops_ = 0;
  std::map<std::string, uint64_t> ops_by_kind_;
  std::map<std::string, uint64_t> errors_by_kind_;
  std::map<std::string, double> seconds_by_kind_;
  std::map<std::string, std::set<std::string>> error_sample_;
  absl::Time mark_;
  std::map<std::string, uint64_t> faults_;
  std::map<std::string, std::vector<double>> converge_s_;
  // Per fault kind: from injecting to healed (the bridge or slurmctld serving
  // again, the watch fault sent, the journal-failed bridge restarted).
  std::map<std::string, std::vector<double>> outage_s_;
  uint64_t checks_ = 0;
  uint64_t violations_ = 0;
  bool quiet_ = false;  // SelfCheck: count, do not print
  std::vector<std::string> violation_text_;
  std::map<std::string, absl::Time> first_seen_;
  std::set<std::string> reported_;
  absl::Time last_heal_ = absl::InfinitePast();
  absl::Time start_;
  absl::Duration elapsed_;
};

json Soak::NodeObject(int i, bool unschedulable) const {
  const std::string name = NodeName(i);
  json n = {
      {"apiVersion", "v1"},
      {"kind", "Node"},
      {"metadata",
       {{"name", name},
        {"labels",
         {{"duet.dev/shared", "true"},
          {"duet.dev/slurm-node-addr", absl::StrCat("127.0.0.", 80 + i)},
          {"cloud.google.com/gke-accelerator", kGpuModel},
          {"cloud.google.com/gke-nodepool", "shared-h100"},
          {"kubernetes.io/hostname", name},
          {"topology.kubernetes.io/zone", "us-central1-a"}}}}},
      {"spec", json::object()},
      {"status",
       {{"capacity", {{"cpu", "8"}, {"memory", "16000Mi"}, {"nvidia.com/gpu", "8"}, {"pods", "110"}}},
        {"allocatable",
         {{"cpu", "8"}, {"memory", "16000Mi"}, {"nvidia.com/gpu", "8"}, {"pods", "110"}}},
        {"conditions", json::array({{{"type", "Ready"}, {"status", "True"}}})}}}};
  if (unschedulable) n["spec"]["unschedulable"] = true;
  return n;
}

bool Soak::Setup() {
  char tmpl[] = "/tmp/duet-soak.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return false;
  dir_ = tmpl;
  const std::string socket = (dir_ / "bridge.sock").string();
  const std::string plug = absl::StrCat("bridge=unix://", socket, " timeout_ms=2000");
  TestSlurmCluster::Options co;
  co.spank = absl::StrCat(DUET_SPANK_SO, ":", plug);
  // The cluster's watchdog must outlive the run (plus setup and the end).
  co.lifetime_s = static_cast<int>(o_.duration_s > 0 ? o_.duration_s + 600 : 7 * 24 * 3600);
  cluster_ = TestSlurmCluster::Get(co);
  if (!cluster_->ok()) {
    std::cerr << "soak: the Slurm cluster did not start\n";
    return false;
  }
  std::ofstream(cluster_->root() + "/etc/plugstack.conf")
      << "required " << DUET_SPANK_SO << " " << plug << cluster_->PlugstackAuthArgs() << "\n";

  fake_ = std::make_unique<FakeApiServer>();
  if (!fake_->ok()) {
    std::cerr << "soak: the fake API server did not start\n";
    return false;
  }
  for (int i = 0; i < o_.nodes; ++i) fake_->Put(NodeObject(i, false));
  std::ofstream(dir_ / "kubeconfig")
      << "apiVersion: v1\nkind: Config\n"
      << "clusters: [{name: fake, cluster: {server: \"" << fake_->url() << "\"}}]\n"
      << "users: [{name: dev, user: {}}]\n"
      << "contexts: [{name: fake, context: {cluster: fake, user: dev}}]\n"
      << "current-context: fake\n";
  extender_port_ = FreePort();
  std::ofstream(dir_ / "bridge.yaml")
      << "grpc: {listen: \"\", unix_socket: " << socket << "}\n"
      << "metrics: {listen: \"\"}\n"
      << "journal: {dir: " << (dir_ / "journal").string() << "}\n"
      << "extender: {listen: \"127.0.0.1:" << extender_port_ << "\", url_prefix: \"" << kPrefix
      << "\"}\n"
      << "kubernetes:\n"
      << "  kubeconfig: " << (dir_ / "kubeconfig").string() << "\n"
      << "  watch_pods: true\n"
      << "  pod_release_grace: 5s\n"
      << "  pod_sweep_period: 500ms\n"
      << "  events_per_minute: 0\n"
      << "slurm:\n"
      << "  enabled: true\n"
      << "  conf_path: " << cluster_->conf() << "\n"
      << "  call_timeout: 3s\n"
      << "  sync_period: 500ms\n"
      << "  release_grace: 1s\n"
      << cluster_->BridgeAuthYaml() << "log_level: warn\n";
  fault_file_ = (dir_ / "journal-fault").string();
  setenv("DUET_TEST_JOURNAL_FAULT_FILE", fault_file_.c_str(), 1);
  if (!StartBridge()) return false;
  for (int i = 0; i < o_.nodes; ++i) {
    const std::string n = NodeName(i);
    if (!WaitFor([&] {
          return cluster_->Cli(absl::StrCat("scontrol --future show node ", n)).rc == 0;
        })) {
      std::cerr << "soak: duet-bridge did not create Slurm node " << n << "\n" << bridge_->Log();
      return false;
    }
    cluster_->StartSlurmd(n, 80 + i, 8, 16000, kGpusPerNode, kGpuModel);
  }
  for (int i = 0; i < o_.nodes; ++i) {
    if (!cluster_->WaitNodeState(NodeName(i), "IDLE", absl::Seconds(30))) {
      std::cerr << "soak: node " << NodeName(i) << " not IDLE\n"
                << cluster_->Log("slurmctld.log");
      return false;
    }
  }
  return true;
}

bool Soak::StartBridge() {
  bridge_ = std::make_unique<BridgeProcess>((dir_ / "bridge.yaml").string(),
                                            (dir_ / "bridge.log").string(),
                                            (dir_ / "bridge.sock").string());
  ::testing::AssertionResult r = bridge_->Start();
  if (!r) {
    std::cerr << "soak: duet-bridge did not start: " << r.message() << "\n";
    return false;
  }
  ConnectClients();
  // The extender listens once the bridge serves; wait for it too.
  WaitFor([&] { return http_->Get("/healthz").ok(); }, absl::Seconds(10));
  ConnectClients();
  return true;
}

void Soak::ConnectClients() {
  stub_ = bridge_->channel() ? v1::Ledger::NewStub(bridge_->channel()) : nullptr;
  http_ = std::make_unique<extender::testing::HttpClient>(extender_port_);
}

void Soak::Teardown() {
  stub_.reset();
  bridge_.reset();
  fake_.reset();
  if (cluster_ != nullptr) {
    cluster_->Cli("squeue -h -o %i | xargs -r scancel");
    cluster_->Stop();
  }
  std::error_code ec;
  if (violations_ == 0 && o_.keep_dir.empty()) {
    fs::remove_all(dir_, ec);
    if (cluster_ != nullptr) fs::remove_all(cluster_->root(), ec);
  } else {
    std::cerr << "soak: kept " << dir_ << " and " << (cluster_ ? cluster_->root() : "") << "\n";
  }
}

// ---------------------------------------------------------------- operations

std::optional<std::pair<int, json>> Soak::Extender(const std::string& verb, const json& body) {
  absl::StatusOr<extender::testing::Reply> r =
      http_->Post(absl::StrCat(kPrefix, "/", verb), body.dump());
  if (!r.ok()) {
    http_ = std::make_unique<extender::testing::HttpClient>(extender_port_);
    return std::nullopt;
  }
  return std::make_pair(r->status, json::parse(r->body, nullptr, false));
}

json Soak::ApiPod(const std::string& name) {
  absl::StatusOr<std::string> r =
      fake_->control()->Get("/api/v1/namespaces/default/pods/" + name);
  if (!r.ok()) return nullptr;
  return json::parse(*r, nullptr, false);
}

Pod* Soak::RandomPod(const std::function<bool(const Pod&)>& pred) {
  std::vector<Pod*> c;
  for (auto& [n, p] : pods_) {
    if (pred(p)) c.push_back(&p);
  }
  if (c.empty()) return nullptr;
  return c[rng_() % c.size()];
}

void Soak::OpPodCreate() {
  if (pods_.size() >= static_cast<size_t>(o_.max_pods)) return OpFilterProbe();
  Pod p;
  const uint64_t n = next_pod_++;
  p.name = absl::StrCat("soak-pod-", n);
  p.uid = absl::StrCat("50a50a50-0000-4000-8000-", absl::StrFormat("%012d", n));
  p.gpus = 1 + static_cast<int>(rng_() % 3);
  json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", p.name}, {"namespace", "default"}, {"uid", p.uid}}},
      {"spec",
       {{"schedulerName", "duet"},
        {"restartPolicy", "Never"},
        {"containers",
         json::array({{{"name", "c"},
                       {"image", "busybox"},
                       {"resources",
                        {{"requests", {{"cpu", "100m"}, {"nvidia.com/gpu", std::to_string(p.gpus)}}},
                         {"limits", {{"nvidia.com/gpu", std::to_string(p.gpus)}}}}}}})}}},
      {"status", {{"phase", "Pending"}}}};
  json r = fake_->Put(pod);
  const bool ok = r.is_object() && !r.contains("error") && r.value("kind", "") == "Pod";
  Count("k8s.pod_create", ok);
  if (ok) pods_[p.name] = p;
}

void Soak::OpPodSchedule() {
  Pod* p = RandomPod([](const Pod& p) { return p.node.empty() && !p.finished; });
  if (p == nullptr) return OpPodCreate();
  json pod = ApiPod(p->name);
  if (!pod.is_object() || !pod.contains("spec")) return;
  json names = json::array();
  for (int i = 0; i < o_.nodes; ++i) {
    if (!node_gone_.count(NodeName(i))) names.push_back(NodeName(i));
  }
  auto filter = Extender("filter", {{"Pod", pod}, {"NodeNames", names}});
  Count("extender.filter", filter && filter->first == 200);
  if (!filter || filter->first != 200 || !filter->second["NodeNames"].is_array() ||
      filter->second["NodeNames"].empty()) {
    return;
  }
  auto prio = Extender("prioritize", {{"Pod", pod}, {"NodeNames", filter->second["NodeNames"]}});
  Count("extender.prioritize", prio && prio->first == 200);
  if (!prio || prio->first != 200 || !prio->second.is_array() || prio->second.empty()) return;
  // Best score first. The top node is tried first; after a refused bind the
  // next one (kube-scheduler would retry the pod later and, as the extender
  // scores, pick the same top node again: see RESULTS.md on starvation).
  std::vector<std::pair<int, std::string>> ranked;
  for (const json& hp : prio->second) ranked.push_back({-hp.value("Score", 0), hp.value("Host", "")});
  std::sort(ranked.begin(), ranked.end());
  for (const auto& [score, host] : ranked) {
    auto bind = Extender("bind", {{"PodName", p->name},
                                  {"PodNamespace", "default"},
                                  {"PodUID", p->uid},
                                  {"Node", host}});
    const bool ok = bind && bind->first == 200 && bind->second.is_object() &&
                    (bind->second["Error"].is_null() || bind->second["Error"] == "");
    Count("extender.bind", ok, bind ? bind->second.dump().substr(0, 200) : "no answer");
    if (ok) {
      p->node = host;
      break;
    }
  }
}

std::set<uint32_t> Soak::PlaceholderGpus(const Pod& p, bool refresh) {
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& h : last_.holdings) {
      if (h.kind == "placeholder" && h.pod_uid == p.uid && h.node == p.node) {
        auto it = h.devices.find("gpu");
        return it == h.devices.end() ? std::set<uint32_t>{} : it->second;
      }
    }
    if (!refresh || pass == 1) break;
    OpListHoldings();
  }
  return {};
}

grpc::Status Soak::Hold(const Pod& as, const std::string& node, const std::set<uint32_t>& gpus) {
  v1::HoldRequest req;
  req.set_node(node);
  v1::PodRef* ref = req.mutable_owner()->mutable_pod();
  ref->set_uid(as.uid);
  ref->set_namespace_("default");
  ref->set_name(as.name);
  for (uint32_t g : gpus) {
    v1::HeldDevice* d = req.mutable_devices()->add_devices();
    d->set_kind(v1::DEVICE_KIND_GPU);
    d->set_index(g);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::HoldResponse resp;
  return stub_->Hold(&ctx, req, &resp);
}

grpc::Status Soak::Release(const Pod& as, const std::string& node, bool* released) {
  v1::ReleaseRequest req;
  req.set_node(node);
  v1::PodRef* ref = req.mutable_owner()->mutable_pod();
  ref->set_uid(as.uid);
  ref->set_namespace_("default");
  ref->set_name(as.name);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ReleaseResponse resp;
  grpc::Status s = stub_->Release(&ctx, req, &resp);
  if (released != nullptr) *released = s.ok() && resp.released();
  return s;
}

void Soak::OpPodHold() {
  Pod* p = RandomPod([](const Pod& p) { return !p.node.empty() && !p.finished && !p.hold; });
  if (p == nullptr) return OpPodSchedule();
  const std::set<uint32_t> gpus = PlaceholderGpus(*p, /*refresh=*/true);
  if (gpus.empty()) return;
  grpc::Status s = Hold(*p, p->node, gpus);
  Count("grpc.pod_hold", s.ok(), absl::StrCat(s.error_code(), " ", s.error_message()));
  if (s.ok()) p->hold = true;
}

void Soak::OpPodRelease() {
  Pod* p = RandomPod([](const Pod& p) { return p.hold; });
  if (p == nullptr) return OpPodHold();
  grpc::Status s = Release(*p, p->node);
  Count("grpc.pod_release", s.ok(), absl::StrCat(s.error_code(), " ", s.error_message()));
  if (s.ok()) p->hold = false;
}

void Soak::OpStealProbe() {
  Pod* victim = RandomPod([](const Pod& p) { return !p.node.empty() && !p.finished; });
  Pod* thief = RandomPod([&](const Pod& p) { return victim != nullptr && p.uid != victim->uid; });
  if (victim == nullptr || thief == nullptr) return OpListHoldings();
  const std::set<uint32_t> gpus = PlaceholderGpus(*victim, /*refresh=*/false);
  if (gpus.empty()) return OpListHoldings();
  grpc::Status s = Hold(*thief, victim->node, gpus);
  // Refusals are this probe's success; UNAVAILABLE etc. are errors.
  const bool refused = s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                       s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
                       s.error_code() == grpc::StatusCode::ALREADY_EXISTS ||
                       s.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
                       s.error_code() == grpc::StatusCode::ABORTED ||
                       s.error_code() == grpc::StatusCode::NOT_FOUND;
  Count("grpc.steal_probe", refused, absl::StrCat(s.error_code(), " ", s.error_message()));
  if (s.ok()) {
    // Granted: a violation only if the victim's placeholder was live then
    // (it may have been released a moment ago); the checker decides with
    // ground truth, so look now.
    Snapshot snap = Read();
    bool victim_live = false;
    for (const auto& h : snap.holdings) {
      if (h.kind == "placeholder" && h.pod_uid == victim->uid && snap.jobs.count(h.job_id) &&
          !snap.jobs[h.job_id].gpus.empty()) {
        victim_live = true;
      }
    }
    if (victim_live && snap.pods.count(victim->name)) {
      Violation(absl::StrCat("I1: Hold(pod ", thief->name, ") granted on ", victim->node, " GPUs [",
                             absl::StrJoin(gpus, ","), "] of live pod ", victim->name));
    }
    (void)Release(*thief, victim->node);  // undo the steal; its answer does not matter
  }
}

void Soak::OpPodFinish() {
  Pod* p = RandomPod([](const Pod& p) { return !p.node.empty() && !p.finished; });
  if (p == nullptr) return OpPodSchedule();
  json pod = ApiPod(p->name);
  if (!pod.is_object() || !pod.contains("status")) return;
  pod["status"]["phase"] = "Succeeded";
  json r = fake_->Put(pod);
  const bool ok = r.is_object() && !r.contains("error") && r.value("kind", "") == "Pod";
  Count("k8s.pod_finish", ok);
  if (ok) p->finished = true;
}

void Soak::OpPodDelete(const std::string& name) {
  json r = fake_->Delete("Pod", name);
  Count("k8s.pod_delete", r.is_object() && !r.contains("error"));
  pods_.erase(name);
}

void Soak::OpListHoldings() {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListHoldingsResponse resp;
  grpc::Status s = stub_->ListHoldings(&ctx, v1::ListHoldingsRequest(), &resp);
  Count("grpc.list_holdings", s.ok());
  if (!s.ok()) return;
  std::vector<duet::testing::LedgerHolding> hs;
  for (const v1::Holding& h : resp.holdings()) {
    duet::testing::LedgerHolding l;
    l.node = h.node();
    if (h.owner().has_placeholder()) {
      l.kind = "placeholder";
      l.job_id = h.owner().placeholder().job_id();
      l.pod_uid = h.owner().placeholder().pod_uid();
    } else {
      continue;
    }
    for (const v1::HeldDevice& d : h.devices()) l.devices["gpu"].insert(d.index());
    hs.push_back(std::move(l));
  }
  last_.holdings = std::move(hs);
}

void Soak::OpListNodes() {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListNodesResponse resp;
  grpc::Status s = stub_->ListNodes(&ctx, v1::ListNodesRequest(), &resp);
  Count("grpc.list_nodes", s.ok());
}

void Soak::OpFilterProbe() {
  Pod* p = RandomPod([](const Pod& p) { return p.node.empty() && !p.finished; });
  if (p == nullptr) return OpListNodes();
  json pod = ApiPod(p->name);
  if (!pod.is_object() || !pod.contains("spec")) return;
  json names = json::array();
  for (int i = 0; i < o_.nodes; ++i) names.push_back(NodeName(i));
  auto filter = Extender("filter", {{"Pod", pod}, {"NodeNames", names}});
  Count("extender.filter", filter && filter->first == 200);
}

void Soak::OpNodeCordon() {
  const int i = static_cast<int>(rng_() % o_.nodes);
  const std::string n = NodeName(i);
  if (node_gone_.count(n)) return;
  const bool cordon = !cordoned_.count(n);
  json r = fake_->Put(NodeObject(i, cordon));
  const bool ok = r.is_object() && !r.contains("error");
  Count(cordon ? "k8s.node_cordon" : "k8s.node_uncordon", ok);
  if (ok && cordon) cordoned_.insert(n);
  if (ok && !cordon) cordoned_.erase(n);
}

void Soak::OpNodeDeleteAdd() {
  // The last node only; Slurm jobs are not pinned to it.
  const int i = o_.nodes - 1;
  const std::string n = NodeName(i);
  if (!node_gone_.count(n)) {
    json r = fake_->Delete("Node", n, "");
    Count("k8s.node_delete", r.is_object() && !r.contains("error"));
    node_gone_[n] = "deleted";
    // Kubernetes' pod GC removes the pods of a deleted node.
    std::vector<std::string> gone;
    for (const auto& [name, p] : pods_) {
      if (p.node == n) gone.push_back(name);
    }
    for (const std::string& name : gone) OpPodDelete(name);
    return;
  }
  json r = fake_->Put(NodeObject(i, false));
  Count("k8s.node_add", r.is_object() && !r.contains("error"));
  node_gone_.erase(n);
  cordoned_.erase(n);
  // A node that comes back comes with its slurmd (the NodeSet pod restarts).
  if (!cluster_->WaitNodeState(n, "IDLE|MIXED|ALLOCATED", absl::Seconds(5))) {
    cluster_->StopSlurmd(n);
    cluster_->StartSlurmd(n, 80 + i, 8, 16000, kGpusPerNode, kGpuModel);
  }
}

void Soak::OpSlurm() {
  const int r = static_cast<int>(rng_() % 100);
  // Slurm refuses every immediate allocation (a pod's placeholder) in the
  // partition while a job pends there ("insufficient priority"), so the soak
  // keeps the queue short: a pending job is cancelled before a new one goes.
  CmdResult pending = cluster_->Cli("squeue -h -t PD -o %i");
  Count("slurm.squeue", pending.rc == 0);
  uint32_t pending_id = 0;
  if (pending.rc == 0 && sscanf(pending.out.c_str(), "%u", &pending_id) == 1 && r < 70) {
    CmdResult c = cluster_->Cli(absl::StrCat("scancel ", pending_id));
    Count("slurm.scancel", c.rc == 0);
    jobs_.erase(pending_id);
    return;
  }
  if (r < 70 || jobs_.empty()) {
    const int gpus = 1 + static_cast<int>(rng_() % 4);
    const int secs = 2 + static_cast<int>(rng_() % 8);
    std::string wrap = absl::StrCat("sleep ", secs);
    if (rng_() % 3 == 0) wrap = absl::StrCat("srun --gres=gpu:1 sleep 1; sleep ", secs);
    // Not on the last node, which node churn deletes and adds: a job that
    // pends for it would hold off every placeholder there (Slurm refuses an
    // immediate allocation behind a pending job).
    const std::string node = NodeName(static_cast<int>(rng_() % (o_.nodes - 1)));
    CmdResult c = cluster_->Cli(absl::StrCat("sbatch --parsable -o /dev/null -w ", node,
                                             " --gres=gpu:", gpus, " --wrap '", wrap, "'"));
    uint32_t id = 0;
    const bool ok = c.rc == 0 && sscanf(c.out.c_str(), "%u", &id) == 1;
    Count("slurm.sbatch", ok);
    if (ok) jobs_.insert(id);
    return;
  }
  auto it = jobs_.begin();
  std::advance(it, rng_() % jobs_.size());
  const uint32_t id = *it;
  if (r < 90) {
    CmdResult c = cluster_->Cli(absl::StrCat("scancel ", id));
    Count("slurm.scancel", c.rc == 0);
    jobs_.erase(id);
  } else {
    CmdResult c = cluster_->Cli(absl::StrCat("scontrol requeue ", id));
    // A job that already ended cannot be requeued: a refusal, not an error.
    Count("slurm.requeue", c.rc == 0 || absl::StrContains(c.out, "completed") ||
                               absl::StrContains(c.out, "Invalid job id") ||
                               absl::StrContains(c.out, "pending"));
    if (c.rc != 0) jobs_.erase(id);
  }
}

void Soak::OneOp() {
  const int r = static_cast<int>(rng_() % 100);
  if (r < 8) return OpPodCreate();
  if (r < 16) return OpPodSchedule();
  if (r < 30) return OpPodHold();
  if (r < 42) return OpPodRelease();
  if (r < 52) return OpStealProbe();
  if (r < 57) return OpPodFinish();
  if (r < 63) {
    Pod* p = RandomPod([](const Pod& p) { return p.finished || p.node.empty(); });
    if (p == nullptr) p = RandomPod([](const Pod&) { return true; });
    if (p == nullptr) return OpPodCreate();
    return OpPodDelete(p->name);
  }
  if (r < 73) return OpListHoldings();
  if (r < 83) return OpListNodes();
  if (r < 99) return OpFilterProbe();
  return OpNodeCordon();
}

// -------------------------------------------------------------------- faults

bool Soak::JournalFault(const std::string& word, const std::string& kind) {
  // Needs a journal write to fail: a grant (a bound pod without its own
  // holding, on a node that takes new holdings, with its placeholder's
  // devices) or else a release (a pod with its holding).
  auto grantable = [&](const Pod& p) {
    return !p.node.empty() && !p.finished && !p.hold && !cordoned_.count(p.node) &&
           !node_gone_.count(p.node);
  };
  auto find = [&]() -> Pod* {
    OpListHoldings();
    for (auto& [name, p] : pods_) {
      if (grantable(p) && !PlaceholderGpus(p, /*refresh=*/false).empty()) return &p;
    }
    for (auto& [name, p] : pods_) {
      if (p.hold && !node_gone_.count(p.node)) return &p;
    }
    return nullptr;
  };
  Pod* p = find();
  if (p == nullptr) {
    // Make room, as an operator would: take the cordons off, clear Slurm's
    // queue (a pending job makes Slurm refuse every placeholder), drop the
    // pods that ended or could not be placed; then place new pods. Half-way,
    // cancel the soak's running jobs too (their devices are what is left).
    for (int i = 0; i < o_.nodes; ++i) {
      const std::string n = NodeName(i);
      if (!cordoned_.count(n) || node_gone_.count(n)) continue;
      json r = fake_->Put(NodeObject(i, false));
      const bool ok = r.is_object() && !r.contains("error");
      Count("k8s.node_uncordon", ok);
      if (ok) cordoned_.erase(n);
    }
    CmdResult c = cluster_->Cli("scancel --state=PENDING");
    Count("slurm.scancel", c.rc == 0);
  }
  // Slurm frees a cancelled job's devices when its nodes have cleaned up,
  // seconds on a loaded machine: the tries go on for a while.
  const absl::Time start = absl::Now();
  bool cancelled = false;
  for (int i = 0; p == nullptr && absl::Now() - start < absl::Seconds(20); ++i) {
    if (!cancelled && absl::Now() - start > absl::Seconds(4)) {
      for (uint32_t id : jobs_) {
        CmdResult c = cluster_->Cli(absl::StrCat("scancel ", id));
        Count("slurm.scancel", c.rc == 0);
      }
      jobs_.clear();
      cancelled = true;
    }
    if (i >= 10) absl::SleepFor(absl::Milliseconds(200));
    std::vector<std::string> stale;
    for (const auto& [name, q] : pods_) {
      if (q.finished || (q.node.empty() && i % 4 == 3)) stale.push_back(name);
    }
    for (const std::string& name : stale) OpPodDelete(name);
    OpPodCreate();
    OpPodSchedule();
    p = find();
  }
  if (p == nullptr) {
    std::cerr << "soak: " << kind << ": no pod to hold or release (" << pods_.size() << " pods, "
              << cordoned_.size() << " nodes cordoned, " << jobs_.size() << " Slurm jobs)\n";
    return false;
  }
  grpc::Status s;
  std::ofstream(fault_file_) << word << "\n";
  if (!p->hold) {
    s = Hold(*p, p->node, PlaceholderGpus(*p, false));
    Count("grpc.pod_hold", !s.ok());
  } else {
    // A release is a journal write too.
    bool released = false;
    s = Release(*p, p->node, &released);
    Count("grpc.pod_release", !s.ok());
    if (s.ok() && !released) s = grpc::Status(grpc::StatusCode::UNKNOWN, "nothing released");
  }
  fs::remove(fault_file_);
  if (s.ok()) {
    // I3: an answer means durable; the journal could not write.
    Violation(absl::StrCat("I3: a change for pod ", p->name,
                           " acknowledged while the journal failed with ", word));
    return true;
  }
  if (s.error_code() != grpc::StatusCode::UNAVAILABLE) {
    // Refused before anything was written (e.g. the placeholder's devices
    // changed since they were read): the journal was not reached.
    std::cerr << "soak: " << kind << ": the change was refused before the journal ("
              << s.error_message() << ")\n";
    return false;
  }
  // The journal stays failed for good: the bridge exits with status 3 for a
  // restart, and until it has, says so on grpc.health.v1 (readiness) rather
  // than look healthy.
  auto health = grpc::health::v1::Health::NewStub(bridge_->channel());
  int exit_status = -1;
  const bool gave_up = WaitFor(
      [&] {
        if ((exit_status = bridge_->ExitStatus()) >= 0) return true;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
        grpc::health::v1::HealthCheckResponse resp;
        return health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok() &&
               resp.status() == grpc::health::v1::HealthCheckResponse::NOT_SERVING;
      },
      absl::Seconds(5));
  if (!gave_up) {
    Violation(absl::StrCat("journal failed with ", word, " but duet-bridge reports SERVING"));
  } else if (WaitFor([&] { return (exit_status = bridge_->ExitStatus()) >= 0; },
                     absl::Seconds(10)) &&
             exit_status != 3) {
    Violation(absl::StrCat("journal failed with ", word, ": duet-bridge exited with status ",
                           exit_status, ", not 3"));
  } else if (exit_status < 0) {
    Violation(absl::StrCat("journal failed with ", word, ": duet-bridge did not exit for a restart"));
  }
  // The remedy is a restart (kubelet's, here ours).
  bridge_->Kill(SIGKILL);
  return StartBridge() || (std::cerr << "soak: restart after " << kind << " failed\n", false);
}

bool Soak::InjectFault(const std::string& kind) {
  mark_ = absl::Now();
  const absl::Time injected_at = mark_;
  bool injected = false;
  if (kind == "bridge_kill9") {
    bridge_->Kill(SIGKILL);
    injected = StartBridge();
  } else if (kind == "slurmctld_restart") {
    cluster_->CtldStop();
    injected = cluster_->CtldStart();
  } else if (kind == "watch_drop") {
    injected = fake_->Control("drop").value("watches", 0) > 0;
  } else if (kind == "watch_410") {
    fake_->Control("compact", {{"expire_watches", true}});
    injected = true;
  } else if (kind == "watch_duplicate" || kind == "watch_reorder") {
    const std::string stat = kind == "watch_duplicate" ? "duplicated" : "reordered";
    const int before = fake_->Control("stats").value(stat, 0);
    fake_->Control("mangle", {{kind == "watch_duplicate" ? "duplicate" : "reorder", 20}});
    // Node and pod churn makes the events the fault mangles.
    for (int i = 0; i < 12; ++i) {
      if (i % 3 == 0) OpNodeCordon();
      if (i % 3 == 1) OpPodSchedule();
      if (i % 3 == 2) OpPodFinish();
    }
    WaitFor([&] { return fake_->Control("stats").value(stat, 0) > before; }, absl::Seconds(3));
    injected = fake_->Control("stats").value(stat, 0) > before;
    fake_->Control("mangle", {{"duplicate", 0}, {"reorder", 0}});
  } else if (kind == "journal_enospc") {
    injected = JournalFault("ENOSPC", kind);
  } else if (kind == "journal_eio") {
    injected = JournalFault("EIO", kind);
  }
  const absl::Time healed = absl::Now();
  last_heal_ = healed;
  if (!injected) {
    std::cerr << "soak: fault " << kind << " could not be injected now; retried later\n";
    ++faults_[kind + ".not_injected"];
    return false;
  }
  ++faults_[kind];
  outage_s_[kind].push_back(absl::ToDoubleSeconds(healed - injected_at));
  Converge(kind, healed);
  return true;
}

// ------------------------------------------------------------------- checker

Snapshot Soak::Read() {
  Snapshot s;
  if (stub_ == nullptr) return s;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListHoldingsResponse resp;
  if (!stub_->ListHoldings(&ctx, v1::ListHoldingsRequest(), &resp).ok()) return s;
  for (const v1::Holding& h : resp.holdings()) {
    duet::testing::LedgerHolding l = duet::testing::ToLedgerHolding(h);
    // The soak's pods are all in "default", known by name; its nodes have GPUs only.
    if (l.kind == "pod") l.pod = h.owner().pod().name();
    s.holdings.push_back(std::move(l));
  }
  CmdResult c = cluster_->Cli("scontrol -d show job");
  if (c.rc != 0 && !absl::StrContains(c.out, "No jobs")) return s;
  for (SlurmJob& j : ParseScontrolJobs(c.out)) s.jobs[j.id] = std::move(j);
  absl::StatusOr<std::string> pods = fake_->control()->Get("/api/v1/namespaces/default/pods");
  if (!pods.ok()) return s;
  json list = json::parse(*pods, nullptr, false);
  if (!list.is_object()) return s;
  for (const json& p : list["items"]) s.pods[p["metadata"]["name"].get<std::string>()] = p;
  s.ok = true;
  return s;
}

void Soak::Violation(const std::string& what) {
  ++violations_;
  if (quiet_) return;
  if (violation_text_.size() < 50) violation_text_.push_back(what);
  std::cerr << "soak: VIOLATION " << what << "\n";
}

std::set<std::string> Soak::Check(const Snapshot& s) {
  ++checks_;
  std::set<std::string> disc;
  // Slurm's live jobs with devices: those are the jobs that hold in Slurm.
  auto job_live = [&](uint32_t id) {
    auto it = s.jobs.find(id);
    return it != s.jobs.end() && !it->second.gpus.empty();
  };
  auto pod_live = [&](const std::string& name, const std::string& uid) {
    auto it = s.pods.find(name);
    if (it == s.pods.end()) return false;
    const json& p = it->second;
    if (p["metadata"].value("uid", "") != uid) return false;
    const std::string phase = p["status"].value("phase", "");
    return phase != "Succeeded" && phase != "Failed";
  };
  std::map<std::string, uint32_t> placeholder_of;  // pod uid@node -> job
  std::map<std::string, std::string> pod_name_of;   // uid -> name (ledger)
  for (const auto& h : s.holdings) {
    if (h.kind == "placeholder") placeholder_of[h.pod_uid + "@" + h.node] = h.job_id;
  }
  // Logical owner of a ledger holding: a step is its job, a pod is its
  // placeholder's job when it has one on that node.
  auto owner_of = [&](const duet::testing::LedgerHolding& h) -> std::string {
    if (h.kind == "pod") {
      auto it = placeholder_of.find(h.pod_uid + "@" + h.node);
      return it != placeholder_of.end() ? absl::StrCat("job:", it->second) : "pod:" + h.pod_uid;
    }
    return absl::StrCat("job:", h.job_id);
  };
  auto live = [&](const duet::testing::LedgerHolding& h) {
    if (h.kind == "pod") {
      auto it = placeholder_of.find(h.pod_uid + "@" + h.node);
      if (it != placeholder_of.end()) return job_live(it->second);
      return pod_live(h.pod, h.pod_uid);
    }
    return job_live(h.job_id);
  };
  // I1 in the ledger alone: any two holders of one device, live or not.
  std::map<std::string, std::set<std::string>> ledger_owners;  // node/gpu -> owners
  std::map<std::string, std::set<std::string>> live_owners;
  for (const auto& h : s.holdings) {
    for (const auto& [kind, idx] : h.devices) {
      for (uint32_t i : idx) {
        const std::string dev = absl::StrCat(h.node, "/", kind, i);
        ledger_owners[dev].insert(owner_of(h));
        if (live(h)) live_owners[dev].insert(owner_of(h));
      }
    }
  }
  for (const auto& [id, j] : s.jobs) {
    for (const auto& [node, idx] : j.gpus) {
      for (uint32_t i : idx) live_owners[absl::StrCat(node, "/gpu", i)].insert(absl::StrCat("job:", id));
    }
  }
  for (const auto& [dev, owners] : ledger_owners) {
    if (owners.size() > 1) {
      Violation(absl::StrCat("I1 (ledger): ", dev, " held by ", absl::StrJoin(owners, ", ")));
    }
  }
  for (const auto& [dev, owners] : live_owners) {
    if (owners.size() > 1) {
      Violation(absl::StrCat("I1 (live): ", dev, " held by ", absl::StrJoin(owners, ", ")));
    }
  }

  // I2: every live bound pod of the soak has a live placeholder with the
  // same devices in the ledger and in Slurm.
  for (const auto& [name, p] : s.pods) {
    const std::string node = p["spec"].value("nodeName", "");
    const std::string uid = p["metadata"].value("uid", "");
    if (node.empty() || !pod_live(name, uid)) continue;
    auto it = placeholder_of.find(uid + "@" + node);
    if (it == placeholder_of.end()) {
      disc.insert(absl::StrCat("I2: bound pod ", name, " on ", node, " has no placeholder"));
      continue;
    }
    auto jt = s.jobs.find(it->second);
    if (jt == s.jobs.end() || !jt->second.gpus.count(node)) {
      disc.insert(absl::StrCat("I2: pod ", name, "'s placeholder ", it->second,
                               " is not live in Slurm"));
    }
  }
  for (const auto& h : s.holdings) {
    if (h.kind == "placeholder") {
      bool found = false;
      for (const auto& [name, p] : s.pods) {
        if (p["metadata"].value("uid", "") == h.pod_uid && pod_live(name, h.pod_uid)) found = true;
      }
      if (!found) {
        disc.insert(absl::StrCat("I2: placeholder ", h.job_id, " of pod ", h.pod_uid,
                                 " outlives its pod"));
      }
    }
    if (h.kind == "pod" && !pod_live(h.pod, h.pod_uid)) {
      disc.insert(absl::StrCat("I2: holding of pod ", h.pod, " outlives its pod"));
    }
  }
  for (const auto& [id, j] : s.jobs) {
    if (!absl::StartsWith(j.name, "duet-pod:") || j.gpus.empty()) continue;
    const std::string name = j.name.substr(j.name.find('/') + 1);
    auto it = s.pods.find(name);
    if (it == s.pods.end() || !pod_live(name, it->second["metadata"].value("uid", ""))) {
      disc.insert(absl::StrCat("I2: Slurm placeholder ", id, " of ", name, " outlives its pod"));
    }
  }
  // I4: the ledger mirrors Slurm's jobs on their devices.
  std::map<std::string, std::set<uint32_t>> ledger_job;  // job@node -> gpus (job/placeholder)
  for (const auto& h : s.holdings) {
    if (h.kind == "slurm_job" || h.kind == "placeholder") {
      auto it = h.devices.find("gpu");
      ledger_job[absl::StrCat(h.job_id, "@", h.node)] =
          it == h.devices.end() ? std::set<uint32_t>{} : it->second;
      if (!job_live(h.job_id)) {
        disc.insert(absl::StrCat("I4: ledger holds ", h.kind, " ", h.job_id, " on ", h.node,
                                 ", not live in Slurm"));
      }
    }
    if (h.kind == "slurm_step" && !job_live(h.job_id)) {
      disc.insert(absl::StrCat("I4: ledger holds step ", h.job_id, ".", h.step_id,
                               ", job not live in Slurm"));
    }
  }
  for (const auto& [id, j] : s.jobs) {
    for (const auto& [node, idx] : j.gpus) {
      auto it = ledger_job.find(absl::StrCat(id, "@", node));
      if (it == ledger_job.end()) {
        disc.insert(absl::StrCat("I4: Slurm job ", id, " on ", node, " not in the ledger"));
      } else if (it->second != idx) {
        disc.insert(absl::StrCat("I4: job ", id, " on ", node, ": ledger [",
                                 absl::StrJoin(it->second, ","), "] Slurm [",
                                 absl::StrJoin(idx, ","), "]"));
      }
    }
  }
  return disc;
}

bool Soak::SelfCheck() {
  auto holding = [](const std::string& kind, uint32_t job, const std::string& uid,
                    std::set<uint32_t> gpus) {
    duet::testing::LedgerHolding h;
    h.node = "soak-a";
    h.kind = kind;
    h.job_id = job;
    h.pod_uid = uid;
    h.pod = "p";
    h.devices["gpu"] = std::move(gpus);
    return h;
  };
  json pod = {{"metadata", {{"name", "p"}, {"uid", "u1"}}},
              {"spec", {{"nodeName", "soak-a"}}},
              {"status", {{"phase", "Running"}}}};
  SlurmJob job7{7, "wrap", "RUNNING", {{"soak-a", {0, 1}}}};
  SlurmJob job8{8, "duet-pod:default/p", "RUNNING", {{"soak-a", {2}}}};
  const uint64_t before = violations_;
  bool ok = true;
  quiet_ = true;
  // Consistent: job 7 imported, pod p with placeholder 8 and its own holding.
  Snapshot good;
  good.holdings = {holding("slurm_job", 7, "", {0, 1}), holding("placeholder", 8, "u1", {2}),
                   holding("pod", 0, "u1", {2})};
  good.jobs = {{7, job7}, {8, job8}};
  good.pods = {{"p", pod}};
  ok &= Check(good).empty() && violations_ == before;
  // I1: Slurm runs job 9 on GPU 2, which pod p's placeholder holds.
  Snapshot i1 = good;
  i1.jobs[9] = SlurmJob{9, "wrap", "RUNNING", {{"soak-a", {2}}}};
  Check(i1);
  ok &= violations_ == before + 1;
  // I2: pod p is gone but its placeholder stays; I4: job 9 not imported.
  Snapshot i2 = good;
  i2.pods.clear();
  i2.jobs[9] = SlurmJob{9, "wrap", "RUNNING", {{"soak-a", {5}}}};
  std::set<std::string> d = Check(i2);
  ok &= d.size() >= 3;
  violations_ = before;
  violation_text_.clear();
  quiet_ = false;
  if (!ok) std::cerr << "soak: the checker's self-check failed\n";
  return ok;
}

void Soak::CheckNow() {
  Snapshot s = Read();
  if (!s.ok) return;
  std::set<std::string> disc = Check(s);
  const absl::Time now = absl::Now();
  for (auto it = first_seen_.begin(); it != first_seen_.end();) {
    it = disc.count(it->first) ? std::next(it) : first_seen_.erase(it);
  }
  for (const std::string& d : disc) {
    absl::Time& t = first_seen_.emplace(d, now).first->second;
    const absl::Time from = std::max(t, last_heal_);
    if (now - from > absl::Seconds(o_.bound_s) && reported_.insert(d).second) {
      Violation(absl::StrCat(d, " (for ", absl::FormatDuration(now - from), ")"));
    }
  }
}

void Soak::Converge(const std::string& kind, absl::Time healed) {
  std::set<std::string> disc;
  while (absl::Now() - healed < absl::Seconds(o_.bound_s)) {
    Snapshot s = Read();
    if (s.ok) {
      disc = Check(s);
      if (disc.empty()) {
        converge_s_[kind].push_back(absl::ToDoubleSeconds(absl::Now() - healed));
        return;
      }
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  Violation(absl::StrCat("no convergence within ", o_.bound_s, " s after ", kind, ": ",
                         disc.empty() ? "checker could not read" : *disc.begin()));
}

void Soak::Run() {
  start_ = absl::Now();
  absl::Time next_slurm = start_;
  absl::Time next_fault = start_ + absl::Seconds(o_.fault_every_s);
  absl::Time next_node_churn = start_ + absl::Seconds(o_.fault_every_s / 2);
  size_t fault_i = 0;
  uint64_t next_check = o_.check_every;
  uint64_t next_progress = 10000;
  const absl::Time end =
      o_.duration_s > 0 ? start_ + absl::Seconds(o_.duration_s) : absl::InfiniteFuture();
  while (ops_ < o_.ops && absl::Now() < end) {
    const absl::Time now = absl::Now();
    if (now >= next_fault) {
      if (InjectFault(FaultKinds()[fault_i % FaultKinds().size()])) ++fault_i;
      next_fault = absl::Now() + absl::Seconds(o_.fault_every_s);
      continue;
    }
    if (now >= next_node_churn) {
      mark_ = absl::Now();
      OpNodeDeleteAdd();
      next_node_churn = absl::Now() + absl::Seconds(o_.fault_every_s);
      continue;
    }
    if (now >= next_slurm) {
      mark_ = absl::Now();
      OpSlurm();
      next_slurm = absl::Now() + absl::Milliseconds(o_.slurm_op_ms);
      continue;
    }
    mark_ = absl::Now();
    OneOp();
    if (ops_ >= next_check) {
      CheckNow();
      next_check = ops_ + o_.check_every;
    }
    if (ops_ >= next_progress) {
      std::cerr << "soak: " << ops_ << " ops, "
                << absl::StrFormat("%.0f", ops_ / absl::ToDoubleSeconds(absl::Now() - start_))
                << " ops/s, " << violations_ << " violations\n";
      next_progress += 10000;
    }
  }
  // The end: no more operations; everything must converge.
  last_heal_ = absl::Now();
  Converge("end", last_heal_);
  elapsed_ = absl::Now() - start_;
}

int Soak::Report() {
  json j;
  j["ops"] = ops_;
  j["seconds"] = absl::ToDoubleSeconds(elapsed_);
  j["ops_per_second"] = ops_ / std::max(1e-9, absl::ToDoubleSeconds(elapsed_));
  j["ops_by_kind"] = ops_by_kind_;
  j["errors_by_kind"] = errors_by_kind_;
  j["error_samples"] = error_sample_;
  j["faults"] = faults_;
  j["checks"] = checks_;
  j["violations"] = violations_;
  j["violation_samples"] = violation_text_;
  j["seed"] = o_.seed;
  std::printf("duet-soak: seed %llu, %llu operations in %.0f s (%.0f ops/s), %llu checks\n",
              static_cast<unsigned long long>(o_.seed), static_cast<unsigned long long>(ops_),
              absl::ToDoubleSeconds(elapsed_), j["ops_per_second"].get<double>(),
              static_cast<unsigned long long>(checks_));
  std::printf("%-26s %10s %8s %10s\n", "operation", "count", "errors", "mean ms");
  for (const auto& [k, n] : ops_by_kind_) {
    std::printf("%-26s %10llu %8llu %10.2f\n", k.c_str(), static_cast<unsigned long long>(n),
                static_cast<unsigned long long>(errors_by_kind_[k]),
                1000.0 * seconds_by_kind_[k] / static_cast<double>(n));
  }
  for (const auto& [k, samples] : error_sample_) {
    for (const std::string& e : samples) std::printf("  %s error: %s\n", k.c_str(), e.c_str());
  }
  std::printf("%-20s %8s %12s %14s %14s\n", "fault", "injected", "heal p50 s", "converge p50 s",
              "converge p99 s");
  json conv;
  std::vector<std::string> kinds = FaultKinds();
  kinds.push_back("end");
  bool all = true;
  for (const std::string& k : kinds) {
    const uint64_t n = k == "end" ? 1 : faults_[k];
    if (k != "end" && n == 0) all = false;
    std::printf("%-20s %8llu %12s %14s %14s\n", k.c_str(), static_cast<unsigned long long>(n),
                Percentile(outage_s_[k], 0.5).c_str(), Percentile(converge_s_[k], 0.5).c_str(),
                Percentile(converge_s_[k], 0.99).c_str());
    conv[k] = {{"n", converge_s_[k].size()},
               {"heal_p50", Percentile(outage_s_[k], 0.5)},
               {"heal_p99", Percentile(outage_s_[k], 0.99)},
               {"p50", Percentile(converge_s_[k], 0.5)},
               {"p99", Percentile(converge_s_[k], 0.99)}};
  }
  j["converge_seconds"] = conv;
  std::printf("violations: %llu\n", static_cast<unsigned long long>(violations_));
  for (const std::string& v : violation_text_) std::printf("  %s\n", v.c_str());
  if (!o_.json_out.empty()) std::ofstream(o_.json_out) << j.dump(2) << "\n";
  if (violations_ > 0) return 1;
  if (o_.require_all_faults && !all) {
    std::printf("FAIL: not every fault kind was injected\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace soak
}  // namespace duet

int main(int argc, char** argv) {
  duet::soak::Options o;
  CLI::App app{"duet-soak: randomized operations and faults against duet-bridge, Slurm and a "
               "fake Kubernetes API server, with an online invariant checker"};
  app.add_option("--ops", o.ops, "operations to run (stops at --duration too)");
  app.add_option("--duration", o.duration_s, "seconds to run at most (0: no limit)");
  app.add_option("--seed", o.seed, "RNG seed");
  app.add_option("--nodes", o.nodes, "Kubernetes/Slurm nodes of 8 GPUs (2..9)")->check(CLI::Range(2, 9));
  app.add_option("--max_pods", o.max_pods, "live pods at most");
  app.add_option("--slurm_op_ms", o.slurm_op_ms, "milliseconds between Slurm operations");
  app.add_option("--fault_every", o.fault_every_s, "seconds between faults");
  app.add_option("--bound", o.bound_s, "seconds an I2/I4 discrepancy may last after a fault");
  app.add_option("--check_every", o.check_every, "operations between checks");
  app.add_flag("--require_all_faults", o.require_all_faults,
               "fail unless every fault kind was injected");
  app.add_option("--json", o.json_out, "write the summary as JSON here");
  app.add_option("--keep", o.keep_dir, "keep the work directories (any value)");
  CLI11_PARSE(app, argc, argv);
  signal(SIGPIPE, SIG_IGN);
  duet::soak::Soak soak(o);
  int rc = 1;
  if (!soak.SelfCheckPublic()) return 1;
  if (soak.Setup()) {
    soak.Run();
    rc = soak.Report();
  }
  soak.Teardown();
  return rc;
}
