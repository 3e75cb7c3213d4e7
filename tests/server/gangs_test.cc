// duet-bridge's gang wiring (bridge/server/gangs.h): the pod watch's
// releaser gives a gang member's placeholder back to its slot instead of
// cancelling it (which would cancel the whole gang's Slurm job), and the
// wiring's thread releases a gang whose members stop arriving.

#include "bridge/server/gangs.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/wait.h"
#include "tests/gang/fake_gang.h"

namespace duet {
namespace {

using ::testing::ElementsAre;

// Records what reaches the releaser behind the gangs'.
class RecordingReleaser final : public k8s::PodReleaser {
 public:
  absl::Status Release(const k8s::PodRelease& r) override {
    absl::MutexLock l(&mu);
    released.push_back(r.holding.owner.pod_uid);
    return absl::OkStatus();
  }
  absl::Mutex mu;
  std::vector<std::string> released;
};

NodeSpec Node(const std::string& name) {
  NodeSpec n;
  n.name = name;
  n.pool = "a3";
  n.cpus = 64;
  n.memory_mib = 512 * 1024;
  for (uint32_t i = 0; i < 4; ++i) {
    DeviceSpec d;
    d.index = i;
    d.model = "nvidia-h100-80gb";
    n.devices.push_back(d);
  }
  return n;
}

gang::GangSpec Spec() {
  gang::GangSpec s;
  s.key = gang::GangKey{"ml", gang::GangSource::kJobSet, "trainer/workers"};
  s.min_member = 2;
  s.member.count = 4;
  return s;
}

class BridgeGangsTest : public ::testing::Test {
 protected:
  BridgeGangsTest() : maker_(&ledger_) {
    EXPECT_TRUE(ledger_.UpsertNode(Node("node-0")).ok());
    EXPECT_TRUE(ledger_.UpsertNode(Node("node-1")).ok());
    BridgeGangsDeps d;
    d.config = &config_;
    d.ledger = &ledger_;
    d.maker = &maker_;
    d.planner = gang::fakes::SimplePlanner;
    d.clock = &clock_;
    d.tick_period = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<BridgeGangs>> g = BridgeGangs::Start(std::move(d));
    EXPECT_TRUE(g.ok()) << g.status();
    gangs_ = *std::move(g);
  }

  GangConfig config_;
  Ledger ledger_;
  gang::fakes::FakeGangMaker maker_;
  fakes::FakeClock clock_;
  std::unique_ptr<BridgeGangs> gangs_;
};

TEST_F(BridgeGangsTest, AMembersPlaceholderGoesBackToItsSlotNotToTheReleaserBehind) {
  gang::GangRegistry* reg = gangs_->registry();
  reg->Admit(Spec(), {"uid-0", "ml", "w-0"});
  ASSERT_EQ(reg->Admit(Spec(), {"uid-1", "ml", "w-1"}).kind, gang::Admission::kReady);
  absl::StatusOr<gang::MemberBind> b = reg->BindMember("uid-0", "node-0");
  ASSERT_TRUE(b.ok()) << b.status();

  RecordingReleaser inner;
  std::unique_ptr<k8s::PodReleaser> releaser = gangs_->Releaser(&inner);
  k8s::PodRelease r;
  r.holding = b->holding;
  r.reason = k8s::PodReleaseReason::kDeleted;
  ASSERT_TRUE(releaser->Release(r).ok());
  EXPECT_TRUE(inner.released.empty());
  EXPECT_TRUE(maker_.cancels().empty());
  EXPECT_TRUE(
      ledger_.FindHolding("node-0", gang::fakes::SlotOwner(500, Spec().key, 0)).has_value());
  EXPECT_EQ(ledger_.holding_count(), 2u);

  // A single pod's placeholder is the releaser behind's.
  k8s::PodRelease single;
  single.holding.node = "node-1";
  single.holding.owner = Owner::Placeholder(77, "uid-single");
  ASSERT_TRUE(releaser->Release(single).ok());
  EXPECT_THAT(inner.released, ElementsAre("uid-single"));
}

TEST_F(BridgeGangsTest, TheThreadReleasesAGangPastItsReserveTimeout) {
  gangs_->registry()->Admit(Spec(), {"uid-0", "ml", "w-0"});
  ASSERT_EQ(ledger_.holding_count(), 2u);
  ASSERT_TRUE(clock_.AwaitSleepers(1));
  ASSERT_TRUE(clock_.Step(absl::Seconds(5), 59, 1));  // 295s: not yet
  EXPECT_TRUE(maker_.cancels().empty());
  clock_.Advance(absl::Seconds(5));
  ASSERT_TRUE(fakes::WaitFor([&] { return ledger_.holding_count() == 0; }));
  EXPECT_THAT(maker_.cancels(), ElementsAre(500u));
  const gang::GangStats st = gangs_->registry()->stats();
  EXPECT_EQ(st.releases[static_cast<int>(gang::ReleaseReason::kReserveTimeout)], 1u);
  std::vector<prometheus::MetricFamily> families = GangFamilies(st);
  ASSERT_EQ(families.size(), 4u);
  EXPECT_EQ(families[2].name, "duet_gang_releases_total");
}

}  // namespace
}  // namespace duet
