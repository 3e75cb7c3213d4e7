#include "bridge/dra/lender.h"

#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/gate.h"
#include "tests/fakes/wait.h"

namespace duet {
namespace dra {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kGpuDriver[] = "gpu.nvidia.com";
constexpr char kTpuDriver[] = "tpu.google.com";

// What the fakes saw, in order ("taint n1/gpu-0", "list", "cancel 3", ...).
class Events {
 public:
  void Add(std::string e) {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(e));
  }
  std::vector<std::string> Get() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  void Clear() {
    absl::MutexLock lock(&mu_);
    events_.clear();
  }
  // Position of the first event starting with `prefix` (-1 when none).
  int Find(const std::string& prefix) const {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < events_.size(); ++i) {
      if (absl::StartsWith(events_[i], prefix)) return static_cast<int>(i);
    }
    return -1;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
};

// GPU node: gpu-<index> of gpu.nvidia.com in pool <node>; TPU node:
// accel<index> of tpu.google.com. Nodes listed in `unlendable` do not map.
class FakeMap : public DeviceMapView {
 public:
  std::map<std::string, std::pair<DeviceKind, uint32_t>> nodes;  // node -> kind, count
  std::map<std::string, std::string> unlendable;                 // node -> why
  // Calls of ToDra, Lendable and NodeDevices (the per-node work).
  mutable std::atomic<int> calls{0};

  std::optional<LedgerDevice> ToLedger(const DraDevice& d) const override {
    auto n = nodes.find(d.pool);
    if (n == nodes.end() || unlendable.count(d.pool)) return std::nullopt;
    const bool gpu = n->second.first == DeviceKind::kGpu;
    const std::string prefix = gpu ? "gpu-" : "accel";
    if (d.driver != (gpu ? kGpuDriver : kTpuDriver) || !absl::StartsWith(d.device, prefix)) {
      return std::nullopt;
    }
    uint32_t index = 0;
    if (!absl::SimpleAtoi(d.device.substr(prefix.size()), &index) || index >= n->second.second) {
      return std::nullopt;
    }
    return LedgerDevice{d.pool, n->second.first, index};
  }
  std::optional<DraDevice> ToDra(const LedgerDevice& d) const override {
    ++calls;
    auto n = nodes.find(d.node);
    if (n == nodes.end() || unlendable.count(d.node) || n->second.first != d.kind) {
      return std::nullopt;
    }
    return Dra(d);
  }
  bool Lendable(const std::string& node, std::string* why) const override {
    ++calls;
    auto u = unlendable.find(node);
    if (u != unlendable.end()) {
      if (why != nullptr) *why = u->second;
      return false;
    }
    return nodes.count(node) > 0;
  }
  std::vector<DraDevice> NodeDevices(const std::string& node) const override {
    ++calls;
    std::vector<DraDevice> out;
    auto n = nodes.find(node);
    if (n == nodes.end() || unlendable.count(node)) return out;
    for (uint32_t i = 0; i < n->second.second; ++i) out.push_back(Dra({node, n->second.first, i}));
    return out;
  }
  static DraDevice Dra(const LedgerDevice& d) {
    return d.kind == DeviceKind::kGpu ? DraDevice{kGpuDriver, d.node, absl::StrCat("gpu-", d.index)}
                                      : DraDevice{kTpuDriver, d.node, absl::StrCat("accel", d.index)};
  }
};

// The rules as a set, with the calls that reached it counted; drift is
// reported to the listener as a watch would.
class FakeRules : public RuleWriter {
 public:
  explicit FakeRules(Events* events) : events_(events) {}
  absl::Status Taint(const std::vector<DraDevice>& devices) override {
    absl::Status s = Record("taint", devices);
    absl::MutexLock lock(&mu_);
    if (s.ok()) rules_.insert(devices.begin(), devices.end());
    return s;
  }
  absl::Status Untaint(const std::vector<DraDevice>& devices) override {
    absl::Status s = Record("untaint", devices);
    absl::MutexLock lock(&mu_);
    for (const DraDevice& d : devices) rules_.erase(d);
    return s;
  }
  absl::Status Resync(const std::vector<DraDevice>& tainted) override {
    absl::MutexLock lock(&mu_);
    ++resyncs_;
    resynced_ = tainted;
    rules_ = std::set<DraDevice>(tainted.begin(), tainted.end());
    return absl::OkStatus();
  }
  absl::Status ResyncPool(const std::string& pool, const std::vector<DraDevice>& tainted) override {
    absl::MutexLock lock(&mu_);
    pools_.push_back(pool);
    if (!pool_error_.ok()) return pool_error_;
    for (auto it = rules_.begin(); it != rules_.end();) {
      it = it->pool == pool ? rules_.erase(it) : std::next(it);
    }
    for (const DraDevice& d : tainted) {
      EXPECT_EQ(d.pool, pool);
      rules_.insert(d);
    }
    return absl::OkStatus();
  }
  void SetDriftListener(RuleDriftListener* listener) override {
    absl::MutexLock lock(&mu_);
    listener_ = listener;
  }
  // Someone deletes the rule of `d`; the watch reports it.
  void DeleteBehindDuetsBack(const DraDevice& d) {
    absl::MutexLock lock(&mu_);
    rules_.erase(d);
    if (listener_ != nullptr) listener_->OnRuleDrift(d);
  }
  // The watch relisted.
  void Relist() {
    absl::MutexLock lock(&mu_);
    if (listener_ != nullptr) listener_->OnRulesRelisted();
  }
  void Put(const DraDevice& d) {
    absl::MutexLock lock(&mu_);
    rules_.insert(d);
  }
  void FailTaint(absl::Status s) {
    absl::MutexLock lock(&mu_);
    taint_error_ = std::move(s);
  }
  void FailPools(absl::Status s) {
    absl::MutexLock lock(&mu_);
    pool_error_ = std::move(s);
  }
  std::vector<DraDevice> resynced() const {
    absl::MutexLock lock(&mu_);
    return resynced_;
  }
  std::set<DraDevice> rules() const {
    absl::MutexLock lock(&mu_);
    return rules_;
  }
  int resyncs() const {
    absl::MutexLock lock(&mu_);
    return resyncs_;
  }
  // The pools ResyncPool was called for, in order; cleared.
  std::vector<std::string> TakePools() {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> out;
    out.swap(pools_);
    return out;
  }

 private:
  absl::Status Record(const char* what, const std::vector<DraDevice>& devices) {
    for (const DraDevice& d : devices) events_->Add(absl::StrCat(what, " ", d.pool, "/", d.device));
    absl::MutexLock lock(&mu_);
    return std::string(what) == "taint" ? taint_error_ : absl::OkStatus();
  }
  Events* const events_;
  mutable absl::Mutex mu_;
  absl::Status taint_error_ ABSL_GUARDED_BY(mu_);
  absl::Status pool_error_ ABSL_GUARDED_BY(mu_);
  std::vector<DraDevice> resynced_ ABSL_GUARDED_BY(mu_);
  std::set<DraDevice> rules_ ABSL_GUARDED_BY(mu_);
  int resyncs_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> pools_ ABSL_GUARDED_BY(mu_);
  RuleDriftListener* listener_ ABSL_GUARDED_BY(mu_) = nullptr;
};

class FakeClaims : public ClaimLister {
 public:
  explicit FakeClaims(Events* events) : events_(events) {}
  absl::StatusOr<std::vector<AllocatedClaim>> ListAllocated() override {
    events_->Add("list");
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    std::vector<AllocatedClaim> out;
    for (const auto& [uid, c] : claims_) {
      if (!c.devices.empty()) out.push_back(c);
    }
    return out;
  }
  absl::StatusOr<std::optional<AllocatedClaim>> GetClaim(const ClaimRef& claim) override {
    events_->Add(absl::StrCat("get ", claim.ns, "/", claim.name));
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    for (const auto& [uid, c] : claims_) {
      if (c.claim.ns != claim.ns || c.claim.name != claim.name) continue;
      if (uid != claim.uid) return std::nullopt;  // another claim of that name
      return c;
    }
    return std::nullopt;
  }
  // The claim exists in etcd with `devices` allocated (none: unallocated).
  void Set(const ClaimRef& claim, std::vector<DraDevice> devices) {
    absl::MutexLock lock(&mu_);
    claims_[claim.uid] = AllocatedClaim{claim, std::move(devices)};
  }
  void Remove(const std::string& uid) {
    absl::MutexLock lock(&mu_);
    claims_.erase(uid);
  }
  void Fail(absl::Status s) {
    absl::MutexLock lock(&mu_);
    error_ = std::move(s);
  }

