// The extender's gang path (docs/gangs.md 2) through the real Extender, a
// real Ledger and GangRegistry, a fake GangMaker and an in-memory PodApi:
// members fail every node until the gang is complete, then pass exactly
// their slot's node; bind moves the slot's devices to the member and rolls
// back when the Binding fails; single pods are unchanged.

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "k8s_adapter/extender/extender.h"
#include "tests/gang/fake_gang.h"

namespace duet {
namespace extender {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr char kGroupLabel[] = "scheduling.x-k8s.io/pod-group";
constexpr char kSizeAnnotation[] = "test.duet.io/min-member";

// Pods in memory; Bind sets spec.nodeName (or fails as told).
class MemoryPodApi final : public PodApi {
 public:
  void Put(const json& pod) {
    absl::MutexLock l(&mu_);
    pods_[Key(pod["metadata"]["namespace"], pod["metadata"]["name"])] = pod;
  }
  absl::StatusOr<json> GetPod(const std::string& ns, const std::string& name) override {
    absl::MutexLock l(&mu_);
    auto it = pods_.find(Key(ns, name));
    if (it == pods_.end()) return absl::NotFoundError(absl::StrCat("pod ", ns, "/", name));
    return it->second;
  }
  absl::Status Bind(const std::string& ns, const std::string& name, const std::string& uid,
                    const std::string& node) override {
    absl::MutexLock l(&mu_);
    binds_.push_back(absl::StrCat(name, "->", node));
    if (!bind_error_.ok()) return bind_error_;
    json& pod = pods_.at(Key(ns, name));
    if (pod["metadata"]["uid"] != uid) return absl::AbortedError("uid precondition");
    pod["spec"]["nodeName"] = node;
    return absl::OkStatus();
  }
  void set_bind_error(absl::Status s) {
    absl::MutexLock l(&mu_);
    bind_error_ = std::move(s);
  }
  std::vector<std::string> binds() {
    absl::MutexLock l(&mu_);
    return binds_;
  }

