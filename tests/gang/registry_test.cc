// GangRegistry (docs/gangs.md 2) over a real Ledger and a fake GangMaker:
// a gang is reserved once and whole or not at all, members gather into
// sticky slots, bind only on their slot's node once complete, and the gang
// is released on a member's deletion, reserve_timeout and idle_release;
// recovery rebuilds the same slots from the ledger.

#include "bridge/gang/registry.h"

#include <atomic>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <algorithm>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "bridge/placement/topology.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/gate.h"
#include "tests/fakes/wait.h"
#include "tests/gang/fake_gang.h"

namespace duet {
namespace gang {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

NodeSpec Node(const std::string& name, uint32_t gpus, const std::string& pool = "a3") {
  NodeSpec n;
  n.name = name;
  n.pool = pool;
  n.cpus = 64;
  n.memory_mib = 512 * 1024;
  for (uint32_t i = 0; i < gpus; ++i) {
    DeviceSpec d;
    d.index = i;
    d.model = "nvidia-h100-80gb";
    n.devices.push_back(d);
  }
  return n;
}

GangSpec Spec(uint32_t members, uint32_t gpus, const std::string& name = "train") {
  GangSpec s;
  s.key = GangKey{"ml", GangSource::kPodGroup, name};
  s.min_member = members;
  s.member.kind = DeviceKind::kGpu;
  s.member.count = gpus;
  s.member.cpu_milli = 4000;
  s.member.memory_mib = 8192;
  return s;
}

MemberRef Member(int i) { return MemberRef{absl::StrCat("uid-", i), "ml", absl::StrCat("train-", i)}; }

// Records what the registry tells the wiring.
struct Recorder {
  absl::Mutex mu;
  std::vector<GangEvent> events;
  std::vector<std::vector<std::pair<MemberRef, std::string>>> completes;

  std::vector<std::string> Reasons() {
    absl::MutexLock l(&mu);
    std::vector<std::string> out;
    for (const GangEvent& e : events) out.push_back(e.reason);
    return out;
  }
};

class RegistryTest : public ::testing::Test {
 protected:
  RegistryTest() : maker_(&ledger_) {}

  void AddNodes(int n, uint32_t gpus) {
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(ledger_.UpsertNode(Node(absl::StrCat("node-", i), gpus)).ok());
    }
  }

  GangRegistryOptions Options() {
    GangRegistryOptions o;
    o.planner = fakes::SimplePlanner;
    o.clock = &clock_;
    o.on_event = [this](const GangEvent& e) {
      absl::MutexLock l(&rec_.mu);
      rec_.events.push_back(e);
    };
    o.on_complete = [this](const GangKey&, const std::vector<std::pair<MemberRef, std::string>>& m) {
      absl::MutexLock l(&rec_.mu);
      rec_.completes.push_back(m);
    };
    return o;
  }

  std::unique_ptr<GangRegistry> NewRegistry() {
    return std::make_unique<GangRegistry>(&ledger_, &maker_, Options());
  }

  // Holdings on `node` whose owner is a member's placeholder (not a slot).
  std::vector<std::string> MembersOn(const std::string& node) {
    std::vector<std::string> out;
    for (const Holding& h : ledger_.ListHoldings(node)) {
      if (h.owner.kind == OwnerKind::kPlaceholder && h.owner.pod_uid.rfind("gang:", 0) != 0) {
        out.push_back(h.owner.pod_uid);
      }
    }
    return out;
  }