 private:
  Events* const events_;
  absl::Mutex mu_;
  std::map<std::string, AllocatedClaim> claims_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

// Slurm as the lend jobs see it: the lowest free devices, a new job id each.
class FakeLends : public LendMaker {
 public:
  FakeLends(Ledger* ledger, Events* events) : ledger_(ledger), events_(events) {}
  // Runs first in each CreateLend, outside any lock (a test's gate); an
  // error fails that call as Slurm's refusal would. Set before any Lend.
  std::function<absl::Status()> on_create;

  absl::StatusOr<Holding> CreateLend(const std::string& node, DeviceKind kind,
                                     uint32_t count) override {
    if (on_create) {
      if (absl::Status s = on_create(); !s.ok()) return s;
    }
    // One job at a time, as slurmctld's job lock has them.
    absl::MutexLock lock(&mu_);
    const uint32_t job = next_job_++;
    HoldRequest r;
    r.node = node;
    r.owner = Owner::Lend(job, node);
    std::shared_ptr<const NodeView> view = ledger_->GetNode(node);
    if (!view) return absl::NotFoundError(node);
    for (const DeviceState& d : view->devices) {
      if (d.spec.kind == kind && d.uses.empty() && r.devices.size() < count) {
        r.devices.push_back({kind, d.spec.index, 0});
      }
    }
    if (r.devices.size() < count) return absl::ResourceExhaustedError("no room in Slurm");
    absl::StatusOr<HoldResult> h = ledger_->Hold(r);
    if (!h.ok()) return h.status();
    events_->Add(absl::StrCat("lend ", job));
    return h->holding;
  }
  absl::Status CancelLend(const std::string& node, uint32_t job_id) override {
    events_->Add(absl::StrCat("cancel ", job_id));
    return ledger_->Release(node, Owner::Lend(job_id, node)).status();
  }

 private:
  Ledger* const ledger_;
  Events* const events_;
  absl::Mutex mu_;
  uint32_t next_job_ ABSL_GUARDED_BY(mu_) = 100;
};

NodeSpec Node(const std::string& name, DeviceKind kind, uint32_t count) {
  NodeSpec n;
  n.name = name;
  n.cpus = 32;
  n.memory_mib = 1024;
  for (uint32_t i = 0; i < count; ++i) {
    DeviceSpec d;
    d.kind = kind;
    d.index = i;
    d.model = "m";
    n.devices.push_back(d);
  }
  return n;
}

AllocationResult Gpu(const std::string& node, uint32_t index) {
  return AllocationResult{FakeMap::Dra({node, DeviceKind::kGpu, index}), "gpus", false};
}
AllocationResult Tpu(const std::string& node, uint32_t index) {
  return AllocationResult{FakeMap::Dra({node, DeviceKind::kTpu, index}), "tpus", false};
}

AdmissionAsk Ask(const std::string& uid, std::vector<AllocationResult> now,
                 std::vector<AllocationResult> before = {}) {
  AdmissionAsk a;
  a.claim = ClaimRef{uid, "ns", "claim-" + uid};
  a.old_results = std::move(before);
  a.new_results = std::move(now);
  return a;
}

class LenderTest : public ::testing::Test {
 protected:
  LenderTest() : rules_(&events_), claims_(&events_), lends_(&ledger_, &events_) {
    map_.nodes["n1"] = {DeviceKind::kGpu, 4};
    map_.nodes["n2"] = {DeviceKind::kGpu, 2};
    map_.nodes["t1"] = {DeviceKind::kTpu, 4};
    map_.nodes["mig"] = {DeviceKind::kGpu, 2};
    map_.unlendable["mig"] = "mig_devices";
    for (const auto& [name, spec] : map_.nodes) {
      EXPECT_TRUE(ledger_.UpsertNode(Node(name, spec.first, spec.second)).ok());
    }
    EXPECT_TRUE(ledger_.UpsertNode(Node("other", DeviceKind::kGpu, 2)).ok());
    options_.admission_grace = absl::Seconds(15);
    options_.reclaim_after = absl::Seconds(60);
    options_.pool_of = [](const std::string& node) -> std::string {
      if (node == "n1" || node == "n2" || node == "mig") return "gpu-pool";
      if (node == "t1") return "tpu-pool";
      return "";
    };
  }
  void TearDown() override { EXPECT_TRUE(ledger_.CheckInvariants().ok()) << ledger_.CheckInvariants(); }

  Lender& lender() {
    if (!lender_) {
      lender_ = std::make_unique<Lender>(
          &ledger_, &lends_, &map_, &rules_, &claims_,
          [this](uint64_t seq) {
            if (on_durable_) on_durable_();
            waited_.push_back(seq);
            return durable_error_;
          },
          &clock_, options_, &registry_);
    }
    return *lender_;
  }
  // The claim-side owner of `device`, "" when none; "lend" for a lend owner.
  std::string HolderOf(const std::string& node, DeviceKind kind, uint32_t index) {
    for (const Holding& h : ledger_.ListHoldings(node)) {
      for (const HeldDevice& d : h.devices) {
        if (d.kind == kind && d.index == index) {
          if (h.owner.kind == OwnerKind::kLend) return "lend";
          if (h.owner.kind == OwnerKind::kClaim) return "claim " + h.owner.pod_uid;
          return h.owner.ToString();
        }
      }
    }
    return "";
  }
  std::string Metrics() {
    return prometheus::TextSerializer().Serialize(registry_.Collect());
  }

  Ledger ledger_;
  Events events_;
  FakeMap map_;
  FakeRules rules_;
  FakeClaims claims_;
  FakeLends lends_;
  fakes::FakeClock clock_;
  prometheus::Registry registry_;
  LenderOptions options_;
  std::vector<uint64_t> waited_;
  absl::Status durable_error_;
  // Runs in Review's durability wait (an admission in flight).
  std::function<void()> on_durable_;
  std::unique_ptr<Lender> lender_;
};

// Claim `uid` as Ask names it, and etcd's record of it allocating `devices`.
ClaimRef Ref(const std::string& uid) { return ClaimRef{uid, "ns", "claim-" + uid}; }
std::vector<DraDevice> Dra(const std::vector<AllocationResult>& results) {
  std::vector<DraDevice> out;
  for (const AllocationResult& r : results) out.push_back(r.device);
  return out;
}

// ---------------------------------------------------------------------------
// Admission

TEST_F(LenderTest, LentFreeDevicesAreAdmittedAndBecomeTheClaims) {
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 2).ok());
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "lend");
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 1), "lend");
  const uint64_t seq_before = ledger_.seq();
  AdmissionVerdict v = lender().Review(Ask("c1", {Gpu("n1", 0), Gpu("n1", 1)}));
  EXPECT_TRUE(v.allowed) << v.reason << ": " << v.message;
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "claim c1");
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 1), "claim c1");
  // Two lend jobs, two claim holdings of one group, durable before the answer.
  EXPECT_EQ(ledger_.seq(), seq_before + 4);
  EXPECT_THAT(waited_, ElementsAre(ledger_.seq()));
  // A retry of the same write is allowed again and changes nothing.
  const uint64_t seq = ledger_.seq();
  v = lender().Review(Ask("c1", {Gpu("n1", 0), Gpu("n1", 1)}));
  EXPECT_TRUE(v.allowed) << v.message;
  EXPECT_EQ(ledger_.seq(), seq);
  EXPECT_THAT(Metrics(), HasSubstr("duet_dra_admissions_total{reason=\"\",result=\"allowed\"} 2"));
}

