#include "bridge/placement/placement.h"

#include <memory>
#include <string>
#include <vector>

#include "bridge/ledger/ledger.h"
#include "bridge/placement/prepared.h"
#include "bridge/placement/topology.h"
#include "bridge/placement/workload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet::placement {
namespace {

using ::testing::HasSubstr;
using internal::NodeFree;

NodeSpec Node(const std::string& name, uint32_t gpus, uint32_t cpus = 64,
              const std::string& model = "G2") {
  NodeSpec spec;
  spec.name = name;
  spec.cpus = cpus;
  spec.memory_mib = 256 * 1024;
  for (uint32_t i = 0; i < gpus; ++i) {
    DeviceSpec d;
    d.index = i;
    d.model = model;
    spec.devices.push_back(d);
  }
  return spec;
}

PodRequest Gpus(uint32_t count, uint32_t milli = kWholeDevice, uint64_t cpu_milli = 1000) {
  PodRequest r;
  r.count = count;
  r.milli = milli;
  r.cpu_milli = cpu_milli;
  r.memory_mib = 1024;
  return r;
}

// A small cluster on a real ledger, with the views and loads the extender
// would keep.
class Cluster {
 public:
  void Add(const NodeSpec& spec) {
    ASSERT_TRUE(ledger_.UpsertNode(spec).ok());
    names_.push_back(spec.name);
    views_.push_back(ledger_.GetNode(spec.name));
    loads_.emplace_back();
  }
  // Holds `devices` (whole unless milli given) on node `i` for a new pod.
  void Hold(size_t i, std::vector<HeldDevice> devices, const PodRequest& r = {}) {
    HoldRequest h;
    h.node = names_[i];
    h.owner = Owner::Pod("uid-" + std::to_string(++pods_));
    h.devices = std::move(devices);
    absl::StatusOr<HoldResult> res = ledger_.Hold(h);
    ASSERT_TRUE(res.ok()) << res.status();
    views_[i] = ledger_.GetNode(names_[i]);
    loads_[i].Add(r);
  }
  void HoldWhole(size_t i, uint32_t n) {
    std::vector<HeldDevice> d;
    for (uint32_t k = 0; k < n; ++k) d.push_back({DeviceKind::kGpu, k, kWholeDevice});
    Hold(i, d);
  }
  // Places through SelectNode and holds what it chose. Returns the node or -1.
  int Place(const PodRequest& r, const Scorer& scorer) {
    std::optional<NodeChoice> c = SelectNode(views_, loads_, r, scorer);
    if (!c.has_value()) return -1;
    Hold(c->node, c->placement.devices, r);
    return static_cast<int>(c->node);
  }
  // CPU and memory requested on node `i` by a pod that holds no device.
  void AddLoad(size_t i, const PodRequest& r) { loads_[i].Add(r); }
  const NodeView& view(size_t i) const { return *views_[i]; }
  const NodeLoad& load(size_t i) const { return loads_[i]; }
  Ledger& ledger() { return ledger_; }

 private:
  Ledger ledger_;
  std::vector<std::string> names_;
  std::vector<std::shared_ptr<const NodeView>> views_;
  std::vector<NodeLoad> loads_;
  int pods_ = 0;
};

Workload MixedWorkload() {
  // Mostly 1-GPU and shared pods, some 8-GPU pods.
  return Workload({{Gpus(1), 0.5}, {Gpus(1, 500), 0.3}, {Gpus(8), 0.2}});
}

TEST(PolicyRegistryTest, EveryPolicyRoundTripsThroughItsName) {
  std::vector<std::string> names;
  for (const PolicyEntry& e : RegisteredPolicies()) {
    EXPECT_STREQ(PolicyName(e.policy), e.name);
    absl::StatusOr<Policy> p = ParsePolicy(e.name);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(*p, e.policy);
    if (e.alias != nullptr) {
      EXPECT_EQ(*ParsePolicy(e.alias), e.policy);
    }
    names.push_back(e.name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"duet", "spread", "most-allocated", "best-fit", "fgd"}));
  EXPECT_EQ(PolicyNamesText(), "duet, spread, most-allocated, best-fit or fgd");
  EXPECT_THAT(std::string(ParsePolicy("random").status().message()),
              HasSubstr("one of duet, spread, most-allocated, best-fit, fgd"));
}