  Ledger ledger_;
  fakes::FakeGangMaker maker_;
  duet::fakes::FakeClock clock_;
  Recorder rec_;
};

TEST_F(RegistryTest, FourMembersOfTwoGpusReserveOnceAndBindOnTheirSlotsNodes) {
  AddNodes(2, 4);
  std::unique_ptr<GangRegistry> reg = NewRegistry();
  const GangSpec spec = Spec(4, 2);
  for (int i = 0; i < 3; ++i) {
    Admission a = reg->Admit(spec, Member(i));
    EXPECT_EQ(a.kind, Admission::kWaiting) << i;
    EXPECT_THAT(a.reason, HasSubstr(absl::StrCat("GANG_WAITING: ", i + 1, "/4 members")));
    EXPECT_EQ(a.slot, static_cast<uint32_t>(i));
    // Not complete: no member may bind yet.
    EXPECT_EQ(reg->BindMember(Member(i).uid, "node-0").status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
  // A member asking again keeps its slot.
  EXPECT_EQ(reg->Admit(spec, Member(1)).slot, 1u);
  ASSERT_EQ(maker_.creates().size(), 1u);
  const auto create = maker_.creates()[0];
  ASSERT_EQ(create.nodes.size(), 2u);
  EXPECT_EQ(create.nodes[0].node, "node-0");
  EXPECT_EQ(create.nodes[0].members, 2u);
  EXPECT_EQ(create.nodes[1].node, "node-1");
  EXPECT_EQ(create.nodes[1].members, 2u);
  EXPECT_EQ(ledger_.holding_count(), 4u);  // the four slots, nothing else

  Admission last = reg->Admit(spec, Member(3));
  EXPECT_EQ(last.kind, Admission::kReady);
  EXPECT_EQ(last.node, "node-1");
  {
    absl::MutexLock l(&rec_.mu);
    ASSERT_EQ(rec_.completes.size(), 1u);
    ASSERT_EQ(rec_.completes[0].size(), 4u);
    EXPECT_EQ(rec_.completes[0][0].first.name, "train-0");
    EXPECT_EQ(rec_.completes[0][0].second, "node-0");
    EXPECT_EQ(rec_.completes[0][3].second, "node-1");
  }
  EXPECT_EQ(reg->Admit(spec, Member(0)).node, "node-0");
  EXPECT_EQ(reg->NodeOf(Member(2).uid), "node-1");

  // Bind: only the slot's node.
  absl::StatusOr<MemberBind> wrong = reg->BindMember(Member(0).uid, "node-1");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong.status().message(), HasSubstr("on node node-0"));
  for (int i = 0; i < 4; ++i) {
    const std::string node = i < 2 ? "node-0" : "node-1";
    absl::StatusOr<MemberBind> b = reg->BindMember(Member(i).uid, node);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(b->created);
    EXPECT_EQ(b->holding.owner, Owner::Placeholder(500, Member(i).uid));
    EXPECT_EQ(b->holding.devices.size(), 2u);
  }
  // A retried bind makes nothing new.
  absl::StatusOr<MemberBind> again = reg->BindMember(Member(0).uid, "node-0");
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->created);
  EXPECT_THAT(MembersOn("node-0"), ElementsAre("uid-0", "uid-1"));
  EXPECT_THAT(MembersOn("node-1"), ElementsAre("uid-2", "uid-3"));
  EXPECT_EQ(ledger_.holding_count(), 4u);
  EXPECT_TRUE(ledger_.CheckInvariants().ok());
  EXPECT_TRUE(reg->IsGangJob(500));
  EXPECT_FALSE(reg->IsGangJob(501));
  const GangStats st = reg->stats();
  EXPECT_EQ(st.reservations, 1u);
  EXPECT_EQ(st.complete, 1u);
  EXPECT_EQ(st.gathering, 0u);
}

TEST_F(RegistryTest, AGangThatDoesNotFitHoldsNothingAndSaysWhy) {
  AddNodes(2, 4);
  // Slurm holds one GPU of node-1: 4 x 2 no longer fits evenly.
  HoldRequest slurm;
  slurm.node = "node-1";
  slurm.owner = Owner::SlurmJob(77);
  slurm.devices = {{DeviceKind::kGpu, 0, kWholeDevice}};
  ASSERT_TRUE(ledger_.Hold(slurm).ok());
  std::unique_ptr<GangRegistry> reg = NewRegistry();
  Admission a = reg->Admit(Spec(4, 2), Member(0));
  EXPECT_EQ(a.kind, Admission::kNoRoom);
  EXPECT_THAT(a.reason, HasSubstr("GANG_NO_ROOM"));
  EXPECT_THAT(a.reason, HasSubstr("podgroup/ml/train"));
  EXPECT_TRUE(maker_.creates().empty());
  EXPECT_EQ(ledger_.holding_count(), 1u);  // Slurm's only
  EXPECT_THAT(rec_.Reasons(), ElementsAre("DuetGangUnplaceable"));

  // Members asking more than any node has: no candidate at all.
  Admission big = reg->Admit(Spec(2, 8, "big"), Member(5));
  EXPECT_EQ(big.kind, Admission::kNoRoom);
  EXPECT_THAT(big.reason, HasSubstr("no node has room for one member (8 gpu"));
  EXPECT_EQ(reg->stats().unplaceable, 2u);
  EXPECT_EQ(reg->stats().gathering, 0u);
}

TEST_F(RegistryTest, SlurmRefusingTheJobHoldsNothing) {
  AddNodes(2, 4);
  maker_.set_create_error(absl::ResourceExhaustedError("Requested node configuration is not available"));
  std::unique_ptr<GangRegistry> reg = NewRegistry();
  Admission a = reg->Admit(Spec(4, 2), Member(0));
  EXPECT_EQ(a.kind, Admission::kNoRoom);
  EXPECT_THAT(a.reason, HasSubstr("not available"));
  EXPECT_EQ(ledger_.holding_count(), 0u);
  // The next member tries again (nothing was remembered).
  maker_.set_create_error(absl::OkStatus());
  EXPECT_EQ(reg->Admit(Spec(4, 2), Member(1)).kind, Admission::kWaiting);
  EXPECT_EQ(maker_.creates().size(), 2u);
}

TEST_F(RegistryTest, AMemberDeletedMidGatherReleasesTheWholeGang) {
  AddNodes(2, 4);
  std::unique_ptr<GangRegistry> reg = NewRegistry();
  ASSERT_EQ(reg->Admit(Spec(4, 2), Member(0)).kind, Admission::kWaiting);
  ASSERT_EQ(reg->Admit(Spec(4, 2), Member(1)).kind, Admission::kWaiting);
  EXPECT_EQ(ledger_.holding_count(), 4u);
  // Not a member: nothing happens.
  absl::StatusOr<bool> other = reg->OnMemberGone("uid-elsewhere");
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(*other);
  EXPECT_TRUE(maker_.cancels().empty());

  absl::StatusOr<bool> gone = reg->OnMemberGone(Member(1).uid);
  ASSERT_TRUE(gone.ok()) << gone.status();
  EXPECT_TRUE(*gone);
  EXPECT_THAT(maker_.cancels(), ElementsAre(500u));
  EXPECT_EQ(ledger_.holding_count(), 0u);
  EXPECT_THAT(rec_.Reasons(), ElementsAre("DuetGangReleased"));
  {
    absl::MutexLock l(&rec_.mu);
    EXPECT_THAT(rec_.events[0].message, HasSubstr("member ml/train-1 was deleted"));
    EXPECT_EQ(rec_.events[0].members.size(), 2u);  // told to every member
  }
  const GangStats st = reg->stats();
  EXPECT_EQ(st.releases[static_cast<int>(ReleaseReason::kMemberDeleted)], 1u);
  EXPECT_EQ(st.gathering, 0u);
  // The remaining member starts a new reservation.
  EXPECT_EQ(reg->Admit(Spec(4, 2), Member(0)).kind, Admission::kWaiting);
  EXPECT_EQ(maker_.creates().size(), 2u);
}

TEST_F(RegistryTest, AReleaseSlurmCannotDoKeepsTheGangForTheNextTry) {
  AddNodes(2, 4);
  std::unique_ptr<GangRegistry> reg = NewRegistry();
  ASSERT_EQ(reg->Admit(Spec(4, 2), Member(0)).kind, Admission::kWaiting);
  maker_.set_cancel_error(absl::UnavailableError("slurmctld down"));
  EXPECT_EQ(reg->OnMemberGone(Member(0).uid).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ledger_.holding_count(), 4u);
  EXPECT_EQ(reg->stats().gathering, 1u);
  maker_.set_cancel_error(absl::OkStatus());
  clock_.Advance(absl::Seconds(300));
  reg->Tick();
  EXPECT_EQ(ledger_.holding_count(), 0u);
}

TEST_F(RegistryTest, ReserveTimeoutReleasesAGangWhoseMembersStopArriving) {
  AddNodes(2, 4);
  std::unique_ptr<GangRegistry> reg = NewRegistry();
  ASSERT_EQ(reg->Admit(Spec(4, 2), Member(0)).kind, Admission::kWaiting);
  clock_.Advance(absl::Seconds(299));
  reg->Tick();
  EXPECT_TRUE(maker_.cancels().empty());
  EXPECT_EQ(ledger_.holding_count(), 4u);
  clock_.Advance(absl::Seconds(1));
  reg->Tick();
  EXPECT_THAT(maker_.cancels(), ElementsAre(500u));
  EXPECT_EQ(ledger_.holding_count(), 0u);
  EXPECT_EQ(reg->stats().releases[static_cast<int>(ReleaseReason::kReserveTimeout)], 1u);
  {
    absl::MutexLock l(&rec_.mu);
    ASSERT_EQ(rec_.events.size(), 1u);
    EXPECT_THAT(rec_.events[0].message, HasSubstr("only 1/4 members arrived"));
  }
}

TEST_F(RegistryTest, TickAsksWhetherGatheringMembersStillExist) {
  AddNodes(2, 4);
  GangRegistryOptions o = Options();
  o.member_exists = [](const MemberRef& m) -> absl::StatusOr<bool> {
    if (m.uid == "uid-1") return absl::UnavailableError("API down");  // no answer: kept
    return m.uid != "uid-2";
  };
  GangRegistry reg(&ledger_, &maker_, std::move(o));
  ASSERT_EQ(reg.Admit(Spec(4, 2), Member(0)).kind, Admission::kWaiting);
  ASSERT_EQ(reg.Admit(Spec(4, 2), Member(1)).kind, Admission::kWaiting);
  reg.Tick();
  EXPECT_TRUE(maker_.cancels().empty());
  ASSERT_EQ(reg.Admit(Spec(4, 2), Member(2)).kind, Admission::kWaiting);
  reg.Tick();
  EXPECT_THAT(maker_.cancels(), ElementsAre(500u));
  EXPECT_EQ(ledger_.holding_count(), 0u);
}

TEST_F(RegistryTest, AMemberAskingSomethingElseIsRefusedAndNotPlaced) {
  AddNodes(2, 4);
  std::unique_ptr<GangRegistry> reg = NewRegistry();
  ASSERT_EQ(reg->Admit(Spec(4, 2), Member(0)).kind, Admission::kWaiting);
  GangSpec other = Spec(4, 1);
  Admission a = reg->Admit(other, Member(1));
  EXPECT_EQ(a.kind, Admission::kMismatch);
  EXPECT_THAT(a.reason, HasSubstr("GANG_MEMBER_MISMATCH"));
  EXPECT_THAT(a.reason, HasSubstr("ask 2 gpu"));
  EXPECT_THAT(a.reason, HasSubstr("this pod asks 1 gpu"));
  // Another size for the same gang is a mismatch too.
  EXPECT_EQ(reg->Admit(Spec(2, 2), Member(2)).kind, Admission::kMismatch);
  EXPECT_THAT(rec_.Reasons(), ElementsAre("DuetGangMemberMismatch", "DuetGangMemberMismatch"));
  // The refused pods hold no slot: the next good member is the second.
  Admission next = reg->Admit(Spec(4, 2), Member(3));
  EXPECT_THAT(next.reason, HasSubstr("2/4 members"));
  EXPECT_EQ(maker_.creates().size(), 1u);
}

TEST_F(RegistryTest, AMemberThatEndsGivesItsDevicesBackToItsSlotAndIdleReleases) {
  AddNodes(2, 4);
  std::unique_ptr<GangRegistry> reg = NewRegistry();
  for (int i = 0; i < 4; ++i) reg->Admit(Spec(4, 2), Member(i));
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(reg->BindMember(Member(i).uid, i < 2 ? "node-0" : "node-1").ok());
  }
  // Member 1 ends: its devices go back to slot 1; a restarted member (new
  // uid) gets slot 1 and node-0 at once (the gang stays complete).
  absl::StatusOr<bool> gone = reg->OnMemberGone(Member(1).uid);
  ASSERT_TRUE(gone.ok() && *gone);
  EXPECT_THAT(MembersOn("node-0"), ElementsAre("uid-0"));
  EXPECT_TRUE(ledger_.FindHolding("node-0", fakes::SlotOwner(500, Spec(4, 2).key, 1)).has_value());
  EXPECT_TRUE(maker_.cancels().empty());
  Admission again = reg->Admit(Spec(4, 2), Member(9));
  EXPECT_EQ(again.kind, Admission::kReady);
  EXPECT_EQ(again.slot, 1u);
  EXPECT_EQ(again.node, "node-0");
  ASSERT_TRUE(reg->BindMember(Member(9).uid, "node-0").ok());

