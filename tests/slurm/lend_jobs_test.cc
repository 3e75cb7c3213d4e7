// Lend jobs (the DRA lending mode, docs/dra.md): Placeholders::CreateLend /
// CancelLend, and how SlurmSync imports and ends them, against the in-memory
// SlurmClient.

#include <cstdint>
#include <vector>

#include "bridge/ledger/ledger.h"
#include "bridge/slurm/placeholders.h"
#include "bridge/slurm/slurm_sync.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_slurm.h"
#include "tests/slurm/test_node_spec.h"

namespace duet {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<uint32_t> Gpus(const Holding& h) {
  std::vector<uint32_t> out;
  for (const HeldDevice& d : h.devices) out.push_back(d.index);
  return out;
}

class LendJobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ledger_.UpsertNode(::duet::testing::TestNodeSpec("n1", 1, 8)).ok());
  }
  void TearDown() override { EXPECT_TRUE(ledger_.CheckInvariants().ok()); }

  Ledger ledger_;
  fakes::FakeSlurmClient slurm_;
  Placeholders placeholders_{&ledger_, &slurm_, PlaceholderJobOptions{"duet", "duet-qos"}};
};

TEST_F(LendJobsTest, CreateLendAsksSlurmAndRecordsALendOwner) {
  absl::StatusOr<Holding> a = placeholders_.CreateLend("n1", DeviceKind::kGpu, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->owner, Owner::Lend(5000, "n1"));
  EXPECT_THAT(Gpus(*a), ElementsAre(0));
  absl::StatusOr<Holding> b = placeholders_.CreateLend("n1", DeviceKind::kGpu, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->owner, Owner::Lend(5001, "n1"));
  EXPECT_THAT(Gpus(*b), ElementsAre(1));  // Slurm's choice, lowest free
  ASSERT_EQ(slurm_.asked().size(), 2u);
  const SlurmAllocRequest req = slurm_.asked()[0];
  EXPECT_EQ(req.job_name, "duet-lend:n1");
  EXPECT_EQ(req.comment, "duet-lend node=n1");
  EXPECT_EQ(req.gpus, 1u);
  EXPECT_EQ(req.cpus, 1u);
  EXPECT_EQ(req.partition, "duet");
  EXPECT_EQ(req.qos, "duet-qos");
  EXPECT_EQ(ParseLendComment(req.comment), std::optional<std::string>("n1"));
  EXPECT_EQ(ParseLendComment("duet-pod uid=x"), std::nullopt);
  EXPECT_EQ(ParseLendComment("duet-lend "), std::nullopt);
  EXPECT_EQ(ParsePlaceholderComment(req.comment), std::nullopt);
}

// A lend job Slurm gave no devices (a GRES without File=, or a Slurm that
// answers without IDX) lends nothing: it is cancelled and the lend fails,
// never recorded as a lend of nothing.
TEST_F(LendJobsTest, ALendJobWithNoDevicesIsCancelledAndLendsNothing) {
  SlurmAllocation empty;
  empty.job_id = 5100;
  slurm_.set_allocation(empty);
  absl::StatusOr<Holding> a = placeholders_.CreateLend("n1", DeviceKind::kGpu, 1);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInternal) << a.status();
  EXPECT_THAT(a.status().message(), HasSubstr("Slurm gave the lend job no devices"));
  EXPECT_THAT(slurm_.killed(), ElementsAre(5100));
  EXPECT_TRUE(ledger_.ListHoldings("n1").empty());
}

