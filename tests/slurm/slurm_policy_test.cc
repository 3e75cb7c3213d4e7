// Placeholders against the settings people give a real Slurm (label: slurm,
// one cluster per test process, slurm.conf chosen by the test's name):
// their own partition (no time limit, out of the users' per-node caps),
// preemption under preempt/partition_prio, reservations and node flags that
// keep them off a node, and slurmctld killed right after a placeholder was
// made. Issue 24; each case failed before placeholders had a partition of
// their own, an unlimited time and these checks.

#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bridge/slurm/libslurm_client.h"
#include "bridge/slurm/placeholders.h"
#include "bridge/slurm/slurm_sync.h"
#include "gtest/gtest.h"
#include "tests/slurm/slurm_cluster_fixture.h"
#include "tests/slurm/test_node_spec.h"

namespace duet {
namespace {

using ::duet::testing::CmdResult;
using ::duet::testing::TestSlurmCluster;
using ::duet::testing::WaitFor;

constexpr const char* kGpu = ::duet::testing::kTestGpuModel;
constexpr char kPods[] = "duet-pods";

// The placeholders' partition as docs/config.md gives it.
constexpr char kPodsPartition[] =
    "PartitionName=duet-pods Nodes=ALL MaxTime=INFINITE State=UP Hidden=YES PreemptMode=OFF "
    "DefMemPerCPU=100";

std::string ExtraConf() {
  const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::string conf = "RebootProgram=/bin/true\n";
  if (absl::StrContains(test, "Preempt")) {
    absl::StrAppend(&conf,
                    "PreemptType=preempt/partition_prio\nPreemptMode=REQUEUE\n"
                    "PartitionName=duet Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
                    "PriorityTier=1 DefMemPerCPU=100\n"
                    "PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 "
                    "DefMemPerCPU=100\n");
  } else if (absl::StrContains(test, "Caps")) {
    absl::StrAppend(&conf,
                    "PartitionName=duet Nodes=ALL Default=YES MaxTime=1 State=UP "
                    "MaxCPUsPerNode=4 DefMemPerCPU=100\n");
  }
  return absl::StrCat(conf, kPodsPartition, "\n");
}


class SlurmPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TestSlurmCluster::Options co;
    co.extra_conf = ExtraConf();
    cluster_ = TestSlurmCluster::Get(co);
    ASSERT_TRUE(cluster_->ok());
    client_ = std::make_unique<LibSlurmClient>();
    sync_ = NewSync(kPods);
    placeholders_ = std::make_unique<Placeholders>(&ledger_, client_.get(),
                                                   PlaceholderJobOptions{kPods, ""});
  }

  std::unique_ptr<SlurmSync> NewSync(const std::string& partition) {
    SlurmSyncOptions o;
    o.loads = &loads_;
    o.release_grace = absl::ZeroDuration();
    o.placeholder_partition = partition;
    o.pod_liveness = [](const std::string&) { return PodLiveness::kLive; };
    o.pod_name = [](const std::string& uid) -> std::optional<PlaceholderPod> {
      return PlaceholderPod{uid, "default", absl::StrCat("pod-", uid)};
    };
    o.on_placeholder_lost = [this](const PlaceholderLoss& loss) { losses_.push_back(loss); };
    return std::make_unique<SlurmSync>(o, &ledger_, client_.get(), Clock::Real());
  }

  void AddNode(const std::string& name, int idx) {
    ASSERT_TRUE(ledger_.UpsertNode(::duet::testing::TestNodeSpec(name, idx, 8)).ok());
    ASSERT_TRUE(sync_->RunOnce().ok());
    cluster_->StartSlurmd(name, idx, 8, 16000, 8, kGpu);
    ASSERT_TRUE(cluster_->WaitNodeState(name, "IDLE")) << cluster_->Log("slurmctld.log");
  }