TEST(PackingTest, OneGpuPodGoesToTheFullerNode) {
  const Workload w = MixedWorkload();
  for (Policy p : {Policy::kDuet, Policy::kMostAllocated, Policy::kBestFit, Policy::kFgd}) {
    Cluster c;
    c.Add(Node("empty", 8));  // first, so a tie or "lowest index" would pick it
    c.Add(Node("fuller", 8));
    c.HoldWhole(1, 5);
    const Scorer s(p, &w);
    EXPECT_GT(Score(c.view(1), c.load(1), Gpus(1), s), Score(c.view(0), c.load(0), Gpus(1), s))
        << PolicyName(p);
    EXPECT_EQ(c.Place(Gpus(1), s), 1) << PolicyName(p);
  }
}

TEST(PackingTest, SpreadPutsOneGpuPodOnTheEmptierNode) {
  Cluster c;
  c.Add(Node("fuller", 8));
  c.Add(Node("empty", 8));
  c.HoldWhole(0, 5);
  const Scorer s(Policy::kLeastAllocated);
  EXPECT_EQ(c.Place(Gpus(1), s), 1);
}

TEST(FragmentationTest, KeepsTheEightGpuNodeWholeWhenTheSixGpuNodeCanTakeThePod) {
  for (uint32_t want : {4u, 6u}) {
    Cluster c;
    c.Add(Node("eight", 8));  // first, so a tie or "lowest index" would pick it
    c.Add(Node("six", 6));
    const Workload w = MixedWorkload();
    for (Policy p : {Policy::kFgd, Policy::kDuet}) {
      const Scorer s(p, &w);
      std::optional<NodeChoice> choice = SelectNode(
          std::vector<std::shared_ptr<const NodeView>>{std::make_shared<NodeView>(c.view(0)),
                                                       std::make_shared<NodeView>(c.view(1))},
          std::vector<NodeLoad>{c.load(0), c.load(1)}, Gpus(want), s);
      ASSERT_TRUE(choice.has_value());
      EXPECT_EQ(choice->node, 1u) << PolicyName(p) << " " << want << " GPUs";
    }
    // Spread, by contrast, takes the bigger node.
    const Scorer spread(Policy::kLeastAllocated);
    EXPECT_EQ(c.Place(Gpus(want), spread), 0);
  }
}

TEST(FragmentationTest, SharedPodTakesThePartlyUsedGpuNotAWholeOne) {
  Cluster c;
  c.Add(Node("n", 2));
  c.Hold(0, {{DeviceKind::kGpu, 1, 400}});
  const Workload w = MixedWorkload();
  const Scorer s(Policy::kFgd, &w);
  std::optional<Placement> p = s.Evaluate(c.view(0), c.load(0), Gpus(1, 500));
  ASSERT_TRUE(p.has_value());
  ASSERT_EQ(p->devices.size(), 1u);
  EXPECT_EQ(p->devices[0].index, 1u);
  EXPECT_EQ(p->devices[0].milli, 500u);
}

TEST(FragmentationTest, MeasureMatchesAHandCount) {
  Cluster c;
  c.Add(Node("n", 2));
  c.Hold(0, {{DeviceKind::kGpu, 0, 700}});  // free: 300, 1000
  const Workload one_gpu({{Gpus(1), 1}});
  EXPECT_DOUBLE_EQ(Fragmentation(c.view(0), c.load(0), one_gpu), 300);
  const Workload half({{Gpus(1, 500), 1}});
  EXPECT_DOUBLE_EQ(Fragmentation(c.view(0), c.load(0), half), 300);
  const Workload two_gpus({{Gpus(2), 1}});  // cannot run: all 1300 free is fragmented
  EXPECT_DOUBLE_EQ(Fragmentation(c.view(0), c.load(0), two_gpus), 1300);
  const Workload mix({{Gpus(1), 0.5}, {Gpus(2), 0.5}});
  EXPECT_DOUBLE_EQ(Fragmentation(c.view(0), c.load(0), mix), 800);
  const Workload too_much_cpu({{Gpus(1, 100, 65000), 1}});  // node has 64 CPUs
  EXPECT_DOUBLE_EQ(Fragmentation(c.view(0), c.load(0), too_much_cpu), 1300);
}

