// Gangs in the DRA lending mode end to end (issue 27, docs/dra.md "Gangs",
// docs/gangs.md 6) with the real binaries: the world of dra_e2e_test.cc
// (tests/integration/dra_world.h: a real Slurm cluster, the real
// duet-bridge with dra.enabled and its webhook, the fake apiserver at 1.37
// calling it, NVIDIA-shaped slices) on two 8-GPU nodes, with the fake
// apiserver serving PodGroups (--gang-crds) and the test scheduler as a
// process. The member pods name no schedulerName and ask `nvidia.com/gpu: 4`
// (the DRA extended resource); the scheduler knows nothing of gangs: it
// allocates the first untainted free devices and retries a pod whose claim
// write was refused. It finds a member's devices because duet untaints only
// the gang's slots.
//
// - a PodGroup of 2 x 4 GPUs beside a Slurm job holding 2 GPUs of each node:
//   ONE duet-gang Slurm job over both nodes; the first member is refused
//   (GANG_WAITING) until the second is pending; then each member's claim is
//   allocated its slot's devices on its node and admitted, the pods bind,
//   and no device is the Slurm job's; once the members end, their claims
//   go back to the slots and the idle gang is released (job cancelled,
//   rules back);
// - a pod outside the gang that the scheduler puts on a slot's devices is
//   refused (GANG_MEMBERS_ONLY) while the slot is vacant; once the members
//   took the slots it gets the device duet lent it;
// - a gang that cannot fit whole holds nothing: no Slurm job, every device
//   keeps its rule, a DuetGangUnplaceable Event on its pods;
// - a member deleted while the gang gathers releases it: its Slurm job is
//   cancelled and its devices' rules are back.
//
// One cluster, one bridge, one fake apiserver per process; ctest runs each
// test in its own process. Label: slurm.

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/dra_world.h"
#include "tests/integration/gang_objects.h"

namespace duet {
namespace {

using ::duet::testing::CmdResult;
using ::duet::testing::DraWorldOptions;
using ::duet::testing::Intersect;
using ::duet::testing::LedgerHolding;
using ::duet::testing::NodeDevices;
using ::duet::testing::PodGroup;
using ::duet::testing::WaitFor;
using json = nlohmann::json;

constexpr char kNodeA[] = "dra-gpu-1";
constexpr char kNodeB[] = "dra-gpu-2";
constexpr char kPodGroupLabel[] = "scheduling.x-k8s.io/pod-group";

// A Slurm job per squeue.
struct SqueueJob {
  uint32_t id = 0;
  std::string name;
  std::string state;
};

class DraGangE2eTest : public ::duet::testing::DraE2eBase {
 protected:
  void SetUp() override {
    DraWorldOptions o;
    o.nodes = 2;
    o.first_addr = 91;
    o.fake_args = {"--gang-crds"};
    o.extra_yaml = "gang: {reserve_timeout: 60s, idle_release: 3s, tick_period: 300ms}\n";
    o.tag = "duet-dra-gang-e2e";
    SetUpWorld(o, /*webhook=*/true, /*scheduler=*/true);
  }

  // A member of PodGroup `group` as a user writes it for the default
  // scheduler.
  json Member(const std::string& name, const std::string& group, int gpus) {
    json p = GpuPod(name, gpus);
    p["metadata"]["labels"] = {{kPodGroupLabel, group}};
    return p;
  }
  void PostPodGroup(const std::string& name, int min_member) {
    w_->fake()->Put(PodGroup(name, min_member));
  }
  void PostPod(const json& pod) {
    const json r = Api("POST", "/api/v1/namespaces/default/pods", pod);
    EXPECT_FALSE(r.contains("error")) << r.dump();
  }

