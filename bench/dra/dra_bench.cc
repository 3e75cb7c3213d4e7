// The DRA lending mode (docs/dra.md, issue 26 "Performance"), with the
// product's own code paths:
//
//   --mode webhook   admission latency. A real Ledger of --nodes nodes x 8
//                    H100s (bench/common/h100_node.h) with its real Journal
//                    in a directory under --dir (fsync on and off), a
//                    DeviceMap built through DeviceMap::Update from
//                    synthesized NVIDIA ResourceSlices (gpu-<minor>, uuid =
//                    the ledger device's id), a Lender whose LendMaker is
//                    bridge/slurm's Placeholders over tests/fakes' in-memory
//                    FakeSlurmClient (no slurmctld), and a RuleWriter that
//                    counts. --lent GPUs of every node are lent first. Then
//                    AdmissionReview JSON bodies of resourceclaims/status
//                    writes, each claim allocated one lent GPU of a random
//                    node and then deallocated again (the allocation
//                    removed), go (a) to WebhookHandler::Handle in process
//                    (parse + Lender::Review + Ledger::Rebind + journal wait
//                    + answer) and (b) over HTTPS to WebhookServer through
//                    libcurl (k8s_adapter's KubeClient, which keeps its
//                    connection alive), one request at a time; with
//                    --clients N (N > 1) the HTTPS part runs N clients at
//                    once, each its own keep-alive connection and its own
//                    nodes (node i is client i % N's), so their allocations
//                    never ask for the same GPU; journal fsyncs per
//                    admission are counted over that part. The server has
//                    2 io threads and --webhook_threads threads for
//                    admissions (dra.webhook.admission_threads, the
//                    product's default: 16), which bounds how many
//                    admissions wait for the journal together.
//   --mode map       DeviceMap at --nodes nodes x 8 H100s of NVIDIA-shaped
//                    ResourceSlices (one slice per node): a full
//                    DeviceMap::Update of every slice, and one node's slice
//                    changed (gpu-0's uuid wrong, then right again) applied
//                    through DeviceMap::Apply (what dra_mode's slice informer
//                    now does) and, for comparison, through a full Update
//                    (what it did before), --requests changes per run.
//   --mode lend      Lender::Lend(node, gpu, n) from the call to its rules
//                    deleted: Placeholders over the fake slurmctld, which
//                    sleeps --slurm_ms per RPC (AllocatePlaceholder, KillJob),
//                    and the real TaintRules sending DELETEs to
//                    tests/fakes/fake_apiserver.py (Kubernetes 1.37, v1
//                    DeviceTaintRules). After each lend its devices are
//                    reclaimed (Lender::Reclaim: POST, claim LIST (a fake that
//                    finds no claim), lend job cancelled), timed apart; the
//                    admission grace is skipped on a simulated clock. Also
//                    the real TaintRules::Resync with nothing to change.
//   --mode churn     rule writes and bridge CPU under churn, on a simulated
//                    clock: pods asking 1/2/4/8 GPUs (50/25/15/10%) arrive at
//                    --arrivals per second and stay an exponential
//                    --lifetime on average; each takes lent, free GPUs of one
//                    node (admitted by Lender::Review) or, when no node has
//                    enough, makes the Lender lend them on a node with room
//                    (lend on demand); leaving, its allocation is removed
//                    (Review of the deallocation). Lender::Tick runs every
//                    simulated second (warm buffer --warm, reclaim after
//                    --reclaim_after s idle), Lender::ReconcileRules (the
//                    dirty nodes' rules) every simulated second and the full
//                    Lender::Resync every dra::kFullRuleResync, as
//                    bridge/server/dra_mode.cc does (its loop reconciles
//                    each 200 ms: the same work in smaller passes).
//                    --rule_pass full30 runs the former schedule instead
//                    (only the full Resync, every 30 s), for comparison. Node i's first i % 4
//                    GPUs are held by a Slurm job. Counts rule writes
//                    (creates, deletes) per lend, per reclaim and per second,
//                    rules at rest, and the CPU time of the calling thread in
//                    each Lender call (no journal: durability is immediate).
//                    Also DesiredTainted() and the first Resync() at --nodes.
//   --mode e2e-lend  from a pod marked Unschedulable to its devices lent, as
//                    duet-bridge runs it: the real DraMode (bridge/server, made
//                    as Bridge::StartDra makes it: its pending-pod informer,
//                    its loop, demand, the placement scorer, the Lender, the
//                    real TaintRules) over a fresh tests/fakes/fake_apiserver.py
//                    (1.37) per run, --e2e_nodes H100 nodes of the lending pool
//                    with NVIDIA slices and the DeviceClass serving
//                    nvidia.com/gpu (KEP-5004), and Placeholders over the fake
//                    slurmctld sleeping --slurm_ms per RPC (concurrent RPCs
//                    side by side; --slurm_serial: one at a time, as a real
//                    slurmctld's job write lock has them). Each pod asks
//                    nvidia.com/gpu: N (--counts); it is created pending, then
//                    after a random gap (--gap_ms) its PodScheduled=False /
//                    Unschedulable condition is written as kube-scheduler
//                    writes it, and the time runs until the benchmark's own
//                    watch of DeviceTaintRules has seen the pod's N rule
//                    deletions (per node, each N deletions in order are one
//                    pod's: exact for N = 1 and for pods of a node each).
//                    --pods pods one at a time, then --pods in bursts of
//                    --burst. After each sample the pods are deleted and the
//                    lent devices reclaimed (Lender::Reclaim), so every sample
//                    starts from all devices tainted. Not part of --mode all.
//
//   dra_bench --mode webhook|lend|churn|all|e2e-lend|map [--nodes 500,1000,5000] ...
//
// Prints one JSON line per configuration and repetition, then a summary
// (medians over --reps). Exits non-zero when anything the benchmark relies
// on fails (a refused admission, a lend that lent nothing, the counted rules
// differing from DesiredTainted()), never on timing.

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/common/h100_node.h"
#include "bench/common/quantile.h"
#include "bridge/config/config.h"
#include "bridge/dra/lender.h"
#include "bridge/journal/journal.h"
#include "bridge/ledger/ledger.h"
#include "bridge/server/dra_mode.h"
#include "bridge/slurm/placeholders.h"
#include "common/clock.h"
#include "k8s_adapter/dra/device_map.h"
#include "k8s_adapter/dra/taint_rules.h"
#include "k8s_adapter/dra/webhook.h"
#include "k8s_adapter/informer.h"
#include "k8s_adapter/kube_client.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "tests/fakes/fake_slurm.h"
#include "tests/k8s_adapter/dra/review_fixture.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace {

using json = nlohmann::json;
constexpr char kGpuDriver[] = "gpu.nvidia.com";
constexpr char kPool[] = "a3-highgpu";  // bench::H100Node's node pool

struct Flags {
  std::string mode = "all";
  std::vector<int> nodes = {500, 1000, 5000};
  int reps = 3;
  // webhook
  int requests = 2000;  // admissions per run (half allocations, half deallocations)
  int lent = 2;         // GPUs lent per node before the admissions
  std::string fsync = "both";
  bool https = true;
  std::vector<int> clients = {1};  // HTTPS clients at once, comma separated
  int webhook_threads = 16;         // WebhookOptions::admission_threads (the product's default)
  std::string dir;
  // lend
  int lend_nodes = 40;  // nodes lent on (each once per count and run)
  std::vector<int> counts = {1, 8};
  std::vector<double> slurm_ms = {5, 20};
  // churn
  int sim_seconds = 900;
  double arrivals = 5;
  double lifetime = 60;
  int warm = 8;
  int reclaim_after = 60;
  // e2e-lend (also --counts, --slurm_ms, --reps)
  int e2e_nodes = 16;
  int pods = 50;      // pods one at a time, and again in bursts
  int burst = 10;
  double gap_ms = 250;  // random wait before each Unschedulable write
  bool slurm_serial = false;  // the fake slurmctld answers one RPC at a time
  // churn: "incremental" (dra_mode now) or "full30" (the full Resync every
  // 30 s and nothing else, as dra_mode did before the incremental reconcile).
  std::string rule_pass = "incremental";
};

std::atomic<bool> failed{false};  // set by the webhook mode's client threads too
void Fail(const std::string& what) {
  std::fprintf(stderr, "dra_bench: FAILED: %s\n", what.c_str());
  failed = true;
}

double ThreadCpuMicros() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}
double Micros(absl::Time start) { return absl::ToDoubleMicroseconds(absl::Now() - start); }

// ---------------------------------------------------------------------------
// Doubles of the Lender's seams (what is not the product's code).

// A clock that only moves when told; a wait for a deadline not yet reached
// jumps there (and is counted), so a reclaim's admission grace never sleeps.
class SimClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  bool AwaitWithDeadline(absl::Mutex*, const absl::Condition& cond,
                         absl::Time deadline) const override {
    if (cond.Eval()) return true;
    absl::MutexLock lock(&mu_);
    if (deadline > now_) {
      now_ = deadline;
      ++jumps_;
    }
    return false;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  int jumps() const {
    absl::MutexLock lock(&mu_);
    return jumps_;
  }

 private:
  mutable absl::Mutex mu_;
  mutable absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1'800'000'000);
  mutable int jumps_ ABSL_GUARDED_BY(mu_) = 0;
};

