// pods::PodHolds, the one transaction behind the extender's bind and
// PlacePod: idempotent per pod and node, placement (with the node's load)
// decides before anything is made, refusals carry reasons, the Slurm side
// is asked through PlaceholderMaker and its CPU/memory reported back.

#include "bridge/pods/pod_holds.h"

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/reason.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet {
namespace pods {
namespace {

using ::testing::HasSubstr;

NodeSpec Node(const std::string& name, uint32_t gpus, NodeState state = NodeState::kReady) {
  NodeSpec n;
  n.name = name;
  n.cpus = 16;
  n.memory_mib = 65536;
  n.state = state;
  for (uint32_t i = 0; i < gpus; ++i) {
    DeviceSpec d;
    d.index = i;
    d.model = "nvidia-h100-80gb";
    n.devices.push_back(d);
  }
  return n;
}

placement::PodRequest Gpus(uint32_t count, uint64_t cpu_milli = 0, uint64_t memory_mib = 0) {
  placement::PodRequest r;
  r.kind = DeviceKind::kGpu;
  r.count = count;
  r.cpu_milli = cpu_milli;
  r.memory_mib = memory_mib;
  return r;
}

// A Slurm side with real behaviour on the ledger: Create records the lowest
// free devices as Placeholder{job, uid}; Cancel releases them.
class FakePlaceholders final : public PlaceholderMaker {
 public:
  explicit FakePlaceholders(Ledger* ledger) : ledger_(ledger) {}

  absl::StatusOr<Holding> Create(const Owner& pod, const std::string& node, uint32_t gpus,
                                 uint32_t tpus, uint32_t cpus, uint64_t memory_mib) override {
    absl::Notification* wait = nullptr;
    {
      absl::MutexLock l(&mu_);
      wait = std::exchange(gate, nullptr);
    }
    if (wait != nullptr) {  // Slurm has not answered yet
      entered.Notify();
      wait->WaitForNotification();
    }
    absl::MutexLock l(&mu_);
    asked.push_back({node, gpus, tpus, cpus, memory_mib});
    if (!refusal.ok()) return refusal;
    HoldRequest h;
    h.node = node;
    h.owner = Owner::Placeholder(next_job_++, pod.pod_uid);
    h.count = CountSelector{DeviceKind::kGpu, gpus, 0, ""};
    absl::StatusOr<HoldResult> r = ledger_->Hold(h);
    if (!r.ok()) return r.status();
    return r->holding;
  }
  absl::Status Cancel(const std::string& node, const std::string& pod_uid) override {
    absl::MutexLock l(&mu_);
    cancelled.push_back(pod_uid);
    for (const Holding& h : ledger_->ListHoldings(node)) {
      if (h.owner.kind == OwnerKind::kPlaceholder && h.owner.pod_uid == pod_uid) {
        absl::Status s = ledger_->Release(node, h.owner).status();
        if (!s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }

  struct Ask {
    std::string node;
    uint32_t gpus, tpus, cpus;
    uint64_t memory_mib;
  };
  std::vector<Ask> asked;
  std::vector<std::string> cancelled;
  absl::Status refusal;
  // Set: the next Create notifies `entered`, then waits for it.
  absl::Notification* gate = nullptr;
  absl::Notification entered;

 private:
  absl::Mutex mu_;
  Ledger* const ledger_;
  uint32_t next_job_ = 700;
};

class PodHoldsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ledger_.UpsertNode(Node("a", 4)).ok());
    ASSERT_TRUE(ledger_.UpsertNode(Node("cordoned", 4, NodeState::kCordoned)).ok());
  }
  PodHoldsOptions Options() {
    PodHoldsOptions o;
    o.load = [this](const NodeView& v) {
      return v.spec.name == "a" ? load_a_ : placement::NodeLoad{};
    };
    o.on_placeholder = [this](const std::string& node, const placement::NodeLoad& l) {
      told_.emplace_back(node, l);
    };
    return o;
  }

  Ledger ledger_;
  placement::NodeLoad load_a_;
  std::vector<std::pair<std::string, placement::NodeLoad>> told_;
  const Owner pod_ = Owner::Pod("uid-1", "ml", "train");
};

TEST_F(PodHoldsTest, WithoutSlurmHoldsAsThePodAndARetryGetsTheSameHolding) {
  PodHolds holds(&ledger_, nullptr, Options());
  absl::StatusOr<PodHold> h = holds.Hold(pod_, "a", Gpus(2));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->created);
  EXPECT_EQ(h->holding.owner, pod_);
  EXPECT_EQ(h->holding.devices.size(), 2u);
  EXPECT_EQ(h->seq, ledger_.seq());
  const uint64_t seq = ledger_.seq();

  absl::StatusOr<PodHold> again = holds.Hold(pod_, "a", Gpus(2));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->holding.devices, h->holding.devices);
  EXPECT_EQ(ledger_.seq(), seq);  // nothing new in the ledger
  EXPECT_TRUE(told_.empty());     // no placeholder, no load to report

  ASSERT_TRUE(holds.Release(pod_, "a").ok());
  EXPECT_FALSE(holds.HoldingOf("uid-1", "a").has_value());
}

TEST_F(PodHoldsTest, WithSlurmMakesOnePlaceholderSizedFromTheRequestAndReportsItsLoad) {
  FakePlaceholders slurm(&ledger_);
  PodHolds holds(&ledger_, &slurm, Options());
  absl::StatusOr<PodHold> h = holds.Hold(pod_, "a", Gpus(2, 1500, 2048));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->created);
  EXPECT_EQ(h->holding.owner.kind, OwnerKind::kPlaceholder);
  EXPECT_EQ(h->holding.owner.pod_uid, "uid-1");
  ASSERT_EQ(slurm.asked.size(), 1u);
  EXPECT_EQ(slurm.asked[0].gpus, 2u);
  EXPECT_EQ(slurm.asked[0].cpus, 2u);  // 1.5 CPUs, whole CPUs rounded up
  EXPECT_EQ(slurm.asked[0].memory_mib, 2048u);
  ASSERT_EQ(told_.size(), 1u);
  EXPECT_EQ(told_[0].first, "a");
  EXPECT_EQ(told_[0].second.cpu_milli, 2000u);
  EXPECT_EQ(told_[0].second.memory_mib, 2048u);

  // A retry (the extender's or duet-node's) finds the placeholder: no second job.
  absl::StatusOr<PodHold> again = holds.Hold(pod_, "a", Gpus(2, 1500, 2048));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->holding.owner, h->holding.owner);
  EXPECT_EQ(slurm.asked.size(), 1u);
  EXPECT_EQ(told_.size(), 1u);

  // A pod asking no CPU still asks Slurm for one.
  ASSERT_TRUE(holds.Hold(Owner::Pod("uid-2", "ml", "small"), "a", Gpus(1)).ok());
  EXPECT_EQ(slurm.asked.back().cpus, 1u);

  ASSERT_TRUE(holds.Release(pod_, "a").ok());
  EXPECT_THAT(slurm.cancelled, ::testing::ElementsAre("uid-1"));
  EXPECT_FALSE(holds.HoldingOf("uid-1", "a").has_value());
}