  // `scontrol show job` field (e.g. "TimeLimit").
  std::string JobField(uint32_t job, const std::string& field) {
    const std::string out = cluster_->Cli(absl::StrCat("scontrol show job ", job)).out;
    for (absl::string_view w : absl::StrSplit(out, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
      if (absl::StartsWith(w, field + "=")) return std::string(w.substr(field.size() + 1));
    }
    return "";
  }

  std::set<uint32_t> PodGpus(const std::string& node, const std::string& uid) {
    std::set<uint32_t> out;
    for (const Holding& h : ledger_.ListHoldings(node)) {
      if (h.owner.kind != OwnerKind::kPlaceholder || h.owner.pod_uid != uid) continue;
      for (const HeldDevice& d : h.devices) out.insert(d.index);
    }
    return out;
  }

  TestSlurmCluster* cluster_ = nullptr;
  Ledger ledger_;
  SlurmNodeLoads loads_;
  std::unique_ptr<LibSlurmClient> client_;
  std::unique_ptr<SlurmSync> sync_;
  std::unique_ptr<Placeholders> placeholders_;
  std::vector<PlaceholderLoss> losses_;
};

// The users' partition has MaxTime=1 and MaxCPUsPerNode=4. Placeholders in
// their own partition have no time limit (in the users' one they expired
// after MaxTime and Slurm gave the pod's GPU to a pending job), and four of
// them do not use up the users' per-node CPU cap (a 1-GPU srun was refused,
// "Requested nodes are busy", with GPUs and CPUs free).
TEST_F(SlurmPolicyTest, PlaceholdersHaveNoTimeLimitAndLeaveTheUsersCapsAlone) {
  AddNode("po-a", 81);
  std::vector<uint32_t> jobs;
  for (int i = 0; i < 4; ++i) {
    auto p = placeholders_->Create(Owner::Pod(absl::StrCat("uid-a", i), "default",
                                              absl::StrCat("a", i)),
                                   "po-a", 1, 0, 1, 100);
    ASSERT_TRUE(p.ok()) << p.status();
    jobs.push_back(p->owner.job_id);
  }
  for (uint32_t job : jobs) {
    EXPECT_EQ(JobField(job, "Partition"), kPods);
    EXPECT_EQ(JobField(job, "TimeLimit"), "UNLIMITED");
  }
  const std::string srun = "srun -I10 -p duet -w po-a --gres=gpu:1 -n1 true";
  CmdResult r = cluster_->Cli(srun);
  // "slurm 24.11.5", "slurm-wlm 24.11.5" (Debian)
  if (absl::StrContains(cluster_->Cli("scontrol --version").out, " 24.11.")) {
    // Slurm 24.11 counts the CPUs of every job on the node, the other
    // partition's placeholders too, against MaxCPUsPerNode (22.05, 25.11 and
    // 26.05 count the partition's own jobs): the four placeholders fill the
    // users' cap of 4 there, and one fewer leaves room.
    EXPECT_NE(r.rc, 0) << r.out;
    ASSERT_TRUE(placeholders_->Cancel("po-a", "uid-a3").ok());
    r = cluster_->Cli(srun);
    EXPECT_EQ(r.rc, 0) << r.out;
    // The srun's job counts on the node until it has left COMPLETING: a
    // placeholder asked for before then is refused "Requested nodes are busy".
    ASSERT_TRUE(WaitFor([&] {
      return cluster_->Cli("squeue -h -p duet -w po-a -t PD,R,CG,S -o %i").out.empty() &&
             cluster_->Cli("squeue -h -w po-a -t CG -o %i").out.empty();
    }, absl::Seconds(30))) << cluster_->Cli("squeue -t PD,R,CG,S -o '%i %P %T %r'").out;
    auto p = placeholders_->Create(Owner::Pod("uid-a3", "default", "a3"), "po-a", 1, 0, 1, 100);
    ASSERT_TRUE(p.ok()) << p.status();
  } else {
    EXPECT_EQ(r.rc, 0) << r.out;
  }

  // The check reads the same settings from slurmctld: placeholders in their
  // own partition risk nothing but the missing device cgroup (TaskPlugin
  // task/none here); sent to the users' partition, they would share its caps
  // and its time limit.
  ASSERT_TRUE(sync_->RunOnce().ok());
  SlurmSyncStats st = sync_->stats();
  ASSERT_TRUE(st.placeholder_risks_known);
  EXPECT_EQ(st.placeholder_risks.size(), 1u);
  EXPECT_EQ(st.placeholder_risks.count("devices_unconstrained"), 1u);
  auto shared = NewSync("");
  ASSERT_TRUE(shared->RunOnce().ok());
  st = shared->stats();
  EXPECT_EQ(st.placeholder_risks.count("shared_partition"), 1u);
  EXPECT_TRUE(absl::StrContains(st.placeholder_risks["shared_partition"], "MaxCPUsPerNode=4"));
  EXPECT_EQ(st.placeholder_risks.count("time_limit"), 1u);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(placeholders_->Cancel("po-a", absl::StrCat("uid-a", i)).ok());
}

// PreemptType=preempt/partition_prio, PreemptMode=REQUEUE, a partition of
// higher PriorityTier: its job asking for every GPU pends while a placeholder
// (in a partition with PreemptMode=OFF) holds two. Slurm preempted
// placeholders in the users' partition, and duet then refused the
// preemptor's steps (the pod still ran), so the high-priority job failed.
TEST_F(SlurmPolicyTest, PreemptionLeavesAPlaceholderInItsOwnPartitionAlone) {
  AddNode("po-b", 82);
  auto p = placeholders_->Create(Owner::Pod("uid-b", "default", "b"), "po-b", 2, 0, 1, 100);
  ASSERT_TRUE(p.ok()) << p.status();
  const uint32_t low = cluster_->Sbatch("-p duet -w po-b --gres=gpu:6 --wrap 'sleep 300'");
  ASSERT_TRUE(cluster_->WaitJobState(low, "RUNNING"));
  // Every GPU: only by preempting the placeholder, which Slurm must not.
  const uint32_t all = cluster_->Sbatch("-p high -w po-b --gres=gpu:8 --wrap 'sleep 300'");
  ASSERT_NE(all, 0u);
  ASSERT_TRUE(WaitFor([&] {
    const std::string reason = cluster_->Cli(absl::StrCat("squeue -h -j ", all, " -o %r")).out;
    return absl::StrContains(reason, "Resources") || absl::StrContains(reason, "Priority");
  }, absl::Seconds(30))) << cluster_->Cli("squeue -o '%i %P %T %r'").out;
  // Six GPUs: preemption works in this cluster, the users' job is requeued.
  cluster_->Cli(absl::StrCat("scancel ", all));
  const uint32_t six = cluster_->Sbatch("-p high -w po-b --gres=gpu:6 --wrap 'sleep 300'");
  ASSERT_TRUE(cluster_->WaitJobState(six, "RUNNING", absl::Seconds(40)))
      << cluster_->Cli("squeue -o '%i %P %T %r'").out << cluster_->Log("slurmctld.log");
  EXPECT_NE(cluster_->JobState(low), "RUNNING");
  EXPECT_EQ(cluster_->JobState(p->owner.job_id), "RUNNING") << cluster_->Log("slurmctld.log");
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(sync_->stats().placeholder_risks.count("preemptable"), 0u);
  EXPECT_EQ(PodGpus("po-b", "uid-b").size(), 2u);
  cluster_->Cli(absl::StrCat("scancel ", six, " ", low));
  EXPECT_TRUE(placeholders_->Cancel("po-b", "uid-b").ok());
}

// A reservation, active now or starting later, keeps placeholders off its
// node, as Slurm does (a placeholder names no reservation and has no end):
// the filter's reason names it, and Slurm refuses a placeholder there. Once
// deleted, the node takes placeholders again. (The filter used to offer a
// reserved node, even score it higher, and every bind sent there failed.)
TEST_F(SlurmPolicyTest, ReservationsNowAndLaterKeepPlaceholdersOff) {
  AddNode("po-c", 83);
  AddNode("po-d", 84);
  ASSERT_EQ(cluster_->Cli("scontrol create reservation ReservationName=now StartTime=now "
                          "Duration=60 Nodes=po-c Users=root")
                .rc,
            0);
  ASSERT_EQ(cluster_->Cli("scontrol create reservation ReservationName=later "
                          "StartTime=now+2hours Duration=60 Nodes=po-d Users=root")
                .rc,
            0);
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_TRUE(absl::StartsWith(loads_.Unusable("po-c"), "reserved in Slurm: reservation now "))
      << loads_.Unusable("po-c");
  EXPECT_TRUE(absl::StrContains(loads_.Unusable("po-d"), "reservation later")) << loads_.Unusable("po-d");
  EXPECT_TRUE(absl::StrContains(loads_.Unusable("po-d"), "from ")) << loads_.Unusable("po-d");
  // Slurm agrees with both.
  auto on_c = placeholders_->Create(Owner::Pod("uid-c", "default", "c"), "po-c", 1, 0, 1, 100);
  EXPECT_FALSE(on_c.ok()) << "Slurm placed a placeholder on a reserved node";
  auto on_d = placeholders_->Create(Owner::Pod("uid-d", "default", "d"), "po-d", 1, 0, 1, 100);
  EXPECT_FALSE(on_d.ok()) << "Slurm placed a placeholder before a reservation";
  if (on_d.ok()) (void)placeholders_->Cancel("po-d", "uid-d");

  ASSERT_EQ(cluster_->Cli("scontrol delete reservation=now").rc, 0);
  ASSERT_EQ(cluster_->Cli("scontrol delete reservation=later").rc, 0);
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(loads_.Unusable("po-c"), "");
  EXPECT_EQ(loads_.Unusable("po-d"), "");
  auto ok = placeholders_->Create(Owner::Pod("uid-d", "default", "d"), "po-d", 1, 0, 1, 100);
  EXPECT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(placeholders_->Cancel("po-d", "uid-d").ok());
}

// A reboot requested for a busy node: Slurm starts nothing new there, so the
// filter drops it with Slurm's word; cancel_reboot makes it usable again.
TEST_F(SlurmPolicyTest, RebootRequestedKeepsPlaceholdersOffUntilCancelled) {
  AddNode("po-e", 85);
  const uint32_t job = cluster_->Sbatch("-p duet -w po-e --gres=gpu:1 --wrap 'sleep 300'");
  ASSERT_TRUE(cluster_->WaitJobState(job, "RUNNING"));
  ASSERT_EQ(cluster_->Cli("scontrol reboot nextstate=resume po-e").rc, 0);
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_TRUE(absl::StartsWith(loads_.Unusable("po-e"), "reboot requested in Slurm"))
      << loads_.Unusable("po-e") << "\n" << cluster_->Cli("scontrol show node po-e").out;
  // Slurm 22.05 starts no job on a node waiting for its reboot; 24.11 and
  // later still do, and put the reboot off until the node is idle, which a
  // pod's placeholder would do for as long as the pod runs. Either way the
  // filter keeps pods off (above).
  auto p = placeholders_->Create(Owner::Pod("uid-e", "default", "e"), "po-e", 1, 0, 1, 100);
  if (p.ok()) {
    EXPECT_TRUE(absl::StrContains(cluster_->Cli("scontrol show node po-e").out, "REBOOT_REQUESTED"))
        << cluster_->Cli("scontrol show node po-e").out;
    (void)placeholders_->Cancel("po-e", "uid-e");
  } else {
    EXPECT_TRUE(absl::StrContains(cluster_->Cli("scontrol --version").out, " 22.05."))
        << "refused on " << cluster_->Cli("scontrol --version").out << ": " << p.status();
  }
  ASSERT_EQ(cluster_->Cli("scontrol cancel_reboot po-e").rc, 0);
  ASSERT_TRUE(WaitFor([&] {
    (void)sync_->RunOnce();
    return loads_.Unusable("po-e").empty();
  })) << loads_.Unusable("po-e") << "\n" << cluster_->Cli("scontrol show node po-e").out;
  cluster_->Cli(absl::StrCat("scancel ", job));
}

// slurmctld killed (-9) just after a placeholder was made loses the job (it
// had not saved it) and may hand its id to the next job. Through the restart
// and the repair the pod's GPUs stay held in the ledger, and the re-made
// placeholder carries the pod's name (it was "duet-pod:/").
TEST_F(SlurmPolicyTest, SlurmctldKilledRightAfterAPlaceholderKeepsThePodsGpusAndName) {
  AddNode("po-f", 86);
  auto p = placeholders_->Create(Owner::Pod("uid-f", "default", "pod-uid-f"), "po-f", 2, 0, 1,
                                 100);
  ASSERT_TRUE(p.ok()) << p.status();
  const std::set<uint32_t> gpus = PodGpus("po-f", "uid-f");
  cluster_->CtldKill();
  ASSERT_TRUE(cluster_->CtldStart());
  bool repaired = false;
  ASSERT_TRUE(WaitFor(
      [&] {
        (void)sync_->RunOnce();
        EXPECT_EQ(PodGpus("po-f", "uid-f"), gpus) << "the pod's GPUs must stay held";
        for (const PlaceholderLoss& l : losses_) repaired = repaired || l.repaired;
        // Not lost (slurmctld had saved it) is fine too: still running.
        auto j = client_->GetJob(p->owner.job_id);
        const bool alive = j.ok() && j->has_value() && (*j)->live() &&
                           ParsePlaceholderComment((*j)->comment).has_value();
        return repaired || alive;
      },
      absl::Seconds(30)))
      << cluster_->Cli("squeue -o '%i %j %T'").out;
  std::cout << (repaired ? "placeholder lost and repaired" : "placeholder survived the kill")
            << "; lost job " << p->owner.job_id << ", now "
            << cluster_->Cli("squeue -h -o '%i %j'").out;
  CmdResult names = cluster_->Cli("squeue -h -w po-f -o %j");
  EXPECT_EQ(std::string(absl::StripAsciiWhitespace(names.out)), "duet-pod:default/pod-uid-f")
      << names.out;
  EXPECT_EQ(PodGpus("po-f", "uid-f"), gpus);
  EXPECT_TRUE(placeholders_->Cancel("po-f", "uid-f").ok());
}

}  // namespace
}  // namespace duet
