// What in Slurm's configuration could end or block a placeholder
// (bridge/slurm/placeholder_policy.h), and reservations and node flags that
// keep placeholders off a node (SlurmNodeLoads). Label: unit; the same
// settings on a real slurmctld are in tests/integration/slurm_policy_test.cc.

#include "bridge/slurm/placeholder_policy.h"

#include <set>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "bridge/slurm/slurm_sync.h"
#include "gtest/gtest.h"

namespace duet {
namespace {

std::set<std::string> Names(const std::vector<PlaceholderRisk>& risks) {
  std::set<std::string> out;
  for (const PlaceholderRisk& r : risks) out.insert(PlaceholderRiskName(r.kind));
  return out;
}

std::string Detail(const std::vector<PlaceholderRisk>& risks, PlaceholderRiskKind kind) {
  for (const PlaceholderRisk& r : risks) {
    if (r.kind == kind) return r.detail;
  }
  return "";
}

SlurmPartitionInfo Partition(const std::string& name, bool is_default, uint16_t tier,
                             const std::string& preempt_mode = "") {
  SlurmPartitionInfo p;
  p.name = name;
  p.is_default = is_default;
  p.priority_tier = tier;
  p.preempt_mode = preempt_mode;
  return p;
}

SlurmClusterConfig Confined() {
  SlurmClusterConfig c;
  c.preempt_type = "preempt/none";
  c.preempt_mode = "OFF";
  c.task_plugin = "task/cgroup,task/affinity";
  c.constrain_devices = true;
  return c;
}

TEST(PlaceholderPolicyTest, OwnUnlimitedPartitionWithoutPreemptionHasNoRisk) {
  const auto risks = PlaceholderRisks(Confined(), {Partition("batch", true, 1),
                                                   Partition("duet-pods", false, 1)},
                                      "duet-pods");
  EXPECT_TRUE(risks.empty()) << Names(risks).size();
}

TEST(PlaceholderPolicyTest, TheDefaultPartitionIsSharedWithUsersAndItsCapsNamed) {
  SlurmPartitionInfo batch = Partition("batch", true, 1);
  batch.max_cpus_per_node = 4;
  batch.max_time_min = 60;
  const auto risks = PlaceholderRisks(Confined(), {batch}, "");
  EXPECT_EQ(Names(risks), (std::set<std::string>{"shared_partition", "time_limit"}));
  EXPECT_TRUE(absl::StrContains(Detail(risks, PlaceholderRiskKind::kSharedPartition),
                                "MaxCPUsPerNode=4"));
  EXPECT_TRUE(absl::StrContains(Detail(risks, PlaceholderRiskKind::kTimeLimit), "MaxTime=60"));
}

TEST(PlaceholderPolicyTest, AMissingPartitionIsSaid) {
  const auto risks = PlaceholderRisks(Confined(), {Partition("batch", true, 1)}, "duet-pods");
  EXPECT_EQ(Names(risks), (std::set<std::string>{"partition_missing"}));
}

TEST(PlaceholderPolicyTest, PartitionPrioPreemptsUnlessOffOrExempt) {
  SlurmClusterConfig c = Confined();
  c.preempt_type = "preempt/partition_prio";
  c.preempt_mode = "REQUEUE";
  const std::vector<SlurmPartitionInfo> parts = {Partition("low", true, 1),
                                                 Partition("high", false, 10),
                                                 Partition("duet-pods", false, 1)};
  auto risks = PlaceholderRisks(c, parts, "duet-pods");
  EXPECT_EQ(Names(risks), (std::set<std::string>{"preemptable"}));
  EXPECT_TRUE(absl::StrContains(Detail(risks, PlaceholderRiskKind::kPreemptable),
                                "high (PriorityTier=10)"))
      << Detail(risks, PlaceholderRiskKind::kPreemptable);

  std::vector<SlurmPartitionInfo> off = parts;
  off[2].preempt_mode = "OFF";
  EXPECT_TRUE(PlaceholderRisks(c, off, "duet-pods").empty());

  std::vector<SlurmPartitionInfo> top = parts;
  top[2].priority_tier = 20;  // nothing ranks above it
  EXPECT_TRUE(PlaceholderRisks(c, top, "duet-pods").empty());

  c.preempt_params = "min_exempt_priority=4294967292";
  EXPECT_TRUE(PlaceholderRisks(c, parts, "duet-pods").empty());
  c.preempt_params = "min_exempt_priority=4294967293";  // not below the placeholders' priority
  EXPECT_EQ(Names(PlaceholderRisks(c, parts, "duet-pods")),
            (std::set<std::string>{"preemptable"}));
}

// slurm.preemption: evict-pods wants placeholders preemptable by CANCEL or
// REQUEUE (the pod is evicted); a mode that would suspend one stays a risk.
TEST(PlaceholderPolicyTest, UnderEvictPodsOnlySuspendingPreemptionIsARisk) {
  SlurmClusterConfig c = Confined();
  c.preempt_type = "preempt/partition_prio";
  c.preempt_mode = "CANCEL";
  std::vector<SlurmPartitionInfo> parts = {Partition("high", false, 10),
                                           Partition("duet-pods", false, 1)};
  EXPECT_TRUE(PlaceholderRisks(c, parts, "duet-pods", /*evict_pods=*/true).empty());
  EXPECT_EQ(Names(PlaceholderRisks(c, parts, "duet-pods", /*evict_pods=*/false)),
            (std::set<std::string>{"preemptable"}));
  c.preempt_mode = "SUSPEND,GANG";
  auto risks = PlaceholderRisks(c, parts, "duet-pods", /*evict_pods=*/true);
  EXPECT_EQ(Names(risks), (std::set<std::string>{"preemptable"}));
  EXPECT_TRUE(absl::StrContains(Detail(risks, PlaceholderRiskKind::kPreemptable), "suspend"))
      << Detail(risks, PlaceholderRiskKind::kPreemptable);
  parts[1].preempt_mode = "REQUEUE";  // the partition's own mode wins
  EXPECT_TRUE(PlaceholderRisks(c, parts, "duet-pods", /*evict_pods=*/true).empty());
}

TEST(PlaceholderPolicyTest, QosPreemptionIsARiskUnlessExempt) {
  SlurmClusterConfig c = Confined();
  c.preempt_type = "preempt/qos";
  const std::vector<SlurmPartitionInfo> parts = {Partition("duet-pods", false, 1, "OFF")};
  EXPECT_EQ(Names(PlaceholderRisks(c, parts, "duet-pods")),
            (std::set<std::string>{"preemptable"}));
  c.preempt_params = "reclaim_licenses,min_exempt_priority=1000";
  EXPECT_TRUE(PlaceholderRisks(c, parts, "duet-pods").empty());
}

TEST(PlaceholderPolicyTest, NoDeviceCgroupIsSaid) {
  SlurmClusterConfig c = Confined();
  c.task_plugin = "task/none";
  const std::vector<SlurmPartitionInfo> parts = {Partition("duet-pods", false, 1)};
  EXPECT_EQ(Names(PlaceholderRisks(c, parts, "duet-pods")),
            (std::set<std::string>{"devices_unconstrained"}));
  c = Confined();
  c.constrain_devices = false;
  EXPECT_EQ(Names(PlaceholderRisks(c, parts, "duet-pods")),
            (std::set<std::string>{"devices_unconstrained"}));
  c.constrain_devices.reset();
  EXPECT_EQ(Names(PlaceholderRisks(c, parts, "duet-pods")),
            (std::set<std::string>{"devices_unconstrained"}));
}

SlurmNodeInfo Idle(const std::string& name) {
  SlurmNodeInfo n;
  n.name = name;
  n.state = "IDLE";
  return n;
}

TEST(SlurmNodeLoadsTest, ReservedNowOrLaterKeepsPlaceholdersOffEndedDoesNot) {
  const absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  SlurmReservationInfo active;
  active.name = "train";
  active.nodes = {"a"};
  active.start = now - absl::Hours(1);
  active.end = now + absl::Hours(1);
  active.users = "alice";
  SlurmReservationInfo later;
  later.name = "maint";
  later.maint = true;
  later.nodes = {"b"};
  later.start = now + absl::Hours(2);
  later.end = now + absl::Hours(3);
  SlurmReservationInfo over = active;
  over.name = "old";
  over.nodes = {"c"};
  over.end = now - absl::Minutes(1);
  SlurmNodeLoads loads;
  loads.Replace({Idle("a"), Idle("b"), Idle("c")}, {active, later, over}, now);
  EXPECT_TRUE(absl::StartsWith(loads.Unusable("a"),
                               "reserved in Slurm: reservation train for users alice until "))
      << loads.Unusable("a");
  EXPECT_TRUE(absl::StrContains(loads.Unusable("b"), "reservation maint (MAINT) from "))
      << loads.Unusable("b");
  EXPECT_TRUE(absl::StrContains(loads.Unusable("b"), "would overlap it")) << loads.Unusable("b");
  EXPECT_EQ(loads.Unusable("c"), "");
  // A node Slurm refuses for its state keeps that reason.
  SlurmNodeInfo drained = Idle("a");
  drained.drain = true;
  drained.reason = "fix";
  loads.Replace({drained}, {active}, now);
  EXPECT_EQ(loads.Unusable("a"), "drained in Slurm (fix)");
}

TEST(SlurmNodeLoadsTest, RebootRequestedAndOtherRefusingFlagsMakeANodeUnusable) {
  SlurmNodeInfo n = Idle("a");
  n.reboot = true;
  EXPECT_EQ(UnusableReason(n), "reboot requested in Slurm");
  n = Idle("a");
  n.failing = true;
  n.reason = "disk";
  EXPECT_EQ(UnusableReason(n), "failing in Slurm (disk)");
  n = Idle("a");
  n.powered_down = true;
  EXPECT_EQ(UnusableReason(n), "powered down in Slurm");
  EXPECT_EQ(UnusableReason(Idle("a")), "");
}

}  // namespace
}  // namespace duet
