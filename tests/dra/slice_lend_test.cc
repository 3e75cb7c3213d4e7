// Multi-host TPU slices in the DRA lending mode (docs/gangs.md 5 and 6):
// a single pod is lent no host of a multi-host slice (SingleTpuLendRefusal);
// a TPU gang that selects a slice asks every chip of a host
// (TpuGangMember), so the lending mode's GangRegistry reserves every host of
// ONE free slice pool in one Slurm job, its chips untainted, and the webhook
// admits them only to the complete gang's members, whole hosts only; the
// gang is given back and recovered as a GPU gang is.

#include "bridge/dra/slice_lends.h"

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bridge/dra/gang_lends.h"
#include "bridge/dra/lender.h"
#include "bridge/gang/registry.h"
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

constexpr char kTpuDriver[] = "tpu.google.com";
constexpr char kAccel[] = "tpu-v5-lite-podslice";

// Nodes whose name starts with "x-" lend nothing; the others lend their
// TPU chips as accel<index>, pool = node (Google's TPU driver).
struct TpuNaming {
  static constexpr const char* kDriver = kTpuDriver;
  static constexpr const char* kPrefix = "accel";
  static constexpr DeviceKind kKind = DeviceKind::kTpu;
  static bool Lends(const std::string& node) { return !absl::StartsWith(node, "x-"); }
};
using Map = ::duet::dra::testing::NamedMap<TpuNaming>;

using ::duet::dra::testing::Claims;
using ::duet::dra::testing::Rules;
using ::duet::dra::testing::SlotMaker;

// Lend jobs as Slurm makes them: the lowest free chips, job 900, 901, ...
class Lends : public LendMaker {
 public:
  explicit Lends(Ledger* ledger) : ledger_(ledger) {}
  absl::StatusOr<Holding> CreateLend(const std::string& node, DeviceKind kind,
                                     uint32_t count) override {
    HoldRequest h;
    h.node = node;
    h.owner = Owner::Lend(next_job_++, node);
    h.count = CountSelector{kind, count, 0, ""};
    absl::StatusOr<HoldResult> r = ledger_->Hold(h);
    if (!r.ok()) return r.status();
    return r->holding;
  }
  absl::Status CancelLend(const std::string& node, uint32_t job_id) override {
    return ledger_->Release(node, Owner::Lend(job_id, node)).status();
  }

 private:
  Ledger* const ledger_;
  uint32_t next_job_ = 900;
};

// A TPU host of `chips` chips in `pool`, its chips labelled `topology`.
NodeSpec TpuNode(const std::string& name, const std::string& pool, const std::string& topology,
                 uint32_t chips = 4) {
  NodeSpec n;
  n.name = name;
  n.pool = pool;
  n.cpus = 64;
  n.memory_mib = 256 * 1024;
  for (uint32_t i = 0; i < chips; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kTpu;
    d.index = i;
    d.model = kAccel;
    d.topology.tpu_topology = topology;
    n.devices.push_back(d);
  }
  return n;
}

gang::GangSpec Spec(uint32_t members, const std::string& topology = "2x4") {
  gang::GangSpec s;
  s.key = gang::GangKey{"ml", gang::GangSource::kJobSet, "slice/workers"};
  s.min_member = members;
  s.tpu_topology = topology;
  s.tpu_accelerator = kAccel;
  return s;
}

gang::MemberRef Pod(int i) {
  return {absl::StrCat("pod-", i), "ml", absl::StrCat("slice-workers-", i)};
}