TEST_F(PodHoldsTest, TheNodesLoadIsCountedBeforeSlurmIsAsked) {
  FakePlaceholders slurm(&ledger_);
  PodHolds holds(&ledger_, &slurm, Options());
  load_a_ = placement::NodeLoad{15000, 0};  // 1 of 16 CPUs left
  absl::StatusOr<PodHold> h = holds.Hold(pod_, "a", Gpus(1, 2000));
  EXPECT_EQ(h.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(h.status()), v1::reason::kNoRoom);
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("cpu"));
  EXPECT_TRUE(slurm.asked.empty());
}

TEST_F(PodHoldsTest, PlaceholdersNotYetGrantedCountAgainstTheNode) {
  FakePlaceholders slurm(&ledger_);
  PodHolds holds(&ledger_, &slurm, Options());
  absl::Notification go;
  slurm.gate = &go;
  absl::StatusOr<PodHold> first = absl::UnknownError("not run");
  std::thread t([&] { first = holds.Hold(pod_, "a", Gpus(3)); });
  slurm.entered.WaitForNotification();  // 3 of a's 4 GPUs asked of Slurm

  // Free in the ledger, but not beside the 3 in flight: refused here, Slurm
  // is not asked.
  absl::StatusOr<PodHold> two = holds.Hold(Owner::Pod("uid-2", "ml", "two"), "a", Gpus(2));
  EXPECT_EQ(two.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(two.status()), v1::reason::kNoRoom);
  EXPECT_THAT(std::string(two.status().message()),
              HasSubstr("3 asked of Slurm and not yet granted"));
  // The extender's filter sees the same.
  std::string why;
  EXPECT_FALSE(holds.Fits(*ledger_.GetNode("a"), Gpus(2), &why));
  EXPECT_THAT(why, HasSubstr("not yet granted"));
  EXPECT_TRUE(holds.Fits(*ledger_.GetNode("a"), Gpus(1), &why));
  // One fits beside them.
  absl::StatusOr<PodHold> one = holds.Hold(Owner::Pod("uid-3", "ml", "one"), "a", Gpus(1));
  ASSERT_TRUE(one.ok()) << one.status();

  go.Notify();
  t.join();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->holding.devices.size(), 3u);
  EXPECT_EQ(slurm.asked.size(), 2u);
  EXPECT_FALSE(holds.Fits(*ledger_.GetNode("a"), Gpus(1), &why));

  // Nothing in flight: the ledger alone refuses, as before.
  absl::StatusOr<PodHold> full = holds.Hold(Owner::Pod("uid-4", "ml", "four"), "a", Gpus(1));
  EXPECT_EQ(ReasonOf(full.status()), v1::reason::kNoRoom);
  EXPECT_THAT(std::string(full.status().message()), ::testing::Not(HasSubstr("not yet granted")));
  EXPECT_EQ(slurm.asked.size(), 2u);

  // A refused placeholder leaves the flight too.
  ASSERT_TRUE(holds.Release(Owner::Pod("uid-3", "ml", "one"), "a").ok());
  slurm.refusal = absl::ResourceExhaustedError("Slurm: no room");
  EXPECT_FALSE(holds.Hold(Owner::Pod("uid-5", "ml", "five"), "a", Gpus(1)).ok());
  slurm.refusal = absl::OkStatus();
  EXPECT_TRUE(holds.Hold(Owner::Pod("uid-6", "ml", "six"), "a", Gpus(1)).ok());
}