// tests/fakes' slurmctld with a fixed time per allocation and kill (what a
// libslurm RPC costs; 0: none).
class SlowSlurm final : public SlurmClient {
 public:
  // `serial`: one RPC at a time (a real slurmctld serialises job
  // allocations and cancels under its job write lock); else concurrent RPCs
  // each sleep their own time.
  explicit SlowSlurm(absl::Duration rpc, bool serial = false) : rpc_(rpc), serial_(serial) {}
  fakes::FakeSlurmClient& fake() { return fake_; }
  absl::Status Ping() override { return fake_.Ping(); }
  absl::StatusOr<std::vector<SlurmNodeInfo>> ListNodes() override { return fake_.ListNodes(); }
  absl::StatusOr<std::optional<SlurmNodeInfo>> GetNode(const std::string& n) override {
    return fake_.GetNode(n);
  }
  absl::Status CreateNode(const SlurmNodeConfig& c) override { return fake_.CreateNode(c); }
  absl::Status UpdateNode(const SlurmNodeUpdate& u) override { return fake_.UpdateNode(u); }
  absl::Status DeleteNode(const std::string& n) override { return fake_.DeleteNode(n); }
  absl::StatusOr<SlurmAllocation> AllocatePlaceholder(const SlurmAllocRequest& r) override {
    Rpc();
    return fake_.AllocatePlaceholder(r);
  }
  absl::StatusOr<SlurmGangAllocation> AllocateGang(const SlurmGangRequest& r) override {
    Rpc();
    return fake_.AllocateGang(r);
  }
  absl::Status KillJob(uint32_t job) override {
    Rpc();
    return fake_.KillJob(job);
  }
  absl::StatusOr<std::vector<SlurmJobInfo>> ListJobs() override { return fake_.ListJobs(); }
  absl::StatusOr<std::optional<SlurmJobInfo>> GetJob(uint32_t job) override {
    return fake_.GetJob(job);
  }

 private:
  void Rpc() {
    if (rpc_ <= absl::ZeroDuration()) return;
    if (!serial_) {
      absl::SleepFor(rpc_);
      return;
    }
    absl::MutexLock lock(&serial_mu_);
    absl::SleepFor(rpc_);
  }
  const absl::Duration rpc_;
  const bool serial_;
  absl::Mutex serial_mu_;
  fakes::FakeSlurmClient fake_{8, 5000};
};

