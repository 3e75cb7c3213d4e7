// Gangs' Slurm side (docs/gangs.md 2-3, 5): GangKey's text form,
// Placeholders as gang::GangMaker (Create / Cancel) and how SlurmSync keeps,
// imports and ends gang jobs, against the in-memory SlurmClient.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bridge/gang/gang.h"
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
using ::testing::IsEmpty;

constexpr char kGang[] = "podgroup/ml/train";

std::vector<uint32_t> Gpus(const Holding& h) {
  std::vector<uint32_t> out;
  for (const HeldDevice& d : h.devices) out.push_back(d.index);
  return out;
}

gang::GangKey Key() { return gang::GangKey{"ml", gang::GangSource::kPodGroup, "train"}; }

// `members` members of 2 GPUs, 1.5 CPUs and 1000 MiB each.
gang::GangSpec Spec(uint32_t members) {
  gang::GangSpec s;
  s.key = Key();
  s.min_member = members;
  s.member.kind = DeviceKind::kGpu;
  s.member.count = 2;
  s.member.cpu_milli = 1500;
  s.member.memory_mib = 1000;
  return s;
}

TEST(GangKeyTest, TextFormRoundTripsAndRefusesAnythingElse) {
  EXPECT_EQ(Key().ToString(), kGang);
  const gang::GangKey js{"ns", gang::GangSource::kJobSet, "js/workers"};
  EXPECT_EQ(js.ToString(), "jobset/ns/js/workers");
  for (const gang::GangKey& k : {Key(), js, gang::GangKey{"a", gang::GangSource::kLws, "lws/3"},
                                 gang::GangKey{"b", gang::GangSource::kWorkload, "w/pg/r1"}}) {
    absl::StatusOr<gang::GangKey> back = gang::GangKey::Parse(k.ToString());
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, k);
  }
  EXPECT_STREQ(gang::GangSourceName(gang::GangSource::kLws), "lws");
  for (const char* bad : {"", "podgroup", "podgroup/ml", "podgroup//x", "podgroup/ml/",
                          "volcano/ml/x", "podgroup/ml/a b", "podgroup/ml/a#1"}) {
    absl::StatusOr<gang::GangKey> k = gang::GangKey::Parse(bad);
    EXPECT_EQ(k.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ParseGangJobName("duet-gang:podgroup/ml/train"), std::optional<gang::GangKey>(Key()));
  EXPECT_EQ(ParseGangJobName("duet-pod:ml/train"), std::nullopt);
  EXPECT_EQ(ParseGangJobName("duet-gang:nonsense"), std::nullopt);
}

class GangJobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ledger_.UpsertNode(::duet::testing::TestNodeSpec("n1", 1, 8)).ok());
    ASSERT_TRUE(ledger_.UpsertNode(::duet::testing::TestNodeSpec("n2", 2, 8)).ok());
  }
  void TearDown() override { EXPECT_TRUE(ledger_.CheckInvariants().ok()); }

  std::vector<Holding> HoldingsOfJob(uint32_t job) const {
    std::vector<Holding> out;
    for (const Holding& h : ledger_.ListHoldings()) {
      if (h.owner.job_id == job) out.push_back(h);
    }
    return out;
  }

  Ledger ledger_;
  fakes::FakeSlurmClient slurm_;
  Placeholders placeholders_{&ledger_, &slurm_, PlaceholderJobOptions{"duet", "duet-qos"}};
  gang::GangMaker& maker_ = placeholders_;
};

