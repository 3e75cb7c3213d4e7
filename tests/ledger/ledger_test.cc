#include "bridge/ledger/ledger.h"

#include <atomic>
#include <thread>
#include <tuple>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet {
namespace {

using ::testing::HasSubstr;

NodeSpec GpuNode(const std::string& name, int gpus = 8, const std::string& model = "h100") {
  NodeSpec n;
  n.name = name;
  n.cpus = 32;
  n.memory_mib = 256 * 1024;
  n.pool = "shared";
  for (int i = 0; i < gpus; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kGpu;
    d.index = i;
    d.id = name + "-GPU-" + std::to_string(i);
    d.model = model;
    n.devices.push_back(d);
  }
  return n;
}

HoldRequest Count(const std::string& node, Owner owner, uint32_t count, uint32_t milli = 0) {
  HoldRequest r;
  r.node = node;
  r.owner = std::move(owner);
  r.count = CountSelector{DeviceKind::kGpu, count, milli, ""};
  return r;
}

HoldRequest Exact(const std::string& node, Owner owner, std::vector<uint32_t> indices,
                  uint32_t milli = 0) {
  HoldRequest r;
  r.node = node;
  r.owner = std::move(owner);
  for (uint32_t i : indices) r.devices.push_back({DeviceKind::kGpu, i, milli});
  return r;
}

std::vector<uint32_t> Indices(const Holding& h) {
  std::vector<uint32_t> out;
  for (const auto& d : h.devices) out.push_back(d.index);
  return out;
}

class LedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ledger_.UpsertNode(GpuNode("a")).ok());
    ASSERT_TRUE(ledger_.UpsertNode(GpuNode("b")).ok());
  }
  void TearDown() override { EXPECT_TRUE(ledger_.CheckInvariants().ok()) << ledger_.CheckInvariants(); }
  Ledger ledger_;
};

TEST_F(LedgerTest, CountHoldTakesLowestFreeDevices) {
  auto r = ledger_.Hold(Count("a", Owner::SlurmJob(1), 2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->created);
  EXPECT_EQ(Indices(r->holding), (std::vector<uint32_t>{0, 1}));
  auto r2 = ledger_.Hold(Count("a", Owner::Pod("u1", "default", "web"), 3));
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(Indices(r2->holding), (std::vector<uint32_t>{2, 3, 4}));
  EXPECT_GT(r2->seq, r->seq);
}

TEST_F(LedgerTest, ExactHoldOnDeviceHeldByPodNamesThePod) {
  ASSERT_TRUE(ledger_.Hold(Exact("a", Owner::Pod("u1", "ml", "infer-0"), {3})).ok());
  auto r = ledger_.Hold(Exact("a", Owner::SlurmStep(7, 0), {2, 3}));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("node a gpu 3 is held by pod ml/infer-0 (uid u1)"));
  // All or nothing: device 2 stayed free.
  EXPECT_EQ(ledger_.GetNode("a")->devices[2].used_milli, 0u);
  EXPECT_EQ(ledger_.holding_count(), 1u);
}

TEST_F(LedgerTest, RetriedHoldIsIdempotent) {
  auto r1 = ledger_.Hold(Exact("a", Owner::SlurmStep(7, 0), {0, 1}));
  ASSERT_TRUE(r1.ok());
  const uint64_t gen = ledger_.GetNode("a")->generation;
  auto r2 = ledger_.Hold(Exact("a", Owner::SlurmStep(7, 0), {1, 0}));
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_FALSE(r2->created);
  EXPECT_EQ(Indices(r2->holding), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(ledger_.GetNode("a")->generation, gen);
  // Same count retried also succeeds.
  ASSERT_TRUE(ledger_.Hold(Count("b", Owner::SlurmJob(9), 4)).ok());
  auto again = ledger_.Hold(Count("b", Owner::SlurmJob(9), 4));
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->created);
}

