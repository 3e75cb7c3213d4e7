// auth.mode token: who may make duet-bridge's mutating calls. A real bridge
// (embedded inventory: gke-h100-a, gke-h100-b, gke-tpu-a) reviews callers'
// tokens with the fake API server's TokenReview; pods live in the fake too.

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/fakes/fake_clock.h"
#include "bridge/server/bridge.h"
#include "proto/duet/v1/error_reason.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace {

using ::testing::HasSubstr;
using k8s::testing::FakeApiServer;

constexpr char kNodeSa[] = "system:serviceaccount:duet-system:duet-node";

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream b;
  b << in.rdbuf();
  return b.str();
}

class AuthzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fake_.ok());
    dir_ = k8s::testing::MakeTempDir();
    k8s::testing::WriteKubeconfig(dir_ + "/kubeconfig", fake_.url());
    // Pods bound to gke-h100-a and gke-h100-b.
    pod_a_ = PutPod("web-a", "gke-h100-a");
    pod_b_ = PutPod("web-b", "gke-h100-b");
    // duet-node on gke-h100-a and on gke-h100-b (Kubernetes >= 1.30: the
    // node is in the token's extra), another ServiceAccount, an operator.
    Token("node-a-token", kNodeSa, {{"authentication.kubernetes.io/node-name", {"gke-h100-a"}},
                                    {"authentication.kubernetes.io/pod-name", {"duet-node-x"}}});
    Token("node-b-token", kNodeSa, {{"authentication.kubernetes.io/node-name", {"gke-h100-b"}}});
    Token("other-token", "system:serviceaccount:default:web", {});
    Token("admin-token", "alice", {}, {"duet-operators"});
  }
  void TearDown() override {
    bridge_.reset();
    k8s::testing::RemoveTree(dir_);
  }

  Config BaseConfig() {
    Config c;
    c.grpc.listen = "127.0.0.1:0";
    c.metrics.listen = "";
    c.journal.dir = dir_ + "/journal";
    c.journal.fsync = false;
    c.inventory.source = "embedded";
    c.kubernetes.kubeconfig = dir_ + "/kubeconfig";
    c.auth.mode = "token";
    c.auth.node_service_account = kNodeSa;
    c.auth.operator_groups = {"duet-operators"};
    c.auth.allow_plaintext_tokens = true;
    return c;
  }

  void Start(const Config& c) {
    ASSERT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
    auto b = Bridge::Start(c);
    ASSERT_TRUE(b.ok()) << b.status();
    bridge_ = std::move(*b);
    stub_ = v1::Ledger::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(bridge_->grpc_port()), grpc::InsecureChannelCredentials()));
  }

  std::string PutPod(const std::string& name, const std::string& node) {
    nlohmann::json pod = fake_.Put({{"kind", "Pod"},
                                    {"metadata", {{"name", name}, {"namespace", "ml"}}},
                                    {"spec", {{"nodeName", node}, {"containers", nlohmann::json::array()}}},
                                    {"status", {{"phase", "Running"}}}});
    return pod["metadata"]["uid"];
  }

  void Token(const std::string& token, const std::string& user,
             const std::map<std::string, std::vector<std::string>>& extra,
             const std::vector<std::string>& groups = {}, double expires_in = -1) {
    nlohmann::json body = {{"token", token},
                           {"username", user},
                           {"groups", groups},
                           {"extra", extra},
                           {"audiences", {"duet-bridge"}}};
    if (expires_in >= 0) body["expires_in"] = expires_in;
    fake_.Control("token", body);
  }

  static void Authorize(grpc::ClientContext* ctx, const std::string& token) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  }

  v1::HoldRequest PodHold(const std::string& uid, const std::string& name,
                          const std::string& node) {
    v1::HoldRequest req;
    req.set_node(node);
    req.mutable_owner()->mutable_pod()->set_uid(uid);
    req.mutable_owner()->mutable_pod()->set_namespace_("ml");
    req.mutable_owner()->mutable_pod()->set_name(name);
    auto* count = req.mutable_count();
    count->set_kind(v1::DEVICE_KIND_GPU);
    count->set_count(2);
    return req;
  }

  grpc::Status Hold(const std::string& token, const v1::HoldRequest& req) {
    grpc::ClientContext ctx;
    Authorize(&ctx, token);
    v1::HoldResponse resp;
    return stub_->Hold(&ctx, req, &resp);
  }

  grpc::Status Release(const std::string& token, const std::string& uid, const std::string& node) {
    grpc::ClientContext ctx;
    Authorize(&ctx, token);
    v1::ReleaseRequest req;
    req.set_node(node);
    req.mutable_owner()->mutable_pod()->set_uid(uid);
    v1::ReleaseResponse resp;
    return stub_->Release(&ctx, req, &resp);
  }

  grpc::Status PlacePod(const std::string& token, const std::string& uid, const std::string& name,
                        const std::string& node) {
    grpc::ClientContext ctx;
    Authorize(&ctx, token);
    v1::PlacePodRequest req;
    req.mutable_pod()->set_uid(uid);
    req.mutable_pod()->set_namespace_("ml");
    req.mutable_pod()->set_name(name);
    req.set_node(node);
    req.set_gpus(1);
    v1::Holding resp;
    return stub_->PlacePod(&ctx, req, &resp);
  }

  size_t Holdings() { return bridge_->ledger()->holding_count(); }
  std::string Metrics() { return bridge_->metrics()->Render(); }
  static std::string Why(const grpc::Status& s) {
    google::rpc::ErrorInfo info;
    if (!v1::ErrorInfoOf(s, &info)) return "";
    return info.metadata().count("why") ? info.metadata().at("why") : "";
  }

  FakeApiServer fake_;
  std::string dir_;
  std::string pod_a_, pod_b_;
  std::unique_ptr<Bridge> bridge_;
  std::unique_ptr<v1::Ledger::Stub> stub_;
};