TEST_F(LenderTest, EveryRefusalReasonRefusesTheWholeWriteAndChangesNothing) {
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 2).ok());  // gpu 0, 1
  ASSERT_TRUE(lender().Review(Ask("c1", {Gpu("n1", 0)})).allowed);
  HoldRequest slurm;
  slurm.node = "n1";
  slurm.owner = Owner::SlurmJob(7);
  slurm.devices = {{DeviceKind::kGpu, 3, 0}};
  ASSERT_TRUE(ledger_.Hold(slurm).ok());
  const uint64_t seq = ledger_.seq();
  struct Case {
    AdmissionAsk ask;
    std::string reason;
  };
  const std::vector<Case> cases = {
      // gpu 1 is lent and free, gpu 2 is free in duet (not lent).
      {Ask("c2", {Gpu("n1", 1), Gpu("n1", 2)}), kReasonNotLent},
      // gpu 3 is Slurm's.
      {Ask("c2", {Gpu("n1", 1), Gpu("n1", 3)}), kReasonNotLent},
      // gpu 0 is claim c1's.
      {Ask("c2", {Gpu("n1", 1), Gpu("n1", 0)}), kReasonHeldByOtherClaim},
      // A device of a lending node that does not map.
      {Ask("c2", {Gpu("n1", 1), Gpu("mig", 0)}), kReasonUnmappableNode},
  };
  for (const Case& c : cases) {
    AdmissionVerdict v = lender().Review(c.ask);
    EXPECT_FALSE(v.allowed);
    EXPECT_EQ(v.reason, c.reason) << v.message;
    EXPECT_EQ(ledger_.seq(), seq) << c.reason;
    EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 1), "lend") << c.reason;
  }
  EXPECT_THAT(lender().Review(cases[0].ask).message, HasSubstr("node n1 gpu 2 is not lent"));
  EXPECT_THAT(Metrics(), HasSubstr("reason=\"NOT_LENT\",result=\"refused\"} 3"));
}

TEST_F(LenderTest, ATpuClaimMustTakeTheWholeHost) {
  absl::StatusOr<std::vector<LedgerDevice>> lent = lender().Lend("t1", DeviceKind::kTpu, 1);
  ASSERT_TRUE(lent.ok()) << lent.status();
  EXPECT_EQ(lent->size(), 4u);  // every chip, one job
  AdmissionVerdict v = lender().Review(Ask("c1", {Tpu("t1", 0), Tpu("t1", 1)}));
  EXPECT_FALSE(v.allowed);
  EXPECT_EQ(v.reason, kReasonPartialHost);
  EXPECT_EQ(HolderOf("t1", DeviceKind::kTpu, 0), "lend");
  v = lender().Review(Ask("c1", {Tpu("t1", 0), Tpu("t1", 1), Tpu("t1", 2), Tpu("t1", 3)}));
  EXPECT_TRUE(v.allowed) << v.message;
  EXPECT_EQ(HolderOf("t1", DeviceKind::kTpu, 3), "claim c1");
}

TEST_F(LenderTest, DevicesOutsideLendingNodesAndAdminAccessAreAllowedUnrecorded) {
  const uint64_t seq = ledger_.seq();
  AdmissionAsk a = Ask("c1", {Gpu("other", 0)});  // not a lending pool
  a.new_results.push_back(AllocationResult{FakeMap::Dra({"n1", DeviceKind::kGpu, 3}), "mon", true});
  AdmissionVerdict v = lender().Review(a);
  EXPECT_TRUE(v.allowed) << v.message;
  EXPECT_EQ(ledger_.seq(), seq);
  EXPECT_TRUE(waited_.empty());
}

TEST_F(LenderTest, DryRunDecidesAndRecordsNothing) {
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 1).ok());
  const uint64_t seq = ledger_.seq();
  AdmissionAsk a = Ask("c1", {Gpu("n1", 0)});
  a.dry_run = true;
  EXPECT_TRUE(lender().Review(a).allowed);
  a.new_results = {Gpu("n1", 1)};
  EXPECT_EQ(lender().Review(a).reason, kReasonNotLent);
  EXPECT_EQ(ledger_.seq(), seq);
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "lend");
}

// Every check runs before the first rebind, so what can still refuse after
// one is the durability wait: each rebind this call made is undone.
TEST_F(LenderTest, ARefusalAfterRebindsUndoesThem) {
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 2).ok());
  durable_error_ = absl::UnavailableError("journal: disk full");
  AdmissionVerdict v = lender().Review(Ask("c1", {Gpu("n1", 0), Gpu("n1", 1)}));
  EXPECT_FALSE(v.allowed);
  EXPECT_EQ(v.reason, kReasonUnavailable);
  EXPECT_THAT(v.message, HasSubstr("disk full"));
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "lend");
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 1), "lend");
  durable_error_ = absl::OkStatus();
  EXPECT_TRUE(lender().Review(Ask("c1", {Gpu("n1", 0), Gpu("n1", 1)})).allowed);
}

// A write removing an allocation may still fail, and a claim deallocated
// may be allocated again before the bridge acts: the webhook gives nothing
// back (only the fenced release does).
TEST_F(LenderTest, ReviewAllowsDeallocationsAndChangesNothing) {
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 2).ok());
  ASSERT_TRUE(lender().Review(Ask("c1", {Gpu("n1", 0), Gpu("n1", 1)})).allowed);
  const uint64_t seq = ledger_.seq();
  const size_t waits = waited_.size();
  AdmissionVerdict v = lender().Review(Ask("c1", {}, {Gpu("n1", 0), Gpu("n1", 1)}));
  EXPECT_TRUE(v.allowed) << v.message;
  v = lender().Review(Ask("c1", {Gpu("n1", 0)}, {Gpu("n1", 0), Gpu("n1", 1)}));  // one dropped
  EXPECT_TRUE(v.allowed) << v.message;
  EXPECT_EQ(ledger_.seq(), seq);
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "claim c1");
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 1), "claim c1");
  EXPECT_EQ(lender().Review(Ask("c2", {Gpu("n1", 1)})).reason, kReasonHeldByOtherClaim);
  EXPECT_GE(waited_.size(), waits);
}

// model/README.md, DRA finding 1: claim A is deallocated; before the bridge
// handles that, the scheduler allocates A again on the same device and the
// webhook allows it (A already holds it). The bridge's release then runs on
// the stale deallocation: its quorum read shows A's new allocation, so the
// device stays A's and B is refused it. (An unfenced release gives the
// device back to Lend here and B is admitted: two pods on one device.)
TEST_F(LenderTest, AStaleReleaseDoesNotFreeADeviceTheClaimWasAllocatedAgain) {
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 1).ok());
  ASSERT_TRUE(lender().Review(Ask("A", {Gpu("n1", 0)})).allowed);
  claims_.Set(Ref("A"), Dra({Gpu("n1", 0)}));
  clock_.Advance(absl::Seconds(60));  // A's pod runs, ends
  claims_.Set(Ref("A"), {});          // the resourceclaim controller deallocates A
  // The scheduler allocates A again, on gpu 0, for its next pod: a retry to
  // the webhook, allowed; the write lands.
  AdmissionVerdict again = lender().Review(Ask("A", {Gpu("n1", 0)}));
  ASSERT_TRUE(again.allowed) << again.message;
  claims_.Set(Ref("A"), Dra({Gpu("n1", 0)}));
  // Now the bridge handles the old deallocation.
  events_.Clear();
  absl::Status result;
  std::thread release([&] { result = lender().ReleaseClaimIfDeallocated("A"); });
  EXPECT_TRUE(clock_.AwaitSleepers(1));  // the grace after A's last admission
  clock_.Advance(absl::Seconds(15));
  release.join();
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_THAT(events_.Get(), ElementsAre("get ns/claim-A"));
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "claim A");
  EXPECT_FALSE(lender().Releasing("A"));
  AdmissionVerdict b = lender().Review(Ask("B", {Gpu("n1", 0)}));
  EXPECT_FALSE(b.allowed);
  EXPECT_EQ(b.reason, kReasonHeldByOtherClaim);
  EXPECT_THAT(Metrics(), HasSubstr("duet_dra_claim_releases_total{result=\"kept\"} 1"));
}