TEST_F(GangJobsTest, CreateMakesOneJobAndRecordsEachSlotWhereItFalls) {
  slurm_.Use("n1", 0, 1);  // another job has n1's gpu 0 in Slurm
  absl::StatusOr<gang::GangAllocation> a = maker_.Create(Key(), Spec(4), {{"n2", 2}, {"n1", 2}});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->job_id, 5000u);
  ASSERT_EQ(slurm_.asked_gangs().size(), 1u);
  EXPECT_THAT(slurm_.asked(), IsEmpty());
  const SlurmGangRequest req = slurm_.asked_gangs()[0];
  EXPECT_THAT(req.nodes, ElementsAre("n2", "n1"));
  EXPECT_EQ(req.job_name, "duet-gang:podgroup/ml/train");
  EXPECT_EQ(req.comment, "duet-gang key=podgroup/ml/train slots=4");
  EXPECT_EQ(req.gpus_per_node, 4u);
  EXPECT_EQ(req.tpus_per_node, 0u);
  EXPECT_EQ(req.cpus_per_node, 3u);  // 2 x 1.5
  EXPECT_EQ(req.memory_mib_per_node, 2000u);
  EXPECT_EQ(req.partition, "duet");
  EXPECT_EQ(req.qos, "duet-qos");
  EXPECT_THAT(req.spank_env, ElementsAre("DUET_GANG=podgroup/ml/train"));
  // Slots fill the nodes in the order given, each taking the next two of
  // the devices Slurm chose there.
  ASSERT_EQ(a->slots.size(), 4u);
  const std::vector<std::pair<std::string, std::vector<uint32_t>>> want = {
      {"n2", {0, 1}}, {"n2", {2, 3}}, {"n1", {1, 2}}, {"n1", {3, 4}}};
  for (uint32_t s = 0; s < 4; ++s) {
    SCOPED_TRACE(s);
    EXPECT_EQ(a->slots[s].owner, Owner::GangSlot(5000, kGang, s));
    EXPECT_EQ(a->slots[s].node, want[s].first);
    EXPECT_EQ(Gpus(a->slots[s]), want[s].second);
    EXPECT_TRUE(ledger_.FindHolding(want[s].first, Owner::GangSlot(5000, kGang, s)).has_value());
  }
  EXPECT_EQ(a->seq, ledger_.seq());
  EXPECT_EQ(HoldingsOfJob(5000).size(), 4u);
}