TEST(FractionalTest, SharesNeverOverfillADevice) {
  Cluster c;
  c.Add(Node("n", 1));
  const Workload w = MixedWorkload();
  const Scorer s(Policy::kDuet, &w);
  EXPECT_EQ(c.Place(Gpus(1, 400), s), 0);
  EXPECT_EQ(c.Place(Gpus(1, 400), s), 0);
  EXPECT_EQ(c.view(0).devices[0].used_milli, 800u);
  // 200m left: a third 400m share does not fit, and no policy says it does.
  std::string reason;
  EXPECT_FALSE(Fits(c.view(0), c.load(0), Gpus(1, 400), &reason));
  EXPECT_THAT(reason, HasSubstr("0 of 1 gpu devices have 400m free"));
  for (Policy p : {Policy::kDuet, Policy::kFgd, Policy::kBestFit, Policy::kLeastAllocated,
                   Policy::kMostAllocated}) {
    EXPECT_EQ(c.Place(Gpus(1, 400), Scorer(p, &w)), -1) << PolicyName(p);
  }
  EXPECT_EQ(c.Place(Gpus(1, 200), s), 0);
  EXPECT_EQ(c.view(0).devices[0].used_milli, 1000u);
  EXPECT_TRUE(c.ledger().CheckInvariants().ok());
}

TEST(FractionalTest, WholeDeviceHoldersNeverShare) {
  Cluster c;
  c.Add(Node("n", 2));
  c.Hold(0, {{DeviceKind::kGpu, 0, 100}});  // a small share on GPU 0
  const Scorer s(Policy::kDuet);
  // A whole-GPU pod gets GPU 1, never GPU 0.
  std::optional<Placement> p = s.Evaluate(c.view(0), c.load(0), Gpus(1));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->devices[0].index, 1u);
  EXPECT_EQ(p->devices[0].milli, kWholeDevice);
  // Two whole GPUs do not fit on a node with one GPU partly used.
  std::string reason;
  EXPECT_FALSE(Fits(c.view(0), c.load(0), Gpus(2), &reason));
  c.Hold(0, {{DeviceKind::kGpu, 1, kWholeDevice}});
  // GPU 1 is held whole: even a 1m share goes to GPU 0, and a share bigger
  // than GPU 0's 900m free fits nowhere.
  p = s.Evaluate(c.view(0), c.load(0), Gpus(1, 1));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->devices[0].index, 0u);
  EXPECT_FALSE(Fits(c.view(0), c.load(0), Gpus(1, 901)));
  EXPECT_TRUE(c.ledger().CheckInvariants().ok());
}

TEST(FitsTest, ReasonsNameCpuMemoryAndModel) {
  Cluster c;
  c.Add(Node("n", 8, /*cpus=*/8, "T4"));
  std::string reason;
  EXPECT_FALSE(Fits(c.view(0), c.load(0), Gpus(1, kWholeDevice, 9000), &reason));
  EXPECT_THAT(reason, HasSubstr("8000m cpu free, 9000m requested"));
  PodRequest mem = Gpus(1);
  mem.memory_mib = 1024 * 1024;
  EXPECT_FALSE(Fits(c.view(0), c.load(0), mem, &reason));
  EXPECT_THAT(reason, HasSubstr("MiB memory free"));
  PodRequest v100 = Gpus(1);
  v100.models = {"V100M16", "V100M32"};
  EXPECT_FALSE(Fits(c.view(0), c.load(0), v100, &reason));
  EXPECT_THAT(reason, HasSubstr("0 of 0 gpu devices of an accepted model"));
  v100.models.push_back("T4");
  EXPECT_TRUE(Fits(c.view(0), c.load(0), v100));
}

TEST(FitsTest, NodeThatIsNotReadyTakesNothing) {
  Cluster c;
  NodeSpec n = Node("n", 1);
  n.state = NodeState::kCordoned;
  c.Add(n);
  std::string reason;
  EXPECT_FALSE(Fits(c.view(0), c.load(0), Gpus(1), &reason));
  EXPECT_THAT(reason, HasSubstr("cordoned"));
}

TEST(SlurmWeightTest, FullerNodesWeighLessUnderDuet) {
  Cluster c;
  c.Add(Node("empty", 8));
  c.Add(Node("fuller", 8));
  c.HoldWhole(1, 6);
  const Workload w = MixedWorkload();
  const Scorer duet(Policy::kDuet, &w);
  EXPECT_LT(SlurmWeight(c.view(1), c.load(1), duet), SlurmWeight(c.view(0), c.load(0), duet));
  const Scorer spread(Policy::kLeastAllocated, &w);
  EXPECT_GT(SlurmWeight(c.view(1), c.load(1), spread), SlurmWeight(c.view(0), c.load(0), spread));
  c.Hold(1, {{DeviceKind::kGpu, 6, kWholeDevice}, {DeviceKind::kGpu, 7, kWholeDevice}});
  // A full node comes first under duet (CPU-only jobs go there)...
  EXPECT_EQ(SlurmWeight(c.view(1), c.load(1), duet), 1u);
  // ...and last under spread, where it fits no shape of the workload.
  EXPECT_EQ(SlurmWeight(c.view(1), c.load(1), spread), kMaxSlurmWeight);
}