// The DeviceTaintRules as a set: counts the requests TaintRules would send
// and the rules that exist.
class CountingRules final : public dra::RuleWriter {
 public:
  absl::Status Taint(const std::vector<dra::DraDevice>& devices) override {
    absl::MutexLock lock(&mu_);
    for (const dra::DraDevice& d : devices) {
      ++creates_;
      drivers_.insert(d.driver);
      rules_.insert(d);
    }
    return absl::OkStatus();
  }
  absl::Status Untaint(const std::vector<dra::DraDevice>& devices) override {
    absl::MutexLock lock(&mu_);
    for (const dra::DraDevice& d : devices) {
      ++deletes_;
      rules_.erase(d);
    }
    return absl::OkStatus();
  }
  absl::Status Resync(const std::vector<dra::DraDevice>& tainted) override {
    absl::MutexLock lock(&mu_);
    std::set<dra::DraDevice> want(tainted.begin(), tainted.end());
    for (const dra::DraDevice& d : want) {
      if (!rules_.count(d)) ++resync_creates_;
    }
    for (const dra::DraDevice& d : rules_) {
      if (!want.count(d)) ++resync_deletes_;
    }
    for (const dra::DraDevice& d : want) drivers_.insert(d.driver);
    rules_ = std::move(want);
    return absl::OkStatus();
  }
  absl::Status ResyncPool(const std::string& pool,
                          const std::vector<dra::DraDevice>& tainted) override {
    absl::MutexLock lock(&mu_);
    ++pool_calls_;
    std::set<dra::DraDevice> want(tainted.begin(), tainted.end());
    for (const std::string& driver : drivers_) {
      for (auto it = rules_.lower_bound({driver, pool, ""});
           it != rules_.end() && it->driver == driver && it->pool == pool;) {
        if (want.erase(*it) == 0) {
          ++resync_deletes_;
          it = rules_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const dra::DraDevice& d : want) {
      ++resync_creates_;
      drivers_.insert(d.driver);
      rules_.insert(d);
    }
    return absl::OkStatus();
  }
  void SetDriftListener(dra::RuleDriftListener*) override {}  // nobody else writes here
  uint64_t pool_calls() const { absl::MutexLock l(&mu_); return pool_calls_; }
  uint64_t creates() const { absl::MutexLock l(&mu_); return creates_; }
  uint64_t deletes() const { absl::MutexLock l(&mu_); return deletes_; }
  uint64_t resync_writes() const {
    absl::MutexLock l(&mu_);
    return resync_creates_ + resync_deletes_;
  }
  size_t rules() const { absl::MutexLock l(&mu_); return rules_.size(); }
  std::set<dra::DraDevice> set() const { absl::MutexLock l(&mu_); return rules_; }

 private:
  mutable absl::Mutex mu_;
  std::set<dra::DraDevice> rules_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> drivers_ ABSL_GUARDED_BY(mu_);  // of the rules ever seen
  uint64_t pool_calls_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t creates_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t deletes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t resync_creates_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t resync_deletes_ ABSL_GUARDED_BY(mu_) = 0;
};

// The quorum LIST finds no claim (the benchmark's claims are all given back
// before a reclaim).
class NoClaims final : public dra::ClaimLister {
 public:
  absl::StatusOr<std::vector<dra::AllocatedClaim>> ListAllocated() override {
    return std::vector<dra::AllocatedClaim>{};
  }
  absl::StatusOr<std::optional<dra::AllocatedClaim>> GetClaim(const dra::ClaimRef&) override {
    return std::optional<dra::AllocatedClaim>();
  }
};

// ---------------------------------------------------------------------------
// The cluster: ledger (+ journal), fake Slurm, device map, Lender.

// Node i's ResourceSlice as the NVIDIA driver publishes it (one slice per
// node, pool = node name, whole GPUs gpu-<minor> with the inventory's uuid).
json NvidiaSlice(const NodeSpec& node) {
  json devices = json::array();
  for (const DeviceSpec& d : node.devices) {
    devices.push_back(
        {{"name", absl::StrCat("gpu-", d.index)},
         {"attributes",
          {{"productName", {{"string", "NVIDIA H100 80GB HBM3"}}},
           {"type", {{"string", "gpu"}}},
           {"uuid", {{"string", d.id}}},
           {"driverVersion", {{"version", "550.90.7"}}},
           {"pcieBusID", {{"string", absl::StrCat("0000:", 16 * (d.index + 1), ":00.0")}}}}},
         {"capacity", {{"memory", {{"value", "80Gi"}}}}}});
  }
  return {{"apiVersion", "resource.k8s.io/v1"},
          {"kind", "ResourceSlice"},
          {"metadata", {{"name", absl::StrCat(node.name, "-gpu.nvidia.com")}}},
          {"spec",
           {{"driver", kGpuDriver},
            {"nodeName", node.name},
            {"pool", {{"name", node.name}, {"generation", 1}, {"resourceSliceCount", 1}}},
            {"devices", devices}}}};
}

struct ClusterOptions {
  int nodes = 0;
  std::string journal_dir;  // "" = no journal (durable at once)
  bool fsync = false;
  absl::Duration slurm_rpc;
  int slurm_used_mod = 0;  // node i: its first i % mod GPUs held by a Slurm job (0: none)
  dra::RuleWriter* rules = nullptr;
  dra::LenderOptions lender;
};

struct Cluster {
  Ledger ledger;
  std::unique_ptr<Journal> journal;
  std::unique_ptr<SlowSlurm> slurm;
  std::unique_ptr<Placeholders> lends;
  std::unique_ptr<k8s_dra::DeviceMap> map;
  NoClaims claims;
  SimClock clock;
  std::unique_ptr<dra::Lender> lender;
  std::vector<std::string> names;
  double map_update_ms = 0;
};

std::unique_ptr<Cluster> MakeCluster(const ClusterOptions& o) {
  auto c = std::make_unique<Cluster>();
  if (!o.journal_dir.empty()) {
    std::filesystem::remove_all(o.journal_dir);
    Journal::Options jo;
    jo.dir = o.journal_dir;
    jo.fsync = o.fsync;
    absl::StatusOr<std::unique_ptr<Journal>> j = Journal::Open(jo, &c->ledger);
    if (!j.ok()) {
      Fail(absl::StrCat("journal: ", j.status().ToString()));
      return nullptr;
    }
    c->journal = *std::move(j);
  }
  c->slurm = std::make_unique<SlowSlurm>(o.slurm_rpc);
  c->lends = std::make_unique<Placeholders>(&c->ledger, c->slurm.get());
  std::vector<json> slices;
  k8s_dra::LedgerInventory inv;
  for (int i = 0; i < o.nodes; ++i) {
    NodeSpec spec = bench::H100Node(i);
    c->names.push_back(spec.name);
    if (absl::Status s = c->ledger.UpsertNode(spec).status(); !s.ok()) {
      Fail(s.ToString());
      return nullptr;
    }
    slices.push_back(NvidiaSlice(spec));
    for (const DeviceSpec& d : spec.devices) inv[spec.name].push_back({d.kind, d.index, d.id});
    const uint32_t used = o.slurm_used_mod > 0 ? static_cast<uint32_t>(i % o.slurm_used_mod) : 0;
    if (used > 0) {
      HoldRequest h;
      h.node = spec.name;
      h.owner = Owner::SlurmJob(static_cast<uint32_t>(10'000'000 + i));
      for (uint32_t g = 0; g < used; ++g) h.devices.push_back({DeviceKind::kGpu, g, kWholeDevice});
      if (!c->ledger.Hold(h).ok()) Fail("slurm hold");
      c->slurm->fake().Use(spec.name, 0, used);
    }
  }
  c->map = std::make_unique<k8s_dra::DeviceMap>(std::vector<std::string>{kGpuDriver});
  const absl::Time t = absl::Now();
  if (absl::Status s = c->map->Update(slices, inv); !s.ok()) {
    Fail(absl::StrCat("DeviceMap::Update: ", s.ToString()));
    return nullptr;
  }
  c->map_update_ms = Micros(t) / 1e3;
  if (!c->map->UnmappableNodes().empty()) Fail("the synthesized slices left nodes unmappable");
  dra::LenderOptions lo = o.lender;
  Ledger* ledger = &c->ledger;
  lo.pool_of = [ledger](const std::string& node) -> std::string {
    std::shared_ptr<const NodeView> v = ledger->GetNode(node);
    return v && v->spec.pool == kPool ? v->spec.pool : "";
  };
  Journal* journal = c->journal.get();
  dra::Lender::DurableWait durable;
  if (journal != nullptr) durable = [journal](uint64_t seq) { return journal->WaitDurable(seq); };
  c->lender = std::make_unique<dra::Lender>(&c->ledger, c->lends.get(), c->map.get(), o.rules,
                                            &c->claims, durable, &c->clock, lo);
  return c;
}

// ---------------------------------------------------------------------------
// --mode webhook

void Personalize(json& review, int i) {
  const std::string uid = absl::StrCat("claim-uid-", i);
  review["request"]["uid"] = absl::StrCat("review-", i);
  for (const char* o : {"object", "oldObject"}) {
    review["request"][o]["metadata"]["uid"] = uid;
    review["request"][o]["metadata"]["name"] = absl::StrCat("train-", i);
  }
}

struct WebhookFigures {
  std::vector<double> alloc_us, dealloc_us;
};

// One HTTPS phase of one run: its latencies (all clients), the journal's
// fsyncs and records per admission over the phase (each admission's release
// included), and admissions per second.
struct HttpsRun {
  WebhookFigures fig;
  double fsyncs_per_admission = 0;
  double records_per_admission = 0;
  double admissions_per_s = 0;
};

void Summarize(const char* label, const std::vector<WebhookFigures>& runs) {
  std::vector<double> a50, a99, d50, d99;
  for (const WebhookFigures& f : runs) {
    a50.push_back(bench::Quantile(f.alloc_us, 0.5));
    a99.push_back(bench::Quantile(f.alloc_us, 0.99));
    d50.push_back(bench::Quantile(f.dealloc_us, 0.5));
    d99.push_back(bench::Quantile(f.dealloc_us, 0.99));
  }
  std::printf(
      "  %-28s allocate p50/p99 %7.3f / %7.3f ms   deallocate p50/p99 %7.3f / %7.3f ms"
      "   (medians of %zu runs)\n",
      label, bench::Median(a50) / 1e3, bench::Median(a99) / 1e3, bench::Median(d50) / 1e3,
      bench::Median(d99) / 1e3, runs.size());
}

void RunWebhook(const Flags& f) {
  std::printf("== webhook admission latency: %d requests per run (half allocate, half "
              "deallocate), %d lent GPUs per node; in process one request at a time, HTTPS "
              "with %s clients at once\n",
              f.requests, f.lent, absl::StrJoin(f.clients, ",").c_str());
  std::vector<bool> fsyncs;
  if (f.fsync == "both" || f.fsync == "on") fsyncs.push_back(true);
  if (f.fsync == "both" || f.fsync == "off") fsyncs.push_back(false);
  const std::string tmp = k8s::testing::MakeTempDir();
  k8s::testing::TlsFiles tls;
  if (f.https) tls = k8s::testing::MakeTestCerts(tmp);
  for (int nodes : f.nodes) {
    for (bool fsync : fsyncs) {
      std::vector<WebhookFigures> direct;
      std::map<int, std::vector<HttpsRun>> https;  // by clients
      for (int rep = 0; rep < f.reps; ++rep) {
        CountingRules rules;
        ClusterOptions co;
        co.nodes = nodes;
        co.journal_dir = absl::StrCat(f.dir, "/dra-bench-journal-", getpid());
        co.fsync = fsync;
        co.rules = &rules;
        // The release's deliberate wait (admission_grace after the claim's
        // last admission) is not what is measured: zero here.
        co.lender.admission_grace = absl::ZeroDuration();
        std::unique_ptr<Cluster> c = MakeCluster(co);
        if (!c) return;
        for (const std::string& n : c->names) {
          auto lent = c->lender->Lend(n, DeviceKind::kGpu, static_cast<uint32_t>(f.lent));
          if (!lent.ok() || lent->size() != static_cast<size_t>(f.lent)) {
            Fail(absl::StrCat("lend on ", n, ": ", lent.status().ToString()));
            return;
          }
        }
        std::mt19937 rng(42 + rep);
        // The bodies, built before the clock runs: allocate gpu-g of a random
        // node to claim i; then claim i is gone and its device given back
        // (the fenced release the claim watch runs: a quorum read, here of a
        // lister that finds no claim, then the Rebind back to Lend).
        auto bodies = [&](int base, int n) {
          std::vector<std::pair<std::string, std::string>> out;
          for (int i = 0; i < n; ++i) {
            const std::string& node = c->names[rng() % c->names.size()];
            const std::string dev = absl::StrCat("gpu-", rng() % f.lent);
            json a = k8s_dra::testing::Review("v1", k8s_dra::testing::Allocation(node, dev));
            Personalize(a, base + i);
            out.emplace_back(a.dump(), absl::StrCat("claim-uid-", base + i));
          }
          return out;
        };
        const std::string target = absl::StrCat(k8s_dra::kAdmissionPath, "?timeout=10s");
        auto release = [&](const std::string& uid, double* us) {
          const absl::Time t = absl::Now();
          absl::Status st = c->lender->ReleaseClaimIfDeallocated(uid);
          if (us != nullptr) *us = Micros(t);
          if (!st.ok()) Fail(absl::StrCat("release ", uid, ": ", st.ToString()));
          return st.ok();
        };
        auto check = [&](int status, const std::string& body, const char* what) {
          if (status != 200 || body.find("\"allowed\":true") == std::string::npos) {
            Fail(absl::StrCat(what, ": ", status, " ", body.substr(0, 300)));
            return false;
          }
          return true;
        };
        // (a) in process.
        {
          k8s_dra::WebhookHandler handler(c->lender.get(), nullptr);
          const auto warm = bodies(1'000'000, 100);
          for (const auto& [a, uid] : warm) {
            handler.Handle("POST", target, a);
            if (!release(uid, nullptr)) return;
          }
          WebhookFigures fig;
          for (const auto& [a, uid] : bodies(0, f.requests / 2)) {
            absl::Time t = absl::Now();
            http::HttpReply r = handler.Handle("POST", target, a);
            fig.alloc_us.push_back(Micros(t));
            if (!check(r.status, r.body, "allocate")) return;
            double us = 0;
            if (!release(uid, &us)) return;
            fig.dealloc_us.push_back(us);
          }
          direct.push_back(std::move(fig));
        }
        // (b) over HTTPS, `n` keep-alive clients at once (node i is client
        // i % n's, so two clients never ask for the same GPU).
        std::map<int, HttpsRun> https_runs;
        if (f.https) {
          k8s_dra::WebhookOptions wo;
          wo.cert_file = tls.cert;
          wo.key_file = tls.key;
          wo.admission_threads = f.webhook_threads;
          auto server = k8s_dra::WebhookServer::Start(c->lender.get(), wo);
          if (!server.ok()) {
            Fail(server.status().ToString());
            return;
          }
          k8s::KubeConfig kc;
          kc.server = absl::StrCat("https://127.0.0.1:", (*server)->port());
          kc.ca_file = tls.ca;
          int base = 2'000'000;
          for (int n : f.clients) {
            std::vector<std::unique_ptr<k8s::KubeClient>> clients;
            for (int k = 0; k < n; ++k) {
              auto client = k8s::NewCurlKubeClient(kc);
              if (!client.ok()) {
                Fail(client.status().ToString());
                return;
              }
              clients.push_back(*std::move(client));
            }
            // Client k's bodies: allocations of GPUs of its own nodes.
            auto client_bodies = [&](int k, int first, int count) {
              std::mt19937 crng(static_cast<uint32_t>(1000 * rep + 17 * n + k));
              std::vector<std::pair<std::string, std::string>> out;
              const size_t mine = (c->names.size() - static_cast<size_t>(k) + n - 1) / n;
              for (int i = 0; i < count; ++i) {
                const size_t node = static_cast<size_t>(k) + n * (crng() % mine);
                const std::string dev = absl::StrCat("gpu-", crng() % f.lent);
                json a = k8s_dra::testing::Review(
                    "v1", k8s_dra::testing::Allocation(c->names[node], dev));
                Personalize(a, first + i);
                out.emplace_back(a.dump(), absl::StrCat("claim-uid-", first + i));
              }
              return out;
            };
            const int per_client = std::max(1, f.requests / 2 / n);
            std::vector<std::vector<std::pair<std::string, std::string>>> warm, timed;
            for (int k = 0; k < n; ++k) {
              warm.push_back(client_bodies(k, base, 20));
              base += 20;
              timed.push_back(client_bodies(k, base, per_client));
              base += per_client;
            }
            std::vector<WebhookFigures> per(static_cast<size_t>(n));
            Journal::Stats before;
            std::atomic<int> ready{0};
            std::atomic<bool> go{false};
            std::vector<std::thread> threads;
            for (int k = 0; k < n; ++k) {
              threads.emplace_back([&, k] {
                auto post = [&](const std::string& body, double* us) {
                  const absl::Time t = absl::Now();
                  absl::StatusOr<std::string> r = clients[k]->Post(target, body);
                  if (us != nullptr) *us = Micros(t);
                  return check(r.ok() ? 200 : 0, r.ok() ? *r : r.status().ToString(),
                               "https allocate");
                };
                for (const auto& [a, uid] : warm[k]) {
                  if (!post(a, nullptr) || !release(uid, nullptr)) return;
                }
                ++ready;
                while (!go.load()) std::this_thread::yield();
                for (const auto& [a, uid] : timed[k]) {
                  double us = 0;
                  if (!post(a, &us)) return;
                  per[k].alloc_us.push_back(us);
                  if (!release(uid, &us)) return;
                  per[k].dealloc_us.push_back(us);
                }
              });
            }
            while (ready.load() < n && !failed) std::this_thread::yield();
            before = c->journal->stats();
            const absl::Time start = absl::Now();
            go = true;
            for (auto& t : threads) t.join();
            const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
            const Journal::Stats after = c->journal->stats();
            if (failed) return;
            HttpsRun& run = https_runs[n];
            for (const WebhookFigures& w : per) {
              run.fig.alloc_us.insert(run.fig.alloc_us.end(), w.alloc_us.begin(), w.alloc_us.end());
              run.fig.dealloc_us.insert(run.fig.dealloc_us.end(), w.dealloc_us.begin(),
                                        w.dealloc_us.end());
            }
            const double admissions = static_cast<double>(run.fig.alloc_us.size());
            run.fsyncs_per_admission = static_cast<double>(after.fsyncs - before.fsyncs) / admissions;
            run.records_per_admission =
                static_cast<double>(after.records - before.records) / admissions;
            run.admissions_per_s = admissions / seconds;
            https[n].push_back(run);
          }
          (*server)->Stop();
        }
        const Journal::Stats js = c->journal->stats();
        json line = {{"mode", "webhook"},
                     {"nodes", nodes},
                     {"fsync", fsync},
                     {"rep", rep},
                     {"map_update_ms", c->map_update_ms},
                     {"direct_alloc_p50_us", bench::Quantile(direct.back().alloc_us, 0.5)},
                     {"direct_alloc_p99_us", bench::Quantile(direct.back().alloc_us, 0.99)},
                     {"direct_dealloc_p50_us", bench::Quantile(direct.back().dealloc_us, 0.5)},
                     {"direct_dealloc_p99_us", bench::Quantile(direct.back().dealloc_us, 0.99)},
                     {"journal_fsyncs", js.fsyncs},
                     {"journal_batches", js.batches}};
        for (const auto& [n, run] : https_runs) {
          // One client: the names of the runs before --clients.
          const std::string p = n == 1 ? "https_" : absl::StrCat("https_c", n, "_");
          line[p + "alloc_p50_us"] = bench::Quantile(run.fig.alloc_us, 0.5);
          line[p + "alloc_p99_us"] = bench::Quantile(run.fig.alloc_us, 0.99);
          line[p + "dealloc_p50_us"] = bench::Quantile(run.fig.dealloc_us, 0.5);
          line[p + "dealloc_p99_us"] = bench::Quantile(run.fig.dealloc_us, 0.99);
          line[p + "fsyncs_per_admission"] = run.fsyncs_per_admission;
          line[p + "records_per_admission"] = run.records_per_admission;
          line[p + "admissions_per_s"] = run.admissions_per_s;
        }
        std::printf("%s\n", line.dump().c_str());
        std::fflush(stdout);
        const std::string dir = co.journal_dir;
        c.reset();
        std::filesystem::remove_all(dir);
      }
      std::printf("%d nodes x 8 GPUs, journal fsync %s:\n", nodes, fsync ? "ON" : "OFF");
      Summarize("WebhookHandler::Handle", direct);
      for (const auto& [n, runs] : https) {
        std::vector<WebhookFigures> figs;
        std::vector<double> fsyncs_per, rate;
        for (const HttpsRun& r : runs) {
          figs.push_back(r.fig);
          fsyncs_per.push_back(r.fsyncs_per_admission);
          rate.push_back(r.admissions_per_s);
        }
        Summarize(absl::StrCat("HTTPS, ", n, n == 1 ? " client" : " clients").c_str(), figs);
        std::printf(
            "  %-28s journal fsyncs per admission %.2f (with its release), %.0f "
            "admissions/s\n",
            "", bench::Median(fsyncs_per), bench::Median(rate));
      }
    }
  }
  k8s::testing::RemoveTree(tmp);
}

// ---------------------------------------------------------------------------
// --mode map

void RunMap(const Flags& f) {
  std::printf("== DeviceMap: full Update vs one node's slice changed (Apply), %d changes per "
              "run\n", f.requests);
  for (int nodes : f.nodes) {
    std::vector<double> full_ms, apply_p50, apply_p99, apply_cpu_p99, full_one_p50;
    for (int rep = 0; rep < f.reps; ++rep) {
      std::vector<json> slices;
      k8s_dra::LedgerInventory inv;
      for (int i = 0; i < nodes; ++i) {
        NodeSpec spec = bench::H100Node(i);
        slices.push_back(NvidiaSlice(spec));
        for (const DeviceSpec& d : spec.devices) inv[spec.name].push_back({d.kind, d.index, d.id});
      }
      prometheus::Registry registry;
      k8s_dra::DeviceMap map({kGpuDriver}, &registry);
      absl::Time t = absl::Now();
      if (absl::Status s = map.Update(slices, inv); !s.ok()) {
        Fail(absl::StrCat("DeviceMap::Update: ", s.ToString()));
        return;
      }
      full_ms.push_back(Micros(t) / 1e3);
      if (!map.UnmappableNodes().empty()) Fail("the synthesized slices left nodes unmappable");
      std::mt19937 rng(7 + rep);
      // Node i's slice with gpu-0's uuid wrong (`bad`) or as published.
      auto changed_slice = [&](size_t i, bool bad) {
        json s = slices[i];
        if (bad) s["spec"]["devices"][0]["attributes"]["uuid"]["string"] = "GPU-wrong";
        return s;
      };
      // Apply: each change makes a random node unmappable, then mappable.
      std::vector<double> apply_us, apply_cpu_us;  // wall, and this thread's CPU
      for (int k = 0; k < f.requests; ++k) {
        const size_t i = rng() % slices.size();
        for (bool bad : {true, false}) {
          k8s_dra::MapDelta delta;
          delta.upserted.push_back(changed_slice(i, bad));
          std::vector<std::string> changed;
          t = absl::Now();
          const double cpu = ThreadCpuMicros();
          absl::Status s = map.Apply(delta, &changed);
          apply_us.push_back(Micros(t));
          apply_cpu_us.push_back(ThreadCpuMicros() - cpu);
          if (!s.ok() || changed.size() != 1 || map.Lendable(slices[i]["spec"]["nodeName"],
                                                             nullptr) == bad) {
            Fail(absl::StrCat("DeviceMap::Apply: ", s.ToString(), ", ", changed.size(),
                              " changed"));
            return;
          }
        }
      }
      // The same change through a full Update (what dra_mode did before):
      // a few, it costs what a full rebuild costs.
      std::vector<double> full_one_us;
      for (int k = 0; k < std::max(2, std::min(10, f.requests / 50)); ++k) {
        const size_t i = rng() % slices.size();
        for (bool bad : {true, false}) {
          std::vector<json> all = slices;  // (the copy dra_mode made is not timed)
          all[i] = changed_slice(i, bad);
          std::vector<std::string> changed;
          t = absl::Now();
          absl::Status s = map.Update(all, inv, &changed);
          full_one_us.push_back(Micros(t));
          if (!s.ok() || changed.size() != 1) {
            Fail(absl::StrCat("DeviceMap::Update: ", s.ToString()));
            return;
          }
        }
      }
      apply_p50.push_back(bench::Quantile(apply_us, 0.5));
      apply_p99.push_back(bench::Quantile(apply_us, 0.99));
      apply_cpu_p99.push_back(bench::Quantile(apply_cpu_us, 0.99));
      full_one_p50.push_back(bench::Quantile(full_one_us, 0.5));
      json line = {{"mode", "map"},
                   {"nodes", nodes},
                   {"rep", rep},
                   {"full_update_ms", full_ms.back()},
                   {"apply_one_node_p50_us", apply_p50.back()},
                   {"apply_one_node_p99_us", apply_p99.back()},
                   {"apply_one_node_cpu_p50_us", bench::Quantile(apply_cpu_us, 0.5)},
                   {"apply_one_node_cpu_p99_us", bench::Quantile(apply_cpu_us, 0.99)},
                   {"full_update_one_node_p50_ms", full_one_p50.back() / 1e3}};
      std::printf("%s\n", line.dump().c_str());
      std::fflush(stdout);
    }
    std::printf(
        "%d nodes x 8 GPUs: full Update %.1f ms; one node's slice: Apply p50/p99 "
        "%.1f / %.1f us (CPU p99 %.1f us), full Update %.1f ms (medians of %d runs)\n",
        nodes, bench::Median(full_ms), bench::Median(apply_p50), bench::Median(apply_p99),
        bench::Median(apply_cpu_p99), bench::Median(full_one_p50) / 1e3, f.reps);
  }
}

// ---------------------------------------------------------------------------
// --mode lend

void RunLend(const Flags& f) {
  std::printf("== lend latency: Lender::Lend to rules deleted (TaintRules -> fake_apiserver.py), "
              "Placeholders over the fake slurmctld, %d nodes per run\n",
              f.lend_nodes);
  k8s::testing::FakeApiServer api({"--kube-version", "1.37"});
  if (!api.ok()) {
    Fail("fake_apiserver.py did not start");
    return;
  }
  k8s_dra::TaintRulesOptions ro;
  ro.api_version = "v1";
  k8s_dra::TaintRules rules(api.control(), ro);
  for (double ms : f.slurm_ms) {
    for (int count : f.counts) {
      std::vector<double> p50, p99, r50, r99, resync;
      for (int rep = 0; rep < f.reps; ++rep) {
        ClusterOptions co;
        co.nodes = f.lend_nodes;
        co.slurm_rpc = absl::Microseconds(ms * 1000);
        co.rules = &rules;
        std::unique_ptr<Cluster> c = MakeCluster(co);
        if (!c) return;
        // Every device starts tainted, as the first Resync leaves them.
        if (absl::Status s = c->lender->Resync(); !s.ok()) {
          Fail(absl::StrCat("Resync: ", s.ToString()));
          return;
        }
        const absl::Time t = absl::Now();
        if (absl::Status s = c->lender->Resync(); !s.ok()) Fail(s.ToString());
        resync.push_back(Micros(t));
        c->clock.Advance(absl::Seconds(16));  // past the admission grace
        std::vector<double> lend_us, reclaim_us;
        for (const std::string& n : c->names) {
          const uint64_t deletes = rules.deletes();
          absl::Time t0 = absl::Now();
          auto lent = c->lender->Lend(n, DeviceKind::kGpu, static_cast<uint32_t>(count));
          lend_us.push_back(Micros(t0));
          if (!lent.ok() || lent->size() != static_cast<size_t>(count) ||
              rules.deletes() - deletes != static_cast<uint64_t>(count)) {
            Fail(absl::StrCat("lend ", count, " on ", n, ": ", lent.status().ToString()));
            return;
          }
          for (const dra::LedgerDevice& d : *lent) {
            const uint64_t creates = rules.creates();
            t0 = absl::Now();
            if (absl::Status s = c->lender->Reclaim(d); !s.ok()) {
              Fail(absl::StrCat("reclaim: ", s.ToString()));
              return;
            }
            reclaim_us.push_back(Micros(t0));
            if (rules.creates() - creates != 1) Fail("a reclaim of one GPU did not write one rule");
          }
        }
        if (c->clock.jumps() != 0) Fail("a reclaim waited for the admission grace");
        json line = {{"mode", "lend"},
                     {"slurm_ms", ms},
                     {"gpus", count},
                     {"rep", rep},
                     {"lend_p50_ms", bench::Quantile(lend_us, 0.5) / 1e3},
                     {"lend_p99_ms", bench::Quantile(lend_us, 0.99) / 1e3},
                     {"reclaim_p50_ms", bench::Quantile(reclaim_us, 0.5) / 1e3},
                     {"reclaim_p99_ms", bench::Quantile(reclaim_us, 0.99) / 1e3},
                     {"resync_noop_ms", resync.back() / 1e3},
                     {"rules", f.lend_nodes * 8}};
        std::printf("%s\n", line.dump().c_str());
        std::fflush(stdout);
        p50.push_back(bench::Quantile(lend_us, 0.5));
        p99.push_back(bench::Quantile(lend_us, 0.99));
        r50.push_back(bench::Quantile(reclaim_us, 0.5));
        r99.push_back(bench::Quantile(reclaim_us, 0.99));
      }
      std::printf(
          "  slurm RPC %5.1f ms, lend %d GPU(s): lend p50/p99 %7.2f / %7.2f ms; "
          "reclaim of one (grace skipped) p50/p99 %6.2f / %6.2f ms; no-op Resync of "
          "%d rules %6.2f ms (medians of %d)\n",
          ms, count, bench::Median(p50) / 1e3, bench::Median(p99) / 1e3, bench::Median(r50) / 1e3,
          bench::Median(r99) / 1e3, f.lend_nodes * 8, bench::Median(resync) / 1e3, f.reps);
    }
  }
}

// ---------------------------------------------------------------------------
// --mode churn

struct Pod {
  std::string uid;
  std::string node;
  std::vector<dra::AllocationResult> results;
};

struct ChurnFigures {
  double writes_per_s = 0, creates = 0, deletes = 0, resync_writes = 0;
  double lends = 0, lent_devices = 0, reclaims = 0, admitted = 0, dropped = 0;
  double rules_at_rest_mean = 0, rules_end = 0, devices = 0;
  double cpu_per_s_ms = 0;  // the Lender's CPU per simulated second
  std::map<std::string, std::vector<double>> cpu_us;  // per operation kind
  double desired_ms = 0, resync_ms = 0;
  double grace_waits = 0;
  // ReconcileRules passes with dirty nodes, the nodes they looked at, and
  // the full reconciles (after the first).
  double passes = 0, pass_nodes = 0, fulls = 0;
};

ChurnFigures Churn(const Flags& f, int nodes, int rep) {
  ChurnFigures out;
  CountingRules rules;
  ClusterOptions co;
  co.nodes = nodes;
  co.rules = &rules;
  co.slurm_used_mod = 4;
  co.lender.warm_buffer = static_cast<uint32_t>(f.warm);
  co.lender.reclaim_after = absl::Seconds(f.reclaim_after);
  // No grace: the simulated clock does not wait, and the waits are not CPU.
  co.lender.admission_grace = absl::ZeroDuration();
  std::unique_ptr<Cluster> c = MakeCluster(co);
  if (!c) return out;
  dra::Lender& lender = *c->lender;
  out.devices = nodes * 8.0;
  auto cpu = [&](const char* op, auto&& fn) {
    const double t = ThreadCpuMicros();
    fn();
    out.cpu_us[op].push_back(ThreadCpuMicros() - t);
  };
  // Where the rules start: every device not lent tainted.
  {
    absl::Time t = absl::Now();
    std::vector<dra::DraDevice> desired = lender.DesiredTainted();
    out.desired_ms = Micros(t) / 1e3;
    t = absl::Now();
    if (!lender.Resync().ok()) Fail("resync");
    out.resync_ms = Micros(t) / 1e3;
    if (desired.size() != rules.rules()) Fail("resync left other rules than DesiredTainted()");
  }
  c->clock.Advance(absl::Seconds(16));
  const uint64_t creates0 = rules.creates(), deletes0 = rules.deletes();
  const uint64_t resync0 = rules.resync_writes();
  const dra::RuleSyncStats stats0 = lender.rule_stats();
  std::mt19937_64 rng(1000 + rep);
  std::exponential_distribution<double> life(1.0 / f.lifetime);
  std::uniform_real_distribution<double> u(0, 1);
  std::multimap<int, Pod> leaving;  // simulated second -> pod
  int next_pod = 0;
  size_t cursor = 0;
  double due = 0, rules_sum = 0;
  auto lent_free = [&](const std::string& node) {
    std::vector<uint32_t> out_idx;
    std::shared_ptr<const NodeView> v = c->ledger.GetNode(node);
    for (const DeviceState& d : v->devices) {
      if (d.uses.size() == 1 && d.uses.front().owner->kind == OwnerKind::kLend &&
          !lender.Reclaiming({node, DeviceKind::kGpu, d.spec.index})) {
        out_idx.push_back(d.spec.index);
      }
    }
    return out_idx;
  };
  auto free_count = [&](const std::string& node) {
    uint32_t n = 0;
    for (const DeviceState& d : c->ledger.GetNode(node)->devices) n += d.uses.empty() ? 1 : 0;
    return n;
  };
  std::set<std::string> lent_nodes;  // nodes that may have lent, free devices
  const double cpu_start = ThreadCpuMicros();
  double cpu_driver = 0;  // the driver's own searches, taken out
  for (int sec = 0; sec < f.sim_seconds; ++sec) {
    // Departures: the claim is gone; the claim watch's fenced release gives
    // its devices back.
    for (auto it = leaving.begin(); it != leaving.end() && it->first <= sec;) {
      absl::Status st;
      cpu("deallocate", [&] { st = lender.ReleaseClaimIfDeallocated(it->second.uid); });
      if (!st.ok()) Fail(absl::StrCat("release refused: ", st.ToString()));
      lent_nodes.insert(it->second.node);
      it = leaving.erase(it);
    }
    // Arrivals.
    for (due += f.arrivals; due >= 1; due -= 1) {
      const double x = u(rng);
      const uint32_t k = x < 0.5 ? 1 : x < 0.75 ? 2 : x < 0.9 ? 4 : 8;
      const double d0 = ThreadCpuMicros();
      std::string node;
      std::vector<uint32_t> idx;
      for (auto it = lent_nodes.begin(); it != lent_nodes.end();) {
        std::vector<uint32_t> lf = lent_free(*it);
        if (lf.empty()) {
          it = lent_nodes.erase(it);
          continue;
        }
        if (lf.size() >= k) {
          node = *it;
          idx.assign(lf.begin(), lf.begin() + k);
          break;
        }
        ++it;
      }
      std::string lend_node;
      if (node.empty()) {
        for (size_t tries = 0; tries < c->names.size(); ++tries) {
          const std::string& n = c->names[cursor++ % c->names.size()];
          if (free_count(n) >= k) {
            lend_node = n;
            break;
          }
        }
      }
      cpu_driver += ThreadCpuMicros() - d0;
      if (node.empty()) {
        if (lend_node.empty()) {
          ++out.dropped;
          continue;
        }
        absl::StatusOr<std::vector<dra::LedgerDevice>> lent;
        cpu("lend", [&] { lent = lender.Lend(lend_node, DeviceKind::kGpu, k); });
        if (!lent.ok() || lent->size() != k) {
          Fail(absl::StrCat("lend on demand: ", lent.status().ToString()));
          continue;
        }
        ++out.lends;
        out.lent_devices += k;
        node = lend_node;
        for (const dra::LedgerDevice& d : *lent) idx.push_back(d.index);
      }
      Pod pod{absl::StrCat("pod-", rep, "-", next_pod++), node, {}};
      for (uint32_t i : idx) {
        pod.results.push_back({{kGpuDriver, node, absl::StrCat("gpu-", i)}, "gpus", false});
      }
      dra::AdmissionAsk ask;
      ask.claim = {pod.uid, "ns", pod.uid};
      ask.new_results = pod.results;
      ask.node = node;
      dra::AdmissionVerdict v;
      cpu("admit", [&] { v = lender.Review(ask); });
      if (!v.allowed) {
        Fail(absl::StrCat("admission refused: ", v.reason, " ", v.message));
        continue;
      }
      ++out.admitted;
      leaving.emplace(sec + 1 + static_cast<int>(life(rng)), std::move(pod));
    }
    // The warm buffer and reclaims, each second; the resync each 30 s.
    const uint64_t before = rules.creates();
    const uint64_t deletes_before_tick = rules.deletes();
    cpu("tick", [&] {
      if (absl::Status s = lender.Tick(); !s.ok()) Fail(absl::StrCat("tick: ", s.ToString()));
    });
    out.reclaims += static_cast<double>(rules.creates() - before);
    // The rules, as dra_mode's loop does them: the dirty nodes' (each 200 ms
    // there; each simulated second here, so a pass has the second's nodes),
    // and the full reconcile every dra::kFullRuleResync.
    if (f.rule_pass == "full30") {
      if (sec % 30 == 29) {
        cpu("full", [&] {
          if (!lender.Resync().ok()) Fail("resync");
        });
      }
    } else if ((sec + 1) % static_cast<int>(absl::ToInt64Seconds(dra::kFullRuleResync)) == 0) {
      cpu("full", [&] {
        if (!lender.Resync().ok()) Fail("resync");
      });
    } else {
      cpu("reconcile", [&] {
        if (absl::Status s = lender.ReconcileRules(); !s.ok()) {
          Fail(absl::StrCat("reconcile: ", s.ToString()));
        }
      });
    }
    // Devices the warm buffer lent: where they are (the driver's own walk).
    if (rules.deletes() != deletes_before_tick) {
      const double d0 = ThreadCpuMicros();
      for (const std::string& n : c->names) {
        if (!lent_free(n).empty()) lent_nodes.insert(n);
      }
      cpu_driver += ThreadCpuMicros() - d0;
    }
    rules_sum += static_cast<double>(rules.rules());
    c->clock.Advance(absl::Seconds(1));
  }
  const double cpu_total = ThreadCpuMicros() - cpu_start - cpu_driver;
  // A reclaim that had to wait out the admission grace (reclaim_after below
  // it): the product's tick thread sleeps there; the simulated clock jumps.
  out.grace_waits = c->clock.jumps();
  out.creates = static_cast<double>(rules.creates() - creates0);
  out.deletes = static_cast<double>(rules.deletes() - deletes0);
  out.resync_writes = static_cast<double>(rules.resync_writes() - resync0);
  const dra::RuleSyncStats stats = lender.rule_stats();
  out.passes = static_cast<double>(stats.incremental - stats0.incremental);
  out.pass_nodes = static_cast<double>(stats.nodes - stats0.nodes);
  out.fulls = static_cast<double>(stats.full - stats0.full);
  out.writes_per_s = (out.creates + out.deletes + out.resync_writes) / f.sim_seconds;
  out.rules_at_rest_mean = rules_sum / f.sim_seconds;
  out.rules_end = static_cast<double>(rules.rules());
  double in_lender = 0;
  for (const auto& [op, v] : out.cpu_us) {
    for (double x : v) in_lender += x;
  }
  (void)cpu_total;
  out.cpu_per_s_ms = in_lender / f.sim_seconds / 1e3;
  // The counted rules are what the Lender says must exist.
  std::vector<dra::DraDevice> desired = lender.DesiredTainted();
  if (std::set<dra::DraDevice>(desired.begin(), desired.end()) != rules.set()) {
    Fail("the rules written differ from DesiredTainted()");
  }
  return out;
}

void RunChurn(const Flags& f) {
  std::printf("== churn: %g pods/s, mean lifetime %g s, %d simulated s, warm buffer %d, "
              "reclaim after %d s; node i: i %% 4 GPUs Slurm's; rule pass %s\n",
              f.arrivals, f.lifetime, f.sim_seconds, f.warm, f.reclaim_after,
              f.rule_pass.c_str());
  for (int nodes : f.nodes) {
    std::vector<ChurnFigures> runs;
    for (int rep = 0; rep < f.reps; ++rep) {
      ChurnFigures r = Churn(f, nodes, rep);
      if (failed) return;
      json line = {{"mode", "churn"},
                   {"nodes", nodes},
                   {"rep", rep},
                   {"admitted", r.admitted},
                   {"dropped", r.dropped},
                   {"lends", r.lends},
                   {"lent_devices", r.lent_devices},
                   {"reclaimed_devices", r.reclaims},
                   {"creates", r.creates},
                   {"deletes", r.deletes},
                   {"resync_writes", r.resync_writes},
                   {"writes_per_s", r.writes_per_s},
                   {"rules_at_rest_mean", r.rules_at_rest_mean},
                   {"rules_end", r.rules_end},
                   {"lender_cpu_ms_per_s", r.cpu_per_s_ms},
                   {"desired_tainted_ms", r.desired_ms},
                   {"first_resync_ms", r.resync_ms},
                   {"grace_waits", r.grace_waits},
                   {"reconcile_passes", r.passes},
                   {"reconciled_nodes", r.pass_nodes},
                   {"full_resyncs", r.fulls}};
      for (const auto& [op, v] : r.cpu_us) {
        line[absl::StrCat("cpu_", op, "_p50_us")] = bench::Quantile(v, 0.5);
        line[absl::StrCat("cpu_", op, "_p99_us")] = bench::Quantile(v, 0.99);
      }
      std::printf("%s\n", line.dump().c_str());
      std::fflush(stdout);
      runs.push_back(std::move(r));
    }
    auto med = [&](auto get) {
      std::vector<double> v;
      for (const ChurnFigures& r : runs) v.push_back(get(r));
      return bench::Median(v);
    };
    auto op = [&](const char* name, double p) {
      return med([&](const ChurnFigures& r) {
        auto it = r.cpu_us.find(name);
        return it == r.cpu_us.end() ? 0.0 : bench::Quantile(it->second, p);
      });
    };
    std::printf(
        "%5d nodes: writes/s %.2f (creates %.0f, deletes %.0f, reconcile %.0f), devices lent on "
        "demand %.0f, reclaimed %.0f; rules at rest %.0f of %.0f devices; Lender CPU "
        "%.2f ms per s; CPU p50/p99 us: admit %.0f/%.0f, deallocate %.0f/%.0f, lend %.0f/%.0f, "
        "tick %.0f/%.0f, reconcile %.0f/%.0f, full resync %.0f; reconcile passes %.0f looking at "
        "%.0f nodes; first full resync %.1f ms, DesiredTainted %.1f ms; dropped %.0f "
        "(medians of %d)\n",
        nodes, med([](const ChurnFigures& r) { return r.writes_per_s; }),
        med([](const ChurnFigures& r) { return r.creates; }),
        med([](const ChurnFigures& r) { return r.deletes; }),
        med([](const ChurnFigures& r) { return r.resync_writes; }),
        med([](const ChurnFigures& r) { return r.lent_devices; }),
        med([](const ChurnFigures& r) { return r.reclaims; }),
        med([](const ChurnFigures& r) { return r.rules_at_rest_mean; }), nodes * 8.0,
        med([](const ChurnFigures& r) { return r.cpu_per_s_ms; }), op("admit", 0.5),
        op("admit", 0.99), op("deallocate", 0.5), op("deallocate", 0.99), op("lend", 0.5),
        op("lend", 0.99), op("tick", 0.5), op("tick", 0.99), op("reconcile", 0.5),
        op("reconcile", 0.99), op("full", 0.5),
        med([](const ChurnFigures& r) { return r.passes; }),
        med([](const ChurnFigures& r) { return r.pass_nodes; }),
        med([](const ChurnFigures& r) { return r.resync_ms; }),
        med([](const ChurnFigures& r) { return r.desired_ms; }),
        med([](const ChurnFigures& r) { return r.dropped; }), f.reps);
  }
}

// ---------------------------------------------------------------------------
// --mode e2e-lend

// The benchmark's own watch of the DeviceTaintRules at the API server: when
// each deletion reached it. Thread-safe (the informer's thread writes).
// A deletion: when it was seen, and the pool (node) of the rule's device.
struct RuleDeleted {
  absl::Time at;
  std::string pool;
};

class RuleWatch final : public k8s::InformerHandler {
 public:
  void OnUpsert(const json&) override {}
  void OnDelete(const std::string&, const json* last) override {
    const absl::Time now = absl::Now();
    std::string pool;
    if (last != nullptr) {
      pool = last->value(json::json_pointer("/spec/deviceSelector/pool"), std::string());
    }
    absl::MutexLock lock(&mu_);
    deleted_.push_back({now, std::move(pool)});
  }
  void OnSynced() override {}
  size_t deleted() {
    absl::MutexLock lock(&mu_);
    return deleted_.size();
  }
  // The time of every deletion seen, once at least `n` were (empty after
  // `timeout`).
  std::vector<RuleDeleted> AwaitDeleted(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return deleted_.size() >= n; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&enough), timeout)) return {};
    return deleted_;
  }

 private:
  absl::Mutex mu_;
  std::vector<RuleDeleted> deleted_ ABSL_GUARDED_BY(mu_);
};

