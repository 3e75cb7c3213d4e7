// Gangs in the DRA lending mode (docs/dra.md, "Gangs"): the lending mode's
// GangRegistry makes one Slurm job for the whole gang on lending nodes, and
// the Lender's webhook admits its slots only to the complete gang's members
// (GangLends), gives a member's claim back to its slot, and the gang goes
// when no claim holds it for idle_release (or at reserve_timeout while
// gathering).

#include "bridge/dra/gang_lends.h"

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bridge/dra/lender.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/dra/lend_fakes.h"
#include "tests/fakes/fake_clock.h"
#include "tests/gang/fake_gang.h"

namespace duet {
namespace dra {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kGpuDriver[] = "gpu.nvidia.com";

// Every node whose name starts with "n" lends GPUs gpu-<index>, pool = node.
struct GpuNaming {
  static constexpr const char* kDriver = kGpuDriver;
  static constexpr const char* kPrefix = "gpu-";
  static constexpr DeviceKind kKind = DeviceKind::kGpu;
  static bool Lends(const std::string& node) { return absl::StartsWith(node, "n"); }
};
using Map = ::duet::dra::testing::NamedMap<GpuNaming>;

using ::duet::dra::testing::Claims;
using ::duet::dra::testing::Rules;
using ::duet::dra::testing::SlotMaker;

class NoLends : public LendMaker {
 public:
  absl::StatusOr<Holding> CreateLend(const std::string&, DeviceKind, uint32_t) override {
    return absl::FailedPreconditionError("no single lends in these tests");
  }
  absl::Status CancelLend(const std::string&, uint32_t) override { return absl::OkStatus(); }
};

NodeSpec Node(const std::string& name, uint32_t gpus) {
  NodeSpec n;
  n.name = name;
  n.pool = "a3";
  n.cpus = 64;
  n.memory_mib = 512 * 1024;
  for (uint32_t i = 0; i < gpus; ++i) {
    DeviceSpec d;
    d.index = i;
    d.model = "m";
    n.devices.push_back(d);
  }
  return n;
}

gang::GangSpec Spec(uint32_t members, uint32_t gpus) {
  gang::GangSpec s;
  s.key = gang::GangKey{"ml", gang::GangSource::kJobSet, "train/workers"};
  s.min_member = members;
  s.member.kind = DeviceKind::kGpu;
  s.member.count = gpus;
  return s;
}

gang::MemberRef Pod(int i) {
  return {absl::StrCat("pod-", i), "ml", absl::StrCat("train-workers-", i)};
}

class GangLendTest : public ::testing::Test {
 protected:
  GangLendTest() : map_(&ledger_), maker_(&ledger_) {
    // "a-big" is no lending node: a planner over every node would take it
    // whole (first by name, room for 4 members of 2 GPUs).
    EXPECT_TRUE(ledger_.UpsertNode(Node("a-big", 8)).ok());
    for (const char* n : {"n0", "n1", "n2"}) EXPECT_TRUE(ledger_.UpsertNode(Node(n, 4)).ok());
  }
  void TearDown() override { EXPECT_TRUE(ledger_.CheckInvariants().ok()); }

  gang::GangRegistryOptions RegistryOptions() {
    gang::GangRegistryOptions o;
    o.planner = gang::fakes::SimplePlanner;
    o.clock = &clock_;
    o.node_filter = [](const std::string& node) { return Map::Lends(node); };
    o.in_use = [this](uint32_t job, const std::vector<std::string>& nodes) {
      return GangLends::InUse(ledger_, job, nodes);
    };
    o.slot_owner = [](uint32_t job, const gang::GangKey& key, uint32_t slot) {
      return Owner::GangSlot(job, key.ToString(), slot);
    };
    o.on_event = [this](const gang::GangEvent& e) { events_.push_back(e.reason); };
    return o;
  }
  void Start() {
    registry_ = std::make_unique<gang::GangRegistry>(&ledger_, &maker_, RegistryOptions());
    gangs_ = std::make_unique<GangLends>(registry_.get(), &clock_);
    LenderOptions lo;
    lo.admission_grace = absl::Seconds(15);
    lo.pool_of = [](const std::string& node) { return Map::Lends(node) ? "pool" : ""; };
    lo.gang_admit = [this](const Owner& slot, const std::vector<std::string>& pods) {
      return gangs_->Admit(slot, pods);
    };
    lo.gang_slots = [this](uint32_t job, const std::string& node) {
      return gangs_->SlotOwners(job, node);
    };
    lender_ = std::make_unique<Lender>(&ledger_, &lends_, &map_, &rules_, &claims_, nullptr,
                                       &clock_, lo);
  }
  // The GPUs a gang slot holds on `node`, as allocation results.
  std::vector<AllocationResult> SlotResults(const std::string& node, uint32_t slot) {
    std::vector<AllocationResult> out;
    const Owner o = Owner::GangSlot(700, Spec(1, 1).key.ToString(), slot);
    std::optional<Holding> h = ledger_.FindHolding(node, o);
    if (!h) return out;
    for (const HeldDevice& d : h->devices) out.push_back({Map::Dra(node, d.index), "gpus", false});
    return out;
  }
  AdmissionAsk Ask(const std::string& claim, std::vector<AllocationResult> results,
                   std::vector<std::string> pods) {
    AdmissionAsk a;
    a.claim = ClaimRef{claim, "ml", "claim-" + claim};
    a.new_results = std::move(results);
    a.pods = std::move(pods);
    return a;
  }
  // Owner kinds holding on `node`, as "slot"/"claim UID".
  std::vector<std::string> Holders(const std::string& node) {
    std::vector<std::string> out;
    for (const Holding& h : ledger_.ListHoldings(node)) {
      out.push_back(h.owner.kind == OwnerKind::kGangSlot ? "slot"
                    : h.owner.kind == OwnerKind::kClaim  ? "claim " + h.owner.pod_uid
                                                         : h.owner.ToString());
    }
    return out;
  }
  // Reserves the gang of 4 x 2 GPUs through `n` members' pending pods.
  void Pending(int n) {
    for (int i = 0; i < n; ++i) gangs_->Lend(Spec(4, 2), Pod(i));
  }

