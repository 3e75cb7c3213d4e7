// Placeholders::Repair against the in-memory slurmctld (label: unit): the
// cases a real cluster shows only by chance, such as slurmctld reusing the
// lost placeholder's job id after a crash.

#include <set>

#include "bridge/ledger/ledger.h"
#include "bridge/slurm/placeholders.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_slurm.h"
#include "tests/slurm/test_node_spec.h"

namespace duet {
namespace {


std::set<uint32_t> PodGpus(const Ledger& ledger, const std::string& node, const std::string& uid) {
  std::set<uint32_t> out;
  for (const Holding& h : ledger.ListHoldings(node)) {
    if (h.owner.kind != OwnerKind::kPlaceholder || h.owner.pod_uid != uid) continue;
    for (const HeldDevice& d : h.devices) out.insert(d.index);
  }
  return out;
}

class PlaceholderRepairTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ledger_.UpsertNode(::duet::testing::TestNodeSpec("n1", 1, 8)).ok());
  }

  // The ledger holds `gpus` for pod uid-a as placeholder job `job`, whose
  // Slurm job is gone (the fake has no such job: its GPUs are free there).
  Holding Lost(uint32_t job, std::vector<uint32_t> gpus) {
    HoldRequest r;
    r.node = "n1";
    r.owner = Owner::Placeholder(job, "uid-a");
    for (uint32_t g : gpus) r.devices.push_back({DeviceKind::kGpu, g, kWholeDevice});
    auto held = ledger_.Hold(r);
    EXPECT_TRUE(held.ok()) << held.status();
    return held.ok() ? held->holding : Holding{};
  }

  Ledger ledger_;
  fakes::FakeSlurmClient slurm_{8, 100};
  Placeholders placeholders_{&ledger_, &slurm_};
};

// slurmctld killed right after a bind forgets the placeholder and hands its
// job id to the repair's new job: the lost owner and the new one are the
// same, so the pod's holding must stay (it was released, leaving the running
// pod without a ledger holding until the next pass).
TEST_F(PlaceholderRepairTest, JobIdReusedBySlurmKeepsThePodsHolding) {
  const Holding lost = Lost(42, {0, 1});
  slurm_.set_next_job_id(42);
  auto fixed = placeholders_.Repair(lost, {"uid-a", "ml", "trainer-0"}, 2, 1024);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  ASSERT_EQ(fixed->size(), 1u);
  EXPECT_EQ((*fixed)[0].owner, Owner::Placeholder(42, "uid-a"));
  EXPECT_EQ(PodGpus(ledger_, "n1", "uid-a"), (std::set<uint32_t>{0, 1}));
  EXPECT_TRUE(ledger_.FindHolding("n1", lost.owner).has_value());
  EXPECT_TRUE(ledger_.CheckInvariants().ok());
  ASSERT_EQ(slurm_.asked().size(), 1u);
  EXPECT_EQ(slurm_.asked()[0].job_name, "duet-pod:ml/trainer-0");
}

// The usual case: a new id; the new job's holding replaces the lost one with
// no gap, and the filler below the pod's GPUs is cancelled.
TEST_F(PlaceholderRepairTest, NewJobReplacesTheLostOneOnTheSameGpus) {
  const Holding lost = Lost(42, {2, 3});
  auto fixed = placeholders_.Repair(lost, {"uid-a", "ml", "trainer-0"}, 2, 1024);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  ASSERT_EQ(fixed->size(), 1u);
  EXPECT_NE((*fixed)[0].owner.job_id, 42u);
  EXPECT_FALSE(ledger_.FindHolding("n1", lost.owner).has_value());
  EXPECT_EQ(PodGpus(ledger_, "n1", "uid-a"), (std::set<uint32_t>{2, 3}));
  EXPECT_EQ(slurm_.live_jobs(), 1u) << "the filler on GPUs 0-1 is cancelled";
}

// A repair Slurm answers with other GPUs (it counts the pod's GPUs in use
// with no job) changes nothing in the ledger and leaves no job behind.
TEST_F(PlaceholderRepairTest, SlurmChoosingOtherGpusChangesNothing) {
  const Holding lost = Lost(42, {0, 1});
  slurm_.Use("n1", 0, 2);  // Slurm still counts GPUs 0-1 in use
  auto fixed = placeholders_.Repair(lost, {"uid-a", "ml", "trainer-0"}, 2, 1024);
  ASSERT_FALSE(fixed.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(fixed.status())) << fixed.status();
  EXPECT_NE(fixed.status().message().find("Slurm gave job"), absl::string_view::npos);
  EXPECT_TRUE(ledger_.FindHolding("n1", lost.owner).has_value());
  EXPECT_EQ(PodGpus(ledger_, "n1", "uid-a"), (std::set<uint32_t>{0, 1}));
  EXPECT_EQ(slurm_.live_jobs(), 0u);
}

}  // namespace
}  // namespace duet