  // Every member ends: idle_release later the gang goes.
  for (int i : {0, 2, 3, 9}) ASSERT_TRUE(reg->OnMemberGone(Member(i).uid).ok());
  EXPECT_EQ(ledger_.holding_count(), 4u);  // the four slots again
  clock_.Advance(absl::Seconds(59));
  reg->Tick();
  EXPECT_TRUE(maker_.cancels().empty());
  clock_.Advance(absl::Seconds(1));
  reg->Tick();
  EXPECT_THAT(maker_.cancels(), ElementsAre(500u));
  EXPECT_EQ(ledger_.holding_count(), 0u);
  EXPECT_EQ(reg->stats().releases[static_cast<int>(ReleaseReason::kIdle)], 1u);
}

TEST_F(RegistryTest, RecoveryRebuildsTheSameSlotsFromTheLedger) {
  AddNodes(3, 4);
  std::map<uint32_t, std::string> slot_nodes;
  {
    std::unique_ptr<GangRegistry> reg = NewRegistry();
    // A complete gang of 4 x 2 (two bound members) and a gathering one.
    for (int i = 0; i < 4; ++i) reg->Admit(Spec(4, 2), Member(i));
    for (int i = 0; i < 4; ++i) {
      if (std::optional<std::string> n = reg->NodeOf(Member(i).uid)) slot_nodes[i] = *n;
    }
    ASSERT_TRUE(reg->BindMember(Member(1).uid, "node-0").ok());
    ASSERT_TRUE(reg->BindMember(Member(2).uid, "node-1").ok());
    ASSERT_EQ(reg->Admit(Spec(2, 2, "eval"), Member(7)).kind, Admission::kWaiting);
  }
  ASSERT_EQ(slot_nodes.size(), 4u);
  std::unique_ptr<GangRegistry> reg = NewRegistry();
  absl::StatusOr<size_t> n = reg->Recover();
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2u);
  const GangStats st = reg->stats();
  EXPECT_EQ(st.complete, 1u);
  EXPECT_EQ(st.gathering, 1u);
  EXPECT_TRUE(reg->IsGangJob(500));
  EXPECT_TRUE(reg->IsGangJob(501));
  // The bound members are where they were.
  EXPECT_EQ(reg->NodeOf(Member(1).uid), "node-0");
  EXPECT_EQ(reg->NodeOf(Member(2).uid), "node-1");
  // The unbound members come back and get the free slots of the same
  // nodes: slot 0 on node-0, slot 3 on node-1.
  Admission m0 = reg->Admit(Spec(4, 2), Member(0));
  EXPECT_EQ(m0.kind, Admission::kReady);
  EXPECT_EQ(m0.slot, 0u);
  EXPECT_EQ(m0.node, slot_nodes[0]);
  Admission m3 = reg->Admit(Spec(4, 2), Member(3));
  EXPECT_EQ(m3.slot, 3u);
  EXPECT_EQ(m3.node, slot_nodes[3]);
  ASSERT_TRUE(reg->BindMember(Member(0).uid, "node-0").ok());
  ASSERT_TRUE(reg->BindMember(Member(3).uid, "node-1").ok());
  // A bound member that ends goes back to a slot owner the ledger knows.
  ASSERT_TRUE(reg->OnMemberGone(Member(2).uid).ok());
  EXPECT_TRUE(ledger_.FindHolding("node-1", fakes::SlotOwner(500, Spec(4, 2).key, 2)).has_value());
  EXPECT_THAT(MembersOn("node-1"), ElementsAre("uid-3"));
  EXPECT_TRUE(ledger_.CheckInvariants().ok());
  // The recovered member request is the slots' devices: 1 GPU is refused.
  EXPECT_EQ(reg->Admit(Spec(2, 1, "eval"), Member(8)).kind, Admission::kMismatch);
  // The gathering gang keeps its timeout from the restart on.
  clock_.Advance(absl::Seconds(300));
  reg->Tick();
  EXPECT_THAT(maker_.cancels(), ElementsAre(501u));
}

