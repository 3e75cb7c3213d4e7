// The webhook end to end: tests/fakes/fake_apiserver.py (Kubernetes 1.37)
// calls WebhookServer over HTTPS, verifying it against the caBundle, for
// writes to resourceclaims/status. The gate's allow and refusal reach the
// writer; with the webhook down, failurePolicy Fail refuses the write.

#include "k8s_adapter/dra/webhook.h"

#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace k8s_dra {
namespace {

using json = nlohmann::json;
using k8s::testing::FakeApiServer;
using ::testing::HasSubstr;

constexpr char kClaims[] = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims";

class StubGate : public dra::AdmissionGate {
 public:
  dra::AdmissionVerdict Review(const dra::AdmissionAsk& ask) override {
    std::lock_guard<std::mutex> lock(mu);
    asks.push_back(ask);
    return verdict;
  }
  std::mutex mu;
  std::vector<dra::AdmissionAsk> asks;
  dra::AdmissionVerdict verdict{true, "", ""};
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json Allocation(const std::string& device) {
  return {{"devices",
           {{"results",
             {{{"request", "gpu"}, {"driver", "gpu.nvidia.com"}, {"pool", "gpu-node-1"},
               {"device", device}}}}}},
          {"nodeSelector",
           {{"nodeSelectorTerms",
             {{{"matchFields",
                {{{"key", "metadata.name"}, {"operator", "In"}, {"values", {"gpu-node-1"}}}}}}}}}}};
}

class WebhookTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = k8s::testing::MakeTempDir();
    tls_ = k8s::testing::MakeTestCerts(dir_);
    api_ = std::make_unique<FakeApiServer>(std::vector<std::string>{"--kube-version", "1.37"});
    ASSERT_TRUE(api_->ok());
    WebhookOptions o;
    o.cert_file = tls_.cert;
    o.key_file = tls_.key;
    o.registry = &registry_;
    absl::StatusOr<std::unique_ptr<WebhookServer>> s = WebhookServer::Start(&gate_, o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    // The configuration the chart installs, pointing at this server.
    json hook = {
        {"name", "resourceclaims.dra.duet.dev"},
        {"clientConfig",
         {{"url", absl::StrCat("https://127.0.0.1:", server_->port(), kAdmissionPath)},
          {"caBundle", absl::Base64Escape(ReadFile(tls_.ca))}}},
        {"rules",
         {{{"apiGroups", {"resource.k8s.io"}},
           {"apiVersions", {"*"}},
           {"operations", {"UPDATE"}},
           {"resources", {"resourceclaims/status"}}}}},
        {"failurePolicy", "Fail"},
        {"sideEffects", "NoneOnDryRun"},
        {"admissionReviewVersions", {"v1"}},
        {"timeoutSeconds", 10}};
    json config = {{"apiVersion", "admissionregistration.k8s.io/v1"},
                   {"kind", "ValidatingWebhookConfiguration"},
                   {"metadata", {{"name", "duet-dra-lending"}}},
                   {"webhooks", {hook}}};
    absl::StatusOr<std::string> made = api_->control()->Post(
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", config.dump());
    ASSERT_TRUE(made.ok()) << made.status();
    json claim = {{"apiVersion", "resource.k8s.io/v1"},
                  {"kind", "ResourceClaim"},
                  {"metadata", {{"name", "train-gpu"}, {"namespace", "default"}}},
                  {"spec",
                   {{"devices",
                     {{"requests",
                       {{{"name", "gpu"}, {"exactly", {{"deviceClassName", "gpu.nvidia.com"}}}}}}}}}}};
    absl::StatusOr<std::string> c = api_->control()->Post(kClaims, claim.dump());
    ASSERT_TRUE(c.ok()) << c.status();
    claim_ = json::parse(*c);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Stop();
    k8s::testing::RemoveTree(dir_);
  }

  // What kube-scheduler's PreBind does: the allocation through /status.
  absl::StatusOr<std::string> Allocate(const std::string& device) {
    json c = claim_;
    c["status"] = {{"allocation", Allocation(device)}};
    return api_->control()->Put(absl::StrCat(kClaims, "/train-gpu/status"), c.dump());
  }
  json Stored() {
    return json::parse(api_->control()->Get(absl::StrCat(kClaims, "/train-gpu")).value_or("{}"));
  }

  std::string dir_;
  k8s::testing::TlsFiles tls_;
  prometheus::Registry registry_;
  StubGate gate_;
  std::unique_ptr<FakeApiServer> api_;
  std::unique_ptr<WebhookServer> server_;
  json claim_;
};

TEST_F(WebhookTest, AnAllowedAllocationIsStored) {
  absl::StatusOr<std::string> r = Allocate("gpu-3");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Stored()["status"]["allocation"]["devices"]["results"][0]["device"], "gpu-3");
  ASSERT_EQ(gate_.asks.size(), 1u);
  const dra::AdmissionAsk& ask = gate_.asks[0];
  EXPECT_EQ(ask.claim.uid, claim_["metadata"]["uid"]);
  EXPECT_EQ(ask.claim.name, "train-gpu");
  EXPECT_EQ(ask.claim.ns, "default");
  EXPECT_EQ(ask.node, "gpu-node-1");
  ASSERT_EQ(ask.new_results.size(), 1u);
  EXPECT_EQ(ask.new_results[0].device, (dra::DraDevice{"gpu.nvidia.com", "gpu-node-1", "gpu-3"}));
  EXPECT_TRUE(ask.old_results.empty());
  EXPECT_FALSE(ask.dry_run);
}

TEST_F(WebhookTest, ARefusalReachesTheWriterAndNothingIsStored) {
  gate_.verdict = {false, "NOT_LENT", "gpu.nvidia.com/gpu-node-1/gpu-3 is not lent to Kubernetes"};
  absl::StatusOr<std::string> r = Allocate("gpu-3");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("admission webhook \"resourceclaims.dra.duet.dev\" denied the request: "
                        "gpu.nvidia.com/gpu-node-1/gpu-3 is not lent"));
  EXPECT_FALSE(Stored().contains("status") && Stored()["status"].contains("allocation"));
}

TEST_F(WebhookTest, WithTheWebhookDownFailurePolicyFailRefuses) {
  server_->Stop();
  absl::StatusOr<std::string> r = Allocate("gpu-3");
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("failed calling webhook"));
  EXPECT_FALSE(Stored().contains("status") && Stored()["status"].contains("allocation"));
  EXPECT_TRUE(gate_.asks.empty());
}

TEST_F(WebhookTest, StartNeedsTlsAndAGate) {
  WebhookOptions o;
  EXPECT_THAT(std::string(WebhookServer::Start(&gate_, o).status().message()),
              HasSubstr("dra.webhook.tls.cert_file"));
  o.cert_file = tls_.cert;
  o.key_file = dir_ + "/missing.key";
  EXPECT_THAT(std::string(WebhookServer::Start(&gate_, o).status().message()),
              HasSubstr("dra.webhook.tls.key_file"));
  EXPECT_FALSE(WebhookServer::Start(nullptr, o).ok());
}

}  // namespace
}  // namespace k8s_dra
}  // namespace duet