  // duet's gang jobs in Slurm (name duet-gang:KEY), not ended.
  std::vector<SqueueJob> GangJobs() {
    std::vector<SqueueJob> out;
    CmdResult r = c_->Cli("squeue -h -o '%i|%j|%T'");
    for (absl::string_view l : absl::StrSplit(r.out, '\n', absl::SkipEmpty())) {
      std::vector<std::string> f = absl::StrSplit(l, '|');
      if (f.size() != 3 || !absl::StartsWith(f[1], "duet-gang:")) continue;
      SqueueJob j;
      if (!absl::SimpleAtoi(f[0], &j.id)) continue;
      j.name = f[1];
      j.state = f[2];
      out.push_back(j);
    }
    return out;
  }

  // Events in namespace default with `reason` about pod `name`.
  int PodEvents(const std::string& name, const std::string& reason) {
    const json list = Api("GET", "/api/v1/namespaces/default/events");
    int n = 0;
    for (const json& e : list.value("items", json::array())) {
      if (e.value("reason", "") == reason && e["involvedObject"].value("name", "") == name) ++n;
    }
    return n;
  }

  // The ledger's holdings of `kind` of job `job` on `node`: their GPUs.
  std::set<uint32_t> JobGpus(const std::string& kind, uint32_t job, const std::string& node) {
    std::set<uint32_t> out;
    for (const LedgerHolding& h : Holdings()) {
      if (h.kind != kind || h.job_id != job || h.node != node) continue;
      auto it = h.devices.find("gpu");
      if (it != h.devices.end()) out.insert(it->second.begin(), it->second.end());
    }
    return out;
  }

  int DuetHoldings(const std::string& kind) {
    int n = 0;
    for (const LedgerHolding& h : Holdings()) n += h.kind == kind ? 1 : 0;
    return n;
  }

  // The pod ends; the resourceclaim controller deallocates its
  // extended-resource claim and deletes it.
  void EndPod(const std::string& name) {
    json p = Pod(name);
    std::string claim;
    if (p.contains("status") && p["status"].contains("extendedResourceClaimStatus")) {
      claim = p["status"]["extendedResourceClaimStatus"].value("resourceClaimName", "");
    }
    Api("DELETE", absl::StrCat("/api/v1/namespaces/default/pods/", name));
    if (claim.empty()) return;
    const std::string path =
        absl::StrCat(::duet::testing::kDraApi, "/namespaces/default/resourceclaims/", claim);
    json c = Api("GET", path);
    if (c.contains("metadata")) {
      c["status"] = json::object();
      Api("PUT", path + "/status", c);
    }
    Api("DELETE", path);
  }