class SliceLendTest : public ::testing::Test {
 protected:
  SliceLendTest() : map_(&ledger_), lends_(&ledger_), maker_(&ledger_) {
    // Two lending slices of 2 hosts x 4 chips, a lending single-host node,
    // and a slice of the same shape that lends nothing ("x-" pool "aa",
    // first by pool name).
    for (const char* p : {"slice-a", "slice-b"}) {
      for (int h = 0; h < 2; ++h) {
        EXPECT_TRUE(ledger_.UpsertNode(TpuNode(absl::StrCat(p, "-", h), p, "2x4")).ok());
      }
    }
    EXPECT_TRUE(ledger_.UpsertNode(TpuNode("single-0", "single", "2x2")).ok());
    for (int h = 0; h < 2; ++h) {
      EXPECT_TRUE(ledger_.UpsertNode(TpuNode(absl::StrCat("x-aa-", h), "aa", "2x4")).ok());
    }
  }
  void TearDown() override { EXPECT_TRUE(ledger_.CheckInvariants().ok()); }

  gang::GangRegistryOptions RegistryOptions() {
    gang::GangRegistryOptions o;
    o.planner = gang::fakes::SimplePlanner;
    o.clock = &clock_;
    // As duet-bridge's DraMode: its pools' nodes; a node that lends
    // nothing is unusable (so it is no slice host for this registry).
    o.node_filter = [](const std::string& node) { return Map::Lends(node); };
    o.unusable = [](const std::string& node) -> std::string {
      return Map::Lends(node) ? "" : "lends nothing: not_in_ledger";
    };
    o.in_use = [this](uint32_t job, const std::vector<std::string>& nodes) {
      return GangLends::InUse(ledger_, job, nodes);
    };
    o.slot_owner = [](uint32_t job, const gang::GangKey& key, uint32_t slot) {
      return Owner::GangSlot(job, key.ToString(), slot);
    };
    o.on_event = [this](const gang::GangEvent& e) { events_.push_back(e.reason); };
    return o;
  }
  void Start(uint32_t warm_buffer = 0) {
    registry_ = std::make_unique<gang::GangRegistry>(&ledger_, &maker_, RegistryOptions());
    gangs_ = std::make_unique<GangLends>(registry_.get(), &clock_);
    LenderOptions lo;
    lo.admission_grace = absl::Seconds(15);
    lo.warm_buffer = warm_buffer;
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
  // A member's pending pod as DraMode's LendForGang serves it: the member
  // request from TpuGangMember (every chip of a node: `all`), then
  // GangLends::Lend.
  gang::Admission Lend(int i, uint32_t members = 2) {
    gang::GangSpec s = Spec(members);
    absl::StatusOr<placement::PodRequest> m =
        TpuGangMember(ledger_.Snapshot(), s, 0, /*all=*/true, Map::Lends);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return {};
    s.member = *m;
    return gangs_->Lend(s, Pod(i));
  }
  void SlurmHolds(const std::string& node, uint32_t job, uint32_t chips) {
    HoldRequest h;
    h.node = node;
    h.owner = Owner::SlurmJob(job);
    h.count = CountSelector{DeviceKind::kTpu, chips, 0, ""};
    ASSERT_TRUE(ledger_.Hold(h).ok());
  }
  // The chips gang job 700's slot holds on `node`, as allocation results.
  std::vector<AllocationResult> SlotResults(const std::string& node, uint32_t slot) {
    std::vector<AllocationResult> out;
    std::optional<Holding> h =
        ledger_.FindHolding(node, Owner::GangSlot(700, Spec(1).key.ToString(), slot));
    if (!h) return out;
    for (const HeldDevice& d : h->devices) out.push_back({Map::Dra(node, d.index), "tpus", false});
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
  std::vector<std::string> Holders(const std::string& node) {
    std::vector<std::string> out;
    for (const Holding& h : ledger_.ListHoldings(node)) {
      out.push_back(h.owner.kind == OwnerKind::kGangSlot ? "slot"
                    : h.owner.kind == OwnerKind::kClaim  ? "claim " + h.owner.pod_uid
                                                         : h.owner.ToString());
    }
    return out;
  }

  Ledger ledger_;
  Map map_;
  Rules rules_;
  Claims claims_;
  Lends lends_;
  SlotMaker maker_;
  duet::fakes::FakeClock clock_;
  std::vector<std::string> events_;
  std::unique_ptr<gang::GangRegistry> registry_;
  std::unique_ptr<GangLends> gangs_;
  std::unique_ptr<Lender> lender_;
};

TEST_F(SliceLendTest, ASinglePodIsLentNoHostOfAMultiHostSliceButASingleHostNode) {
  const std::string refusal = SingleTpuLendRefusal(*ledger_.GetNode("slice-b-1"));
  EXPECT_THAT(refusal, HasSubstr("TPU_SLICE_WHOLE"));
  EXPECT_THAT(refusal, HasSubstr("slice-b-1"));
  EXPECT_THAT(refusal, HasSubstr("slice-b"));
  EXPECT_THAT(refusal, HasSubstr("2x4"));
  // A 2x2 host of 4 chips is a whole single-host slice: lent per host.
  EXPECT_EQ(SingleTpuLendRefusal(*ledger_.GetNode("single-0")), "");
}

TEST_F(SliceLendTest, TheWarmBufferKeepsNoHostOfAMultiHostSliceLent) {
  // One pool of every lending node, 8 chips wanted lent and free: only the
  // single-host node is lent (whole); the slices stay for a gang or Slurm.
  Start(/*warm_buffer=*/8);
  (void)lender_->Tick();
  EXPECT_EQ(ledger_.ListHoldings("single-0").size(), 1u);
  for (const char* n : {"slice-a-0", "slice-a-1", "slice-b-0", "slice-b-1"}) {
    EXPECT_THAT(Holders(n), ElementsAre()) << n;
  }
}

TEST_F(SliceLendTest, ATpuGangMemberAsksEveryChipOfAHostOfTheSliceItSelects) {
  const LedgerSnapshot snap = ledger_.Snapshot();
  // Every chip of a node: a 2x4 host of the lending pools has 4.
  absl::StatusOr<placement::PodRequest> all = TpuGangMember(snap, Spec(2), 0, true, Map::Lends);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->kind, DeviceKind::kTpu);
  EXPECT_EQ(all->count, 4u);
  // An ExactCount is what it asks (PickGangSlice says when it is no host).
  absl::StatusOr<placement::PodRequest> two = TpuGangMember(snap, Spec(2), 2, false, Map::Lends);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->count, 2u);
  EXPECT_TRUE(absl::IsInvalidArgument(TpuGangMember(snap, Spec(2), 0, false, Map::Lends).status()));
  // No slice selected: no slice gang (its pods are lent for alone).
  absl::StatusOr<placement::PodRequest> none = TpuGangMember(snap, Spec(2, ""), 4, false, nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(none.status())) << none.status();
  // A shape only outside the lending pools (a 4x8 host of 8 chips there):
  // not found, whatever Slurm's nodes have.
  for (int h = 0; h < 4; ++h) {
    ASSERT_TRUE(ledger_.UpsertNode(TpuNode(absl::StrCat("x-big-", h), "big", "4x8", 8)).ok());
  }
  absl::StatusOr<placement::PodRequest> outside =
      TpuGangMember(ledger_.Snapshot(), Spec(4, "4x8"), 0, true, Map::Lends);
  EXPECT_TRUE(absl::IsNotFound(outside.status())) << outside.status();
  EXPECT_THAT(outside.status().message(), HasSubstr("4x8"));
  gang::GangSpec other = Spec(2);
  other.tpu_accelerator = "tpu-v6e-slice";
  EXPECT_TRUE(absl::IsNotFound(TpuGangMember(snap, other, 0, true, Map::Lends).status()));
}