TEST_F(PodHoldsTest, RefusalsCarryReasonsOnBothPaths) {
  FakePlaceholders slurm(&ledger_);
  PodHolds with_slurm(&ledger_, &slurm, Options());
  PodHolds without(&ledger_, nullptr, Options());
  for (PodHolds* holds : {&with_slurm, &without}) {
    absl::StatusOr<PodHold> unknown = holds->Hold(pod_, "nope", Gpus(1));
    EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(ReasonOf(unknown.status()), v1::reason::kNodeNotShared);

    absl::StatusOr<PodHold> cordoned = holds->Hold(pod_, "cordoned", Gpus(1));
    EXPECT_EQ(cordoned.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(ReasonOf(cordoned.status()), v1::reason::kNodeNotReady);
    EXPECT_EQ(ReasonMetadata(cordoned.status())["state"], "cordoned");

    absl::StatusOr<PodHold> full = holds->Hold(pod_, "a", Gpus(5));
    EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(ReasonOf(full.status()), v1::reason::kNoRoom);
    EXPECT_EQ(ReasonMetadata(full.status())["node"], "a");
    EXPECT_THAT(std::string(full.status().message()), HasSubstr("4 of 4 gpu devices"));
  }
  EXPECT_TRUE(slurm.asked.empty());
  EXPECT_EQ(ledger_.holding_count(), 0u);

  // Slurm's own refusals come back as they are; "no room" gets its reason.
  slurm.refusal = absl::UnavailableError("slurmctld unreachable");
  EXPECT_EQ(with_slurm.Hold(pod_, "a", Gpus(1)).status().code(), absl::StatusCode::kUnavailable);
  slurm.refusal = absl::ResourceExhaustedError("Requested node configuration is not available");
  absl::StatusOr<PodHold> no_room = with_slurm.Hold(pod_, "a", Gpus(1));
  EXPECT_EQ(no_room.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(no_room.status()), v1::reason::kNoRoom);
  EXPECT_THAT(std::string(no_room.status().message()), HasSubstr("Requested node configuration"));
  EXPECT_EQ(ledger_.holding_count(), 0u);
}

TEST_F(PodHoldsTest, BadRequestsAreInvalidArgument) {
  PodHolds holds(&ledger_, nullptr, Options());
  EXPECT_EQ(holds.Hold(pod_, "a", Gpus(0)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(holds.Hold(Owner::SlurmJob(5), "a", Gpus(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(holds.Hold(Owner::Pod(""), "a", Gpus(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger_.holding_count(), 0u);
}

}  // namespace
}  // namespace pods
}  // namespace duet
