// TaintRules and DetectRuleApi against tests/fakes/fake_apiserver.py posing as
// Kubernetes 1.37 (resource.k8s.io/v1 devicetaintrules) and 1.36
// (v1beta2 behind the DRADeviceTaints gate; absent without it), so the
// version choice and the apiserver's validation of names and rules are real.

#include "k8s_adapter/dra/taint_rules.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "tests/fakes/wait.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace k8s_dra {
namespace {

using json = nlohmann::json;
using k8s::testing::FakeApiServer;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

const dra::DraDevice kGpu0{"gpu.nvidia.com", "gpu-node-1", "gpu-0"};
const dra::DraDevice kGpu1{"gpu.nvidia.com", "gpu-node-1", "gpu-1"};
const dra::DraDevice kAccel0{"tpu.google.com", "tpu-node-1", "accel0"};

// The names of the DeviceTaintRules stored at `version`.
std::vector<std::string> RuleNames(FakeApiServer& api, const std::string& version) {
  absl::StatusOr<std::string> body =
      api.control()->Get(absl::StrCat("/apis/resource.k8s.io/", version, "/devicetaintrules"));
  EXPECT_TRUE(body.ok()) << body.status();
  std::vector<std::string> names;
  if (!body.ok()) return names;
  const json list = json::parse(*body);
  for (const json& item : list["items"]) names.push_back(item["metadata"]["name"]);
  return names;
}

json GetRule(FakeApiServer& api, const std::string& version, const std::string& name) {
  absl::StatusOr<std::string> body = api.control()->Get(
      absl::StrCat("/apis/resource.k8s.io/", version, "/devicetaintrules/", name));
  EXPECT_TRUE(body.ok()) << body.status();
  return body.ok() ? json::parse(*body) : json();
}

TEST(DetectRuleApiTest, V1On137V1beta2On136WithTheGateElseRefused) {
  FakeApiServer v137({"--kube-version", "1.37"});
  ASSERT_TRUE(v137.ok());
  EXPECT_EQ(DetectRuleApi(v137.control()).value_or("error"), "v1");
  FakeApiServer v136({"--kube-version", "1.36", "--feature-gates", "DRADeviceTaints=true"});
  ASSERT_TRUE(v136.ok());
  EXPECT_EQ(DetectRuleApi(v136.control()).value_or("error"), "v1beta2");
  FakeApiServer off({"--kube-version", "1.36"});
  ASSERT_TRUE(off.ok());
  absl::StatusOr<std::string> s = DetectRuleApi(off.control());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("DRADeviceTaints"));
}

class TaintRulesTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string v = GetParam();
    api_ = std::make_unique<FakeApiServer>(
        v == "v1" ? std::vector<std::string>{"--kube-version", "1.37"}
                  : std::vector<std::string>{"--kube-version", "1.36", "--feature-gates",
                                             "DRADeviceTaints=true"});
    ASSERT_TRUE(api_->ok());
    TaintRulesOptions o;
    o.api_version = v;
    o.registry = &registry_;
    rules_ = std::make_unique<TaintRules>(api_->control(), o);
  }
  std::string version() const { return GetParam(); }
  absl::StatusCode ResyncPoolOfAnotherPool() {
    return rules_->ResyncPool("gpu-node-1", {kAccel0}).code();
  }

  prometheus::Registry registry_;
  std::unique_ptr<FakeApiServer> api_;
  std::unique_ptr<TaintRules> rules_;
};