// The same race with the release under way first: the re-admission is
// refused (RELEASING), dry run or not, and recorded nowhere; the release
// gives the device back; the scheduler's next try gets it.
TEST_F(LenderTest, AClaimBeingReleasedIsRefusedUntilItsDeviceIsLentAgain) {
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 2).ok());
  ASSERT_TRUE(lender().Review(Ask("A", {Gpu("n1", 0)})).allowed);
  claims_.Set(Ref("A"), {});  // deallocated (or its write never landed)
  events_.Clear();
  absl::Status result;
  std::thread release([&] { result = lender().ReleaseClaimIfDeallocated("A"); });
  ASSERT_TRUE(clock_.AwaitSleepers(1));
  EXPECT_TRUE(lender().Releasing("A"));
  EXPECT_TRUE(events_.Get().empty());  // no read before the grace
  const uint64_t seq = ledger_.seq();
  const size_t waits = waited_.size();
  AdmissionAsk dry = Ask("A", {Gpu("n1", 0)});
  dry.dry_run = true;
  for (const AdmissionAsk& ask : {Ask("A", {Gpu("n1", 0)}), dry, Ask("A", {Gpu("n1", 1)})}) {
    AdmissionVerdict v = lender().Review(ask);
    EXPECT_FALSE(v.allowed);
    EXPECT_EQ(v.reason, kReasonReleasing) << v.message;
  }
  // A write that keeps the allocation A has (etcd's old object names it) is
  // not a new allocation: allowed, recorded nothing.
  EXPECT_TRUE(lender().Review(Ask("A", {Gpu("n1", 0)}, {Gpu("n1", 0)})).allowed);
  EXPECT_EQ(ledger_.seq(), seq);
  EXPECT_EQ(waited_.size(), waits + 1);
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 1), "lend");
  // The read waits the whole grace after A's last admission.
  clock_.Advance(absl::Seconds(14));
  ASSERT_TRUE(clock_.AwaitSleepers(1));
  EXPECT_TRUE(events_.Get().empty());
  clock_.Advance(absl::Seconds(1));
  release.join();
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_THAT(events_.Get(), ElementsAre("get ns/claim-A"));
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "lend");
  EXPECT_FALSE(lender().Releasing("A"));
  EXPECT_TRUE(lender().Review(Ask("A", {Gpu("n1", 0)})).allowed);
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "claim A");
  EXPECT_THAT(Metrics(), HasSubstr("reason=\"RELEASING\",result=\"refused\"} 3"));
  EXPECT_THAT(Metrics(), HasSubstr("duet_dra_claim_releases_total{result=\"released\"} 1"));
}

TEST_F(LenderTest, ReleaseKeepsWhatTheQuorumReadStillShowsAllocated) {
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 3).ok());
  ASSERT_TRUE(lender().Review(Ask("A", {Gpu("n1", 0), Gpu("n1", 1)})).allowed);
  claims_.Set(Ref("A"), Dra({Gpu("n1", 0), Gpu("n1", 1)}));
  clock_.Advance(absl::Seconds(15));
  events_.Clear();
  const uint64_t seq = ledger_.seq();
  EXPECT_TRUE(lender().ReleaseClaimIfDeallocated("A").ok());  // the grace is over: no wait
  EXPECT_THAT(events_.Get(), ElementsAre("get ns/claim-A"));
  EXPECT_EQ(ledger_.seq(), seq);
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "claim A");
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 1), "claim A");
  // Un-flagged: a retry of A's write is allowed again.
  EXPECT_TRUE(lender().Review(Ask("A", {Gpu("n1", 0), Gpu("n1", 1)})).allowed);
  // A claim that holds nothing: OK, no read.
  events_.Clear();
  EXPECT_TRUE(lender().ReleaseClaimIfDeallocated("nobody").ok());
  EXPECT_TRUE(events_.Get().empty());
  EXPECT_EQ(lender().ReleaseClaimIfDeallocated("").code(), absl::StatusCode::kInvalidArgument);
}

// Deleted (the read finds no such claim, or another claim of that name), or
// never allocated (an allowed write the apiserver then refused: model
// finding 2): back to lent, free.
TEST_F(LenderTest, ReleaseGivesBackWhatADeletedOrNeverAllocatedClaimHolds) {
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 3).ok());
  ASSERT_TRUE(lender().Review(Ask("A", {Gpu("n1", 0)})).allowed);
  ASSERT_TRUE(lender().Review(Ask("B", {Gpu("n1", 1)})).allowed);
  ASSERT_TRUE(lender().Review(Ask("C", {Gpu("n1", 2)})).allowed);
  claims_.Set(ClaimRef{"B2", "ns", "claim-B"}, Dra({Gpu("n1", 1)}));  // B deleted, made again
  claims_.Set(Ref("C"), {});                                          // C's write got a 409
  clock_.Advance(absl::Seconds(15));
  for (const char* uid : {"A", "B", "C"}) {
    EXPECT_TRUE(lender().ReleaseClaimIfDeallocated(uid).ok()) << uid;
  }
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "lend");
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 1), "lend");
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 2), "lend");
  EXPECT_TRUE(lender().ReleaseClaimIfDeallocated("A").ok());  // nothing left: OK
}

TEST_F(LenderTest, AFailedReadKeepsTheHoldingAndUnflags) {
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 1).ok());
  ASSERT_TRUE(lender().Review(Ask("A", {Gpu("n1", 0)})).allowed);
  clock_.Advance(absl::Seconds(15));
  claims_.Fail(absl::UnavailableError("apiserver down"));
  absl::Status s = lender().ReleaseClaimIfDeallocated("A");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("stay held"));
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "claim A");
  EXPECT_FALSE(lender().Releasing("A"));
  claims_.Fail(absl::OkStatus());
  EXPECT_TRUE(lender().ReleaseClaimIfDeallocated("A").ok());
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "lend");
}

// Release step 2 waits for an admission of the claim still in flight (its
// durability wait) before it reads, and the grace after it.
TEST_F(LenderTest, ReleaseWaitsOutTheClaimsAdmissionInFlight) {
  options_.admission_grace = absl::ZeroDuration();
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 2).ok());
  ASSERT_TRUE(lender().Review(Ask("A", {Gpu("n1", 0)})).allowed);
  absl::Mutex mu;
  bool in_wait = false;
  bool go = false;
  on_durable_ = [&] {
    absl::MutexLock lock(&mu);
    in_wait = true;
    mu.Await(absl::Condition(&go));
  };
  // A retry of A's write, in flight.
  AdmissionVerdict retry;
  std::thread admission([&] { retry = lender().Review(Ask("A", {Gpu("n1", 0)})); });
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(&in_wait));
  }
  events_.Clear();
  absl::Status result;
  std::thread release([&] { result = lender().ReleaseClaimIfDeallocated("A"); });
  ASSERT_TRUE(clock_.AwaitSleepers(1));
  EXPECT_TRUE(events_.Get().empty());
  claims_.Set(Ref("A"), Dra({Gpu("n1", 0)}));  // the write lands
  {
    absl::MutexLock lock(&mu);
    go = true;
  }
  admission.join();
  release.join();
  EXPECT_TRUE(retry.allowed);
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_THAT(events_.Get(), ElementsAre("get ns/claim-A"));
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "claim A");
}