  Ledger ledger_;
  Map map_;
  Rules rules_;
  Claims claims_;
  NoLends lends_;
  SlotMaker maker_;
  duet::fakes::FakeClock clock_;
  std::vector<std::string> events_;
  std::unique_ptr<gang::GangRegistry> registry_;
  std::unique_ptr<GangLends> gangs_;
  std::unique_ptr<Lender> lender_;
};

TEST_F(GangLendTest, AGangIsLentAsOneSlurmJobOverItsNodesAndItsSlotsAreUntainted) {
  Start();
  gang::Admission first = gangs_->Lend(Spec(4, 2), Pod(0));
  EXPECT_EQ(first.kind, gang::Admission::kWaiting) << first.reason;
  Pending(4);
  // One allocation, over two lending nodes (not the bigger node that lends
  // nothing), two members each.
  ASSERT_EQ(maker_.creates().size(), 1u);
  const std::vector<gang::GangNode> nodes = maker_.creates()[0];
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].node, "n0");
  EXPECT_EQ(nodes[1].node, "n1");
  EXPECT_EQ(nodes[0].members, 2u);
  EXPECT_THAT(Holders("n0"), ElementsAre("slot", "slot"));
  EXPECT_TRUE(ledger_.ListHoldings("a-big").empty());
  // The slots' devices carry no rule; the rest of the lending nodes do.
  ASSERT_TRUE(lender_->Resync().ok());
  const std::set<DraDevice> tainted = rules_.tainted();
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_FALSE(tainted.count(Map::Dra("n0", i))) << i;
    EXPECT_FALSE(tainted.count(Map::Dra("n1", i))) << i;
    EXPECT_TRUE(tainted.count(Map::Dra("n2", i))) << i;
  }
  EXPECT_EQ(registry_->Find(Spec(4, 2).key)->state, gang::GangState::kComplete);
}

TEST_F(GangLendTest, AGangThatCannotBePlacedWholeOnLendingNodesLendsNothingAndSaysWhy) {
  Start();
  // 3 members of 4 GPUs: the lending nodes have room for 3 (n0, n1, n2) but
  // n2 is half used by Slurm; the big node would take 2 but lends nothing.
  HoldRequest slurm;
  slurm.node = "n2";
  slurm.owner = Owner::SlurmJob(42);
  slurm.count = CountSelector{DeviceKind::kGpu, 2, 0, ""};
  ASSERT_TRUE(ledger_.Hold(slurm).ok());
  gang::GangSpec spec = Spec(3, 4);
  gang::Admission a = gangs_->Lend(spec, Pod(0));
  EXPECT_EQ(a.kind, gang::Admission::kNoRoom) << a.reason;
  EXPECT_THAT(a.reason, HasSubstr("GANG_NO_ROOM"));
  EXPECT_TRUE(maker_.creates().empty());
  EXPECT_TRUE(ledger_.ListHoldings("n0").empty());
  EXPECT_TRUE(ledger_.ListHoldings("a-big").empty());
  EXPECT_THAT(events_, ElementsAre("DuetGangUnplaceable"));
  EXPECT_FALSE(registry_->Find(spec.key).has_value());
}

