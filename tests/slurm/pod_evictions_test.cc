// PodEvictions and PodEvictionWait (slurm.preemption: evict-pods) on a fake
// clock, with the eviction and Slurm's job record scripted (label: unit).
// The real Eviction API is in kube_api_test; the whole path, through a real
// slurmctld's preemption and spank_duet, in slurm_e2e_test.

#include "bridge/slurm/pod_evictions.h"

#include <deque>
#include <set>
#include <string>
#include <vector>

#include "bridge/ledger/ledger.h"
#include "common/reason.h"
#include "gtest/gtest.h"
#include "proto/duet/v1/reasons.h"
#include "tests/fakes/fake_clock.h"
#include "tests/slurm/test_node_spec.h"

namespace duet {
namespace {

const PlaceholderPod kPod{"uid-a", "ml", "server-0"};

class PodEvictionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ledger_.UpsertNode(::duet::testing::TestNodeSpec("n1", 1, 8)).ok());
  }

  PodEvictionsOptions Options() {
    PodEvictionsOptions o;
    o.wait = absl::Seconds(60);
    o.retry = absl::Seconds(5);
    o.evict = [this](const PlaceholderPod& pod) {
      evicted_.push_back(pod.ns + "/" + pod.name + " " + pod.uid);
      if (answers_.empty()) return absl::OkStatus();
      absl::Status s = answers_.front();
      answers_.pop_front();
      return s;
    };
    o.get_job = [this](uint32_t id) -> absl::StatusOr<std::optional<SlurmJobInfo>> {
      ++lookups_;
      if (!slurm_up_) return absl::UnavailableError("slurmctld down");
      if (id != job_.job_id) return std::optional<SlurmJobInfo>();
      return std::optional<SlurmJobInfo>(job_);
    };
    return o;
  }

  // Placeholder job 42 of kPod holds GPUs 0-1 of n1.
  void HoldPlaceholder() {
    HoldRequest r;
    r.node = "n1";
    r.owner = Owner::Placeholder(42, kPod.uid);
    r.devices = {{DeviceKind::kGpu, 0, kWholeDevice}, {DeviceKind::kGpu, 1, kWholeDevice}};
    ASSERT_TRUE(ledger_.Hold(r).ok());
    job_.job_id = 42;
    job_.comment = "duet-pod uid=uid-a ns=ml name=server-0";
    job_.state = SlurmJobState::kFinished;
  }

  // Slurm step 7.0 asks for GPUs `gpus` on n1.
  static HoldRequest Step(std::vector<uint32_t> gpus) {
    HoldRequest r;
    r.node = "n1";
    r.owner = Owner::SlurmStep(7, 0);
    for (uint32_t g : gpus) r.devices.push_back({DeviceKind::kGpu, g, kWholeDevice});
    return r;
  }

  Ledger ledger_;
  fakes::FakeClock clock_{absl::FromUnixSeconds(1000000)};
  SlurmJobInfo job_;
  bool slurm_up_ = true;
  int lookups_ = 0;
  std::vector<std::string> evicted_;
  std::deque<absl::Status> answers_;
};

// The sync pass saw the preempted placeholder: one eviction, and the step
// is told how long it may wait, who holds its device and why.
TEST_F(PodEvictionsTest, APreemptedPlaceholdersPodIsEvictedOnceAndTheStepWaits) {
  HoldPlaceholder();
  PodEvictions ev(Options(), &clock_);
  ev.Preempted(kPod, "n1", 42);
  ev.Preempted(kPod, "n1", 42);  // the next pass: nothing new
  EXPECT_EQ(evicted_, (std::vector<std::string>{"ml/server-0 uid-a"}));

  clock_.Advance(absl::Seconds(20));
  std::optional<absl::Status> wait = PodEvictionWait(ev, ledger_, Step({1, 2}), clock_.Now());
  ASSERT_TRUE(wait.has_value());
  EXPECT_TRUE(absl::IsResourceExhausted(*wait));
  EXPECT_EQ(ReasonOf(*wait), v1::reason::kPodEvicting);
  const auto meta = ReasonMetadata(*wait);
  EXPECT_EQ(meta.at("wait_s"), "40");
  EXPECT_EQ(meta.at("holder"), "ml/server-0");
  EXPECT_EQ(meta.at("device"), "gpu 1");
  EXPECT_EQ(meta.at("node"), "n1");
  EXPECT_EQ(evicted_.size(), 1u) << "accepted once: not sent again";
  EXPECT_EQ(lookups_, 0) << "known from the pass: Slurm not asked";
  EXPECT_EQ(ev.stats().evicted, 1u);
  EXPECT_EQ(ev.stats().pending, 1);
}