// ---------------------------------------------------------------------------
// Lending and reclaiming

TEST_F(LenderTest, LendMakesOneJobPerGpuThenDeletesTheirRules) {
  absl::StatusOr<std::vector<LedgerDevice>> lent = lender().Lend("n1", DeviceKind::kGpu, 2);
  ASSERT_TRUE(lent.ok()) << lent.status();
  EXPECT_EQ(lent->size(), 2u);
  EXPECT_THAT(events_.Get(), ElementsAre("lend 100", "lend 101", "untaint n1/gpu-0",
                                         "untaint n1/gpu-1"));
  EXPECT_THAT(Metrics(), HasSubstr("duet_dra_lends_total 2"));
}

// An 8-GPU node of its own pool for the concurrency cases (`gpus` GPUs).
void AddBigNode(Ledger* ledger, FakeMap* map, LenderOptions* options, uint32_t gpus) {
  map->nodes["big"] = {DeviceKind::kGpu, gpus};
  ASSERT_TRUE(ledger->UpsertNode(Node("big", DeviceKind::kGpu, gpus)).ok());
  options->pool_of = [](const std::string& node) -> std::string {
    return node == "big" ? "big-pool" : "";
  };
}

TEST_F(LenderTest, LendAsksForItsLendJobsAtOnce) {
  AddBigNode(&ledger_, &map_, &options_, 8);
  // Each CreateLend waits until all 8 are in flight: one at a time, the
  // first would wait for the others until the gate's timeout.
  fakes::Gate gate(8);
  lends_.on_create = [&gate] {
    gate.Arrive();
    return absl::OkStatus();
  };
  absl::StatusOr<std::vector<LedgerDevice>> lent = lender().Lend("big", DeviceKind::kGpu, 8);
  EXPECT_FALSE(gate.timed_out()) << "the 8 lend jobs were not asked for at once";
  ASSERT_TRUE(lent.ok()) << lent.status();
  ASSERT_EQ(lent->size(), 8u);
  for (uint32_t i = 0; i < 8; ++i) {
    EXPECT_EQ((*lent)[i], (LedgerDevice{"big", DeviceKind::kGpu, i}));  // sorted
    EXPECT_EQ(HolderOf("big", DeviceKind::kGpu, i), "lend");
    EXPECT_EQ(rules_.rules().count(FakeMap::Dra({"big", DeviceKind::kGpu, i})), 0u);
  }
  EXPECT_EQ(ledger_.ListHoldings("big").size(), 8u);  // one lend job per GPU
  EXPECT_THAT(Metrics(), HasSubstr("duet_dra_lends_total 8"));
}

TEST_F(LenderTest, LendKeepsWhatItsOtherJobsLentWhenOneFailsAndAsksNoMore) {
  // 12 GPUs: a first group of 8 jobs at once, the third of which Slurm
  // refuses; the other 7 stay lent (as the jobs before a failure did one at
  // a time) and the remaining 4 are not asked for.
  AddBigNode(&ledger_, &map_, &options_, 12);
  for (uint32_t i = 0; i < 12; ++i) rules_.Put(FakeMap::Dra({"big", DeviceKind::kGpu, i}));
  fakes::Gate gate(8);
  lends_.on_create = [&gate] {
    return gate.Arrive() == 3 ? absl::UnavailableError("slurmctld: try again") : absl::OkStatus();
  };
  absl::StatusOr<std::vector<LedgerDevice>> lent = lender().Lend("big", DeviceKind::kGpu, 12);
  EXPECT_FALSE(gate.timed_out()) << "the first 8 lend jobs were not asked for at once";
  EXPECT_EQ(gate.arrived(), 8);  // at most 8 at once; none after the failed group
  ASSERT_TRUE(lent.ok()) << lent.status();
  ASSERT_EQ(lent->size(), 7u);
  std::set<LedgerDevice> held;
  for (const Holding& h : ledger_.ListHoldings("big")) {
    EXPECT_EQ(h.owner.kind, OwnerKind::kLend);
    for (const HeldDevice& d : h.devices) held.insert({"big", d.kind, d.index});
  }
  EXPECT_EQ(held, std::set<LedgerDevice>(lent->begin(), lent->end()));
  // The 7 lent devices' rules are gone; the other 5 keep theirs.
  for (uint32_t i = 0; i < 12; ++i) {
    const LedgerDevice d{"big", DeviceKind::kGpu, i};
    EXPECT_EQ(rules_.rules().count(FakeMap::Dra(d)), held.count(d) ? 0u : 1u) << i;
  }
  EXPECT_THAT(Metrics(), HasSubstr("duet_dra_lends_total 7"));
}

TEST_F(LenderTest, LendWhoseJobsAllFailReturnsTheFailureAndLendsNothing) {
  AddBigNode(&ledger_, &map_, &options_, 8);
  for (uint32_t i = 0; i < 8; ++i) rules_.Put(FakeMap::Dra({"big", DeviceKind::kGpu, i}));
  lends_.on_create = [] { return absl::UnavailableError("slurmctld unreachable"); };
  absl::StatusOr<std::vector<LedgerDevice>> lent = lender().Lend("big", DeviceKind::kGpu, 8);
  EXPECT_EQ(lent.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(ledger_.ListHoldings("big").empty());
  EXPECT_EQ(rules_.rules().size(), 8u);
  EXPECT_THAT(events_.Get(), ::testing::IsEmpty());
}

TEST_F(LenderTest, LendRefusesNodesThatDoNotLend) {
  absl::StatusOr<std::vector<LedgerDevice>> r = lender().Lend("mig", DeviceKind::kGpu, 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("mig_devices"));
  EXPECT_EQ(lender().Lend("other", DeviceKind::kGpu, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(events_.Get().empty());
}

TEST_F(LenderTest, ReclaimRunsItsStepsInOrder) {
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 1).ok());
  events_.Clear();
  const LedgerDevice gpu0{"n1", DeviceKind::kGpu, 0};
  absl::Status result;
  std::thread reclaim([&] { result = lender().Reclaim(gpu0); });
  // Step 3 waits on the clock: by then (1) the flag and (2) the rule are there,
  // and no LIST has been made.
  ASSERT_TRUE(clock_.AwaitSleepers(1));
  EXPECT_TRUE(lender().Reclaiming(gpu0));
  AdmissionVerdict v = lender().Review(Ask("late", {Gpu("n1", 0)}));
  EXPECT_FALSE(v.allowed);
  EXPECT_EQ(v.reason, kReasonReclaiming);
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "lend");
  EXPECT_THAT(events_.Get(), ElementsAre("taint n1/gpu-0"));
  clock_.Advance(absl::Seconds(15));
  reclaim.join();
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_THAT(events_.Get(), ElementsAre("taint n1/gpu-0", "list", "cancel 100"));
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "");
  EXPECT_FALSE(lender().Reclaiming(gpu0));
  EXPECT_THAT(Metrics(), HasSubstr("duet_dra_reclaims_total{result=\"done\"} 1"));
}

TEST_F(LenderTest, ReclaimWaitsTheGraceAfterTheLastAdmission) {
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 1).ok());
  clock_.Advance(absl::Seconds(20));
  // An admission touching gpu 0, 20 s after start, undone (its rebind could
  // not be made durable): gpu 0 is lent and free again.
  durable_error_ = absl::UnavailableError("journal: disk full");
  ASSERT_EQ(lender().Review(Ask("c1", {Gpu("n1", 0)})).reason, kReasonUnavailable);
  durable_error_ = absl::OkStatus();
  ASSERT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "lend");
  clock_.Advance(absl::Seconds(10));
  events_.Clear();
  absl::Status result;
  std::thread reclaim([&] { result = lender().Reclaim({"n1", DeviceKind::kGpu, 0}); });
  ASSERT_TRUE(clock_.AwaitSleepers(1));
  clock_.Advance(absl::Seconds(4));  // 14 s after the admission: still waiting
  ASSERT_TRUE(clock_.AwaitSleepers(1));
  EXPECT_EQ(events_.Find("list"), -1);
  clock_.Advance(absl::Seconds(1));
  reclaim.join();
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_THAT(events_.Get(), ElementsAre("taint n1/gpu-0", "list", "cancel 100"));
}