TEST_F(GangJobsTest, CreateRefusesWhatOneJobCannotAskBeforeAskingSlurm) {
  struct Case {
    const char* what;
    gang::GangSpec spec;
    std::vector<gang::GangNode> nodes;
  };
  gang::GangSpec shared = Spec(2);
  shared.member.count = 1;
  shared.member.milli = 500;
  gang::GangSpec none = Spec(2);
  none.member.count = 0;
  const std::vector<Case> cases = {
      {"uneven", Spec(3), {{"n1", 2}, {"n2", 1}}},
      {"members", Spec(5), {{"n1", 2}, {"n2", 2}}},
      {"twice", Spec(4), {{"n1", 2}, {"n1", 2}}},
      {"empty", Spec(0), {}},
      {"zero", Spec(0), {{"n1", 0}}},
      {"shared", shared, {{"n1", 1}, {"n2", 1}}},
      {"no device", none, {{"n1", 1}, {"n2", 1}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    absl::StatusOr<gang::GangAllocation> a = maker_.Create(Key(), c.spec, c.nodes);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
    EXPECT_THAT(std::string(a.status().message()), HasSubstr("podgroup/ml/train"));
  }
  EXPECT_EQ(maker_.Create(Key(), Spec(2), {{"n1", 1}, {"zz", 1}}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(slurm_.asked_gangs(), IsEmpty());
  EXPECT_THAT(ledger_.ListHoldings(), IsEmpty());
}

TEST_F(GangJobsTest, ALedgerRefusalReleasesTheSlotsAndCancelsTheJob) {
  // A step the ledger knows holds n1's gpu 2, which Slurm thinks free.
  HoldRequest step;
  step.node = "n1";
  step.owner = Owner::SlurmStep(77, 0);
  step.devices = {{DeviceKind::kGpu, 2, 0}};
  ASSERT_TRUE(ledger_.Hold(step).ok());
  absl::StatusOr<gang::GangAllocation> a = maker_.Create(Key(), Spec(4), {{"n2", 2}, {"n1", 2}});
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted) << a.status();
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("slot 3 on n1"));
  EXPECT_THAT(slurm_.killed(), ElementsAre(5000));
  EXPECT_EQ(slurm_.live_jobs(), 0u);
  ASSERT_EQ(ledger_.ListHoldings().size(), 1u);  // the step only
  EXPECT_EQ(ledger_.ListHoldings()[0].owner, step.owner);
}

TEST_F(GangJobsTest, NoRoomInSlurmHoldsNothing) {
  slurm_.Use("n1", 0, 6);
  absl::StatusOr<gang::GangAllocation> a = maker_.Create(Key(), Spec(4), {{"n1", 2}, {"n2", 2}});
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted) << a.status();
  EXPECT_THAT(ledger_.ListHoldings(), IsEmpty());
  EXPECT_EQ(slurm_.live_jobs(), 0u);
}

TEST_F(GangJobsTest, CancelEndsTheJobAndReleasesEverySlotAndMember) {
  absl::StatusOr<gang::GangAllocation> a = maker_.Create(Key(), Spec(4), {{"n1", 2}, {"n2", 2}});
  ASSERT_TRUE(a.ok()) << a.status();
  // Slot 0's member bound: its devices are its placeholder's now.
  ASSERT_TRUE(
      ledger_.Rebind("n1", Owner::GangSlot(5000, kGang, 0), Owner::Placeholder(5000, "uid-a"))
          .ok());
  // Another pod's placeholder (another job) stays.
  absl::StatusOr<Holding> other =
      placeholders_.Create(Owner::Pod("uid-z", "ml", "z"), "n1", 1, 0, 1, 0);
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE(maker_.Cancel(Key(), a->job_id).ok());
  EXPECT_THAT(slurm_.killed(), ElementsAre(5000));
  EXPECT_THAT(HoldingsOfJob(5000), IsEmpty());
  EXPECT_EQ(ledger_.ListHoldings().size(), 1u);
  EXPECT_TRUE(ledger_.FindHolding("n1", other->owner).has_value());
  // Gone already: OK.
  EXPECT_TRUE(maker_.Cancel(Key(), a->job_id).ok());
}

SlurmJobInfo GangJob(uint32_t id, const std::vector<std::string>& nodes,
                     const std::vector<uint32_t>& gpus, uint32_t slots) {
  SlurmJobInfo j;
  j.job_id = id;
  j.name = std::string("duet-gang:") + kGang;
  j.comment = GangComment(Key(), slots);
  j.state = SlurmJobState::kRunning;
  for (const std::string& n : nodes) j.devices.push_back(SlurmJobNodeDevices{n, gpus, {}});
  j.cpus = 2;
  return j;
}

class GangSyncTest : public GangJobsTest {
 protected:
  SlurmSync& Sync() {
    if (!sync_) {
      SlurmSyncOptions o;
      o.manage_nodes = false;
      o.manage_weights = false;
      o.release_grace = grace_;
      o.on_live_job = [this](const SlurmJobInfo& job) { user_jobs_.push_back(job.job_id); };
      o.pod_liveness = [](const std::string&) { return PodLiveness::kLive; };
      o.pod_name = [](const std::string& uid) {
        return std::optional<PlaceholderPod>(PlaceholderPod{uid, "ml", "member-" + uid});
      };
      sync_ = std::make_unique<SlurmSync>(o, &ledger_, &slurm_, &clock_);
    }
    return *sync_;
  }
  absl::Duration grace_ = absl::ZeroDuration();
  std::vector<uint32_t> user_jobs_;
  fakes::FakeClock clock_;
  std::unique_ptr<SlurmSync> sync_;
};

// At a bridge restart the ledger (replayed) has the gang's slots and
// members: the sync keeps them as what job J holds and imports nothing.
TEST_F(GangSyncTest, ALiveGangJobsSlotsAndMembersStandForIt) {
  absl::StatusOr<gang::GangAllocation> a = maker_.Create(Key(), Spec(4), {{"n1", 2}, {"n2", 2}});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(
      ledger_.Rebind("n2", Owner::GangSlot(5000, kGang, 3), Owner::Placeholder(5000, "uid-d"))
          .ok());
  slurm_.add_job(GangJob(5000, {"n1", "n2"}, {0, 1, 2, 3}, 4));
  const std::vector<Holding> before = ledger_.ListHoldings();
  ASSERT_TRUE(Sync().RunOnce().ok());
  ASSERT_TRUE(Sync().RunOnce().ok());
  EXPECT_EQ(ledger_.ListHoldings().size(), before.size());
  EXPECT_EQ(HoldingsOfJob(5000).size(), 4u);
  EXPECT_FALSE(ledger_.FindHolding("n1", Owner::SlurmJob(5000)).has_value());
  EXPECT_EQ(Sync().stats().conflicts, 0u);
  EXPECT_EQ(Sync().stats().holdings_imported, 0u);
  EXPECT_EQ(Sync().stats().holdings_released, 0u);
  EXPECT_THAT(user_jobs_, IsEmpty());  // duet's job, not a user's
}

// The DRA lending mode: every slot of a live gang job is a claim's now
// (docs/dra.md "Gangs"). The claims stand for the job: nothing is imported
// over them, nothing released.
TEST_F(GangSyncTest, ALiveGangJobWhoseSlotsClaimsHoldIsNotImportedAgain) {
  absl::StatusOr<gang::GangAllocation> a = maker_.Create(Key(), Spec(2), {{"n1", 1}, {"n2", 1}});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(ledger_.Rebind("n1", Owner::GangSlot(5000, kGang, 0), Owner::Claim(5000, "c0")).ok());
  ASSERT_TRUE(ledger_.Rebind("n2", Owner::GangSlot(5000, kGang, 1), Owner::Claim(5000, "c1")).ok());
  SlurmJobInfo job = GangJob(5000, {"n1", "n2"}, {0, 1}, 2);
  job.start_time = clock_.Now() - absl::Hours(1);
  slurm_.add_job(job);
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(Sync().RunOnce().ok());
  EXPECT_EQ(Sync().stats().holdings_imported, 0u);
  EXPECT_EQ(Sync().stats().holdings_released, 0u);
  EXPECT_EQ(Sync().stats().conflicts, 0u);  // no import tried over the claims
  EXPECT_EQ(ledger_.ListHoldings().size(), 2u);
  EXPECT_TRUE(ledger_.FindHolding("n1", Owner::Claim(5000, "c0")).has_value());
  EXPECT_THAT(user_jobs_, IsEmpty());
}

// A gang job Slurm lost: its slots go, a member whose pod runs keeps its
// devices (re-made as its own placeholder).
TEST_F(GangSyncTest, AGoneGangJobsSlotsAreReleasedAndItsRunningMembersKept) {
  absl::StatusOr<gang::GangAllocation> a = maker_.Create(Key(), Spec(4), {{"n1", 2}, {"n2", 2}});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(
      ledger_.Rebind("n2", Owner::GangSlot(5000, kGang, 2), Owner::Placeholder(5000, "uid-c"))
          .ok());
  ASSERT_TRUE(slurm_.KillJob(5000).ok());  // scancel: not listed any more
  clock_.Advance(absl::Seconds(1));        // the list is read after the grants
  ASSERT_TRUE(Sync().RunOnce().ok());
  for (const Holding& h : ledger_.ListHoldings()) {
    EXPECT_NE(h.owner.kind, OwnerKind::kGangSlot) << h.owner.ToString();
  }
  // The member's devices stay its pod's: repaired as a new placeholder.
  std::vector<Holding> member;
  for (const Holding& h : ledger_.ListHoldings("n2")) {
    if (h.owner.kind == OwnerKind::kPlaceholder && h.owner.pod_uid == "uid-c") member.push_back(h);
  }
  ASSERT_EQ(member.size(), 1u);
  EXPECT_THAT(Gpus(member[0]), ElementsAre(0, 1));
  EXPECT_EQ(Sync().stats().holdings_released, 3u);
  EXPECT_EQ(ledger_.ListHoldings().size(), 1u);
}

// A live gang job the ledger has nothing of (a ledger that lost it) is
// imported as its slots, never as a Slurm job; not while it may still be on
// its way into the ledger.
TEST_F(GangSyncTest, AGangJobTheLedgerLacksIsImportedAsItsSlotsOnceOldEnough) {
  grace_ = absl::Seconds(30);
  SlurmJobInfo job = GangJob(71, {"n1", "n2"}, {4, 5, 6, 7}, 4);
  job.start_time = clock_.Now() - absl::Seconds(5);
  slurm_.add_job(job);
  ASSERT_TRUE(Sync().RunOnce().ok());
  EXPECT_THAT(ledger_.ListHoldings(), IsEmpty());  // within the grace
  clock_.Advance(absl::Seconds(30));
  ASSERT_TRUE(Sync().RunOnce().ok());
  ASSERT_EQ(HoldingsOfJob(71).size(), 4u);
  const std::vector<std::pair<std::string, std::vector<uint32_t>>> want = {
      {"n1", {4, 5}}, {"n1", {6, 7}}, {"n2", {4, 5}}, {"n2", {6, 7}}};
  for (uint32_t s = 0; s < 4; ++s) {
    SCOPED_TRACE(s);
    std::optional<Holding> h = ledger_.FindHolding(want[s].first, Owner::GangSlot(71, kGang, s));
    ASSERT_TRUE(h.has_value());
    EXPECT_EQ(Gpus(*h), want[s].second);
  }
  EXPECT_FALSE(ledger_.FindHolding("n1", Owner::SlurmJob(71)).has_value());
  EXPECT_EQ(Sync().stats().conflicts, 0u);
  // Next pass: present, nothing more.
  ASSERT_TRUE(Sync().RunOnce().ok());
  EXPECT_EQ(Sync().stats().holdings_imported, 4u);
}

}  // namespace
}  // namespace duet