TEST_F(AuthzTest, ACallWithoutATokenIsUnauthenticatedAndChangesNothing) {
  Start(BaseConfig());
  grpc::Status s = Hold("", PodHold(pod_a_, "web-a", "gke-h100-a"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  EXPECT_EQ(v1::ReasonOf(s), "NOT_AUTHENTICATED");
  EXPECT_EQ(Why(s), "missing_token");
  s = PlacePod("", pod_a_, "web-a", "gke-h100-a");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Holdings(), 0u);
  EXPECT_THAT(Metrics(), HasSubstr("duet_grpc_auth_refusals_total{method=\"Hold\",reason=\"missing_token\"} 1"));
  EXPECT_THAT(Metrics(),
              HasSubstr("duet_grpc_auth_refusals_total{method=\"PlacePod\",reason=\"missing_token\"} 1"));
}

TEST_F(AuthzTest, UnknownAndExpiredTokensAreRefused) {
  Config c = BaseConfig();
  c.auth.cache_ttl = absl::ZeroDuration();
  Start(c);
  grpc::Status s = Hold("forged", PodHold(pod_a_, "web-a", "gke-h100-a"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Why(s), "invalid_token");
  EXPECT_THAT(s.error_message(), HasSubstr("token lookup failed"));

  Token("short-lived", kNodeSa, {{"authentication.kubernetes.io/node-name", {"gke-h100-a"}}}, {},
        /*expires_in=*/0.5);
  ASSERT_TRUE(PlacePod("short-lived", pod_a_, "web-a", "gke-h100-a").ok());
  ASSERT_TRUE(Release("short-lived", pod_a_, "gke-h100-a").ok());
  // The API server's clock passes the expiry (re-registered as due now).
  Token("short-lived", kNodeSa, {{"authentication.kubernetes.io/node-name", {"gke-h100-a"}}}, {},
        /*expires_in=*/0);
  s = PlacePod("short-lived", pod_a_, "web-a", "gke-h100-a");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("expired"));

  // A token for another audience (the API server's own) is not for the bridge.
  nlohmann::json body = {{"token", "api-token"},
                         {"username", kNodeSa},
                         {"extra", {{"authentication.kubernetes.io/node-name", {"gke-h100-a"}}}},
                         {"audiences", {"https://kubernetes.default.svc"}}};
  fake_.Control("token", body);
  s = PlacePod("api-token", pod_a_, "web-a", "gke-h100-a");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Holdings(), 0u);
  EXPECT_THAT(Metrics(),
              HasSubstr("duet_grpc_auth_refusals_total{method=\"PlacePod\",reason=\"invalid_token\"} 2"));
}