TEST_F(RegistryTest, RecoveryFindsAGangWhoseEverySlotIsBoundThroughItsJob) {
  AddNodes(2, 4);
  {
    std::unique_ptr<GangRegistry> reg = NewRegistry();
    for (int i = 0; i < 2; ++i) reg->Admit(Spec(2, 4), Member(i));
    ASSERT_TRUE(reg->BindMember(Member(0).uid, "node-0").ok());
    ASSERT_TRUE(reg->BindMember(Member(1).uid, "node-1").ok());
  }
  // Without job_gang nothing marks job 500 as a gang's.
  EXPECT_EQ(*NewRegistry()->Recover(), 0u);
  GangRegistryOptions o = Options();
  o.job_gang = [](uint32_t job) -> std::optional<GangKey> {
    if (job == 500) return Spec(2, 4).key;
    return std::nullopt;
  };
  o.slot_owner = [](uint32_t job, const GangKey& key, uint32_t slot) {
    return fakes::SlotOwner(job, key, slot);
  };
  GangRegistry reg(&ledger_, &maker_, std::move(o));
  ASSERT_EQ(*reg.Recover(), 1u);
  EXPECT_EQ(reg.NodeOf(Member(0).uid), "node-0");
  EXPECT_EQ(reg.NodeOf(Member(1).uid), "node-1");
  ASSERT_TRUE(reg.OnMemberGone(Member(0).uid).ok());
  EXPECT_TRUE(ledger_.FindHolding("node-0", fakes::SlotOwner(500, Spec(2, 4).key, 0)).has_value());
}