// duet-bridge's DRA wiring (DraMode, as Bridge::StartDra makes it) over a
// fresh fake API server, a ledger of --e2e_nodes H100 nodes of the lending
// pool, and the slow fake slurmctld; plus the benchmark's rule watch.
class E2eWorld {
 public:
  E2eWorld(const Flags& f, absl::Duration slurm_rpc, const k8s::testing::TlsFiles& tls)
      : api_(std::vector<std::string>{"--kube-version", "1.37"}) {
    if (!api_.ok()) {
      Fail("fake_apiserver.py did not start");
      return;
    }
    // What the cluster has before duet: the class serving nvidia.com/gpu
    // from DRA (KEP-5004) and the driver's slices.
    auto post = [this](const std::string& path, const json& body) {
      absl::StatusOr<std::string> r = api_.control()->Post(path, body.dump());
      if (!r.ok()) Fail(absl::StrCat("POST ", path, ": ", r.status().ToString()));
      return r.ok();
    };
    if (!post(absl::StrCat(kDraApi, "/deviceclasses"),
              json::parse(R"({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                  "metadata": {"name": "gpu.nvidia.com"},
                  "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.nvidia.com\""}}],
                           "extendedResourceName": "nvidia.com/gpu"}})"))) {
      return;
    }
    for (int i = 0; i < f.e2e_nodes; ++i) {
      NodeSpec spec = bench::H100Node(i);
      names_.push_back(spec.name);
      if (absl::Status s = ledger_.UpsertNode(spec).status(); !s.ok()) {
        Fail(s.ToString());
        return;
      }
      if (!post(absl::StrCat(kDraApi, "/resourceslices"), NvidiaSlice(spec))) return;
    }
    slurm_ = std::make_unique<SlowSlurm>(slurm_rpc, f.slurm_serial);
    lends_ = std::make_unique<Placeholders>(&ledger_, slurm_.get());
    config_.enabled = true;
    config_.pools = {kPool};
    config_.drivers = {kGpuDriver};
    config_.warm_buffer = 0;
    config_.reclaim_after = absl::Hours(1);  // the benchmark reclaims itself
    config_.webhook.cert_file = tls.cert;
    config_.webhook.key_file = tls.key;
    config_.webhook.listen = "127.0.0.1:0";
    config_.webhook.admission_grace = absl::ZeroDuration();  // no admissions here
    config_.kube_version = "1.37";
    k8s::KubeConfig kc;
    kc.server = api_.url();
    absl::StatusOr<std::unique_ptr<k8s::KubeClient>> kube = k8s::NewCurlKubeClient(kc);
    if (!kube.ok()) {
      Fail(kube.status().ToString());
      return;
    }
    kube_ = *std::move(kube);
    DraModeDeps d;
    d.config = &config_;
    d.ledger = &ledger_;
    d.kube = kube_.get();
    d.lends = lends_.get();
    absl::StatusOr<std::unique_ptr<DraMode>> m = DraMode::Start(std::move(d));
    if (!m.ok()) {
      Fail(absl::StrCat("DraMode::Start: ", m.status().ToString()));
      return;
    }
    mode_ = *std::move(m);
    k8s::InformerOptions ro;
    ro.path = absl::StrCat(kDraApi, "/devicetaintrules");
    rule_informer_ = std::make_unique<k8s::Informer>(api_.control(), ro, &rules_seen_);
    if (absl::Status s = rule_informer_->Start(); !s.ok()) {
      Fail(absl::StrCat("the rule watch: ", s.ToString()));
      return;
    }
    // DraMode::Start's Resync tainted every device.
    const size_t rules = rule_informer_->stats().objects;
    if (rules != names_.size() * 8) {
      Fail(absl::StrCat("after DraMode::Start: ", rules, " DeviceTaintRules, want ",
                        names_.size() * 8));
      return;
    }
    ok_ = true;
  }
  ~E2eWorld() {
    if (rule_informer_) rule_informer_->Stop();
    if (mode_) mode_->Stop();
  }

  bool ok() const { return ok_; }
  RuleWatch& rules_seen() { return rules_seen_; }

  // A pod as a user writes it for the default scheduler, pending. Returns
  // the object the API server stored ({} on failure).
  json CreatePod(const std::string& name, int gpus) {
    const std::string q = absl::StrCat(gpus);
    json pod = {{"apiVersion", "v1"},
                {"kind", "Pod"},
                {"metadata", {{"name", name}, {"namespace", "default"}}},
                {"spec",
                 {{"containers",
                   {{{"name", "main"},
                     {"image", "nvcr.io/nvidia/pytorch:24.10-py3"},
                     {"resources",
                      {{"limits", {{"nvidia.com/gpu", q}}},
                       {"requests", {{"nvidia.com/gpu", q}}}}}}}}}}};
    absl::StatusOr<std::string> r =
        api_.control()->Post("/api/v1/namespaces/default/pods", pod.dump());
    if (!r.ok()) {
      Fail(absl::StrCat("create pod ", name, ": ", r.status().ToString()));
      return json::object();
    }
    return json::parse(*r);
  }
  // What kube-scheduler writes for a pod no node fits (as
  // tests/fakes/test_scheduler.py does): PodScheduled=False/Unschedulable.
  bool MarkUnschedulable(json pod) {
    pod["status"]["conditions"] =
        json::array({{{"type", "PodScheduled"},
                      {"status", "False"},
                      {"reason", "Unschedulable"},
                      {"message", "no node has the devices the pod asks for"},
                      {"lastTransitionTime", absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(),
                                                              absl::UTCTimeZone())}}});
    const std::string name = pod["metadata"]["name"];
    absl::StatusOr<std::string> r = api_.control()->Put(
        absl::StrCat("/api/v1/namespaces/default/pods/", name, "/status"), pod.dump());
    if (!r.ok()) Fail(absl::StrCat("pod ", name, " status: ", r.status().ToString()));
    return r.ok();
  }
  void DeletePod(const std::string& name) {
    absl::StatusOr<std::string> r =
        api_.control()->Delete(absl::StrCat("/api/v1/namespaces/default/pods/", name));
    if (!r.ok()) Fail(absl::StrCat("delete pod ", name, ": ", r.status().ToString()));
  }
  // The devices the ledger holds for lend jobs.
  std::vector<dra::LedgerDevice> Lent() {
    std::vector<dra::LedgerDevice> out;
    for (const std::string& n : names_) {
      for (const DeviceState& d : ledger_.GetNode(n)->devices) {
        if (d.uses.size() == 1 && d.uses.front().owner->kind == OwnerKind::kLend) {
          out.push_back({n, d.spec.kind, d.spec.index});
        }
      }
    }
    return out;
  }
  // Back to where a sample starts: every device not lent, tainted.
  bool ReclaimAll() {
    for (const dra::LedgerDevice& d : Lent()) {
      if (absl::Status s = mode_->lender()->Reclaim(d); !s.ok()) {
        Fail(absl::StrCat("reclaim ", d.node, " gpu ", d.index, ": ", s.ToString()));
        return false;
      }
    }
    return true;
  }

 private:
  static constexpr char kDraApi[] = "/apis/resource.k8s.io/v1";
  bool ok_ = false;
  k8s::testing::FakeApiServer api_;
  std::vector<std::string> names_;
  Ledger ledger_;
  std::unique_ptr<SlowSlurm> slurm_;
  std::unique_ptr<Placeholders> lends_;
  DraConfig config_;
  std::unique_ptr<k8s::KubeClient> kube_;
  std::unique_ptr<DraMode> mode_;
  RuleWatch rules_seen_;
  std::unique_ptr<k8s::Informer> rule_informer_;
};