TEST_F(AuthzTest, DuetNodeActsForPodsBoundToItsOwnNodeOnly) {
  Start(BaseConfig());
  // The right caller: duet-node of gke-h100-a for a pod bound there.
  ASSERT_TRUE(PlacePod("node-a-token", pod_a_, "web-a", "gke-h100-a").ok());
  ASSERT_EQ(Holdings(), 1u);
  // Another node's duet-node may not release it, nor place on gke-h100-a.
  grpc::Status s = Release("node-b-token", pod_a_, "gke-h100-a");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_EQ(v1::ReasonOf(s), "NOT_PERMITTED");
  EXPECT_EQ(Why(s), "wrong_node");
  EXPECT_EQ(bridge_->ledger()->ListHoldings("gke-h100-a").size(), 1u);
  s = PlacePod("node-b-token", pod_a_, "web-a", "gke-h100-a");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // Nor hold on its own node in the name of a pod bound elsewhere.
  s = Hold("node-b-token", PodHold(pod_a_, "web-a", "gke-h100-b"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Why(s), "pod_not_on_node");
  EXPECT_THAT(s.error_message(), HasSubstr("runs on gke-h100-a"));
  EXPECT_TRUE(bridge_->ledger()->ListHoldings("gke-h100-b").empty());
  // A ServiceAccount that is not duet-node: nothing.
  s = Release("other-token", pod_a_, "gke-h100-a");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Why(s), "not_allowed");
  EXPECT_EQ(Holdings(), 1u);
  // Its own duet-node releases it.
  ASSERT_TRUE(Release("node-a-token", pod_a_, "gke-h100-a").ok());
  EXPECT_EQ(Holdings(), 0u);
  // And gke-h100-b's duet-node holds for its own pod.
  ASSERT_TRUE(Hold("node-b-token", PodHold(pod_b_, "web-b", "gke-h100-b")).ok());
  const std::string m = Metrics();
  EXPECT_THAT(m, HasSubstr("duet_grpc_auth_refusals_total{method=\"Release\",reason=\"wrong_node\"} 1"));
  EXPECT_THAT(m, HasSubstr("duet_grpc_auth_refusals_total{method=\"PlacePod\",reason=\"wrong_node\"} 1"));
  EXPECT_THAT(m, HasSubstr("duet_grpc_auth_refusals_total{method=\"Hold\",reason=\"pod_not_on_node\"} 1"));
  EXPECT_THAT(m, HasSubstr("duet_grpc_auth_refusals_total{method=\"Release\",reason=\"not_allowed\"} 1"));
}

TEST_F(AuthzTest, ReleaseOfAPodKubernetesNoLongerHasIsItsNodesToMake) {
  Start(BaseConfig());
  ASSERT_TRUE(PlacePod("node-a-token", pod_a_, "web-a", "gke-h100-a").ok());
  fake_.Delete("Pod", "web-a", "ml");
  // The pod watch may already have released it; either way duet-node of the
  // node may release, another node's may not.
  EXPECT_EQ(Release("node-b-token", pod_a_, "gke-h100-a").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(Release("node-a-token", pod_a_, "gke-h100-a").ok());
  EXPECT_EQ(Holdings(), 0u);
}

TEST_F(AuthzTest, WithoutTheNodeInTheTokenThePodItNamesSaysWhereDuetNodeRuns) {
  Config c = BaseConfig();
  c.kubernetes.watch_pods = false;  // every pod from the API
  Start(c);
  // Kubernetes before 1.30: the token names duet-node's pod only.
  nlohmann::json self = fake_.Put({{"kind", "Pod"},
                                   {"metadata", {{"name", "duet-node-abc"}, {"namespace", "duet-system"}}},
                                   {"spec", {{"nodeName", "gke-h100-a"}}}});
  Token("old-style", kNodeSa, {{"authentication.kubernetes.io/pod-name", {"duet-node-abc"}},
                               {"authentication.kubernetes.io/pod-uid", {self["metadata"]["uid"]}}});
  EXPECT_TRUE(PlacePod("old-style", pod_a_, "web-a", "gke-h100-a").ok());
  grpc::Status s = PlacePod("old-style", pod_b_, "web-b", "gke-h100-b");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Why(s), "wrong_node");
  // A token bound to no pod at all (a long-lived Secret token) names no node.
  Token("unbound", kNodeSa, {});
  s = PlacePod("unbound", pod_a_, "web-a", "gke-h100-a");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Why(s), "no_node");
  EXPECT_EQ(Holdings(), 1u);
}