TEST_P(TaintRulesTest, TaintWritesOneRuleWithTheWholeSelector) {
  ASSERT_TRUE(rules_->Taint({kGpu0, kAccel0}).ok());
  EXPECT_THAT(RuleNames(*api_, version()),
              UnorderedElementsAre("duet-gpu-node-1-gpu-0", "duet-tpu-node-1-accel0"));
  json rule = GetRule(*api_, version(), "duet-gpu-node-1-gpu-0");
  EXPECT_EQ(rule["apiVersion"], "resource.k8s.io/" + version());
  EXPECT_EQ(rule["metadata"]["labels"]["app.kubernetes.io/managed-by"], "duet");
  EXPECT_EQ(rule["spec"]["deviceSelector"],
            (json{{"driver", "gpu.nvidia.com"}, {"pool", "gpu-node-1"}, {"device", "gpu-0"}}));
  EXPECT_EQ(rule["spec"]["taint"]["key"], "duet.dev/not-lent");
  EXPECT_EQ(rule["spec"]["taint"]["effect"], "NoSchedule");
  EXPECT_EQ(rules_->creates(), 2u);
  // Idempotent: the 409 is success and writes nothing.
  ASSERT_TRUE(rules_->Taint({kGpu0}).ok());
  EXPECT_EQ(rules_->creates(), 2u);
  EXPECT_EQ(RuleNames(*api_, version()).size(), 2u);
}

TEST_P(TaintRulesTest, UntaintDeletesAndAMissingRuleIsFine) {
  ASSERT_TRUE(rules_->Taint({kGpu0, kGpu1}).ok());
  ASSERT_TRUE(rules_->Untaint({kGpu0}).ok());
  EXPECT_THAT(RuleNames(*api_, version()), UnorderedElementsAre("duet-gpu-node-1-gpu-1"));
  ASSERT_TRUE(rules_->Untaint({kGpu0}).ok());
  EXPECT_EQ(rules_->deletes(), 1u);
  const std::string text = prometheus::TextSerializer().Serialize(registry_.Collect());
  EXPECT_THAT(text, HasSubstr("duet_dra_rule_writes_total{op=\"create\"} 2"));
  EXPECT_THAT(text, HasSubstr("duet_dra_rule_writes_total{op=\"delete\"} 1"));
}