TEST_F(LenderTest, ReclaimAbortsWhenTheListShowsAClaimAndStaysLent) {
  options_.admission_grace = absl::ZeroDuration();
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 1).ok());
  events_.Clear();
  // A claim allocated gpu 0 that duet never admitted (the webhook bypassed).
  claims_.Set(ClaimRef{"rogue", "ns", "r"}, {FakeMap::Dra({"n1", DeviceKind::kGpu, 0})});
  absl::Status s = lender().Reclaim({"n1", DeviceKind::kGpu, 0});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("ns/r"));
  EXPECT_THAT(events_.Get(), ElementsAre("taint n1/gpu-0", "list", "untaint n1/gpu-0"));
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "lend");
  EXPECT_FALSE(lender().Reclaiming({"n1", DeviceKind::kGpu, 0}));
  EXPECT_TRUE(lender().Review(Ask("c1", {Gpu("n1", 0)})).allowed);  // un-flagged
  EXPECT_THAT(Metrics(), HasSubstr("duet_dra_reclaims_total{result=\"aborted\"} 1"));
}

TEST_F(LenderTest, ReclaimFailuresUnflagAndUntaint) {
  options_.admission_grace = absl::ZeroDuration();
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 1).ok());
  const LedgerDevice gpu0{"n1", DeviceKind::kGpu, 0};
  events_.Clear();
  claims_.Fail(absl::UnavailableError("apiserver down"));
  EXPECT_EQ(lender().Reclaim(gpu0).code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(events_.Get(), ElementsAre("taint n1/gpu-0", "list", "untaint n1/gpu-0"));
  EXPECT_FALSE(lender().Reclaiming(gpu0));
  claims_.Fail(absl::OkStatus());
  events_.Clear();
  rules_.FailTaint(absl::UnavailableError("rule write failed"));
  EXPECT_EQ(lender().Reclaim(gpu0).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(events_.Find("list"), -1);
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "lend");
  EXPECT_FALSE(lender().Reclaiming(gpu0));
  // Not lent and free: refused up front.
  rules_.FailTaint(absl::OkStatus());
  ASSERT_TRUE(lender().Review(Ask("c1", {Gpu("n1", 0)})).allowed);
  EXPECT_EQ(lender().Reclaim(gpu0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(lender().Reclaim({"n1", DeviceKind::kGpu, 3}).code(),
            absl::StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------------------------
// Warm buffer and rules

TEST_F(LenderTest, TickKeepsTheWarmBufferAndReclaimsIdleDevicesAboveIt) {
  options_.warm_buffer = 2;
  options_.admission_grace = absl::ZeroDuration();
  ASSERT_TRUE(lender().Tick().ok());
  int lent_gpus = 0;
  for (const Holding& h : ledger_.ListHoldings()) {
    if (h.owner.kind == OwnerKind::kLend && h.devices.front().kind == DeviceKind::kGpu) {
      lent_gpus += static_cast<int>(h.devices.size());
    }
  }
  EXPECT_EQ(lent_gpus, 2);  // gpu-pool's buffer
  EXPECT_EQ(HolderOf("t1", DeviceKind::kTpu, 0), "lend");  // tpu-pool: one host
  EXPECT_EQ(HolderOf("mig", DeviceKind::kGpu, 0), "");    // never lent
  // One more lent by demand: three lent, free in gpu-pool.
  ASSERT_TRUE(lender().Lend("n2", DeviceKind::kGpu, 1).ok());
  ASSERT_TRUE(lender().Tick().ok());  // idle clock starts for the new one
  events_.Clear();
  clock_.Advance(absl::Seconds(59));
  ASSERT_TRUE(lender().Tick().ok());
  EXPECT_EQ(events_.Find("cancel"), -1);
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(lender().Tick().ok());
  int cancels = 0;
  for (const std::string& e : events_.Get()) cancels += absl::StartsWith(e, "cancel") ? 1 : 0;
  EXPECT_EQ(cancels, 1);  // back down to the buffer, not below
}

// The index Tick walks instead of every node: the nodes with devices held by
// Lend or Claim owners, following each change.
TEST_F(LenderTest, TheIndexFollowsLendsAdmissionsReleasesAndReclaims) {
  options_.admission_grace = absl::ZeroDuration();
  EXPECT_THAT(lender().IndexedLentNodes(), ElementsAre());
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 2).ok());  // gpu 0, 1
  EXPECT_THAT(lender().IndexedLentNodes(), ElementsAre("n1"));
  EXPECT_EQ(lender().IndexedLent("n1"), 2u);
  // A Slurm job's devices are not lent.
  HoldRequest slurm;
  slurm.node = "n2";
  slurm.owner = Owner::SlurmJob(7);
  slurm.devices = {{DeviceKind::kGpu, 0, kWholeDevice}};
  ASSERT_TRUE(ledger_.Hold(slurm).ok());
  EXPECT_THAT(lender().IndexedLentNodes(), ElementsAre("n1"));
  // Admitted: the claim's now, still lent.
  ASSERT_TRUE(lender().Review(Ask("c1", {Gpu("n1", 0)})).allowed);
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "claim c1");
  EXPECT_EQ(lender().IndexedLent("n1"), 2u);
  // Released: back to its lend job.
  ASSERT_TRUE(lender().ReleaseClaimIfDeallocated("c1").ok());
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "lend");
  EXPECT_EQ(lender().IndexedLent("n1"), 2u);
  // Reclaimed one by one: the node leaves the index with the last.
  ASSERT_TRUE(lender().Reclaim({"n1", DeviceKind::kGpu, 0}).ok());
  EXPECT_EQ(lender().IndexedLent("n1"), 1u);
  ASSERT_TRUE(lender().Reclaim({"n1", DeviceKind::kGpu, 1}).ok());
  EXPECT_EQ(lender().IndexedLent("n1"), 0u);
  EXPECT_THAT(lender().IndexedLentNodes(), ElementsAre());
  // A TPU host lends and reclaims as one.
  ASSERT_TRUE(lender().Lend("t1", DeviceKind::kTpu, 1).ok());
  EXPECT_THAT(lender().IndexedLentNodes(), ElementsAre("t1"));
  EXPECT_EQ(lender().IndexedLent("t1"), 4u);
  ASSERT_TRUE(lender().Reclaim({"t1", DeviceKind::kTpu, 0}).ok());
  EXPECT_THAT(lender().IndexedLentNodes(), ElementsAre());
}

// Holdings a journal replay left before the Lender was made are indexed, so
// Tick still reclaims what idles above the buffer.
TEST_F(LenderTest, ALenderOverALedgerThatAlreadyLendsIndexesItsHoldings) {
  options_.admission_grace = absl::ZeroDuration();
  HoldRequest lend;
  lend.node = "n1";
  lend.owner = Owner::Lend(5, "n1");
  lend.devices = {{DeviceKind::kGpu, 0, kWholeDevice}};
  ASSERT_TRUE(ledger_.Hold(lend).ok());
  HoldRequest claim;
  claim.node = "n2";
  claim.owner = Owner::Claim(6, "c9", "ns", "claim-c9");
  claim.devices = {{DeviceKind::kGpu, 1, kWholeDevice}};
  ASSERT_TRUE(ledger_.Hold(claim).ok());
  EXPECT_THAT(lender().IndexedLentNodes(), ElementsAre("n1", "n2"));
  EXPECT_EQ(lender().IndexedLent("n1"), 1u);
  EXPECT_EQ(lender().IndexedLent("n2"), 1u);
  ASSERT_TRUE(lender().Tick().ok());  // idle since now (warm buffer 0)
  clock_.Advance(absl::Seconds(60));
  ASSERT_TRUE(lender().Tick().ok());
  EXPECT_NE(events_.Find("cancel 5"), -1);
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "");
  EXPECT_THAT(lender().IndexedLentNodes(), ElementsAre("n2"));
  ASSERT_TRUE(lender().Tick().ok());
  EXPECT_THAT(Metrics(), HasSubstr("duet_dra_lent_devices 1"));  // the claim's
}