TEST_F(LendJobsTest, CreateLendCancelsTheJobWhenTheLedgerRefusesSlurmsDevices) {
  // A step the ledger knows holds gpu 0, which Slurm thinks free.
  HoldRequest step;
  step.node = "n1";
  step.owner = Owner::SlurmStep(77, 0);
  step.devices = {{DeviceKind::kGpu, 0, 0}};
  ASSERT_TRUE(ledger_.Hold(step).ok());
  absl::StatusOr<Holding> a = placeholders_.CreateLend("n1", DeviceKind::kGpu, 1);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(slurm_.killed(), ElementsAre(5000));
  EXPECT_EQ(ledger_.ListHoldings("n1").size(), 1u);
  EXPECT_EQ(placeholders_.CreateLend("n1", DeviceKind::kGpu, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(placeholders_.CreateLend("zz", DeviceKind::kGpu, 1).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(LendJobsTest, CreateLendKeepsItsJobWhenASyncImportAndAClaimGotThereFirst) {
  // Between Slurm's answer and CreateLend's own hold, a sync pass imported
  // lend job 5000 (gpu 0) and the webhook admitted a claim on it (Rebind
  // Lend -> Claim): the lend is made, and its job must not be cancelled
  // from under the claim.
  HoldRequest claimed;
  claimed.node = "n1";
  claimed.owner = Owner::Claim(5000, "claim-uid-1", "default", "c1");
  claimed.devices = {{DeviceKind::kGpu, 0, kWholeDevice}};
  ASSERT_TRUE(ledger_.Hold(claimed).ok());
  absl::StatusOr<Holding> a = placeholders_.CreateLend("n1", DeviceKind::kGpu, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->owner, Owner::Lend(5000, "n1"));
  EXPECT_THAT(Gpus(*a), ElementsAre(0));
  EXPECT_TRUE(slurm_.killed().empty());
  ASSERT_EQ(ledger_.ListHoldings("n1").size(), 1u);
  EXPECT_EQ(ledger_.ListHoldings("n1")[0].owner.kind, OwnerKind::kClaim);
}

TEST_F(LendJobsTest, CancelLendKillsTheJobAndReleasesButNeverUnderAClaim) {
  absl::StatusOr<Holding> a = placeholders_.CreateLend("n1", DeviceKind::kGpu, 1);
  absl::StatusOr<Holding> b = placeholders_.CreateLend("n1", DeviceKind::kGpu, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(placeholders_.CancelLend("n1", 5000).ok());
  EXPECT_THAT(slurm_.killed(), ElementsAre(5000));
  EXPECT_FALSE(ledger_.FindHolding("n1", Owner::Lend(5000, "n1")).has_value());
  // Job 5001's device is a claim's: cancelling would give Slurm a device
  // Kubernetes uses.
  ASSERT_TRUE(ledger_.Rebind("n1", Owner::Lend(5001, "n1"), Owner::Claim(5001, "uid-c")).ok());
  absl::Status s = placeholders_.CancelLend("n1", 5001);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("uid-c"));
  EXPECT_THAT(slurm_.killed(), ElementsAre(5000));
  EXPECT_EQ(slurm_.live_jobs(), 1u);
  // Nothing held: OK.
  EXPECT_TRUE(placeholders_.CancelLend("n1", 4242).ok());
}

SlurmJobInfo LendJob(uint32_t id, const std::string& node, std::vector<uint32_t> gpus) {
  SlurmJobInfo j;
  j.job_id = id;
  j.name = "duet-lend:" + node;
  j.comment = "duet-lend node=" + node;
  j.state = SlurmJobState::kRunning;
  j.nodes = node;
  j.devices = {SlurmJobNodeDevices{node, std::move(gpus), {}}};
  j.cpus = 1;
  return j;
}

class LendSyncTest : public LendJobsTest {
 protected:
  SlurmSync& Sync() {
    if (!sync_) {
      SlurmSyncOptions o;
      o.manage_nodes = false;
      o.manage_weights = false;
      o.release_grace = absl::ZeroDuration();
      o.on_live_job = [this](const SlurmJobInfo& job) { user_jobs_.push_back(job.job_id); };
      sync_ = std::make_unique<SlurmSync>(o, &ledger_, &slurm_, &clock_);
    }
    return *sync_;
  }
  std::vector<uint32_t> user_jobs_;
  fakes::FakeClock clock_;
  std::unique_ptr<SlurmSync> sync_;
};

TEST_F(LendSyncTest, LendJobsAreImportedAsLendOwnersNeverAsSlurmJobs) {
  slurm_.add_job(LendJob(61, "n1", {2}));
  ASSERT_TRUE(Sync().RunOnce().ok());
  EXPECT_TRUE(ledger_.FindHolding("n1", Owner::Lend(61, "n1")).has_value());
  EXPECT_FALSE(ledger_.FindHolding("n1", Owner::SlurmJob(61)).has_value());
  EXPECT_TRUE(user_jobs_.empty());
  EXPECT_EQ(Sync().stats().conflicts, 0u);
}

TEST_F(LendSyncTest, ALendJobWhoseDevicesAClaimHoldsIsPresent) {
  HoldRequest claim;
  claim.node = "n1";
  claim.owner = Owner::Claim(61, "uid-c", "ns", "c");
  claim.devices = {{DeviceKind::kGpu, 2, 0}};
  ASSERT_TRUE(ledger_.Hold(claim).ok());
  slurm_.add_job(LendJob(61, "n1", {2}));
  ASSERT_TRUE(Sync().RunOnce().ok());
  EXPECT_FALSE(ledger_.FindHolding("n1", Owner::Lend(61, "n1")).has_value());
  EXPECT_TRUE(ledger_.FindHolding("n1", claim.owner).has_value());
  EXPECT_EQ(Sync().stats().conflicts, 0u);
  EXPECT_EQ(Sync().stats().claims_without_lend_job, 0u);
}

TEST_F(LendSyncTest, GoneLendJobsReleaseTheirLendHoldingButClaimsAreKept) {
  HoldRequest lend;
  lend.node = "n1";
  lend.owner = Owner::Lend(61, "n1");
  lend.devices = {{DeviceKind::kGpu, 1, 0}};
  ASSERT_TRUE(ledger_.Hold(lend).ok());
  HoldRequest claim;
  claim.node = "n1";
  claim.owner = Owner::Claim(62, "uid-c", "ns", "c");
  claim.devices = {{DeviceKind::kGpu, 2, 0}};
  ASSERT_TRUE(ledger_.Hold(claim).ok());
  clock_.Advance(absl::Seconds(1));  // the holdings predate the job list
  ASSERT_TRUE(Sync().RunOnce().ok());  // neither job 61 nor 62 in Slurm
  EXPECT_FALSE(ledger_.FindHolding("n1", lend.owner).has_value());
  EXPECT_TRUE(ledger_.FindHolding("n1", claim.owner).has_value()) << "Kubernetes uses it";
  EXPECT_EQ(Sync().stats().claims_without_lend_job, 1u);
  EXPECT_EQ(slurm_.asked().size(), 0u) << "no lend job is re-made";
  ASSERT_TRUE(Sync().RunOnce().ok());
  EXPECT_TRUE(ledger_.FindHolding("n1", claim.owner).has_value());
  EXPECT_EQ(Sync().stats().claims_without_lend_job, 1u);
}

}  // namespace
}  // namespace duet