TEST_P(TaintRulesTest, AnEmptySelectorFieldIsRefusedAndNothingIsWritten) {
  for (const dra::DraDevice& bad : {dra::DraDevice{"", "p", "d"}, dra::DraDevice{"x", "", "d"},
                                    dra::DraDevice{"x", "p", ""}}) {
    EXPECT_EQ(rules_->Taint({kGpu0, bad}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(rules_->Resync({bad}).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(rules_->Untaint({bad}).code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(RuleNames(*api_, version()).empty());
  EXPECT_EQ(rules_->creates(), 0u);
}

TEST_P(TaintRulesTest, ResyncCreatesTheMissingAndDeletesTheRestOfDuets) {
  ASSERT_TRUE(rules_->Taint({kGpu0, kGpu1}).ok());
  // Not duet's (no managed-by label): left alone.
  json foreign = {{"apiVersion", "resource.k8s.io/" + version()},
                  {"kind", "DeviceTaintRule"},
                  {"metadata", {{"name", "someone-elses"}}},
                  {"spec",
                   {{"deviceSelector", {{"driver", "x.example.com"}, {"pool", "p"}, {"device", "d"}}},
                    {"taint", {{"key", "example.com/maintenance"}, {"effect", "NoSchedule"}}}}}};
  const std::string coll = absl::StrCat("/apis/resource.k8s.io/", version(), "/devicetaintrules");
  ASSERT_TRUE(api_->control()->Post(coll, foreign.dump()).ok());
  // Duet's, but with the wrong taint: rewritten.
  json drifted = rules_->RuleObject(kAccel0);
  drifted["spec"]["taint"]["effect"] = "None";
  ASSERT_TRUE(api_->control()->Post(coll, drifted.dump()).ok());

  ASSERT_TRUE(rules_->Resync({kGpu1, kAccel0}).ok());
  EXPECT_THAT(RuleNames(*api_, version()),
              UnorderedElementsAre("duet-gpu-node-1-gpu-1", "duet-tpu-node-1-accel0", "someone-elses"));
  EXPECT_EQ(GetRule(*api_, version(), "duet-tpu-node-1-accel0")["spec"]["taint"]["effect"],
            "NoSchedule");
  // gpu-0 deleted, the drifted rule deleted and made again.
  EXPECT_EQ(rules_->deletes(), 2u);
  EXPECT_EQ(rules_->creates(), 3u);
  // Nothing to do: no writes.
  ASSERT_TRUE(rules_->Resync({kGpu1, kAccel0}).ok());
  EXPECT_EQ(rules_->deletes(), 2u);
  EXPECT_EQ(rules_->creates(), 3u);
}

TEST_P(TaintRulesTest, OddAndLongNamesAreMadeSafeAndStayDistinct) {
  const dra::DraDevice upper{"gpu.nvidia.com", "Node_A.example", "gpu-0"};
  const dra::DraDevice lower{"gpu.nvidia.com", "node-a-example", "gpu-0"};
  const dra::DraDevice long_pool{"gpu.nvidia.com", std::string(300, 'n'), "gpu-0"};
  const std::string a = TaintRules::RuleName(upper);
  EXPECT_NE(a, TaintRules::RuleName(lower));
  EXPECT_EQ(a, TaintRules::RuleName(upper));  // deterministic
  EXPECT_LE(TaintRules::RuleName(long_pool).size(), 253u);
  EXPECT_NE(TaintRules::RuleName(long_pool),
            TaintRules::RuleName({"gpu.nvidia.com", std::string(300, 'n'), "gpu-1"}));
  // The apiserver takes them (its name validation is the real one's).
  ASSERT_TRUE(rules_->Taint({upper, lower, long_pool}).ok());
  EXPECT_EQ(RuleNames(*api_, version()).size(), 3u);
}

TEST_P(TaintRulesTest, ANameHeldByAnotherDevicesRuleIsAnError) {
  json other = rules_->RuleObject(kGpu1);
  other["metadata"]["name"] = TaintRules::RuleName(kGpu0);
  ASSERT_TRUE(api_->control()
                  ->Post(absl::StrCat("/apis/resource.k8s.io/", version(), "/devicetaintrules"),
                         other.dump())
                  .ok());
  absl::Status s = rules_->Taint({kGpu0});
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(s.message()), HasSubstr("gpu-1"));
}

// What the watch reported.
class DriftLog : public dra::RuleDriftListener {
 public:
  void OnRuleDrift(const dra::DraDevice& device) override {
    absl::MutexLock lock(&mu_);
    drift_.push_back(device.ToString());
  }
  void OnRulesRelisted() override {
    absl::MutexLock lock(&mu_);
    ++relists_;
  }
  std::vector<std::string> drift() {
    absl::MutexLock lock(&mu_);
    return drift_;
  }
  int relists() {
    absl::MutexLock lock(&mu_);
    return relists_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> drift_ ABSL_GUARDED_BY(mu_);
  int relists_ ABSL_GUARDED_BY(mu_) = 0;
};

// The API requests that are not the watch's, from request `from` on.
std::vector<std::string> Requests(FakeApiServer& api, size_t from) {
  std::vector<std::string> out;
  const json all = api.Requests();
  for (size_t i = from; i < all.size(); ++i) {
    const std::string path = all[i].value("path", "");
    if (path.find("watch=") != std::string::npos) continue;
    out.push_back(all[i].value("method", "") + " " + path);
  }
  return out;
}

// The watch keeps the cache: a rule deleted or edited behind duet's back is
// reported with its device, duet's own writes are not, and ResyncPool puts
// the pool right from the cache, writing only the difference and listing
// nothing.
TEST_P(TaintRulesTest, TheWatchReportsDriftAndResyncPoolRestoresItWithoutAList) {
  ASSERT_TRUE(rules_->Taint({kGpu0, kAccel0}).ok());
  ASSERT_TRUE(rules_->Untaint({kAccel0}).ok());
  DriftLog log;
  rules_->SetDriftListener(&log);
  ASSERT_TRUE(rules_->StartWatch().ok());
  EXPECT_EQ(log.relists(), 1);
  EXPECT_EQ(rules_->cached(), 1u);
  ASSERT_TRUE(rules_->Taint({kGpu1}).ok());  // duet's own: no drift
  const std::string coll = absl::StrCat("/apis/resource.k8s.io/", version(), "/devicetaintrules");
  // Someone deletes gpu-0's rule and edits gpu-1's taint.
  ASSERT_TRUE(api_->control()->Delete(absl::StrCat(coll, "/duet-gpu-node-1-gpu-0")).ok());
  json edited = GetRule(*api_, version(), "duet-gpu-node-1-gpu-1");
  edited["spec"]["taint"]["effect"] = "None";
  ASSERT_TRUE(api_->control()->Put(absl::StrCat(coll, "/duet-gpu-node-1-gpu-1"), edited.dump()).ok());
  // (Each reported once; the watch event of duet's own create of gpu-1 may
  // race the cache's update and report gpu-1 once more, which is harmless,
  // but before gpu-0's delete: the edit is in the cache once gpu-1 is
  // reported after gpu-0.)
  auto reported = [&] {
    const std::vector<std::string> d = log.drift();
    return std::set<std::string>(d.begin(), d.end());
  };
  ASSERT_TRUE(fakes::WaitFor([&] {
    const std::vector<std::string> d = log.drift();
    const auto gpu0 = std::find(d.begin(), d.end(), kGpu0.ToString());
    return gpu0 != d.end() && std::find(gpu0 + 1, d.end(), kGpu1.ToString()) != d.end();
  }));
  EXPECT_EQ(reported(), (std::set<std::string>{kGpu0.ToString(), kGpu1.ToString()}));

  const size_t before = api_->Requests().size();
  ASSERT_TRUE(rules_->ResyncPool("gpu-node-1", {kGpu0, kGpu1}).ok());
  // gpu-1 deleted and made again, gpu-0 made again; no LIST.
  EXPECT_THAT(Requests(*api_, before),
              ::testing::ElementsAre(absl::StrCat("DELETE ", coll, "/duet-gpu-node-1-gpu-1"),
                                     absl::StrCat("POST ", coll), absl::StrCat("POST ", coll)));
  EXPECT_THAT(RuleNames(*api_, version()),
              UnorderedElementsAre("duet-gpu-node-1-gpu-0", "duet-gpu-node-1-gpu-1"));
  EXPECT_EQ(GetRule(*api_, version(), "duet-gpu-node-1-gpu-1")["spec"]["taint"]["effect"],
            "NoSchedule");
  // In step: nothing to write, nothing sent; another pool is left alone.
  const size_t after = api_->Requests().size();
  ASSERT_TRUE(rules_->ResyncPool("gpu-node-1", {kGpu0, kGpu1}).ok());
  ASSERT_TRUE(rules_->ResyncPool("tpu-node-1", {}).ok());
  EXPECT_THAT(Requests(*api_, after), ::testing::ElementsAre());
  // The full Resync reads the cache too: no LIST.
  ASSERT_TRUE(rules_->Resync({kGpu0}).ok());
  EXPECT_EQ(rules_->lists(), 0u);
  EXPECT_THAT(RuleNames(*api_, version()), UnorderedElementsAre("duet-gpu-node-1-gpu-0"));
  EXPECT_EQ(ResyncPoolOfAnotherPool(), absl::StatusCode::kInvalidArgument);
  rules_->StopWatch();
}

// Without a watch, ResyncPool needs a view first (a Resync's LIST), and
// then keeps it with its own writes.
TEST_P(TaintRulesTest, WithoutAWatchResyncPoolWorksFromTheLastResync) {
  EXPECT_EQ(rules_->ResyncPool("gpu-node-1", {kGpu0}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(RuleNames(*api_, version()).empty());
  ASSERT_TRUE(rules_->Resync({kGpu0}).ok());
  EXPECT_EQ(rules_->lists(), 1u);
  ASSERT_TRUE(rules_->ResyncPool("gpu-node-1", {kGpu1}).ok());
  EXPECT_THAT(RuleNames(*api_, version()), UnorderedElementsAre("duet-gpu-node-1-gpu-1"));
  EXPECT_EQ(rules_->lists(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Versions, TaintRulesTest, ::testing::Values("v1", "v1beta2"));

}  // namespace
}  // namespace k8s_dra
}  // namespace duet
