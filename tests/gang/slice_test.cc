// A gang that selects a multi-host TPU slice (docs/gangs.md 5), through the
// GangRegistry over a real Ledger and the fake GangMaker: it takes every
// host of one free slice pool, every chip, one member per host; a slice
// with any chip held is skipped; a gang of another shape is refused; TPU
// gangs that select no slice never land on a slice's hosts.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bridge/gang/registry.h"
#include "bridge/gang/slice.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"
#include "tests/gang/fake_gang.h"

namespace duet {
namespace gang {
namespace {

using ::testing::HasSubstr;

constexpr char kModel[] = "tpu-v5-lite-podslice";

// A host of a 2x4 v5e slice: 4 chips of the slice's 8.
NodeSpec SliceHost(const std::string& name, const std::string& pool) {
  NodeSpec n;
  n.name = name;
  n.pool = pool;
  n.cpus = 64;
  n.memory_mib = 256 * 1024;
  for (uint32_t i = 0; i < 4; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kTpu;
    d.index = i;
    d.model = kModel;
    d.topology.tpu_topology = "2x4";
    n.devices.push_back(d);
  }
  return n;
}

GangSpec SliceGang(const std::string& name, uint32_t members, uint32_t chips,
                   const std::string& topology = "2x4") {
  GangSpec s;
  s.key = GangKey{"ml", GangSource::kJobSet, name};
  s.min_member = members;
  s.member.kind = DeviceKind::kTpu;
  s.member.count = chips;
  s.member.cpu_milli = 4000;
  s.member.memory_mib = 8192;
  s.tpu_topology = topology;
  s.tpu_accelerator = topology.empty() ? "" : kModel;
  return s;
}

MemberRef Member(const std::string& gang, int i) {
  return MemberRef{absl::StrCat(gang, "-uid-", i), "ml", absl::StrCat(gang, "-", i)};
}

class SliceGangTest : public ::testing::Test {
 protected:
  SliceGangTest() : maker_(&ledger_) {
    for (const char* pool : {"slice-a", "slice-b"}) {
      for (int h = 0; h < 2; ++h) {
        EXPECT_TRUE(ledger_.UpsertNode(SliceHost(absl::StrCat(pool, "-", h), pool)).ok());
      }
    }
    GangRegistryOptions o;
    o.planner = fakes::SimplePlanner;
    o.clock = &clock_;
    registry_ = std::make_unique<GangRegistry>(&ledger_, &maker_, std::move(o));
  }

  // Holds `chips` TPU chips of `node` for a pod (or a Slurm job, alike here).
  void HoldChips(const std::string& node, uint32_t chips) {
    HoldRequest h;
    h.node = node;
    h.owner = Owner::Pod("other", "ml", "other");
    h.count = CountSelector{DeviceKind::kTpu, chips, 0, ""};
    ASSERT_TRUE(ledger_.Hold(h).ok());
  }

  // The chips of `node` the gang's slots hold.
  uint32_t SlotChips(const std::string& node) {
    uint32_t n = 0;
    for (const Holding& h : ledger_.ListHoldings(node)) {
      if (h.owner.pod_uid.rfind("gang:", 0) == 0) n += static_cast<uint32_t>(h.devices.size());
    }
    return n;
  }

  Ledger ledger_;
  fakes::FakeGangMaker maker_;
  duet::fakes::FakeClock clock_;
  std::unique_ptr<GangRegistry> registry_;
};

TEST_F(SliceGangTest, AFreeSliceIsTakenWholeEveryChipOneMemberPerHost) {
  const GangSpec spec = SliceGang("train", 2, 4);
  EXPECT_EQ(registry_->Admit(spec, Member("train", 0)).kind, Admission::kWaiting);
  const Admission a = registry_->Admit(spec, Member("train", 1));
  ASSERT_EQ(a.kind, Admission::kReady) << a.reason;
  ASSERT_EQ(maker_.creates().size(), 1u);
  const std::vector<GangNode> nodes = maker_.creates()[0].nodes;
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].node, "slice-a-0");
  EXPECT_EQ(nodes[1].node, "slice-a-1");
  EXPECT_EQ(nodes[0].members, 1u);
  EXPECT_EQ(nodes[1].members, 1u);
  EXPECT_EQ(SlotChips("slice-a-0"), 4u);
  EXPECT_EQ(SlotChips("slice-a-1"), 4u);
  EXPECT_EQ(*registry_->NodeOf(Member("train", 0).uid), "slice-a-0");
  EXPECT_EQ(*registry_->NodeOf(Member("train", 1).uid), "slice-a-1");