struct E2eFigures {
  std::vector<double> sequential_ms, burst_ms;
};

// One world: --pods pods one at a time, then --pods pods in bursts of
// --burst. Each sample: create the pending pod(s), wait a random gap (so the
// condition lands at a random phase of dra_mode's loop), then time from just
// before the Unschedulable write until the rule watch has seen the deletion
// of the devices lent for it. In a burst each pod is timed from just before
// the burst's first write (an upper bound for the pods written later) to
// the last deletion of its group of `gpus` on its node (below). Then the pods are deleted and
// every lent device reclaimed (rules back, lend jobs cancelled).
E2eFigures E2eLend(const Flags& f, double slurm_ms, int gpus, int rep,
                   const k8s::testing::TlsFiles& tls) {
  E2eFigures out;
  E2eWorld w(f, absl::Microseconds(slurm_ms * 1000), tls);
  if (!w.ok()) return out;
  std::mt19937 rng(7000 + rep);
  std::uniform_real_distribution<double> gap(0, f.gap_ms);
  int next = 0;
  auto round = [&](int pods, std::vector<double>* into) {
    std::vector<json> made;
    for (int i = 0; i < pods; ++i) {
      made.push_back(w.CreatePod(absl::StrCat("train-", rep, "-", next++), gpus));
      if (failed) return false;
    }
    if (f.gap_ms > 0) absl::SleepFor(absl::Microseconds(gap(rng) * 1000));
    const size_t base = w.rules_seen().deleted();
    const absl::Time t0 = absl::Now();
    for (const json& p : made) {
      if (!w.MarkUnschedulable(p)) return false;
    }
    const size_t want = static_cast<size_t>(pods) * static_cast<size_t>(gpus);
    std::vector<RuleDeleted> seen =
        w.rules_seen().AwaitDeleted(base + want, absl::Seconds(30));
    if (seen.empty()) {
      Fail(absl::StrCat(pods, " pod(s) asking ", gpus, " GPU(s): ",
                        w.rules_seen().deleted() - base, " of ", want,
                        " rule deletions seen in 30 s"));
      return false;
    }
    // A pod's devices are on one node: per node, each `gpus` deletions in
    // the order seen are one pod's, done at the last of them. Exact for 1
    // GPU and for pods that each take a node of their own (8 GPUs here),
    // whether pods are lent one after another or at once; pods of several
    // GPUs sharing a node, lent at once, may interleave there (then a
    // pod's figure may be early). A remainder (a deletion without its
    // pool) counts as done at the burst's last deletion.
    std::map<std::string, size_t> per_node;
    std::vector<absl::Time> done;
    for (size_t i = base; i < base + want; ++i) {
      if (++per_node[seen[i].pool] % static_cast<size_t>(gpus) == 0) done.push_back(seen[i].at);
    }
    std::sort(done.begin(), done.end());
    while (done.size() < static_cast<size_t>(pods)) done.push_back(seen[base + want - 1].at);
    for (int k = 0; k < pods; ++k) into->push_back(absl::ToDoubleMilliseconds(done[k] - t0));
    // Exactly what was asked was lent: no pod served twice, none short.
    const size_t lent = w.Lent().size();
    if (lent != want) {
      Fail(absl::StrCat(pods, " pod(s) asking ", gpus, " GPU(s): ", lent, " devices lent"));
      return false;
    }
    for (const json& p : made) w.DeletePod(p["metadata"]["name"]);
    return !failed && w.ReclaimAll();
  };
  for (int i = 0; i < f.pods; ++i) {
    if (!round(1, &out.sequential_ms)) return out;
  }
  for (int i = 0; i < f.pods; i += f.burst) {
    if (!round(std::min(f.burst, f.pods - i), &out.burst_ms)) return out;
  }
  return out;
}