TEST(GangKeyTest, ToStringAndParseRoundTrip) {
  GangKey k{"ml", GangSource::kJobSet, "trainer/workers"};
  EXPECT_EQ(k.ToString(), "jobset/ml/trainer/workers");
  absl::StatusOr<GangKey> back = GangKey::Parse(k.ToString());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, k);
  EXPECT_FALSE(GangKey::Parse("nosuch/ml/x").ok());
  EXPECT_FALSE(GangKey::Parse("podgroup/ml").ok());
  absl::StatusOr<std::pair<GangKey, uint32_t>> slot = ParseSlotUid(SlotUid(k, 12));
  ASSERT_TRUE(slot.ok());
  EXPECT_EQ(slot->first, k);
  EXPECT_EQ(slot->second, 12u);
  EXPECT_FALSE(ParseSlotUid("gang:podgroup/ml/x").ok());
  EXPECT_FALSE(ParseSlotUid("pod-uid").ok());
}

// The candidates come from the ledger in its own order (not by name): the
// nodes chosen must be the same whatever order the nodes entered the ledger
// in, ties included (every node equally free, two pools, blocks). The
// registry over a ledger filled in name order decides as it did when it
// read a snapshot sorted by name.
TEST(RegistryOrderTest, TheChosenNodesDoNotDependOnTheLedgersOrderWhenNodesTie) {
  std::vector<NodeSpec> nodes;
  for (int i = 0; i < 24; ++i) {
    NodeSpec n = Node(absl::StrCat("node-", i), 8, i % 2 == 0 ? "a3" : "a3b");
    n.labels["cloud.google.com/gce-topology-block"] = absl::StrCat("b", i % 3);
    n.labels["cloud.google.com/gce-topology-subblock"] = absl::StrCat("s", i % 6);
    nodes.push_back(std::move(n));
  }
  auto choose = [&](const std::vector<int>& order, bool churn) {
    Ledger ledger;
    fakes::FakeGangMaker maker(&ledger);
    for (int i : order) EXPECT_TRUE(ledger.UpsertNode(nodes[i]).ok());
    if (churn) {
      // Free table slots taken again by other nodes: the ledger's order is
      // neither insertion nor name order.
      for (int i : {order[0], order[5], order[11]}) {
        EXPECT_TRUE(ledger.RemoveNode(nodes[i].name).ok());
      }
      for (int i : {order[11], order[0], order[5]}) EXPECT_TRUE(ledger.UpsertNode(nodes[i]).ok());
    }
    GangRegistryOptions o;
    o.planner = [](const std::vector<placement::GangCandidate>& c, uint32_t members,
                   std::string* reason) { return placement::PickGangNodes(c, members, reason); };
    o.topology = [](const NodeView& v) { return placement::TopologyOf(v); };
    GangRegistry reg(&ledger, &maker, o);
    std::vector<std::vector<std::string>> picks;
    // Three gangs one after another: each later one sees the earlier ones'
    // holdings, so the ties change as the cluster fills.
    for (const auto& [name, members, gpus] :
         std::vector<std::tuple<std::string, uint32_t, uint32_t>>{{"g1", 4, 4}, {"g2", 3, 8},
                                                                  {"g3", 6, 2}}) {
      Admission a = reg.Admit(Spec(members, gpus, name), Member(static_cast<int>(picks.size())));
      EXPECT_EQ(a.kind, members == 1 ? Admission::kReady : Admission::kWaiting) << a.reason;
      std::vector<std::string> picked;
      const std::vector<fakes::FakeGangMaker::CreateCall> creates = maker.creates();
      if (creates.empty()) return picks;
      for (const GangNode& g : creates.back().nodes) {
        picked.push_back(absl::StrCat(g.node, "x", g.members));
      }
      picks.push_back(picked);
    }
    return picks;
  };
  std::vector<int> by_name(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) by_name[i] = static_cast<int>(i);
  std::sort(by_name.begin(), by_name.end(),
            [&](int a, int b) { return nodes[a].name < nodes[b].name; });
  const std::vector<std::vector<std::string>> before = choose(by_name, false);
  ASSERT_EQ(before.size(), 3u);
  for (const auto& p : before) EXPECT_FALSE(p.empty());
  std::vector<int> reversed(by_name.rbegin(), by_name.rend());
  std::vector<int> mixed;
  for (size_t i = 0; i < nodes.size(); ++i) mixed.push_back(static_cast<int>((i * 7) % nodes.size()));
  EXPECT_EQ(choose(reversed, false), before);
  EXPECT_EQ(choose(mixed, false), before);
  EXPECT_EQ(choose(mixed, true), before);
  EXPECT_EQ(choose(reversed, true), before);
}