TEST(ScoreTest, ScoresStayInRange) {
  Cluster c;
  c.Add(Node("a", 8));
  c.Add(Node("b", 2));
  c.HoldWhole(1, 1);
  const Workload w = MixedWorkload();
  for (Policy p : {Policy::kDuet, Policy::kFgd, Policy::kBestFit, Policy::kLeastAllocated,
                   Policy::kMostAllocated}) {
    for (const PodRequest& r : {Gpus(0), Gpus(1), Gpus(1, 250), Gpus(2)}) {
      for (size_t i = 0; i < 2; ++i) {
        const int score = Score(c.view(i), c.load(i), r, Scorer(p, &w));
        EXPECT_GE(score, 0);
        EXPECT_LE(score, kMaxScore);
      }
    }
  }
}

TEST(PolicyTest, NamesRoundTrip) {
  for (Policy p : {Policy::kDuet, Policy::kFgd, Policy::kBestFit, Policy::kLeastAllocated,
                   Policy::kMostAllocated}) {
    absl::StatusOr<Policy> parsed = ParsePolicy(PolicyName(p));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, p);
  }
  EXPECT_EQ(ParsePolicy("nope").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(WorkloadTest, FromPodsKeepsTheCommonShapesAndNormalises) {
  std::vector<PodRequest> pods;
  for (int i = 0; i < 6; ++i) pods.push_back(Gpus(1));
  for (int i = 0; i < 3; ++i) pods.push_back(Gpus(1, 500));
  pods.push_back(Gpus(8));
  const Workload w = Workload::FromPods(pods, 0.9);
  ASSERT_EQ(w.shapes().size(), 2u);
  EXPECT_EQ(w.shapes()[0].request.milli, kWholeDevice);
  EXPECT_DOUBLE_EQ(w.shapes()[0].weight, 6.0 / 9);
  EXPECT_DOUBLE_EQ(w.shapes()[1].weight, 3.0 / 9);
  EXPECT_EQ(Workload::FromPods(pods, 1.0).shapes().size(), 3u);
}

TEST(RequestTest, ValidateRejectsSharesOverSeveralDevices) {
  EXPECT_TRUE(ValidatePodRequest(Gpus(1, 300)).ok());
  EXPECT_FALSE(ValidatePodRequest(Gpus(2, 300)).ok());
  EXPECT_FALSE(ValidatePodRequest(Gpus(1, 0)).ok());
  EXPECT_FALSE(ValidatePodRequest(Gpus(1, 1001)).ok());
}

// Requests whose models are resolved to ledger ids give the same verdicts as
// ones compared by name, on ledger views (ids set) and on hand-built views
// (ids 0), including a model no device has.
TEST(ModelIdTest, ResolvedAndUnresolvedRequestsAgree) {
  Cluster c;
  NodeSpec mixed = Node("mixed", 4, 64, "G2");
  for (uint32_t i = 4; i < 8; ++i) {
    DeviceSpec d;
    d.index = i;
    d.model = "G3-model-with-a-long-name";
    mixed.devices.push_back(d);
  }
  c.Add(mixed);
  NodeView hand = c.view(0);  // a copy without ids
  for (DeviceState& d : hand.devices) d.spec.model_id = 0;
  for (const std::vector<std::string>& models :
       std::vector<std::vector<std::string>>{{}, {"G2"}, {"G3-model-with-a-long-name"},
                                             {"G2", "G3-model-with-a-long-name"}, {"no-such"}}) {
    for (uint32_t count : {1u, 4u, 5u, 8u}) {
      PodRequest by_name = Gpus(count);
      by_name.models = models;
      PodRequest by_id = by_name;
      by_id.ResolveModelIds();
      ASSERT_EQ(by_id.model_ids.size(), models.size());
      for (const NodeView* v : std::vector<const NodeView*>{&c.view(0), &hand}) {
        std::string r1, r2;
        EXPECT_EQ(Fits(*v, {}, by_name, &r1), Fits(*v, {}, by_id, &r2))
            << models.size() << " models, " << count << " GPUs";
        EXPECT_EQ(r1, r2);
        const Scorer scorer(Policy::kDuet);
        EXPECT_EQ(scorer.Evaluate(*v, {}, by_name).has_value(),
                  scorer.Evaluate(*v, {}, by_id).has_value());
      }
    }
  }
  PodRequest none = Gpus(1);
  none.models = {"no-such"};
  none.ResolveModelIds();
  EXPECT_EQ(none.model_ids, std::vector<uint32_t>{0});
  EXPECT_FALSE(Fits(c.view(0), {}, none));
  PodRequest g3 = Gpus(4);
  g3.models = {"G3-model-with-a-long-name"};
  g3.ResolveModelIds();
  EXPECT_TRUE(Fits(c.view(0), {}, g3));
  g3.count = 5;
  EXPECT_FALSE(Fits(c.view(0), {}, g3));
}

// fgd scores as the FGD paper's simulator does: floor(100 * sigmoid(-growth)),
// growth in devices. A shared pod's device is the first (by index) with the
// best such score, so two devices whose growths differ by less than the
// score's step tie and the first wins, where duet takes the lesser growth.
TEST(FgdTest, ScoresLikeThePaperAndTheFirstDeviceWinsAScoreTie) {
  Cluster c;
  c.Add(Node("n", 2));
  c.Hold(0, {{DeviceKind::kGpu, 0, 960}, {DeviceKind::kGpu, 1, 975}});  // free: 40, 25
  // A 10m share on device 0 shrinks fragmentation by 5m (0.005 device), on
  // device 1 by 10m: 50 and 50 after rounding down.
  const Workload w({{Gpus(1, 100), 0.5}, {Gpus(1, 30), 0.5}});
  std::optional<Placement> fgd = Scorer(Policy::kFgd, &w).Evaluate(c.view(0), c.load(0), Gpus(1, 10));
  ASSERT_TRUE(fgd.has_value());
  ASSERT_EQ(fgd->devices.size(), 1u);
  EXPECT_EQ(fgd->devices[0].index, 0u);
  EXPECT_EQ(fgd->score, 50);
  EXPECT_EQ(fgd->raw, 50);
  std::optional<Placement> duet =
      Scorer(Policy::kDuet, &w).Evaluate(c.view(0), c.load(0), Gpus(1, 10));
  ASSERT_TRUE(duet.has_value());
  EXPECT_EQ(duet->devices[0].index, 1u);

  // A whole GPU on an empty 2-GPU node, against a workload of whole GPUs:
  // no growth scores 50; against 2-GPU pods the GPU left over is
  // fragmented (growth 1): floor(100 / (1 + e^1)) = 26.
  Cluster e;
  e.Add(Node("e", 2));
  const Workload one({{Gpus(1), 1}});
  const Workload two({{Gpus(2), 1}});
  EXPECT_EQ(Scorer(Policy::kFgd, &one).Evaluate(e.view(0), e.load(0), Gpus(1))->score, 50);
  EXPECT_EQ(Scorer(Policy::kFgd, &two).Evaluate(e.view(0), e.load(0), Gpus(1))->score, 26);
}

// Equal fgd scores tie, and SelectNode's tie goes to the first node: the
// node whose growth is 0.01 device lower, second in order, does not win.
TEST(FgdTest, NodesWithinOneScoreStepTie) {
  Cluster c;
  c.Add(Node("a", 1));
  c.Add(Node("b", 1));
  c.Hold(0, {{DeviceKind::kGpu, 0, 960}});  // free 40
  c.Hold(1, {{DeviceKind::kGpu, 0, 975}});  // free 25
  const Workload w({{Gpus(1, 100), 0.5}, {Gpus(1, 30), 0.5}});
  EXPECT_EQ(c.Place(Gpus(1, 10), Scorer(Policy::kFgd, &w)), 0);
}

// duet's CPU-aware term: two nodes alike in devices, one with little CPU
// left. Its free GPUs are stranded (the workload asks 8 cores per GPU), so a
// CPU-light GPU pod goes there and uses one of them, not to the node that
// has the CPU to feed all of its GPUs. Fragmentation and packing alone see
// no difference between the two.
TEST(DuetTest, CpuLightGpuPodGoesWhereFreeCpuStrandsGpus) {
  Cluster c;
  c.Add(Node("cpu-rich", 8, 96));
  c.Add(Node("cpu-short", 8, 96));
  c.AddLoad(1, Gpus(0, kWholeDevice, 80000));  // 16 of 96 cores left
  const Workload w({{Gpus(1, kWholeDevice, 8000), 1}});
  EXPECT_EQ(c.Place(Gpus(1, kWholeDevice, 2000), Scorer(Policy::kDuet, &w)), 1);
  Cluster f;
  f.Add(Node("cpu-rich", 8, 96));
  f.Add(Node("cpu-short", 8, 96));
  f.AddLoad(1, Gpus(0, kWholeDevice, 80000));
  // Without the term (fgd: growth only, ties to the first) it is the first node.
  EXPECT_EQ(f.Place(Gpus(1, kWholeDevice, 2000), Scorer(Policy::kFgd, &w)), 0);
}

// PreparedRaw (what the extender's prioritize scores from, a summary made
// once per node change) gives Scorer::Raw's value to the last bit, and
// nullopt exactly where Raw does, over random nodes (models, shares, CPU and
// memory tracked or not, not ready), loads, requests, every policy, with and
// without a workload and domain packing.
TEST(PreparedRawTest, EqualsScorerRawBitForBit) {
  uint64_t state = 12345;
  auto next = [&state](uint64_t n) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (state >> 33) % n;
  };
  Ledger ledger;
  for (int n = 0; n < 60; ++n) {
    NodeSpec spec = Node("n" + std::to_string(n), static_cast<uint32_t>(next(9)),
                         next(4) == 0 ? 0 : 16 + static_cast<uint32_t>(next(100)),
                         next(3) == 0 ? "G3" : "G2");
    if (next(5) == 0) spec.memory_mib = 0;
    if (next(10) == 0) spec.state = NodeState::kCordoned;
    spec.labels["cloud.google.com/gce-topology-block"] = next(2) == 0 ? "A" : "B";
    ASSERT_TRUE(ledger.UpsertNode(spec).ok());
    uint32_t owner = 0;
    for (const DeviceSpec& d : spec.devices) {
      const uint64_t k = next(4);
      if (k == 0) continue;
      HoldRequest h;
      h.node = spec.name;
      h.owner = Owner::SlurmJob(1000 * n + ++owner);
      h.devices = {{DeviceKind::kGpu, d.index, k == 1 ? kWholeDevice : static_cast<uint32_t>(250 * k)}};
      ASSERT_TRUE(ledger.Hold(h).ok());
    }
  }
  const LedgerSnapshot snap = ledger.Snapshot();
  const DomainUsage domains = DomainUsage::Of(snap.nodes);
  std::vector<Workload::Shape> shapes = {{Gpus(1), 0.5}, {Gpus(1, 500), 0.3}, {Gpus(4), 0.2}};
  for (Workload::Shape& sh : shapes) sh.request.memory_mib = 0;
  const Workload workload(shapes);
  int compared = 0;
  int fits = 0;
  for (const Policy policy : {Policy::kDuet, Policy::kLeastAllocated, Policy::kMostAllocated,
                              Policy::kBestFit, Policy::kFgd}) {
    for (const Workload* w : {static_cast<const Workload*>(nullptr), &workload}) {
      for (const DomainUsage* d : {static_cast<const DomainUsage*>(nullptr), &domains}) {
        const Scorer scorer(policy, w, d);
        for (int r = 0; r < 40; ++r) {
          PodRequest req = next(3) == 0 ? Gpus(1, 250 * (1 + static_cast<uint32_t>(next(3))))
                                        : Gpus(static_cast<uint32_t>(next(5)));
          req.cpu_milli = 1000 * next(40);
          req.memory_mib = 1024 * next(100);
          if (next(3) == 0) req.models = {next(2) == 0 ? "G3" : "G2"};
          if (next(2) == 0) req.ResolveModelIds();
          for (const std::shared_ptr<const NodeView>& view : snap.nodes) {
            NodeLoad load;
            if (next(2) == 0) {
              load.cpu_milli = 1000 * next(80);
              load.memory_mib = 1024 * next(200);
            }
            const NodeFree prepared = PrepareNode(*view);
            const std::optional<double> want = scorer.Raw(*view, load, req);
            const std::optional<double> got =
                PreparedRaw(scorer, prepared, load, req, domains.NodePacking(view->spec.name));
            ASSERT_EQ(want.has_value(), got.has_value()) << view->spec.name;
            if (want.has_value()) {
              // Bit for bit, not within a tolerance.
              ASSERT_EQ(*want, *got) << view->spec.name << " " << PolicyName(policy);
              ++fits;
            }
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_GT(fits, compared / 10);  // both verdicts are well represented
  EXPECT_LT(fits, compared);
}

}  // namespace
}  // namespace duet::placement