TEST_F(SliceLendTest, ATpuGangIsLentOneFreeSliceWholeInOneJobItsChipsUntainted) {
  Start();
  // Slurm holds a chip of slice-a: slice-a is no gang's.
  SlurmHolds("slice-a-1", 42, 1);
  gang::Admission first = Lend(0);
  EXPECT_EQ(first.kind, gang::Admission::kWaiting) << first.reason;
  ASSERT_EQ(maker_.creates().size(), 1u);
  const std::vector<gang::GangNode> nodes = maker_.creates()[0];
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].node, "slice-b-0");
  EXPECT_EQ(nodes[1].node, "slice-b-1");
  EXPECT_EQ(nodes[0].members, 1u);
  // Every chip of every host of slice-b, under the one job.
  for (const char* n : {"slice-b-0", "slice-b-1"}) {
    EXPECT_THAT(Holders(n), ElementsAre("slot")) << n;
    std::optional<Holding> h = ledger_.ListHoldings(n).empty()
                                   ? std::nullopt
                                   : std::optional<Holding>(ledger_.ListHoldings(n)[0]);
    ASSERT_TRUE(h.has_value());
    EXPECT_EQ(h->owner.job_id, 700u);
    EXPECT_EQ(h->devices.size(), 4u) << n;
  }
  EXPECT_TRUE(ledger_.ListHoldings("x-aa-0").empty());
  EXPECT_TRUE(ledger_.ListHoldings("single-0").empty());
  // The slice's chips carry no rule; slice-a's free chips and the
  // single-host node's do.
  ASSERT_TRUE(lender_->Resync().ok());
  const std::set<DraDevice> tainted = rules_.tainted();
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_FALSE(tainted.count(Map::Dra("slice-b-0", i))) << i;
    EXPECT_FALSE(tainted.count(Map::Dra("slice-b-1", i))) << i;
    EXPECT_TRUE(tainted.count(Map::Dra("slice-a-0", i))) << i;
    EXPECT_TRUE(tainted.count(Map::Dra("single-0", i))) << i;
  }
  // The webhook: not before the gang is complete, only members, whole
  // hosts only.
  const std::vector<AllocationResult> slot0 = SlotResults("slice-b-0", 0);
  ASSERT_EQ(slot0.size(), 4u);
  AdmissionVerdict early = lender_->Review(Ask("c0", slot0, {"pod-0"}));
  EXPECT_EQ(early.reason, kReasonGangWaiting) << early.message;
  EXPECT_EQ(Lend(1).kind, gang::Admission::kReady);
  AdmissionVerdict stranger = lender_->Review(Ask("cx", slot0, {"someone-else"}));
  EXPECT_EQ(stranger.reason, kReasonGangMembersOnly) << stranger.message;
  AdmissionVerdict half = lender_->Review(Ask("c0", {slot0[0], slot0[1]}, {"pod-0"}));
  EXPECT_EQ(half.reason, kReasonPartialHost) << half.message;
  EXPECT_THAT(Holders("slice-b-0"), ElementsAre("slot"));
  AdmissionVerdict member = lender_->Review(Ask("c0", slot0, {"pod-0"}));
  ASSERT_TRUE(member.allowed) << member.message;
  EXPECT_THAT(Holders("slice-b-0"), ElementsAre("claim c0"));
}