  // The other slice is still whole: a second gang takes it; a third finds none.
  EXPECT_EQ(registry_->Admit(SliceGang("second", 2, 4), Member("second", 0)).kind,
            Admission::kWaiting);
  EXPECT_EQ(maker_.creates()[1].nodes[0].node, "slice-b-0");
  const Admission third = registry_->Admit(SliceGang("third", 2, 4), Member("third", 0));
  EXPECT_EQ(third.kind, Admission::kNoRoom);
  EXPECT_THAT(third.reason, HasSubstr("GANG_NO_ROOM"));
  EXPECT_THAT(third.reason, HasSubstr("no 2x4 slice of tpu-v5-lite-podslice is free whole"));
  EXPECT_THAT(third.reason, HasSubstr("4 of its 4 TPU chips held"));
  EXPECT_EQ(maker_.creates().size(), 2u);
}

TEST_F(SliceGangTest, ASliceWithOneChipHeldIsSkipped) {
  HoldChips("slice-a-1", 1);
  const Admission a = registry_->Admit(SliceGang("train", 2, 4), Member("train", 0));
  ASSERT_EQ(a.kind, Admission::kWaiting) << a.reason;
  ASSERT_EQ(maker_.creates().size(), 1u);
  EXPECT_EQ(maker_.creates()[0].nodes[0].node, "slice-b-0");
  EXPECT_EQ(maker_.creates()[0].nodes[1].node, "slice-b-1");
  EXPECT_EQ(SlotChips("slice-a-0"), 0u);  // nothing of the held slice is taken

  HoldChips("slice-a-0", 1);  // now no free slice is left for a second gang
  const Admission b = registry_->Admit(SliceGang("second", 2, 4), Member("second", 0));
  EXPECT_EQ(b.kind, Admission::kNoRoom);
  EXPECT_THAT(b.reason, HasSubstr("pool slice-a: host slice-a-0: 1 of its 4 TPU chips held"));
  EXPECT_EQ(maker_.creates().size(), 1u);
}

TEST_F(SliceGangTest, AGangOfAnotherShapeIsRefusedAndHoldsNothing) {
  Admission a = registry_->Admit(SliceGang("three", 3, 4), Member("three", 0));
  EXPECT_EQ(a.kind, Admission::kNoRoom);
  EXPECT_THAT(a.reason, HasSubstr("GANG_NO_ROOM"));
  EXPECT_THAT(a.reason, HasSubstr("has 2 hosts, one member each; this gang has 3 members"));
  a = registry_->Admit(SliceGang("half", 2, 2), Member("half", 0));
  EXPECT_EQ(a.kind, Admission::kNoRoom);
  EXPECT_THAT(a.reason, HasSubstr("takes every chip of its host (4); these members ask 2"));
  a = registry_->Admit(SliceGang("big", 4, 4, "4x4"), Member("big", 0));
  EXPECT_EQ(a.kind, Admission::kNoRoom);
  EXPECT_THAT(a.reason, HasSubstr("no multi-host TPU 4x4 slice"));
  EXPECT_TRUE(maker_.creates().empty());
  EXPECT_EQ(ledger_.holding_count(), 0u);
}

// A registry places only on its own nodes (GangRegistryOptions::node_filter):
// the extender's registry never takes a slice of a DRA lending pool, and the
// lending mode's none of the extender's, slices included.
TEST_F(SliceGangTest, ASliceOutsideTheRegistrysNodesIsNeverTaken) {
  GangRegistryOptions o;
  o.planner = fakes::SimplePlanner;
  o.clock = &clock_;
  o.node_filter = [](const std::string& node) { return node.rfind("slice-b-", 0) == 0; };
  GangRegistry only_b(&ledger_, &maker_, std::move(o));
  const Admission a = only_b.Admit(SliceGang("train", 2, 4), Member("train", 0));
  ASSERT_EQ(a.kind, Admission::kWaiting) << a.reason;
  ASSERT_EQ(maker_.creates().size(), 1u);
  EXPECT_EQ(maker_.creates()[0].nodes[0].node, "slice-b-0");
  EXPECT_EQ(maker_.creates()[0].nodes[1].node, "slice-b-1");
  // slice-a is free whole, but not this registry's: a second gang gets none.
  const Admission b = only_b.Admit(SliceGang("second", 2, 4), Member("second", 0));
  EXPECT_EQ(b.kind, Admission::kNoRoom);
  EXPECT_THAT(b.reason, HasSubstr("not one of the nodes this gang registry places on"));
  EXPECT_EQ(maker_.creates().size(), 1u);
  EXPECT_EQ(SlotChips("slice-a-0"), 0u);
}

TEST_F(SliceGangTest, ATpuGangThatSelectsNoSliceNeverLandsOnASlicesHosts) {
  const Admission a = registry_->Admit(SliceGang("loose", 2, 2, ""), Member("loose", 0));
  EXPECT_EQ(a.kind, Admission::kNoRoom) << a.reason;
  EXPECT_TRUE(maker_.creates().empty());
  EXPECT_EQ(ledger_.holding_count(), 0u);
}

TEST_F(SliceGangTest, SliceCandidatesSayWhyAHostIsBusy) {
  HoldChips("slice-b-0", 2);
  placement::PodRequest member = SliceGang("x", 2, 4).member;
  std::vector<placement::SliceCandidate> c = SliceCandidates(
      ledger_.Snapshot(), member, nullptr,
      [](const std::string& node) { return node == "slice-a-1" ? "drained" : ""; });
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].busy, "");
  EXPECT_EQ(c[1].busy, "Slurm: drained");
  EXPECT_EQ(c[2].busy, "2 of its 4 TPU chips held");
  EXPECT_EQ(c[3].busy, "");
}

}  // namespace
}  // namespace gang
}  // namespace duet