void RunE2eLend(const Flags& f) {
  std::printf("== end-to-end lend latency: pod marked Unschedulable -> its DeviceTaintRules "
              "deleted (seen by a watch), DraMode over fake_apiserver.py (1.37) and the fake "
              "slurmctld; %d nodes x 8 GPUs, %d pods one at a time, then in bursts of %d; "
              "random gap up to %g ms\n",
              f.e2e_nodes, f.pods, f.burst, f.gap_ms);
  const std::string tmp = k8s::testing::MakeTempDir();
  const k8s::testing::TlsFiles tls = k8s::testing::MakeTestCerts(tmp);
  for (double ms : f.slurm_ms) {
    for (int gpus : f.counts) {
      std::vector<double> s50, s99, b50, b99;
      for (int rep = 0; rep < f.reps; ++rep) {
        E2eFigures r = E2eLend(f, ms, gpus, rep, tls);
        if (failed) {
          k8s::testing::RemoveTree(tmp);
          return;
        }
        auto mx = [](const std::vector<double>& v) {
          return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
        };
        json line = {{"mode", "e2e-lend"},
                     {"slurm_ms", ms},
                     {"slurm_serial", f.slurm_serial},
                     {"gpus", gpus},
                     {"rep", rep},
                     {"sequential_p50_ms", bench::Quantile(r.sequential_ms, 0.5)},
                     {"sequential_p99_ms", bench::Quantile(r.sequential_ms, 0.99)},
                     {"sequential_max_ms", mx(r.sequential_ms)},
                     {"burst_p50_ms", bench::Quantile(r.burst_ms, 0.5)},
                     {"burst_p99_ms", bench::Quantile(r.burst_ms, 0.99)},
                     {"burst_max_ms", mx(r.burst_ms)},
                     {"samples", r.sequential_ms.size() + r.burst_ms.size()}};
        std::printf("%s\n", line.dump().c_str());
        std::fflush(stdout);
        s50.push_back(bench::Quantile(r.sequential_ms, 0.5));
        s99.push_back(bench::Quantile(r.sequential_ms, 0.99));
        b50.push_back(bench::Quantile(r.burst_ms, 0.5));
        b99.push_back(bench::Quantile(r.burst_ms, 0.99));
      }
      std::printf(
          "  slurm RPC %5.1f ms, %d GPU(s): one at a time p50/p99 %7.1f / %7.1f ms; "
          "bursts of %d p50/p99 %7.1f / %7.1f ms (medians of %d)\n",
          ms, gpus, bench::Median(s50), bench::Median(s99), f.burst, bench::Median(b50),
          bench::Median(b99), f.reps);
    }
  }
  k8s::testing::RemoveTree(tmp);
}