// A GangMaker whose Create first passes a gate or waits to be let go: a
// Slurm call that takes as long as the test wants.
class HeldMaker final : public GangMaker {
 public:
  explicit HeldMaker(Ledger* ledger) : inner_(ledger) {}

  // Create of gang `name` waits in it until Let() (and says it entered).
  void Hold(const std::string& name) { held_ = name; }
  // Every Create passes `gate` first.
  void set_gate(duet::fakes::Gate* gate) { gate_ = gate; }
  void Let() { let_.Notify(); }
  bool entered() const { return entered_.HasBeenNotified(); }

  absl::StatusOr<GangAllocation> Create(const GangKey& key, const GangSpec& spec,
                                        const std::vector<GangNode>& nodes) override {
    if (gate_ != nullptr) gate_->Arrive();
    if (key.name == held_) {
      entered_.Notify();
      let_.WaitForNotification();
    }
    return inner_.Create(key, spec, nodes);
  }
  absl::Status Cancel(const GangKey& key, uint32_t job_id) override {
    return inner_.Cancel(key, job_id);
  }
  const fakes::FakeGangMaker& inner() const { return inner_; }

 private:
  fakes::FakeGangMaker inner_;
  std::string held_;
  duet::fakes::Gate* gate_ = nullptr;
  absl::Notification entered_;
  absl::Notification let_;
};