  // The scheduler's refusals of pod `pod` whose text has `text` (its whole
  // log: a count that only grows).
  int Refusals(const std::string& pod, const std::string& text) {
    int n = 0;
    const std::string log = w_->SchedulerLog(std::string::npos);
    for (absl::string_view l : absl::StrSplit(log, '\n', absl::SkipEmpty())) {
      const json j = json::parse(l, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || j.value("pod", "") != absl::StrCat("default/", pod)) continue;
      if (absl::StrContains(j.value("error", ""), text)) ++n;
    }
    return n;
  }
};

// Scenario 1 and the gathering half of scenario 2.
TEST_F(DraGangE2eTest, GangIsLentAsOneSlurmJobAndItsMembersBindOnlyOnceItIsComplete) {
  // Slurm holds 2 GPUs of each node: a member (4 GPUs) fits once per node.
  const uint32_t job = RunningJob(absl::StrCat("-N 2 -w ", kNodeA, ",", kNodeB, " --gres=gpu:2"));
  std::map<std::string, NodeDevices> slurm = ::duet::testing::SlurmJobDevices(*c_, job);
  ASSERT_EQ(slurm[kNodeA]["gpu"].size(), 2u);
  ASSERT_EQ(slurm[kNodeB]["gpu"].size(), 2u);

  PostPodGroup("train", 2);
  PostPod(Member("train-0", "train", 4));
  // The gang is reserved whole at once: one Slurm job over both nodes, its
  // slots' devices untainted (4 of each node's 6 tainted ones).
  ASSERT_TRUE(WaitFor([&] { return GangJobs().size() == 1; }, absl::Seconds(30)))
      << c_->Cli("squeue").out << w_->Log();
  const SqueueJob gang = GangJobs()[0];
  EXPECT_EQ(gang.name, "duet-gang:podgroup/default/train");
  CmdResult show = c_->Cli(absl::StrCat("scontrol show job ", gang.id));
  EXPECT_TRUE(absl::StrContains(show.out, "NumNodes=2")) << show.out;
  EXPECT_TRUE(absl::StrContains(show.out, "Comment=duet-gang key=podgroup/default/train slots=2"))
      << show.out;
  EXPECT_TRUE(WaitFor([&] { return Rules(kNodeA).size() == 4 && Rules(kNodeB).size() == 4; }))
      << Rules().size();
  // The first member alone is refused its slot's devices: the gang waits.
  ASSERT_TRUE(WaitFor([&] { return Refusals("train-0", "members are pending") >= 2; },
                      absl::Seconds(30)))
      << w_->SchedulerLog();
  EXPECT_EQ(Pod("train-0")["spec"].value("nodeName", ""), "");
  EXPECT_EQ(DuetHoldings("claim"), 0) << w_->Ctl("holds").out;
  EXPECT_TRUE(absl::StrContains(w_->Metrics(), "duet_dra_admissions_total{reason=\"GANG_WAITING\""))
      << w_->Metrics();

  // The second member: the gang is complete, both bind, one per node.
  PostPod(Member("train-1", "train", 4));
  std::map<std::string, std::string> claim_of;  // node -> claim
  for (const char* pod : {"train-0", "train-1"}) {
    std::string node;
    ASSERT_TRUE(WaitFor([&] {
      node = Pod(pod)["spec"].value("nodeName", "");
      return !node.empty();
    }, absl::Seconds(30))) << pod << " was not bound\n" << w_->SchedulerLog();
    const std::string claim = BoundWithClaim(pod, node);
    ASSERT_FALSE(claim.empty());
    EXPECT_FALSE(claim_of.count(node)) << "both members on " << node;
    claim_of[node] = claim;
  }
  ASSERT_EQ(claim_of.size(), 2u);
  // Still ONE gang job, no lend job: the members' devices are the gang
  // job's, on each node exactly the claim's, never the Slurm job's.
  EXPECT_EQ(GangJobs().size(), 1u) << c_->Cli("squeue").out;
  std::map<std::string, NodeDevices> gang_devices = ::duet::testing::SlurmJobDevices(*c_, gang.id);
  for (const auto& [node, claim] : claim_of) {
    std::string alloc_node;
    const std::set<uint32_t> gpus = ClaimGpus(claim, &alloc_node);
    EXPECT_EQ(alloc_node, node);
    EXPECT_EQ(gpus.size(), 4u);
    EXPECT_EQ(gpus, gang_devices[node]["gpu"]) << "node " << node;
    EXPECT_TRUE(Intersect(gpus, slurm[node]["gpu"]).empty()) << "node " << node;
    EXPECT_TRUE(WaitFor([&] { return JobGpus("claim", gang.id, node) == gpus; }))
        << w_->Ctl("holds").out;
    EXPECT_EQ(LendJobs(node), 0) << c_->Cli("squeue").out;
  }
  EXPECT_EQ(DuetHoldings("gang_slot"), 0) << w_->Ctl("holds").out;
  EXPECT_EQ(::duet::testing::SlurmJobDevices(*c_, job), slurm);
  EXPECT_EQ(Metric("duet_gang_reservations_total"), 1) << w_->Metrics();

  // The members end: their claims are given back to the gang's slots, and
  // gang.idle_release (3 s here) later the gang is released whole: its job
  // is cancelled and every device not the Slurm job's is tainted again.
  w_->StopScheduler();
  for (const char* pod : {"train-0", "train-1"}) EndPod(pod);
  EXPECT_TRUE(WaitFor([&] { return DuetHoldings("claim") == 0; })) << w_->Ctl("holds").out;
  EXPECT_TRUE(WaitFor([&] { return c_->JobEnded(gang.id); }, absl::Seconds(20)))
      << c_->Cli("squeue").out << w_->Log();
  EXPECT_TRUE(WaitFor([&] { return DuetHoldings("gang_slot") == 0; })) << w_->Ctl("holds").out;
  EXPECT_TRUE(WaitFor([&] { return Rules().size() == 16; })) << Rules().size();
  EXPECT_EQ(Metric("duet_gang_releases_total{reason=\"idle\"}"), 1) << w_->Metrics();
  EXPECT_EQ(c_->JobState(job), "RUNNING");
}

// Scenario 2: the fence against a pod outside the gang.
TEST_F(DraGangE2eTest, ClaimOfAPodOutsideTheGangIsRefusedTheSlotsDevices) {
  PostPodGroup("fenced", 2);
  PostPod(Member("fenced-0", "fenced", 4));
  ASSERT_TRUE(WaitFor([&] { return GangJobs().size() == 1; }, absl::Seconds(30)))
      << c_->Cli("squeue").out << w_->Log();
  // Only the slots' devices are untainted: the scheduler puts a pod asking
  // one GPU on one of them, and the webhook refuses the write.
  ASSERT_TRUE(WaitFor([&] { return Rules().size() == 8; })) << Rules().size();
  PostPod(GpuPod("outsider", 1));
  ASSERT_TRUE(WaitFor([&] { return Refusals("outsider", "are not its members") >= 2; },
                      absl::Seconds(30)))
      << w_->SchedulerLog();
  EXPECT_TRUE(absl::StrContains(w_->Metrics(),
                                "duet_dra_admissions_total{reason=\"GANG_MEMBERS_ONLY\""))
      << w_->Metrics();
  EXPECT_EQ(Pod("outsider")["spec"].value("nodeName", ""), "");
  EXPECT_EQ(DuetHoldings("claim"), 0) << w_->Ctl("holds").out;
  EXPECT_GT(Refusals("fenced-0", "admission webhook"), 0) << w_->SchedulerLog();
  EXPECT_EQ(Pod("fenced-0")["spec"].value("nodeName", ""), "");
  // The gang completes and takes its slots; the outsider then gets the
  // device duet lent it, never one of the gang's.
  PostPod(Member("fenced-1", "fenced", 4));
  for (const char* pod : {"fenced-0", "fenced-1"}) {
    ASSERT_TRUE(WaitFor([&] { return !Pod(pod)["spec"].value("nodeName", "").empty(); },
                        absl::Seconds(30)))
        << pod << " was not bound\n" << w_->SchedulerLog();
  }
  const uint32_t gang = GangJobs()[0].id;
  std::map<std::string, NodeDevices> gang_devices = ::duet::testing::SlurmJobDevices(*c_, gang);
  std::string node;
  ASSERT_TRUE(WaitFor([&] {
    node = Pod("outsider")["spec"].value("nodeName", "");
    return !node.empty();
  }, absl::Seconds(30))) << w_->SchedulerLog();
  const std::string claim = BoundWithClaim("outsider", node);
  const std::set<uint32_t> gpus = ClaimGpus(claim);
  EXPECT_EQ(gpus.size(), 1u);
  EXPECT_TRUE(Intersect(gpus, gang_devices[node]["gpu"]).empty()) << "node " << node;
  // Its claim holds a lend job's device (a pod refused for over 5 s may
  // have been lent for twice; the spare is reclaimed later).
  EXPECT_TRUE(WaitFor([&] {
    for (const LedgerHolding& h : Holdings()) {
      if (h.kind == "claim" && h.node == node && h.job_id != gang &&
          h.devices.count("gpu") && h.devices.at("gpu") == gpus) {
        return true;
      }
    }
    return false;
  })) << w_->Ctl("holds").out;
  EXPECT_GE(LendJobs(node), 1) << c_->Cli("squeue").out;
}

// Scenario 3: 2 members x 8 GPUs; a Slurm job holds 2 GPUs of node A, so
// only node B could take a member.
TEST_F(DraGangE2eTest, GangThatCannotFitWholeHoldsNothingAndSaysWhy) {
  const uint32_t job = RunningJob(absl::StrCat("-w ", kNodeA, " --gres=gpu:2"));
  PostPodGroup("big", 2);
  PostPod(Member("big-0", "big", 8));
  PostPod(Member("big-1", "big", 8));
  for (const char* pod : {"big-0", "big-1"}) {
    EXPECT_TRUE(WaitFor([&] { return PodEvents(pod, "DuetGangUnplaceable") >= 1; },
                        absl::Seconds(30)))
        << pod << "\n" << Api("GET", "/api/v1/namespaces/default/events").dump() << w_->Log();
  }
  // Two more Slurm sync passes and scheduler attempts: still nothing held,
  // nothing lent, every device tainted.
  const double passes = SyncPasses();
  ASSERT_TRUE(WaitFor([&] { return SyncPasses() >= passes + 2; })) << w_->Log();
  const int tried = Refusals("big-0", "nodes have the devices");
  EXPECT_TRUE(WaitFor([&] { return Refusals("big-0", "nodes have the devices") >= tried + 2; }))
      << w_->SchedulerLog();
  EXPECT_TRUE(GangJobs().empty()) << c_->Cli("squeue").out;
  EXPECT_EQ(LendJobs(kNodeA) + LendJobs(kNodeB), 0) << c_->Cli("squeue").out;
  EXPECT_EQ(Rules().size(), 16u);
  EXPECT_EQ(DuetHoldings("gang_slot") + DuetHoldings("lend") + DuetHoldings("claim"), 0)
      << w_->Ctl("holds").out;
  EXPECT_EQ(Metric("duet_gang_reservations_total"), 0) << w_->Metrics();
  EXPECT_EQ(c_->JobState(job), "RUNNING");
}

// Scenario 4: one of two members, then it is deleted: the registry's tick
// (gang.tick_period 300ms here) finds it gone and releases the gang.
TEST_F(DraGangE2eTest, MemberDeletedBeforeTheGangIsCompleteReleasesIt) {
  PostPodGroup("half", 2);
  PostPod(Member("half-0", "half", 4));
  ASSERT_TRUE(WaitFor([&] { return GangJobs().size() == 1; }, absl::Seconds(30)))
      << c_->Cli("squeue").out << w_->Log();
  const uint32_t gang = GangJobs()[0].id;
  ASSERT_TRUE(WaitFor([&] { return Rules().size() == 8; })) << Rules().size();
  EXPECT_EQ(DuetHoldings("gang_slot"), 2) << w_->Ctl("holds").out;

  Api("DELETE", "/api/v1/namespaces/default/pods/half-0");
  EXPECT_TRUE(WaitFor([&] { return c_->JobEnded(gang); }, absl::Seconds(15)))
      << c_->Cli("squeue").out << w_->Log();
  EXPECT_TRUE(WaitFor([&] { return DuetHoldings("gang_slot") == 0; })) << w_->Ctl("holds").out;
  // Every device is tainted again: its DeviceTaintRule is back.
  EXPECT_TRUE(WaitFor([&] { return Rules().size() == 16; })) << Rules().size();
  EXPECT_TRUE(GangJobs().empty()) << c_->Cli("squeue").out;
  EXPECT_EQ(Metric("duet_gang_releases_total{reason=\"member-deleted\"}"), 1) << w_->Metrics();
}

}  // namespace
}  // namespace duet