 private:
  static std::string Key(const std::string& ns, const std::string& name) { return ns + "/" + name; }
  absl::Mutex mu_;
  std::map<std::string, json> pods_;
  std::vector<std::string> binds_;
  absl::Status bind_error_;
};

json Pod(const std::string& name, int gpus, const std::string& group = "", int size = 0) {
  json pod = {{"metadata", {{"name", name}, {"namespace", "ml"}, {"uid", "uid-" + name}}},
              {"spec",
               {{"schedulerName", "duet"},
                {"containers",
                 json::array({{{"name", "c"},
                               {"image", "i"},
                               {"resources",
                                {{"limits", {{"nvidia.com/gpu", std::to_string(gpus)}}},
                                 {"requests", {{"cpu", "2"}, {"memory", "4Gi"}}}}}}})}}}};
  if (!group.empty()) {
    pod["metadata"]["labels"][kGroupLabel] = group;
    pod["metadata"]["annotations"][kSizeAnnotation] = std::to_string(size);
  }
  return pod;
}

// What k8s_adapter/gang's recognition does, reduced to a label and an
// annotation.
absl::StatusOr<std::optional<gang::GangSpec>> GangOf(const json& pod) {
  const json& md = pod["metadata"];
  if (!md.contains("labels") || !md["labels"].contains(kGroupLabel)) {
    return std::optional<gang::GangSpec>();
  }
  gang::GangSpec s;
  s.key = gang::GangKey{md["namespace"], gang::GangSource::kPodGroup, md["labels"][kGroupLabel]};
  s.min_member = static_cast<uint32_t>(std::stoul(md["annotations"][kSizeAnnotation].get<std::string>()));
  if (s.min_member == 0) {
    return absl::FailedPreconditionError(absl::StrCat("PodGroup ", s.key.name, ": minMember is 0"));
  }
  return std::optional<gang::GangSpec>(std::move(s));
}

NodeSpec Node(const std::string& name, uint32_t gpus) {
  NodeSpec n;
  n.name = name;
  n.pool = "a3";
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

class ExtenderGangTest : public ::testing::Test {
 protected:
  ExtenderGangTest() : maker_(&ledger_) {
    for (const char* n : {"node-0", "node-1", "node-2"}) {
      EXPECT_TRUE(ledger_.UpsertNode(Node(n, 4)).ok());
    }
    // node-2 is busy with Slurm work: only node-0 and node-1 take members.
    HoldRequest h;
    h.node = "node-2";
    h.owner = Owner::SlurmJob(42);
    h.devices = {{DeviceKind::kGpu, 0, kWholeDevice}, {DeviceKind::kGpu, 1, kWholeDevice},
                 {DeviceKind::kGpu, 2, kWholeDevice}};
    EXPECT_TRUE(ledger_.Hold(h).ok());
    gang::GangRegistryOptions go;
    go.planner = gang::fakes::SimplePlanner;
    registry_ = std::make_unique<gang::GangRegistry>(&ledger_, &maker_, std::move(go));
    ExtenderOptions eo;
    eo.gang_of = GangOf;
    eo.gangs = registry_.get();
    eo.wait_durable = [this](uint64_t seq) {
      absl::MutexLock l(&mu_);
      durable_waits_.push_back(seq);
      return durable_error_;
    };
    extender_ = std::make_unique<Extender>(&ledger_, nullptr, &api_, std::move(eo));
  }

  ExtenderArgs Args(const json& pod) {
    ExtenderArgs a;
    a.pod = pod;
    a.node_names = {"node-0", "node-1", "node-2"};
    return a;
  }
  absl::Status Bind(const std::string& name, const std::string& node) {
    return extender_->Bind(BindingArgs{name, "ml", "uid-" + name, node});
  }
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
  gang::fakes::FakeGangMaker maker_;
  std::unique_ptr<gang::GangRegistry> registry_;
  MemoryPodApi api_;
  std::unique_ptr<Extender> extender_;
  absl::Mutex mu_;
  std::vector<uint64_t> durable_waits_;
  absl::Status durable_error_;
};

TEST_F(ExtenderGangTest, MembersWaitForTheWholeGangThenPassAndBindOnlyTheirSlotsNode) {
  std::vector<json> members;
  for (int i = 0; i < 4; ++i) {
    members.push_back(Pod(absl::StrCat("w", i), 2, "train", 4));
    api_.Put(members.back());
  }
  for (int i = 0; i < 3; ++i) {
    FilterResult f = extender_->Filter(Args(members[i]));
    EXPECT_TRUE(f.node_names.empty()) << i;
    EXPECT_TRUE(f.failed.empty());
    ASSERT_EQ(f.failed_unresolvable.size(), 3u);
    for (const auto& [node, why] : f.failed_unresolvable) {
      EXPECT_THAT(why, HasSubstr(absl::StrCat("GANG_WAITING: ", i + 1, "/4 members"))) << node;
    }
    // Nothing binds before the gang is complete.
    EXPECT_FALSE(Bind(absl::StrCat("w", i), "node-0").ok());
  }
  EXPECT_TRUE(api_.binds().empty());
  ASSERT_EQ(maker_.creates().size(), 1u);

  FilterResult last = extender_->Filter(Args(members[3]));
  EXPECT_THAT(last.node_names, ElementsAre("node-1"));
  EXPECT_THAT(last.failed_unresolvable["node-0"], HasSubstr("GANG_NODE"));
  EXPECT_THAT(last.failed_unresolvable["node-0"], HasSubstr("is on node node-1"));
  // The others, asked again, pass their own node only.
  EXPECT_THAT(extender_->Filter(Args(members[0])).node_names, ElementsAre("node-0"));
  EXPECT_THAT(extender_->Filter(Args(members[2])).node_names, ElementsAre("node-1"));

  std::vector<HostPriority> prio = extender_->Prioritize(Args(members[0]));
  ASSERT_EQ(prio.size(), 3u);
  EXPECT_EQ(prio[0].score, kMaxExtenderPriority);
  EXPECT_EQ(prio[1].score, 0);
  EXPECT_EQ(prio[2].score, 0);

  // Another node than the slot's is refused before anything is posted.
  absl::Status wrong = Bind("w0", "node-1");
  EXPECT_EQ(wrong.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong.message(), HasSubstr("is on node node-0"));
  EXPECT_TRUE(api_.binds().empty());

  for (int i = 0; i < 4; ++i) {
    absl::Status b = Bind(absl::StrCat("w", i), i < 2 ? "node-0" : "node-1");
    ASSERT_TRUE(b.ok()) << b;
  }
  EXPECT_THAT(api_.binds(), ElementsAre("w0->node-0", "w1->node-0", "w2->node-1", "w3->node-1"));
  EXPECT_THAT(MembersOn("node-0"), ElementsAre("uid-w0", "uid-w1"));
  EXPECT_THAT(MembersOn("node-1"), ElementsAre("uid-w2", "uid-w3"));
  {
    absl::MutexLock l(&mu_);
    EXPECT_EQ(durable_waits_.size(), 4u);
  }
  // A retried bind of a bound pod is success with nothing new.
  EXPECT_TRUE(Bind("w0", "node-0").ok());
  EXPECT_EQ(api_.binds().size(), 4u);
  EXPECT_EQ(extender_->stats().bound, 4u);
  EXPECT_TRUE(ledger_.CheckInvariants().ok());
}

TEST_F(ExtenderGangTest, AFailedBindingGivesTheDevicesBackToTheSlot) {
  for (int i = 0; i < 2; ++i) api_.Put(Pod(absl::StrCat("w", i), 4, "pair", 2));
  extender_->Filter(Args(Pod("w0", 4, "pair", 2)));
  ASSERT_THAT(extender_->Filter(Args(Pod("w1", 4, "pair", 2))).node_names, ElementsAre("node-1"));
  api_.set_bind_error(absl::UnavailableError("API server down"));
  EXPECT_FALSE(Bind("w1", "node-1").ok());
  EXPECT_TRUE(MembersOn("node-1").empty());
  const gang::GangKey key{"ml", gang::GangSource::kPodGroup, "pair"};
  EXPECT_TRUE(ledger_.FindHolding("node-1", gang::fakes::SlotOwner(500, key, 1)).has_value());
  EXPECT_EQ(extender_->stats().rolled_back, 1u);
  // Not durable: rolled back too.
  api_.set_bind_error(absl::OkStatus());
  {
    absl::MutexLock l(&mu_);
    durable_error_ = absl::UnavailableError("journal stalled");
  }
  EXPECT_FALSE(Bind("w1", "node-1").ok());
  EXPECT_TRUE(ledger_.FindHolding("node-1", gang::fakes::SlotOwner(500, key, 1)).has_value());
  {
    absl::MutexLock l(&mu_);
    durable_error_ = absl::OkStatus();
  }
  ASSERT_TRUE(Bind("w1", "node-1").ok());
  EXPECT_THAT(MembersOn("node-1"), ElementsAre("uid-w1"));
}

TEST_F(ExtenderGangTest, GangsThatCannotBePlacedOrReadFailEveryNodeWithTheReason) {
  // 3 members of 4 GPUs: only two nodes have 4 free.
  FilterResult f = extender_->Filter(Args(Pod("big", 4, "big", 3)));
  EXPECT_TRUE(f.node_names.empty());
  ASSERT_EQ(f.failed_unresolvable.size(), 3u);
  EXPECT_THAT(f.failed_unresolvable["node-0"], HasSubstr("GANG_NO_ROOM"));
  EXPECT_EQ(ledger_.holding_count(), 1u);  // Slurm's job only

  FilterResult unread = extender_->Filter(Args(Pod("odd", 1, "odd", 0)));
  EXPECT_TRUE(unread.node_names.empty());
  EXPECT_THAT(unread.failed_unresolvable["node-1"], HasSubstr("minMember is 0"));

  // A member asking other than the first is refused, not placed alone.
  extender_->Filter(Args(Pod("a0", 2, "mixed", 2)));
  FilterResult mixed = extender_->Filter(Args(Pod("a1", 1, "mixed", 2)));
  EXPECT_TRUE(mixed.node_names.empty());
  EXPECT_THAT(mixed.failed_unresolvable["node-0"], HasSubstr("GANG_MEMBER_MISMATCH"));
}

TEST_F(ExtenderGangTest, SinglePodsAreUnchanged) {
  const json single = Pod("solo", 1);
  api_.Put(single);
  FilterResult f = extender_->Filter(Args(single));
  EXPECT_THAT(f.node_names, ElementsAre("node-0", "node-1", "node-2"));
  std::vector<HostPriority> prio = extender_->Prioritize(Args(single));
  ASSERT_EQ(prio.size(), 3u);
  ASSERT_TRUE(Bind("solo", "node-2").ok());
  ASSERT_EQ(ledger_.ListHoldings("node-2").size(), 2u);
  EXPECT_TRUE(ledger_.FindHolding("node-2", Owner::Pod("uid-solo", "ml", "solo")).has_value());
  EXPECT_TRUE(maker_.creates().empty());
}

}  // namespace
}  // namespace extender
}  // namespace duet