class RegistryConcurrencyTest : public ::testing::Test {
 protected:
  RegistryConcurrencyTest() : maker_(&ledger_) {}

  void AddNodes(int n, uint32_t gpus) {
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(ledger_.UpsertNode(Node(absl::StrCat("node-", i), gpus)).ok());
    }
  }
  std::unique_ptr<GangRegistry> NewRegistry() {
    GangRegistryOptions o;
    o.planner = fakes::SimplePlanner;
    return std::make_unique<GangRegistry>(&ledger_, &maker_, o);
  }

  Ledger ledger_;
  HeldMaker maker_;
};

// Two gangs reserve at once: both Slurm calls are in flight together (the
// gate lets neither through alone), and the second does not pick the node
// the first is asking Slurm for (the simple planner would pick node-0 for
// both: the second would then find its devices taken and fail).
TEST_F(RegistryConcurrencyTest, TwoReservationsInFlightAtOnceNeverPickTheSameDevices) {
  AddNodes(2, 4);
  std::unique_ptr<GangRegistry> reg = NewRegistry();
  duet::fakes::Gate gate(2);
  maker_.set_gate(&gate);
  Admission a, b;
  std::thread ta([&] { a = reg->Admit(Spec(1, 4, "a"), Member(0)); });
  std::thread tb([&] { b = reg->Admit(Spec(1, 4, "b"), Member(1)); });
  ta.join();
  tb.join();
  EXPECT_FALSE(gate.timed_out()) << "the two Slurm calls did not run at the same time";
  ASSERT_EQ(a.kind, Admission::kReady) << a.reason;
  ASSERT_EQ(b.kind, Admission::kReady) << b.reason;
  EXPECT_NE(a.node, b.node);
  EXPECT_EQ(maker_.inner().creates().size(), 2u);
  EXPECT_EQ(ledger_.holding_count(), 2u);
  EXPECT_TRUE(ledger_.CheckInvariants().ok());
}