std::vector<int> Ints(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(p, &v)) return {};
    out.push_back(v);
  }
  return out;
}

int Main(int argc, char** argv) {
  Flags f;
  std::string nodes = "500,1000,5000", counts = "1,8", slurm_ms = "5,20";
  f.dir = std::filesystem::temp_directory_path().string();
  CLI::App app{"DRA lending mode benchmark (bench/RESULTS.md, DRA lending)"};
  app.add_option("--mode", f.mode, "webhook, lend, churn, all (those three) or e2e-lend")
      ->check(CLI::IsMember({"webhook", "lend", "churn", "all", "e2e-lend", "map"}));
  app.add_option("--nodes", nodes, "node counts, comma separated (webhook, churn)");
  app.add_option("--reps", f.reps, "runs per configuration");
  app.add_option("--requests", f.requests, "webhook: admissions per run");
  app.add_option("--lent", f.lent, "webhook: GPUs lent per node")->check(CLI::Range(1, 8));
  app.add_option("--fsync", f.fsync, "webhook: journal fsync both, on or off")
      ->check(CLI::IsMember({"both", "on", "off"}));
  app.add_option("--https", f.https, "webhook: also over HTTPS");
  std::string clients = "1";
  app.add_option("--clients", clients,
                 "webhook: HTTPS clients at once (each its own connection), comma separated");
  app.add_option("--webhook_threads", f.webhook_threads,
                 "webhook: the server's threads for admissions, which block on the journal "
                 "(dra.webhook.admission_threads; the product's default is 16)")
      ->check(CLI::Range(1, 256));
  app.add_option("--dir", f.dir, "webhook: where the journal is written (the disk matters)");
  app.add_option("--lend_nodes", f.lend_nodes, "lend: nodes lent on per run");
  app.add_option("--counts", counts, "lend: GPUs per lend, comma separated");
  app.add_option("--slurm_ms", slurm_ms, "lend: the fake slurmctld's time per RPC, ms, comma separated");
  app.add_option("--sim_seconds", f.sim_seconds, "churn: simulated seconds");
  app.add_option("--arrivals", f.arrivals, "churn: pods per simulated second");
  app.add_option("--lifetime", f.lifetime, "churn: mean pod lifetime, s");
  app.add_option("--warm", f.warm, "churn: dra.warm_buffer");
  app.add_option("--reclaim_after", f.reclaim_after, "churn: dra.reclaim_after, s");
  app.add_option("--e2e_nodes", f.e2e_nodes, "e2e-lend: lending nodes (8 GPUs each)")
      ->check(CLI::Range(1, 5000));
  app.add_option("--pods", f.pods, "e2e-lend: pods one at a time, and again in bursts")
      ->check(CLI::Range(1, 100000));
  app.add_option("--burst", f.burst, "e2e-lend: pods per burst")->check(CLI::Range(1, 1000));
  app.add_option("--gap_ms", f.gap_ms,
                 "e2e-lend: the random wait before each Unschedulable write is uniform in "
                 "[0, gap_ms) (0: none)")
      ->check(CLI::Range(0.0, 60000.0));
  app.add_flag("--slurm_serial", f.slurm_serial,
               "e2e-lend: the fake slurmctld answers one RPC at a time, as a real one "
               "serialises job allocations (default: concurrent RPCs sleep side by side)");
  app.add_option("--rule_pass", f.rule_pass,
                 "churn: incremental (ReconcileRules each s, full Resync each 10 min) or full30 "
                 "(the former schedule: Resync each 30 s)")
      ->check(CLI::IsMember({"incremental", "full30"}));
  CLI11_PARSE(app, argc, argv);
  f.nodes = Ints(nodes);
  f.counts = Ints(counts);
  f.clients = Ints(clients);
  for (int n : f.clients) {
    if (n < 1 || n > 256) {
      std::fprintf(stderr, "bad --clients\n");
      return 2;
    }
  }
  f.slurm_ms.clear();
  for (absl::string_view p : absl::StrSplit(slurm_ms, ',', absl::SkipEmpty())) {
    double v = 0;
    if (!absl::SimpleAtod(p, &v)) return 2;
    f.slurm_ms.push_back(v);
  }
  if (f.nodes.empty() || f.counts.empty() || f.clients.empty() || f.reps < 1 || f.requests < 2) {
    std::fprintf(stderr, "bad --nodes, --counts, --reps or --requests\n");
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);
  std::printf("dra_bench: mode %s, nodes %s, %d reps, %u hardware threads\n", f.mode.c_str(),
              nodes.c_str(), f.reps, std::thread::hardware_concurrency());
  if (f.mode == "webhook" || f.mode == "all") RunWebhook(f);
  if (!failed && (f.mode == "lend" || f.mode == "all")) RunLend(f);
  if (!failed && (f.mode == "churn" || f.mode == "all")) RunChurn(f);
  if (!failed && f.mode == "e2e-lend") RunE2eLend(f);
  if (!failed && f.mode == "map") RunMap(f);
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace duet

int main(int argc, char** argv) { return duet::Main(argc, argv); }