TEST_F(SliceLendTest, ATpuGangWithNoWholeSliceFreeHoldsNothingAndSaysWhy) {
  Start();
  SlurmHolds("slice-a-1", 42, 1);
  SlurmHolds("slice-b-0", 43, 4);
  gang::Admission a = Lend(0);
  EXPECT_EQ(a.kind, gang::Admission::kNoRoom) << a.reason;
  EXPECT_THAT(a.reason, HasSubstr("GANG_NO_ROOM"));
  EXPECT_THAT(a.reason, HasSubstr("pool slice-a"));
  EXPECT_THAT(a.reason, HasSubstr("pool slice-b"));
  EXPECT_TRUE(maker_.creates().empty());
  EXPECT_THAT(events_, ElementsAre("DuetGangUnplaceable"));
  EXPECT_FALSE(registry_->Find(Spec(2).key).has_value());
  // Nothing of any slice (nor of the single-host node) was taken.
  EXPECT_THAT(Holders("slice-a-0"), ElementsAre());
  EXPECT_THAT(Holders("slice-b-1"), ElementsAre());
  EXPECT_THAT(Holders("single-0"), ElementsAre());
  // A gang of 3 is no 2-host slice's, free or not.
  events_.clear();
  gang::GangSpec three = Spec(3);
  three.key.name = "three";
  three.member = *TpuGangMember(ledger_.Snapshot(), three, 0, true, Map::Lends);
  gang::Admission b = gangs_->Lend(three, Pod(9));
  EXPECT_EQ(b.kind, gang::Admission::kNoRoom) << b.reason;
  EXPECT_THAT(b.reason, HasSubstr("3 members"));
}