// A step faster than the pass: Slurm's record says PREEMPTED, so the pod is
// evicted from the step's refusal; a placeholder that was not preempted
// (Slurm lost it, a user cancelled it) leaves the refusal as it was.
TEST_F(PodEvictionsTest, AStepBeforeThePassAsksSlurmWhetherThePlaceholderWasPreempted) {
  HoldPlaceholder();
  PodEvictions ev(Options(), &clock_);
  job_.preempted = true;
  EXPECT_FALSE(PodEvictionWait(ev, ledger_, Step({0}), clock_.Now(), /*ask_slurm=*/false))
      << "evictions under way only";
  EXPECT_EQ(lookups_, 0);
  job_.preempted = false;
  EXPECT_FALSE(PodEvictionWait(ev, ledger_, Step({0}), clock_.Now()).has_value());
  EXPECT_EQ(lookups_, 1);
  EXPECT_TRUE(evicted_.empty());

  slurm_up_ = false;
  job_.preempted = true;
  EXPECT_FALSE(PodEvictionWait(ev, ledger_, Step({0}), clock_.Now()).has_value())
      << "Slurm cannot say: no eviction on a guess";
  EXPECT_TRUE(evicted_.empty());

  slurm_up_ = true;
  std::optional<absl::Status> wait = PodEvictionWait(ev, ledger_, Step({0}), clock_.Now());
  ASSERT_TRUE(wait.has_value());
  EXPECT_EQ(ReasonOf(*wait), v1::reason::kPodEvicting);
  EXPECT_EQ(ReasonMetadata(*wait).at("wait_s"), "60");
  // The pod's namespace and name come from the job's comment.
  EXPECT_EQ(evicted_, (std::vector<std::string>{"ml/server-0 uid-a"}));
}

// A PodDisruptionBudget refuses: tried again only after `retry`, from the
// pass or a step's refusal, until the wait is over; then the step's refusal
// stands and the expiry is counted once.
TEST_F(PodEvictionsTest, ABudgetRefusalIsRetriedUntilTheWaitEnds) {
  HoldPlaceholder();
  PodEvictions ev(Options(), &clock_);
  for (int i = 0; i < 20; ++i) answers_.push_back(absl::ResourceExhaustedError("429"));
  ev.Preempted(kPod, "n1", 42);
  EXPECT_EQ(evicted_.size(), 1u);
  EXPECT_TRUE(PodEvictionWait(ev, ledger_, Step({0}), clock_.Now()).has_value());
  EXPECT_EQ(evicted_.size(), 1u) << "before the retry interval";
  clock_.Advance(absl::Seconds(5));
  EXPECT_TRUE(PodEvictionWait(ev, ledger_, Step({0}), clock_.Now()).has_value());
  EXPECT_EQ(evicted_.size(), 2u);
  ev.Preempted(kPod, "n1", 42);
  EXPECT_EQ(evicted_.size(), 2u);
  EXPECT_EQ(ev.stats().blocked, 2u);

  clock_.Advance(absl::Seconds(55));
  EXPECT_FALSE(PodEvictionWait(ev, ledger_, Step({0}), clock_.Now()).has_value());
  EXPECT_FALSE(PodEvictionWait(ev, ledger_, Step({0}), clock_.Now()).has_value());
  EXPECT_EQ(ev.stats().expired, 1u);
  EXPECT_EQ(evicted_.size(), 2u) << "nothing sent after the wait";
}

// Only devices a pod being evicted holds wait: another holder on the step's
// devices (a Slurm job, a pod nobody evicts) keeps the refusal.
TEST_F(PodEvictionsTest, AnotherHolderOnTheStepsDevicesKeepsTheRefusal) {
  HoldPlaceholder();
  HoldRequest other;
  other.node = "n1";
  other.owner = Owner::Placeholder(43, "uid-b");
  other.devices = {{DeviceKind::kGpu, 2, kWholeDevice}};
  ASSERT_TRUE(ledger_.Hold(other).ok());
  PodEvictions ev(Options(), &clock_);
  ev.Preempted(kPod, "n1", 42);
  EXPECT_TRUE(PodEvictionWait(ev, ledger_, Step({1}), clock_.Now()).has_value());
  EXPECT_FALSE(PodEvictionWait(ev, ledger_, Step({1, 2}), clock_.Now()).has_value());
  EXPECT_FALSE(PodEvictionWait(ev, ledger_, Step({3}), clock_.Now()).has_value())
      << "a free device is no eviction's business";
}

// The wait ran out (the pod stays; SlurmSync re-makes its placeholder), and
// Slurm preempts the new placeholder job later: a new eviction, a new wait.
TEST_F(PodEvictionsTest, ARemadePlaceholderPreemptedAgainStartsANewEviction) {
  HoldPlaceholder();
  PodEvictions ev(Options(), &clock_);
  answers_.push_back(absl::ResourceExhaustedError("429"));
  const absl::Time first = ev.Preempted(kPod, "n1", 42);
  EXPECT_EQ(first, clock_.Now() + absl::Seconds(60));
  clock_.Advance(absl::Seconds(61));
  EXPECT_FALSE(PodEvictionWait(ev, ledger_, Step({0}), clock_.Now()).has_value());
  const absl::Time second = ev.Preempted(kPod, "n1", 50);
  EXPECT_EQ(second, clock_.Now() + absl::Seconds(60));
  EXPECT_EQ(evicted_.size(), 2u);
  EXPECT_EQ(ev.stats().pending, 1);
  EXPECT_EQ(ev.stats().evicted, 1u);
}

// The pod left (the pass no longer finds its placeholder in the ledger):
// forgotten, the gauge drops, and a later refusal on those devices is not a
// wait.
TEST_F(PodEvictionsTest, APodThatLeftIsForgotten) {
  HoldPlaceholder();
  PodEvictions ev(Options(), &clock_);
  ev.Preempted(kPod, "n1", 42);
  ev.Retain({kPod.uid});
  EXPECT_EQ(ev.stats().pending, 1);
  ev.Retain({});
  EXPECT_EQ(ev.stats().pending, 0);
  EXPECT_FALSE(ev.Evicting(kPod.uid).has_value());
}

}  // namespace
}  // namespace duet