// The claim index a release reads instead of every holding: per claim uid,
// its (node, lend job) holdings, following admissions and releases.
TEST_F(LenderTest, TheClaimIndexFollowsAdmissionsAndReleases) {
  options_.admission_grace = absl::ZeroDuration();
  using Place = std::pair<std::string, uint32_t>;
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 3).ok());  // jobs 100, 101, 102
  ASSERT_TRUE(lender().Lend("n2", DeviceKind::kGpu, 1).ok());  // job 103
  EXPECT_THAT(lender().IndexedClaim("c1"), ElementsAre());
  // A dry run and a refusal index nothing.
  AdmissionAsk dry = Ask("c1", {Gpu("n1", 0)});
  dry.dry_run = true;
  ASSERT_TRUE(lender().Review(dry).allowed);
  ASSERT_FALSE(lender().Review(Ask("c1", {Gpu("n1", 0), Gpu("n1", 3)})).allowed);
  EXPECT_THAT(lender().IndexedClaim("c1"), ElementsAre());
  // One claim on two nodes, through three lend jobs; another beside it.
  ASSERT_TRUE(lender().Review(Ask("c1", {Gpu("n1", 0), Gpu("n1", 1), Gpu("n2", 0)})).allowed);
  ASSERT_TRUE(lender().Review(Ask("c2", {Gpu("n1", 2)})).allowed);
  EXPECT_THAT(lender().IndexedClaim("c1"),
              ElementsAre(Place{"n1", 100}, Place{"n1", 101}, Place{"n2", 103}));
  EXPECT_THAT(lender().IndexedClaim("c2"), ElementsAre(Place{"n1", 102}));
  // A release that keeps what is still allocated keeps it indexed.
  claims_.Set(Ref("c1"), Dra({Gpu("n2", 0)}));
  ASSERT_TRUE(lender().ReleaseClaimIfDeallocated("c1").ok());
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "lend");
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 1), "lend");
  EXPECT_EQ(HolderOf("n2", DeviceKind::kGpu, 0), "claim c1");
  EXPECT_THAT(lender().IndexedClaim("c1"), ElementsAre(Place{"n2", 103}));
  EXPECT_THAT(lender().IndexedClaim("c2"), ElementsAre(Place{"n1", 102}));
  // Deleted: the rest goes back, and the claim leaves the index.
  claims_.Set(Ref("c1"), {});
  ASSERT_TRUE(lender().ReleaseClaimIfDeallocated("c1").ok());
  EXPECT_EQ(HolderOf("n2", DeviceKind::kGpu, 0), "lend");
  EXPECT_THAT(lender().IndexedClaim("c1"), ElementsAre());
  // A node leaving the inventory: its claim holding is released, not lent
  // back, and the node and claim leave the index with it.
  ASSERT_TRUE(ledger_.RemoveNode("n1").ok());
  EXPECT_THAT(lender().IndexedClaim("c2"), ElementsAre(Place{"n1", 102}));
  ASSERT_TRUE(lender().ReleaseClaimIfDeallocated("c2").ok());
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 2), "");
  EXPECT_THAT(lender().IndexedClaim("c2"), ElementsAre());
}

// Claim holdings a journal replay left before the Lender was made are
// indexed, so a release finds and gives them back.
TEST_F(LenderTest, ALenderOverALedgerThatAlreadyHoldsClaimsReleasesThem) {
  options_.admission_grace = absl::ZeroDuration();
  using Place = std::pair<std::string, uint32_t>;
  for (const auto& [node, job, index] :
       {std::tuple<const char*, uint32_t, uint32_t>{"n1", 5, 0}, {"n1", 6, 1}, {"n2", 7, 1}}) {
    HoldRequest claim;
    claim.node = node;
    claim.owner = Owner::Claim(job, "c9", "ns", "claim-c9");
    claim.devices = {{DeviceKind::kGpu, index, kWholeDevice}};
    ASSERT_TRUE(ledger_.Hold(claim).ok());
  }
  EXPECT_THAT(lender().IndexedClaim("c9"),
              ElementsAre(Place{"n1", 5}, Place{"n1", 6}, Place{"n2", 7}));
  // The quorum read by the name the holdings carry: it still allocates n1's.
  claims_.Set(Ref("c9"), Dra({Gpu("n1", 0), Gpu("n1", 1)}));
  events_.Clear();
  ASSERT_TRUE(lender().ReleaseClaimIfDeallocated("c9").ok());
  EXPECT_THAT(events_.Get(), ElementsAre("get ns/claim-c9"));
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "claim c9");
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 1), "claim c9");
  EXPECT_EQ(HolderOf("n2", DeviceKind::kGpu, 1), "lend");
  EXPECT_THAT(lender().IndexedClaim("c9"), ElementsAre(Place{"n1", 5}, Place{"n1", 6}));
  claims_.Set(Ref("c9"), {});
  ASSERT_TRUE(lender().ReleaseClaimIfDeallocated("c9").ok());
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 0), "lend");
  EXPECT_EQ(HolderOf("n1", DeviceKind::kGpu, 1), "lend");
  EXPECT_THAT(lender().IndexedClaim("c9"), ElementsAre());
}

// A node that joins after the Lender was made lends through the warm buffer
// (its pool is asked again), and one that leaves is forgotten.
TEST_F(LenderTest, TheWarmBufferLendsOnNodesThatJoinLater) {
  options_.warm_buffer = 1;
  options_.pool_of = [](const std::string& node) -> std::string {
    return node == "late" ? "late-pool" : "";
  };
  ASSERT_TRUE(lender().Tick().ok());
  EXPECT_THAT(lender().IndexedLentNodes(), ElementsAre());
  map_.nodes["late"] = {DeviceKind::kGpu, 2};
  ASSERT_TRUE(ledger_.UpsertNode(Node("late", DeviceKind::kGpu, 2)).ok());
  ASSERT_TRUE(lender().Tick().ok());
  EXPECT_THAT(lender().IndexedLentNodes(), ElementsAre("late"));
  EXPECT_EQ(lender().IndexedLent("late"), 1u);
}

TEST_F(LenderTest, DesiredTaintedIsEveryDeviceNotLentFreeAndNotAllocated) {
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 2).ok());
  ASSERT_TRUE(lender().Review(Ask("c1", {Gpu("n1", 1)})).allowed);
  std::vector<std::string> names;
  for (const DraDevice& d : lender().DesiredTainted()) names.push_back(d.pool + "/" + d.device);
  // n1: gpu-0 lent free, gpu-1 allocated; mig and other lend nothing.
  EXPECT_THAT(names, ElementsAre("n1/gpu-2", "n1/gpu-3", "n2/gpu-0", "n2/gpu-1", "t1/accel0",
                                 "t1/accel1", "t1/accel2", "t1/accel3"));
  ASSERT_TRUE(lender().Resync().ok());
  EXPECT_EQ(rules_.resynced().size(), names.size());
}

