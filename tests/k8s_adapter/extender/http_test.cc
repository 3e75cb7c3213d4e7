// The extender's HTTP(S) server on loopback: the golden request over the
// wire, keep-alive, 413/400/404/405, TLS with an openssl-made certificate,
// and the Prometheus families.

#include "k8s_adapter/extender/server.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "tests/k8s_adapter/extender/cluster.h"
#include "tests/k8s_adapter/extender/http_client.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace extender {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using testing::HttpClient;

class NoApi final : public PodApi {
 public:
  absl::StatusOr<json> GetPod(const std::string&, const std::string&) override {
    return absl::UnavailableError("no API server in this test");
  }
  absl::Status Bind(const std::string&, const std::string&, const std::string&, const std::string&) override {
    return absl::UnavailableError("no API server in this test");
  }
};

class HttpTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::BuildCluster(ledger_); }

  std::unique_ptr<ExtenderServer> Start(ServerOptions o) {
    o.registry = registry_;
    auto s = ExtenderServer::Start(&extender_, std::move(o));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::string Metrics() {
    return prometheus::TextSerializer().Serialize(registry_->Collect());
  }

  Ledger ledger_;
  NoApi api_;
  Extender extender_{&ledger_, nullptr, &api_, ExtenderOptions{}};
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
};

TEST_F(HttpTest, GoldenFilterAndPrioritizeOverOneKeepAliveConnection) {
  auto server = Start({});
  ASSERT_NE(server, nullptr);
  HttpClient c(server->port());
  const std::string body = testing::Testdata("filter_args.json");
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<testing::Reply> r = c.Post("/duet/filter", body);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200);
    EXPECT_TRUE(r->keep_alive);
    EXPECT_EQ(json::parse(r->body), testing::TestdataJson("filter_result.json"));
  }
  absl::StatusOr<testing::Reply> r = c.Post("/duet/prioritize", body);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(json::parse(r->body), testing::TestdataJson("prioritize_result.json"));
  r = c.Get("/healthz");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(c.connected());  // one connection all along

  const std::string m = Metrics();
  EXPECT_THAT(m, HasSubstr("duet_extender_requests_total{code=\"200\",verb=\"filter\"} 3"));
  EXPECT_THAT(m, HasSubstr("duet_extender_request_seconds_count{verb=\"prioritize\"} 1"));
}

TEST_F(HttpTest, OversizedBodyGets413AndChangesNothing) {
  ServerOptions o;
  o.max_request_bytes = 2048;
  auto server = Start(o);
  ASSERT_NE(server, nullptr);
  const uint64_t seq = ledger_.seq();
  HttpClient c(server->port());
  absl::StatusOr<testing::Reply> r = c.Post("/duet/filter", testing::Testdata("filter_args.json"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 413);
  EXPECT_THAT(r->body, HasSubstr("larger than 2048 bytes"));
  EXPECT_FALSE(r->keep_alive);
  EXPECT_EQ(ledger_.seq(), seq);
  // A fresh connection is served normally.
  HttpClient c2(server->port());
  r = c2.Get("/healthz");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(Metrics(), HasSubstr("duet_extender_requests_total{code=\"413\",verb=\"filter\"} 1"));
}

TEST_F(HttpTest, LargeRequestWithinTheLimitIsServed) {
  auto server = Start({});
  ASSERT_NE(server, nullptr);
  json args = testing::TestdataJson("filter_args.json");
  for (int i = 0; i < 30000; ++i) args["NodeNames"].push_back("gke-cpu-pool-n2-" + std::to_string(i));
  const std::string body = args.dump();
  ASSERT_GT(body.size(), 700000u);
  HttpClient c(server->port());
  absl::StatusOr<testing::Reply> r = c.Post("/duet/filter", body);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  json result = json::parse(r->body);
  EXPECT_EQ(result["NodeNames"].size(), 3u);
  // pool-2 and the 30,000 CPU nodes (gke-cpu-pool-n2-0 was already in the list).
  EXPECT_EQ(result["FailedAndUnresolvableNodes"].size(), 30001u);
}

TEST_F(HttpTest, GarbageWrongPathAndWrongMethod) {
  auto server = Start({});
  ASSERT_NE(server, nullptr);
  HttpClient c(server->port());
  absl::StatusOr<testing::Reply> r = c.Post("/duet/filter", "\x01garbage{");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 400);
  EXPECT_THAT(r->body, HasSubstr("not valid JSON"));
  r = c.Post("/duet/prioritize", R"({"Pod": {}, "NodeNames": "all"})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400);
  EXPECT_THAT(r->body, HasSubstr("ExtenderArgs.NodeNames: not a list"));
  r = c.Post("/nope", "{}");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 404);
  r = c.Get("/duet/bind");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 405);
  EXPECT_TRUE(c.connected());  // errors keep the connection
  EXPECT_TRUE(ledger_.CheckInvariants().ok());
}

TEST_F(HttpTest, TlsServesOnlyTls) {
  const std::string dir = k8s::testing::MakeTempDir();
  k8s::testing::TlsFiles tls = k8s::testing::MakeTestCerts(dir);
  ASSERT_FALSE(tls.cert.empty()) << "openssl failed";
  ServerOptions o;
  o.tls.cert_file = tls.cert;
  o.tls.key_file = tls.key;
  auto server = Start(o);
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(server->tls());
  HttpClient c(server->port(), tls.ca);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<testing::Reply> r = c.Post("/duet/filter", testing::Testdata("filter_args.json"));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(json::parse(r->body), testing::TestdataJson("filter_result.json"));
  }
  // Plain HTTP to the TLS port gets no answer.
  HttpClient plain(server->port());
  EXPECT_FALSE(plain.Get("/healthz").ok());
  // A client that does not trust the CA is refused in the handshake.
  HttpClient untrusting(server->port(), "/etc/ssl/certs/ca-certificates.crt");
  EXPECT_FALSE(untrusting.Get("/healthz").ok());
  server->Stop();
  k8s::testing::RemoveTree(dir);
}

TEST_F(HttpTest, BadTlsFilesAndBusyPortAreNamed) {
  ServerOptions o;
  o.tls.cert_file = "/nonexistent/cert.pem";
  o.tls.key_file = "/nonexistent/key.pem";
  auto s = ExtenderServer::Start(&extender_, o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("extender.tls.cert_file"));

  auto first = Start({});
  ASSERT_NE(first, nullptr);
  ServerOptions same;
  same.listen = "127.0.0.1:" + std::to_string(first->port());
  s = ExtenderServer::Start(&extender_, same);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("extender.listen"));
}

TEST_F(HttpTest, BadSettingsAreRefusedBeforeBinding) {
  // The configured settings are checked as the config checks them
  // (ExtenderSettings::Validate), with the field path.
  ServerOptions o;
  o.threads = 0;
  auto s = ExtenderServer::Start(&extender_, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(), "extender.threads: must be 1..64");
  o = ServerOptions();
  o.tls.cert_file = "only-a-cert.pem";
  s = ExtenderServer::Start(&extender_, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(), "extender.tls: cert_file and key_file must be set together");
  o = ServerOptions();
  o.max_request_bytes = 1023;
  s = ExtenderServer::Start(&extender_, o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("extender.max_request_bytes"));
}

TEST_F(HttpTest, EchoOnlyWhenEnabled) {
  ServerOptions o;
  o.enable_echo = true;
  auto server = Start(o);
  ASSERT_NE(server, nullptr);
  HttpClient c(server->port());
  absl::StatusOr<testing::Reply> r = c.Post("/duet/_echo", "hello");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "hello");
}

}  // namespace
}  // namespace extender
}  // namespace duet
