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

#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/dra_world.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using ::duet::testing::CmdResult;
using ::duet::testing::Intersect;
using ::duet::testing::NodeDevices;
using ::duet::testing::RunCmd;
using ::duet::testing::TestSlurmCluster;
using ::duet::testing::WaitFor;
using World = ::duet::testing::DraWorld;
using json = nlohmann::json;

constexpr char kNode[] = "dra-gpu-1";
constexpr char kTaintKey[] = "duet.dev/not-lent";
constexpr char kDra[] = "/apis/resource.k8s.io/v1";

class DraChurn;

class DraE2eTest : public ::duet::testing::DraE2eBase {
 protected:
  friend class DraChurn;

  void SetUp() override {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    // The mutation test runs without the fence: no webhook registered. The
    // churn tests run a stale, slow scheduler of their own.
    SetUpWorld(::duet::testing::DraWorldOptions{}, !absl::StrContains(test, "WithoutTheWebhook"),
               !absl::StrContains(test, "Churn"));
  }
};

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