TEST_F(AuthzTest, OperatorsActForAnyPodAndSlurmOwnersKeepTheirOwnPath) {
  Start(BaseConfig());
  ASSERT_TRUE(Hold("admin-token", PodHold(pod_b_, "web-b", "gke-h100-a")).ok());
  ASSERT_TRUE(Release("admin-token", pod_b_, "gke-h100-a").ok());
  // Slurm-owned calls are decided by slurm.credential (munge by default,
  // Slurm off or on), not by tokens: an operator's token is no credential.
  v1::HoldRequest slurm;
  slurm.set_node("gke-h100-a");
  slurm.mutable_owner()->mutable_slurm_job()->set_job_id(42);
  slurm.mutable_count()->set_kind(v1::DEVICE_KIND_GPU);
  slurm.mutable_count()->set_count(1);
  for (const char* token : {"", "admin-token"}) {
    grpc::Status s = Hold(token, slurm);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << token;
    EXPECT_NE(s.error_message().find("has no munge credential"), std::string::npos)
        << s.error_message();
  }
  EXPECT_EQ(Holdings(), 0u);
}

TEST_F(AuthzTest, ReviewsAreCachedForTheirTtl) {
  Start(BaseConfig());  // cache_ttl 10s
  auto reviews = [&] {
    int n = 0;
    for (const auto& r : fake_.Requests()) {
      if (r["path"].get<std::string>().find("tokenreviews") != std::string::npos) ++n;
    }
    return n;
  };
  ASSERT_TRUE(PlacePod("node-a-token", pod_a_, "web-a", "gke-h100-a").ok());
  ASSERT_TRUE(Release("node-a-token", pod_a_, "gke-h100-a").ok());
  ASSERT_TRUE(PlacePod("node-a-token", pod_a_, "web-a", "gke-h100-a").ok());
  EXPECT_EQ(reviews(), 1);
  // An API server that fails: UNAVAILABLE for a token not cached, nothing changed.
  fake_.Control("fail", {{"count", 5}, {"code", 503}});
  grpc::Status s = PlacePod("node-b-token", pod_b_, "web-b", "gke-h100-b");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_EQ(Holdings(), 1u);
}

TEST_F(AuthzTest, TokensTravelOverTlsOnlyAndTheUnixSocketIsTrusted) {
  const k8s::testing::TlsFiles tls = k8s::testing::MakeTestCerts(dir_);
  ASSERT_FALSE(tls.ca.empty());
  Config c = BaseConfig();
  c.auth.allow_plaintext_tokens = false;
  c.grpc.tls.cert_file = tls.cert;
  c.grpc.tls.key_file = tls.key;
  c.grpc.unix_socket = dir_ + "/bridge.sock";
  c.grpc.plaintext_listen = "127.0.0.1:0";
  Start(c);
  // Over TLS: accepted.
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = Slurp(tls.ca);
  auto tls_stub = v1::Ledger::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(bridge_->grpc_port()), grpc::SslCredentials(ssl)));
  {
    grpc::ClientContext ctx;
    Authorize(&ctx, "node-a-token");
    v1::PlacePodRequest req;
    req.mutable_pod()->set_uid(pod_a_);
    req.mutable_pod()->set_namespace_("ml");
    req.mutable_pod()->set_name("web-a");
    req.set_node("gke-h100-a");
    req.set_gpus(1);
    v1::Holding resp;
    grpc::Status s = tls_stub->PlacePod(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  // The same token in clear (the plaintext listener): refused.
  stub_ = v1::Ledger::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(bridge_->grpc_plaintext_port()),
                          grpc::InsecureChannelCredentials()));
  grpc::Status s = Release("node-a-token", pod_a_, "gke-h100-a");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Why(s), "plaintext_token");
  EXPECT_EQ(Holdings(), 1u);
  // Over the unix socket (file permissions): no token needed.
  stub_ = v1::Ledger::NewStub(
      grpc::CreateChannel("unix:" + c.grpc.unix_socket, grpc::InsecureChannelCredentials()));
  EXPECT_TRUE(Release("", pod_a_, "gke-h100-a").ok());
  EXPECT_EQ(Holdings(), 0u);
}