// While gang a's Slurm call is held: gang b's filter answers (on another
// node), and a second member of gang a waits for a's reservation and joins
// it (one Slurm job for gang a, not two).
TEST_F(RegistryConcurrencyTest, AnotherGangsFilterDoesNotWaitForASlowSlurmCall) {
  AddNodes(3, 4);
  std::unique_ptr<GangRegistry> reg = NewRegistry();
  maker_.Hold("a");
  const GangSpec a_spec = Spec(2, 4, "a");
  Admission a0, a1, b;
  std::atomic<bool> b_done{false};
  std::thread t0([&] { a0 = reg->Admit(a_spec, Member(0)); });
  ASSERT_TRUE(duet::fakes::WaitFor([&] { return maker_.entered(); }, duet::fakes::kWaitTimeout,
                                   "gang a's Slurm call"));
  std::thread t1([&] { a1 = reg->Admit(a_spec, Member(1)); });
  std::thread tb([&] {
    b = reg->Admit(Spec(1, 4, "b"), Member(5));
    b_done = true;
  });
  const ::testing::AssertionResult b_answered =
      duet::fakes::WaitFor([&] { return b_done.load(); }, duet::fakes::kWaitTimeout,
                           "gang b's filter while gang a's Slurm call is held");
  maker_.Let();
  t0.join();
  t1.join();
  tb.join();
  EXPECT_TRUE(b_answered);
  ASSERT_EQ(b.kind, Admission::kReady) << b.reason;
  EXPECT_EQ(b.node, "node-2");
  EXPECT_EQ(a0.kind, Admission::kWaiting) << a0.reason;
  ASSERT_EQ(a1.kind, Admission::kReady) << a1.reason;
  EXPECT_EQ(a1.slot, 1u);
  int a_creates = 0;
  for (const auto& c : maker_.inner().creates()) a_creates += c.key.name == "a" ? 1 : 0;
  EXPECT_EQ(a_creates, 1);
  EXPECT_EQ(ledger_.holding_count(), 3u);
  EXPECT_TRUE(ledger_.CheckInvariants().ok());
}

// A gang that finds no room only because another reservation's node is
// promised waits for that reservation and looks again: it gets the devices
// the first left free, as if the two had run one after another.
TEST_F(RegistryConcurrencyTest, NoRoomWhileAnotherReservationIsInFlightWaitsForIt) {
  AddNodes(1, 8);
  std::unique_ptr<GangRegistry> reg = NewRegistry();
  maker_.Hold("a");
  Admission a, b;
  std::thread ta([&] { a = reg->Admit(Spec(1, 4, "a"), Member(0)); });
  ASSERT_TRUE(duet::fakes::WaitFor([&] { return maker_.entered(); }, duet::fakes::kWaitTimeout,
                                   "gang a's Slurm call"));
  std::thread tb([&] { b = reg->Admit(Spec(1, 4, "b"), Member(1)); });
  maker_.Let();
  ta.join();
  tb.join();
  ASSERT_EQ(a.kind, Admission::kReady) << a.reason;
  ASSERT_EQ(b.kind, Admission::kReady) << b.reason;
  EXPECT_EQ(a.node, "node-0");
  EXPECT_EQ(b.node, "node-0");
  EXPECT_EQ(ledger_.holding_count(), 2u);
  EXPECT_TRUE(ledger_.CheckInvariants().ok());
}

}  // namespace
}  // namespace gang
}  // namespace duet