TEST_F(SliceLendTest, TheSliceGoesBackWhenIdleAndARestartRecoversItFromItsClaims) {
  Start();
  ASSERT_EQ(Lend(0).kind, gang::Admission::kWaiting);
  ASSERT_EQ(Lend(1).kind, gang::Admission::kReady);
  // slice-a is free: the first by pool name.
  ASSERT_EQ(maker_.creates().size(), 1u);
  EXPECT_EQ(maker_.creates()[0][0].node, "slice-a-0");
  auto results = [this](int h) {
    std::vector<AllocationResult> r;
    std::optional<Holding> held = ledger_.FindHolding(
        absl::StrCat("slice-a-", h), Owner::GangSlot(700, Spec(1).key.ToString(), h));
    if (!held) return r;
    for (const HeldDevice& d : held->devices) {
      r.push_back({Map::Dra(absl::StrCat("slice-a-", h), d.index), "tpus", false});
    }
    return r;
  };
  for (int h = 0; h < 2; ++h) {
    std::vector<AllocationResult> r = results(h);
    ASSERT_EQ(r.size(), 4u);
    ASSERT_TRUE(lender_->Review(Ask(absl::StrCat("c", h), r, {absl::StrCat("pod-", h)})).allowed);
    std::vector<DraDevice> devs;
    for (const AllocationResult& a : r) devs.push_back(a.device);
    claims_.Set(ClaimRef{absl::StrCat("c", h), "ml", absl::StrCat("claim-c", h)}, devs);
  }
  // duet-bridge restarts: the gang comes back from the claims on its job.
  lender_.reset();
  gangs_.reset();
  gang::GangRegistryOptions o = RegistryOptions();
  o.job_gang = [](uint32_t job) -> std::optional<gang::GangKey> {
    if (job == 700) return Spec(1).key;
    return std::nullopt;
  };
  registry_ = std::make_unique<gang::GangRegistry>(&ledger_, &maker_, std::move(o));
  ASSERT_EQ(*registry_->Recover(), 1u);
  std::optional<gang::GangInfo> info = registry_->Find(Spec(2).key);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->state, gang::GangState::kComplete);
  EXPECT_EQ(info->job_id, 700u);
  EXPECT_EQ(info->slots, 2u);
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
  // In use: kept.
  registry_->Tick();
  clock_.Advance(absl::Seconds(600));
  registry_->Tick();
  EXPECT_TRUE(maker_.cancels().empty());
  // The members end: their claims go back to the slots, whole hosts.
  for (int h = 0; h < 2; ++h) {
    claims_.Remove(absl::StrCat("c", h));
    ASSERT_TRUE(lender_->ReleaseClaimIfDeallocated(absl::StrCat("c", h)).ok());
    EXPECT_THAT(Holders(absl::StrCat("slice-a-", h)), ElementsAre("slot"));
  }
  // idle_release after no claim holds it: the job goes, the slice is free.
  registry_->Tick();
  clock_.Advance(absl::Seconds(60));
  registry_->Tick();
  EXPECT_THAT(maker_.cancels(), ElementsAre(700u));
  EXPECT_EQ(ledger_.holding_count(), 0u);
}

}  // namespace
}  // namespace dra
}  // namespace duet