TEST_F(LedgerTest, SameOwnerDifferentDevicesIsAlreadyExists) {
  ASSERT_TRUE(ledger_.Hold(Exact("a", Owner::SlurmStep(7, 0), {0, 1})).ok());
  auto r = ledger_.Hold(Exact("a", Owner::SlurmStep(7, 0), {2}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(r.status().message(), HasSubstr("already holds gpu0,gpu1"));
}

TEST_F(LedgerTest, BadInputIsRefusedAndChangesNothing) {
  const uint64_t seq = ledger_.seq();
  EXPECT_EQ(ledger_.Hold(Count("nope", Owner::SlurmJob(1), 1)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ledger_.Hold(Exact("a", Owner::SlurmJob(1), {8})).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ledger_.Hold(Count("a", Owner::SlurmJob(1), 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto too_many = ledger_.Hold(Count("a", Owner::SlurmJob(1), 9));
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_many.status().message(), HasSubstr("more than node a's 8 gpu"));
  EXPECT_EQ(ledger_.Hold(Exact("a", Owner::SlurmJob(1), {1, 1})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.Hold(Count("a", Owner::SlurmJob(0), 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.Hold(Count("a", Owner::Pod(""), 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.Hold(Count("a", Owner::Pod(std::string(200, 'x')), 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.Hold(Count("", Owner::SlurmJob(1), 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.Hold(Exact("a", Owner::SlurmJob(1), {0}, 1001)).status().code(),
            absl::StatusCode::kInvalidArgument);
  HoldRequest neither;
  neither.node = "a";
  neither.owner = Owner::SlurmJob(1);
  EXPECT_EQ(ledger_.Hold(neither).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.seq(), seq);
  EXPECT_EQ(ledger_.holding_count(), 0u);
}

TEST_F(LedgerTest, NotEnoughFreeIsResourceExhausted) {
  ASSERT_TRUE(ledger_.Hold(Count("a", Owner::Pod("p1"), 6)).ok());
  auto r = ledger_.Hold(Count("a", Owner::SlurmJob(3), 3));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("2 of 8 gpu devices have room, 3 requested"));
}

TEST_F(LedgerTest, StaleGenerationIsAborted) {
  const uint64_t gen = ledger_.GetNode("a")->generation;
  ASSERT_TRUE(ledger_.Hold(Count("a", Owner::SlurmJob(1), 1)).ok());
  HoldRequest r = Count("a", Owner::SlurmJob(2), 1);
  r.expected_generation = gen;
  EXPECT_EQ(ledger_.Hold(r).status().code(), absl::StatusCode::kAborted);
  r.expected_generation = ledger_.GetNode("a")->generation;
  EXPECT_TRUE(ledger_.Hold(r).ok());
}

TEST_F(LedgerTest, StepsNestInTheirJobAndPodsInTheirPlaceholder) {
  // Job import records the job; its steps may hold the same devices.
  ASSERT_TRUE(ledger_.Hold(Exact("a", Owner::SlurmJob(5), {0, 1, 2, 3})).ok());
  ASSERT_TRUE(ledger_.Hold(Exact("a", Owner::SlurmStep(5, 0), {0, 1})).ok());
  ASSERT_TRUE(ledger_.Hold(Exact("a", Owner::SlurmStep(5, 1), {2, 3})).ok());
  EXPECT_EQ(ledger_.Hold(Exact("a", Owner::SlurmStep(6, 0), {3})).status().code(),
            absl::StatusCode::kResourceExhausted);
  // The placeholder holds for the pod; the pod then holds the same devices.
  ASSERT_TRUE(ledger_.Hold(Exact("a", Owner::Placeholder(99, "uid-p"), {4, 5})).ok());
  ASSERT_TRUE(ledger_.Hold(Exact("a", Owner::Pod("uid-p", "ns", "p"), {4, 5})).ok());
  auto r = ledger_.Hold(Exact("a", Owner::Pod("uid-q", "ns", "q"), {5}));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("placeholder job 99"));
  auto view = ledger_.GetNode("a");
  EXPECT_EQ(view->devices[0].used_milli, 1000u);
  EXPECT_EQ(view->devices[4].used_milli, 1000u);
  EXPECT_EQ(view->devices[6].used_milli, 0u);
}

TEST_F(LedgerTest, SharesPackOntoOneDeviceAndNeverOverfill) {
  auto a = ledger_.Hold(Count("a", Owner::Pod("p1"), 1, 300));
  ASSERT_TRUE(a.ok());
  auto b = ledger_.Hold(Count("a", Owner::Pod("p2"), 1, 500));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(Indices(a->holding), Indices(b->holding));  // best fit packs
  auto c = ledger_.Hold(Count("a", Owner::Pod("p3"), 1, 300));
  ASSERT_TRUE(c.ok());
  EXPECT_NE(Indices(c->holding), Indices(a->holding));  // 300 > 200 left
  const uint32_t dev = Indices(a->holding)[0];
  EXPECT_EQ(ledger_.GetNode("a")->devices[dev].used_milli, 800u);
  // A whole-device holder never shares.
  auto whole = ledger_.Hold(Exact("a", Owner::SlurmStep(4, 0), {dev}));
  EXPECT_EQ(whole.status().code(), absl::StatusCode::kResourceExhausted);
  auto over = ledger_.Hold(Exact("a", Owner::Pod("p4"), {dev}, 201));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(ledger_.Hold(Exact("a", Owner::Pod("p4"), {dev}, 200)).ok());
  EXPECT_EQ(ledger_.GetNode("a")->devices[dev].used_milli, 1000u);
}

TEST_F(LedgerTest, ReleaseIsIdempotentAndFreesDevices) {
  ASSERT_TRUE(ledger_.Hold(Count("a", Owner::SlurmJob(1), 8)).ok());
  auto r = ledger_.Release("a", Owner::SlurmJob(1));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->released);
  EXPECT_EQ(r->holding.devices.size(), 8u);
  auto again = ledger_.Release("a", Owner::SlurmJob(1));
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->released);
  EXPECT_TRUE(ledger_.Hold(Count("a", Owner::Pod("p"), 8)).ok());
}

TEST_F(LedgerTest, CordonRefusesNewPodsButNotSlurmSteps) {
  NodeSpec a = GpuNode("a");
  a.state = NodeState::kCordoned;
  ASSERT_TRUE(ledger_.UpsertNode(a).ok());
  auto pod = ledger_.Hold(Count("a", Owner::Pod("p"), 1));
  EXPECT_EQ(pod.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(pod.status().message(), HasSubstr("cordoned"));
  EXPECT_TRUE(ledger_.Hold(Count("a", Owner::SlurmStep(1, 0), 1)).ok());
}

TEST_F(LedgerTest, RemovedNodeWithHoldingsStaysGoneUntilReleased) {
  ASSERT_TRUE(ledger_.Hold(Count("a", Owner::SlurmJob(1), 2)).ok());
  ASSERT_TRUE(ledger_.RemoveNode("a").ok());
  ASSERT_NE(ledger_.GetNode("a"), nullptr);
  EXPECT_EQ(ledger_.GetNode("a")->spec.state, NodeState::kGone);
  EXPECT_EQ(ledger_.Hold(Count("a", Owner::SlurmJob(2), 1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(ledger_.Release("a", Owner::SlurmJob(1)).ok());
  EXPECT_EQ(ledger_.GetNode("a"), nullptr);
  EXPECT_EQ(ledger_.RemoveNode("a").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(ledger_.RemoveNode("b").ok());
  EXPECT_EQ(ledger_.node_count(), 0u);
}

TEST_F(LedgerTest, UpsertCannotDropAHeldDevice) {
  ASSERT_TRUE(ledger_.Hold(Exact("a", Owner::SlurmJob(1), {7})).ok());
  auto r = ledger_.UpsertNode(GpuNode("a", 4));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("gpu 7 is held by slurm job 1"));
  EXPECT_EQ(ledger_.GetNode("a")->devices.size(), 8u);
  // Growing is fine and keeps the holding.
  ASSERT_TRUE(ledger_.UpsertNode(GpuNode("a", 16)).ok());
  EXPECT_EQ(ledger_.GetNode("a")->devices[7].used_milli, 1000u);
}

TEST_F(LedgerTest, UnchangedUpsertIsANoOp) {
  const uint64_t seq = ledger_.seq();
  const uint64_t gen = ledger_.GetNode("a")->generation;
  ASSERT_TRUE(ledger_.UpsertNode(GpuNode("a")).ok());
  EXPECT_EQ(ledger_.seq(), seq);
  EXPECT_EQ(ledger_.GetNode("a")->generation, gen);
}

TEST_F(LedgerTest, InvalidNodeSpecNamesTheField) {
  NodeSpec n = GpuNode("c");
  n.devices[1].index = 0;
  auto r = ledger_.UpsertNode(n);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("gpu 0 listed twice"));
  n = GpuNode("c");
  n.devices[2].capacity_milli = 0;
  EXPECT_THAT(ledger_.UpsertNode(n).status().message(), HasSubstr("devices[2].capacity_milli"));
  EXPECT_EQ(ledger_.node_count(), 2u);
}

TEST_F(LedgerTest, SnapshotIsStableWhileWritersGoOn) {
  ASSERT_TRUE(ledger_.Hold(Count("a", Owner::SlurmJob(1), 1)).ok());
  LedgerSnapshot snap = ledger_.Snapshot();
  ASSERT_TRUE(ledger_.Hold(Count("a", Owner::SlurmJob(2), 3)).ok());
  ASSERT_EQ(snap.nodes.size(), 2u);
  EXPECT_EQ(snap.nodes[0]->spec.name, "a");
  EXPECT_EQ(snap.nodes[0]->devices[1].used_milli, 0u);  // the old view is untouched
  EXPECT_EQ(ledger_.GetNode("a")->devices[1].used_milli, 1000u);
}

TEST_F(LedgerTest, ListenersSeeEveryChangeInOrder) {
  struct Recorder : ChangeListener {
    std::vector<std::pair<Change::Type, uint64_t>> seen;
    void OnChange(const Change& c) override { seen.emplace_back(c.type, c.seq); }
  } rec;
  ledger_.AddListener(&rec);
  ASSERT_TRUE(ledger_.Hold(Count("a", Owner::SlurmJob(1), 1)).ok());
  ASSERT_TRUE(ledger_.Release("a", Owner::SlurmJob(1)).ok());
  ASSERT_TRUE(ledger_.RemoveNode("b").ok());
  EXPECT_FALSE(ledger_.Hold(Count("a", Owner::SlurmJob(1), 9)).ok());  // refused: no change
  ledger_.RemoveListener(&rec);
  ASSERT_EQ(rec.seen.size(), 3u);
  EXPECT_EQ(rec.seen[0].first, Change::Type::kHold);
  EXPECT_EQ(rec.seen[1].first, Change::Type::kRelease);
  EXPECT_EQ(rec.seen[2].first, Change::Type::kRemoveNode);
  EXPECT_LT(rec.seen[0].second, rec.seen[1].second);
  EXPECT_LT(rec.seen[1].second, rec.seen[2].second);
}

TEST_F(LedgerTest, ListHoldingsByNode) {
  ASSERT_TRUE(ledger_.Hold(Count("a", Owner::SlurmJob(1), 1)).ok());
  ASSERT_TRUE(ledger_.Hold(Count("a", Owner::Pod("p"), 2)).ok());
  ASSERT_TRUE(ledger_.Hold(Count("b", Owner::SlurmJob(1), 1)).ok());
  EXPECT_EQ(ledger_.ListHoldings("a").size(), 2u);
  EXPECT_EQ(ledger_.ListHoldings("b").size(), 1u);
  EXPECT_EQ(ledger_.ListHoldings().size(), 3u);
  EXPECT_TRUE(ledger_.ListHoldings("zzz").empty());
}

// Many threads race for the last devices of one node: every device ends with
// exactly one holder, and the grants add up.
TEST(LedgerConcurrencyTest, RacingHoldersNeverShareADevice) {
  Ledger ledger;
  ASSERT_TRUE(ledger.UpsertNode(GpuNode("n", 8)).ok());
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        Owner o = (t % 2) ? Owner::Pod("p" + std::to_string(t) + "-" + std::to_string(i))
                          : Owner::SlurmStep(1 + t * 10000 + i, 0);
        auto r = ledger.Hold(Count("n", o, 1 + (i % 3)));
        if (r.ok()) {
          granted += r->holding.devices.size();
          if (i % 2 == 0) {
            granted -= r->holding.devices.size();
            ASSERT_TRUE(ledger.Release("n", o).ok());
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(ledger.CheckInvariants().ok()) << ledger.CheckInvariants();
  uint32_t used = 0;
  for (const auto& d : ledger.GetNode("n")->devices) used += d.used_milli / 1000;
  EXPECT_EQ(static_cast<int>(used), granted.load());
}

TEST_F(LedgerTest, GetNodesAnswersInOrderWithNullForUnknownNames) {
  // More names than one batch of the lock (256), unknown ones among them.
  std::vector<std::string> names;
  for (int i = 0; i < 600; ++i) names.push_back(i % 3 == 0 ? "a" : i % 3 == 1 ? "b" : "x" + std::to_string(i));
  std::vector<std::shared_ptr<const NodeView>> views = ledger_.GetNodes(names);
  ASSERT_EQ(views.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    if (i % 3 == 2) {
      EXPECT_EQ(views[i], nullptr) << names[i];
    } else {
      ASSERT_NE(views[i], nullptr) << names[i];
      EXPECT_EQ(views[i]->spec.name, names[i]);
      EXPECT_EQ(views[i], ledger_.GetNode(names[i]));
    }
  }
  EXPECT_TRUE(ledger_.GetNodes({}).empty());
}

TEST_F(LedgerTest, StoredDevicesCarryTheirInternedModelId) {
  ASSERT_TRUE(ledger_.UpsertNode(GpuNode("c", 2, "a100-interned")).ok());
  const uint32_t h100 = FindModelId("h100");
  const uint32_t a100 = FindModelId("a100-interned");
  EXPECT_NE(h100, 0u);
  EXPECT_NE(a100, 0u);
  EXPECT_NE(h100, a100);
  EXPECT_EQ(InternModel("a100-interned"), a100);  // stable
  for (const DeviceState& d : ledger_.GetNode("a")->devices) EXPECT_EQ(d.spec.model_id, h100);
  for (const DeviceState& d : ledger_.GetNode("c")->devices) EXPECT_EQ(d.spec.model_id, a100);
  // A name no device ever had has no id, and asking does not make one.
  EXPECT_EQ(FindModelId("never-in-any-inventory"), 0u);
  EXPECT_EQ(FindModelId("never-in-any-inventory"), 0u);
  // The id is not part of the spec's identity: re-sending the inventory's
  // spec (ids unset) changes nothing.
  const uint64_t gen = ledger_.GetNode("c")->generation;
  ASSERT_TRUE(ledger_.UpsertNode(GpuNode("c", 2, "a100-interned")).ok());
  EXPECT_EQ(ledger_.GetNode("c")->generation, gen);
}

// ---------------------------------------------------------------------------
// The DRA lending mode's owners and Rebind.

TEST(OwnerTest, LendAndClaimOwnersFormTheirGroups) {
  const Owner lend1 = Owner::Lend(7, "a");
  const Owner lend2 = Owner::Lend(8, "a");
  const Owner lend_b = Owner::Lend(7, "b");
  EXPECT_EQ(lend1.holder_class(), HolderClass::kPod);
  EXPECT_EQ(lend1.pod_uid, "lend:a");
  EXPECT_TRUE(lend1.SameGroup(lend2));    // every lend owner of a node
  EXPECT_FALSE(lend1.SameGroup(lend_b));  // not another node's
  const Owner c1 = Owner::Claim(7, "uid-1", "ns", "c");
  const Owner c2 = Owner::Claim(8, "uid-1");
  EXPECT_EQ(c1.holder_class(), HolderClass::kPod);
  EXPECT_TRUE(c1.SameGroup(c2));  // one claim, devices of two lend jobs
  EXPECT_FALSE(c1.SameGroup(lend1));
  EXPECT_FALSE(c1.SameGroup(Owner::Claim(7, "uid-2")));
  EXPECT_EQ(c1.ToString(), "claim ns/c (uid uid-1) on lend job 7");
  EXPECT_EQ(c2.ToString(), "claim uid uid-1 on lend job 8");
  EXPECT_EQ(lend1.ToString(), "lend job 7 on node a");
  EXPECT_TRUE(ValidateOwner(lend1).ok());
  EXPECT_TRUE(ValidateOwner(c1).ok());
  EXPECT_FALSE(ValidateOwner(Owner::Lend(0, "a")).ok());
  EXPECT_FALSE(ValidateOwner(Owner::Claim(7, "")).ok());
}

TEST_F(LedgerTest, RebindMovesTheWholeHoldingAndKeepsTheDevicesHeld) {
  ASSERT_TRUE(ledger_.Hold(Exact("a", Owner::Lend(5, "a"), {2})).ok());
  const uint64_t gen = ledger_.GetNode("a")->generation;
  const Owner claim = Owner::Claim(5, "uid-1", "ns", "c");
  absl::StatusOr<HoldResult> r = ledger_.Rebind("a", Owner::Lend(5, "a"), claim);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->holding.owner, claim);
  EXPECT_EQ(Indices(r->holding), std::vector<uint32_t>{2});
  EXPECT_EQ(r->seq, ledger_.seq());
  EXPECT_EQ(ledger_.GetNode("a")->generation, gen + 2);  // a release and a hold
  EXPECT_FALSE(ledger_.FindHolding("a", Owner::Lend(5, "a")).has_value());
  ASSERT_TRUE(ledger_.FindHolding("a", claim).has_value());
  // Still held: nobody else gets it.
  EXPECT_EQ(ledger_.Hold(Exact("a", Owner::SlurmJob(9), {2})).status().code(),
            absl::StatusCode::kResourceExhausted);
  // And back.
  ASSERT_TRUE(ledger_.Rebind("a", claim, Owner::Lend(5, "a")).ok());
  EXPECT_TRUE(ledger_.FindHolding("a", Owner::Lend(5, "a")).has_value());
}

// Gangs (docs/gangs.md): a reserved slot is a pod-side owner of its own
// group, "gang:KEY#SLOT", under the gang's job.
TEST(OwnerTest, GangSlotOwnersAreOneGroupPerSlot) {
  const Owner s0 = Owner::GangSlot(7, "podgroup/ml/train", 0);
  const Owner s1 = Owner::GangSlot(7, "podgroup/ml/train", 1);
  EXPECT_EQ(s0.kind, OwnerKind::kGangSlot);
  EXPECT_EQ(s0.job_id, 7u);
  EXPECT_EQ(s0.pod_uid, "gang:podgroup/ml/train#0");
  EXPECT_EQ(s0.holder_class(), HolderClass::kPod);
  EXPECT_TRUE(s0.SameGroup(Owner::GangSlot(8, "podgroup/ml/train", 0)));
  EXPECT_FALSE(s0.SameGroup(s1));
  EXPECT_FALSE(s0.SameGroup(Owner::Placeholder(7, "uid-1")));
  EXPECT_EQ(s1.ToString(), "gang podgroup/ml/train slot 1 (gang job 7)");
  std::string gang;
  uint32_t slot = 0;
  ASSERT_TRUE(ParseGangSlotUid("gang:jobset/ns/js/workers#12", &gang, &slot));
  EXPECT_EQ(gang, "jobset/ns/js/workers");
  EXPECT_EQ(slot, 12u);
  for (const char* bad : {"gang:x#", "gang:#1", "lend:x#1", "gang:x#1a", "gang:x"}) {
    EXPECT_FALSE(ParseGangSlotUid(bad, &gang, &slot)) << bad;
  }
  EXPECT_TRUE(ValidateOwner(s0).ok());
  EXPECT_FALSE(ValidateOwner(Owner::GangSlot(0, "podgroup/ml/train", 0)).ok());
  Owner malformed = s0;
  malformed.pod_uid = "gang:podgroup/ml/train";
  EXPECT_FALSE(ValidateOwner(malformed).ok());
  Owner named = s0;
  named.pod_name = "p";
  EXPECT_FALSE(ValidateOwner(named).ok());
  EXPECT_FALSE(
      ValidateOwner(Owner::GangSlot(7, std::string(kMaxGangSlotUidLength, 'x'), 0)).ok());
}

// A slot's devices move to the member's placeholder at bind and back when
// the member ends: the devices stay held throughout.
TEST_F(LedgerTest, GangSlotHoldsAndRebindsToAPlaceholderAndBack) {
  const Owner slot = Owner::GangSlot(5, "podgroup/ml/train", 0);
  ASSERT_TRUE(ledger_.Hold(Exact("a", slot, {1, 2})).ok());
  EXPECT_EQ(ledger_.Hold(Exact("a", Owner::Pod("uid-x"), {1})).status().code(),
            absl::StatusCode::kResourceExhausted);
  const Owner member = Owner::Placeholder(5, "uid-1");
  absl::StatusOr<HoldResult> r = ledger_.Rebind("a", slot, member);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Indices(r->holding), (std::vector<uint32_t>{1, 2}));
  EXPECT_FALSE(ledger_.FindHolding("a", slot).has_value());
  EXPECT_EQ(ledger_.Hold(Exact("a", Owner::SlurmJob(9), {2})).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(ledger_.Rebind("a", member, slot).ok());
  ASSERT_TRUE(ledger_.FindHolding("a", slot).has_value());
  EXPECT_EQ(Indices(*ledger_.FindHolding("a", slot)), (std::vector<uint32_t>{1, 2}));
  // Not to the Slurm side.
  EXPECT_EQ(ledger_.Rebind("a", slot, Owner::SlurmJob(5)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ledger_.CheckInvariants().ok());
}

TEST_F(LedgerTest, RebindRefusalsChangeNothing) {
  ASSERT_TRUE(ledger_.Hold(Exact("a", Owner::Lend(5, "a"), {0})).ok());
  ASSERT_TRUE(ledger_.Hold(Exact("a", Owner::Claim(6, "uid-1"), {1})).ok());
  const uint64_t seq = ledger_.seq();
  // `from` holds nothing there.
  EXPECT_EQ(ledger_.Rebind("a", Owner::Lend(9, "a"), Owner::Claim(9, "u")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ledger_.Rebind("zzz", Owner::Lend(5, "a"), Owner::Claim(5, "u")).status().code(),
            absl::StatusCode::kNotFound);
  // `to` already holds on the node.
  EXPECT_EQ(ledger_.Rebind("a", Owner::Lend(5, "a"), Owner::Claim(6, "uid-1")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Another holder class, the same owner, a malformed owner.
  EXPECT_EQ(ledger_.Rebind("a", Owner::Lend(5, "a"), Owner::SlurmJob(5)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.Rebind("a", Owner::Lend(5, "a"), Owner::Lend(5, "a")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.Rebind("a", Owner::Lend(5, "a"), Owner::Claim(5, "")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.seq(), seq);
  EXPECT_TRUE(ledger_.FindHolding("a", Owner::Lend(5, "a")).has_value());
}

TEST_F(LedgerTest, RebindRefusesWhenAnotherGroupAlreadySharesTheDevice) {
  // Two lend owners of a node are one group, so the ledger lets them share a
  // device; moving one to a claim would then break I1.
  ASSERT_TRUE(ledger_.Hold(Exact("a", Owner::Lend(5, "a"), {3})).ok());
  ASSERT_TRUE(ledger_.Hold(Exact("a", Owner::Lend(6, "a"), {3})).ok());
  const uint64_t seq = ledger_.seq();
  EXPECT_EQ(ledger_.Rebind("a", Owner::Lend(5, "a"), Owner::Claim(5, "u")).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ledger_.seq(), seq);
}

TEST_F(LedgerTest, RebindOnANodeLeavingTheInventoryIsRefused) {
  ASSERT_TRUE(ledger_.Hold(Exact("a", Owner::Lend(5, "a"), {0})).ok());
  ASSERT_TRUE(ledger_.RemoveNode("a").ok());  // GONE: the holding keeps it
  EXPECT_EQ(ledger_.Rebind("a", Owner::Lend(5, "a"), Owner::Claim(5, "u")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(ledger_.FindHolding("a", Owner::Lend(5, "a")).has_value());
}

TEST_F(LedgerTest, RebindTellsListenersAReleaseThenAHold) {
  struct Recorder : ChangeListener {
    std::vector<std::tuple<Change::Type, uint64_t, Owner, uint64_t>> seen;  // type, seq, owner, gen
    void OnChange(const Change& c) override {
      seen.emplace_back(c.type, c.seq, c.holding->owner, (*c.view)->generation);
    }
  } rec;
  ASSERT_TRUE(ledger_.Hold(Exact("a", Owner::Lend(5, "a"), {1, 2})).ok());
  ledger_.AddListener(&rec);
  ASSERT_TRUE(ledger_.Rebind("a", Owner::Lend(5, "a"), Owner::Claim(5, "u")).ok());
  ledger_.RemoveListener(&rec);
  ASSERT_EQ(rec.seen.size(), 2u);
  EXPECT_EQ(std::get<0>(rec.seen[0]), Change::Type::kRelease);
  EXPECT_EQ(std::get<2>(rec.seen[0]), Owner::Lend(5, "a"));
  EXPECT_EQ(std::get<0>(rec.seen[1]), Change::Type::kHold);
  EXPECT_EQ(std::get<2>(rec.seen[1]), Owner::Claim(5, "u"));
  EXPECT_EQ(std::get<1>(rec.seen[0]) + 1, std::get<1>(rec.seen[1]));
  // Each change carries the node as it was right after it.
  EXPECT_EQ(std::get<3>(rec.seen[0]) + 1, std::get<3>(rec.seen[1]));
}

// Holders race with rebinds back and forth: nobody ever takes a device while
// it moves between the lend owner and the claim.
TEST(LedgerConcurrencyTest, RebindLeavesNoGapForAHold) {
  Ledger ledger;
  ASSERT_TRUE(ledger.UpsertNode(GpuNode("a", 1)).ok());
  ASSERT_TRUE(ledger.Hold(Exact("a", Owner::Lend(5, "a"), {0})).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> stolen{0};
  std::thread thief([&] {
    uint32_t job = 100;
    while (!stop) {
      if (ledger.Hold(Exact("a", Owner::SlurmJob(job++), {0})).ok()) ++stolen;
    }
  });
  const Owner lend = Owner::Lend(5, "a");
  const Owner claim = Owner::Claim(5, "u");
  for (int i = 0; i < 5000; ++i) {
    ASSERT_TRUE(ledger.Rebind("a", lend, claim).ok());
    ASSERT_TRUE(ledger.Rebind("a", claim, lend).ok());
  }
  stop = true;
  thief.join();
  EXPECT_EQ(stolen, 0);
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

}  // namespace
}  // namespace duet