TEST_F(GangLendTest, TheWebhookAdmitsAGangSlotOnlyToAMemberOfTheCompleteGang) {
  Start();
  Pending(2);  // reserved, 2 of 4 members pending
  const std::vector<AllocationResult> slot0 = SlotResults("n0", 0);
  ASSERT_EQ(slot0.size(), 2u);
  // A member, too early: the gang is not complete.
  AdmissionVerdict early = lender_->Review(Ask("c0", slot0, {"pod-0"}));
  EXPECT_FALSE(early.allowed);
  EXPECT_EQ(early.reason, kReasonGangWaiting);
  EXPECT_THAT(early.message, HasSubstr("2/4"));
  Pending(4);
  // Not a member: refused, whatever the scheduler picked; nothing moves.
  AdmissionVerdict stranger = lender_->Review(Ask("cx", slot0, {"someone-else"}));
  EXPECT_FALSE(stranger.allowed);
  EXPECT_EQ(stranger.reason, kReasonGangMembersOnly);
  EXPECT_THAT(stranger.message, HasSubstr("jobset/ml/train/workers"));
  AdmissionVerdict nobody = lender_->Review(Ask("cy", slot0, {}));
  EXPECT_EQ(nobody.reason, kReasonGangMembersOnly);
  EXPECT_THAT(Holders("n0"), ElementsAre("slot", "slot"));
  // A member: the slot becomes its claim's, under the gang's one job.
  AdmissionVerdict member = lender_->Review(Ask("c0", slot0, {"pod-0"}));
  ASSERT_TRUE(member.allowed) << member.message;
  std::optional<Holding> held = ledger_.FindHolding("n0", Owner::Claim(700, "c0"));
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->devices.size(), 2u);
  // Half a slot, or two slots in one claim, are refused.
  const std::vector<AllocationResult> slot1 = SlotResults("n0", 1);
  AdmissionVerdict half = lender_->Review(Ask("c1", {slot1[0]}, {"pod-1"}));
  EXPECT_EQ(half.reason, kReasonPartialHost);
  EXPECT_THAT(Holders("n0"), ElementsAre("claim c0", "slot"));
}

TEST_F(GangLendTest, AMembersClaimGoesBackToItsSlotAndAGangNoClaimHoldsIsReleasedWhenIdle) {
  Start();
  Pending(4);
  const std::vector<AllocationResult> slot0 = SlotResults("n0", 0);
  ASSERT_TRUE(lender_->Review(Ask("c0", slot0, {"pod-0"})).allowed);
  claims_.Set(ClaimRef{"c0", "ml", "claim-c0"}, {slot0[0].device, slot0[1].device});
  // In use: never idle.
  registry_->Tick();
  clock_.Advance(absl::Seconds(120));
  registry_->Tick();
  EXPECT_TRUE(maker_.cancels().empty());
  // The member ends, its claim is deallocated: its devices go back to a
  // slot of the gang (not to a lend of job 700 that a reclaim could cancel).
  claims_.Remove("c0");
  ASSERT_TRUE(lender_->ReleaseClaimIfDeallocated("c0").ok());
  EXPECT_THAT(Holders("n0"), ElementsAre("slot", "slot"));
  // idle_release (60 s) after no claim holds any of its devices.
  registry_->Tick();
  clock_.Advance(absl::Seconds(59));
  registry_->Tick();
  EXPECT_TRUE(maker_.cancels().empty());
  clock_.Advance(absl::Seconds(1));
  registry_->Tick();
  EXPECT_THAT(maker_.cancels(), ElementsAre(700u));
  EXPECT_EQ(ledger_.holding_count(), 0u);
}

TEST_F(GangLendTest, AGangWhoseMembersStopArrivingIsReleasedAtTheReserveTimeout) {
  Start();
  Pending(3);
  EXPECT_EQ(ledger_.holding_count(), 4u);
  clock_.Advance(absl::Seconds(299));
  registry_->Tick();
  EXPECT_TRUE(maker_.cancels().empty());
  clock_.Advance(absl::Seconds(1));
  registry_->Tick();
  EXPECT_THAT(maker_.cancels(), ElementsAre(700u));
  EXPECT_EQ(ledger_.holding_count(), 0u);
  EXPECT_THAT(events_, ElementsAre("DuetGangReleased"));
}

TEST_F(GangLendTest, ARestartRecoversAGangWhoseSlotsClaimsHold) {
  Start();
  Pending(4);
  for (uint32_t s = 0; s < 2; ++s) {
    ASSERT_TRUE(lender_->Review(Ask(absl::StrCat("c", s), SlotResults("n0", s),
                                    {absl::StrCat("pod-", s)}))
                    .allowed);
  }
  // duet-bridge restarts: the registry is rebuilt from the ledger (and
  // Slurm's job name, for a job only claims hold).
  lender_.reset();
  gangs_.reset();
  gang::GangRegistryOptions o = RegistryOptions();
  o.job_gang = [](uint32_t job) -> std::optional<gang::GangKey> {
    if (job == 700) return Spec(1, 1).key;
    return std::nullopt;
  };
  gang::GangRegistry again(&ledger_, &maker_, std::move(o));
  ASSERT_EQ(*again.Recover(), 1u);
  std::optional<gang::GangInfo> info = again.Find(Spec(4, 2).key);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->state, gang::GangState::kComplete);
  EXPECT_EQ(info->job_id, 700u);
  // Both of n0's slots are the gang's to give claims back to.
  EXPECT_EQ(again.SlotOwners(700, "n0").size(), 2u);
  // Claims hold it: not idle.
  again.Tick();
  clock_.Advance(absl::Seconds(600));
  again.Tick();
  EXPECT_TRUE(maker_.cancels().empty());
}

}  // namespace
}  // namespace dra
}  // namespace duet