// The rules' reconcile (docs/dra.md, "DeviceTaintRules"): the first pass is
// a full one and fixes everything.
TEST_F(LenderTest, TheFirstRulePassIsFullAndFixesEveryRule) {
  rules_.Put(DraDevice{kGpuDriver, "n1", "gpu-9"});     // a stray rule
  rules_.Put(DraDevice{kGpuDriver, "other", "gpu-0"});  // a node that does not lend
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 1).ok());  // n1/gpu-0 untainted
  ASSERT_TRUE(lender().ReconcileRules().ok());
  EXPECT_EQ(rules_.resyncs(), 1);
  EXPECT_THAT(rules_.TakePools(), ElementsAre());
  const std::vector<DraDevice> want = lender().DesiredTainted();
  EXPECT_EQ(rules_.rules(), std::set<DraDevice>(want.begin(), want.end()));
  EXPECT_EQ(rules_.rules().count(FakeMap::Dra({"n1", DeviceKind::kGpu, 0})), 0u);
  EXPECT_EQ(lender().rule_stats().full, 1u);
  EXPECT_THAT(lender().DirtyNodes(), ElementsAre());
  // A relist of the rules' watch makes the next pass a full one again.
  rules_.Relist();
  ASSERT_TRUE(lender().ReconcileRules().ok());
  EXPECT_EQ(rules_.resyncs(), 2);
}

// A rule deleted behind duet's back (the watch reports it) is made again by
// the incremental pass, which looks at that node only.
TEST_F(LenderTest, ARuleDeletedBehindDuetsBackIsRestoredByTheIncrementalPass) {
  ASSERT_TRUE(lender().ReconcileRules().ok());  // the full one
  const DraDevice gone = FakeMap::Dra({"n2", DeviceKind::kGpu, 1});
  rules_.DeleteBehindDuetsBack(gone);
  EXPECT_THAT(lender().DirtyNodes(), ElementsAre("n2"));
  ASSERT_TRUE(lender().ReconcileRules().ok());
  EXPECT_EQ(rules_.rules().count(gone), 1u);
  EXPECT_THAT(rules_.TakePools(), ElementsAre("n2"));
  EXPECT_EQ(rules_.resyncs(), 1);  // no full pass
  EXPECT_EQ(lender().rule_stats().incremental, 1u);
  EXPECT_EQ(lender().rule_stats().nodes, 1u);
  const std::vector<DraDevice> want = lender().DesiredTainted();
  EXPECT_EQ(rules_.rules(), std::set<DraDevice>(want.begin(), want.end()));
}

// With nothing dirty a pass calls nothing: no RuleWriter call, no look at
// the map (the per-node work), whatever the cluster's size.
TEST_F(LenderTest, ACleanRulePassCallsNothing) {
  ASSERT_TRUE(lender().ReconcileRules().ok());  // the full one
  ASSERT_TRUE(lender().ReconcileRules().ok());
  rules_.TakePools();
  const int resyncs = rules_.resyncs();
  const int map_calls = map_.calls.load();
  const std::vector<std::string> events = events_.Get();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(lender().ReconcileRules().ok());
  EXPECT_THAT(rules_.TakePools(), ElementsAre());
  EXPECT_EQ(rules_.resyncs(), resyncs);
  EXPECT_EQ(map_.calls.load(), map_calls);
  EXPECT_EQ(events_.Get(), events);
  EXPECT_EQ(lender().rule_stats().incremental, 0u);
}

// Ledger changes (a lend, an admission), a reclaim's flag and MarkRulesDirty
// mark exactly their nodes; a failed node pass keeps its node dirty.
TEST_F(LenderTest, TheIncrementalPassFollowsLedgerChangesAndRetriesFailures) {
  ASSERT_TRUE(lender().ReconcileRules().ok());
  ASSERT_TRUE(lender().Lend("n1", DeviceKind::kGpu, 2).ok());
  EXPECT_THAT(lender().DirtyNodes(), ElementsAre("n1"));
  // A rule the lend deleted, made again by someone: the pass deletes it.
  rules_.Put(FakeMap::Dra({"n1", DeviceKind::kGpu, 1}));
  ASSERT_TRUE(lender().ReconcileRules().ok());
  EXPECT_THAT(rules_.TakePools(), ElementsAre("n1"));
  EXPECT_EQ(rules_.rules().count(FakeMap::Dra({"n1", DeviceKind::kGpu, 1})), 0u);
  lender().MarkRulesDirty({"n2", "t1"});
  rules_.FailPools(absl::UnavailableError("apiserver down"));
  absl::Status s = lender().ReconcileRules();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(lender().DirtyNodes(), ElementsAre("n2", "t1"));
  rules_.FailPools(absl::OkStatus());
  ASSERT_TRUE(lender().ReconcileRules().ok());
  EXPECT_THAT(lender().DirtyNodes(), ElementsAre());
  const std::vector<DraDevice> want = lender().DesiredTainted();
  EXPECT_EQ(rules_.rules(), std::set<DraDevice>(want.begin(), want.end()));
}

// ---------------------------------------------------------------------------
// I1 under a race: claims allocate and free gpu 0 while reclaims take it back
// and "Slurm" runs a job on it in between. A claim is never admitted while
// the device is anyone else's, and no reclaim cancels while a claim holds it.

TEST(LenderRaceTest, ReviewsAndReclaimsNeverGiveOneDeviceToTwo) {
  Ledger ledger;
  Events events;
  FakeMap map;
  map.nodes["n1"] = {DeviceKind::kGpu, 1};
  ASSERT_TRUE(ledger.UpsertNode(Node("n1", DeviceKind::kGpu, 1)).ok());
  FakeRules rules(&events);
  FakeClaims claims(&events);
  FakeLends lends(&ledger, &events);
  LenderOptions options;
  options.admission_grace = absl::ZeroDuration();
  options.pool_of = [](const std::string&) { return std::string("p"); };
  Lender lender(&ledger, &lends, &map, &rules, &claims, nullptr, Clock::Real(), options);

  std::atomic<bool> stop{false};
  std::atomic<int> violations{0};
  std::atomic<int> admitted{0};
  std::atomic<int> reclaimed{0};
  std::thread claimer([&] {
    for (int i = 0; !stop; ++i) {
      const std::string uid = absl::StrCat("c", i);
      if (!lender.Review(Ask(uid, {Gpu("n1", 0)})).allowed) continue;
      ++admitted;
      // Kubernetes now shows the allocation; the ledger must say it is ours.
      claims.Set(ClaimRef{uid, "ns", uid}, {FakeMap::Dra({"n1", DeviceKind::kGpu, 0})});
      bool ours = false;
      for (const Holding& h : ledger.ListHoldings("n1")) {
        ours = ours || (h.owner.kind == OwnerKind::kClaim && h.owner.pod_uid == uid);
        if (h.owner.holder_class() == HolderClass::kSlurm) ++violations;
      }
      if (!ours) ++violations;
      // Deallocated: the fenced release gives the device back.
      claims.Remove(uid);
      if (!lender.ReleaseClaimIfDeallocated(uid).ok()) ++violations;
    }
  });
  std::thread reclaimer([&] {
    for (uint32_t job = 1; !stop; ++job) {
      (void)lender.Lend("n1", DeviceKind::kGpu, 1);
      if (lender.Reclaim({"n1", DeviceKind::kGpu, 0}).ok()) {
        ++reclaimed;
        // Slurm gives the device to a job, which ends.
        HoldRequest r;
        r.node = "n1";
        r.owner = Owner::SlurmJob(job);
        r.devices = {{DeviceKind::kGpu, 0, 0}};
        if (!ledger.Hold(r).ok()) ++violations;
        (void)ledger.Release("n1", r.owner);
      }
    }
  });
  ASSERT_TRUE(fakes::WaitFor([&] { return admitted > 200 && reclaimed > 200; },
                             fakes::kWaitTimeout, "admissions and reclaims to interleave"));
  stop = true;
  claimer.join();
  reclaimer.join();
  EXPECT_EQ(violations, 0);
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

}  // namespace
}  // namespace dra
}  // namespace duet