// The authorizer alone: its cache keeps at most cache_size tokens, and an
// entry is reviewed again once cache_ttl has passed.
TEST_F(AuthzTest, TheReviewCacheIsBounded) {
  fakes::FakeClock clock(absl::FromUnixSeconds(1000));
  auth::CallAuthorizer::Options o;
  o.config = BaseConfig().auth;
  o.config.cache_size = 2;
  o.clock = &clock;
  std::vector<std::string> refused;
  o.on_refusal = [&](const std::string& m, const std::string& why) { refused.push_back(why); };
  auth::CallAuthorizer authz(
      fake_.control(), [](const Owner&) { return auth::PodBinding{true, "gke-h100-a"}; }, o);
  auth::CallerInfo caller;
  caller.tls = true;
  const Owner pod = Owner::Pod(pod_a_, "ml", "web-a");
  for (const char* t : {"node-a-token", "admin-token", "other-token", "forged"}) {
    caller.bearer = t;
    (void)authz.Check(caller, "Hold", "gke-h100-a", pod);
    EXPECT_LE(authz.cached(), 2u);
  }
  EXPECT_EQ(refused, (std::vector<std::string>{"not_allowed", "invalid_token"}));
  // A revoked token stays accepted until its entry expires, then is refused.
  caller.bearer = "node-a-token";
  ASSERT_TRUE(authz.Check(caller, "Hold", "gke-h100-a", pod).ok());
  fake_.Control("token", {{"token", "node-a-token"}, {"revoke", true}});
  EXPECT_TRUE(authz.Check(caller, "Hold", "gke-h100-a", pod).ok());
  clock.Advance(absl::Seconds(11));
  absl::Status s = authz.Check(caller, "Hold", "gke-h100-a", pod);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  // No caller identity at all, and a unix-socket caller.
  caller.bearer.clear();
  EXPECT_TRUE(absl::IsUnauthenticated(authz.Check(caller, "Hold", "gke-h100-a", pod)));
  caller.local = true;
  EXPECT_TRUE(authz.Check(caller, "Hold", "gke-h100-a", pod).ok());
}

TEST(AuthConfigTest, TokenModeNamesWhatItNeeds) {
  Config c;
  c.auth.mode = "tokens";
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("auth.mode"));
  c.auth.mode = "token";
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("auth.node_service_account"));
  c.auth.node_service_account = "duet-node";
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("system:serviceaccount:NAMESPACE:NAME"));
  c.auth.node_service_account = kNodeSa;
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  c.slurm.enabled = true;
  c.slurm.credential = "none";
  EXPECT_THAT(ValidateConfig(c).message(), HasSubstr("slurm.credential"));
  auto parsed = ParseConfig(
      "auth: {mode: token, node_service_account: \"system:serviceaccount:a:b\", "
      "audiences: [x], operator_groups: [ops], cache_ttl: 3s}\n");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->auth.audiences, std::vector<std::string>{"x"});
  EXPECT_EQ(parsed->auth.cache_ttl, absl::Seconds(3));
  EXPECT_FALSE(ParseConfig("auth: {mode: token, secret: x}\n").ok());
}

}  // namespace
}  // namespace duet
