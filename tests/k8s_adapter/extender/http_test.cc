// The extender's HTTP(S) server on loopback: the golden request over the
// wire, keep-alive, 413/400/404/405, TLS with an openssl-made certificate,
// client certificates (mTLS), the JSON depth limit, who may listen where,
// and the Prometheus families.

#include "k8s_adapter/extender/server.h"

#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
#include "tests/k8s_adapter/extender/client_certs.h"
#include "tests/k8s_adapter/extender/cluster.h"
#include "tests/k8s_adapter/extender/http_client.h"
#include "tests/k8s_adapter/fake_server.h"
#include "tests/fakes/wait.h"

namespace duet {
namespace extender {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using testing::HttpClient;

// The process's peak resident memory (VmHWM), in KiB.
long PeakRssKib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

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

// kube-scheduler's client certificate is the extender's only credential:
// with extender.tls.client_ca_file, a client without a certificate, or with
// one another CA signed, gets no answer at all (the handshake fails); the
// chart-shaped certificate is served.
TEST_F(HttpTest, ClientCertificatesAreRequiredWithAClientCa) {
  const std::string dir = k8s::testing::MakeTempDir();
  k8s::testing::TlsFiles server_tls = k8s::testing::MakeTestCerts(dir);
  ASSERT_FALSE(server_tls.cert.empty()) << "openssl failed";
  testing::ClientCert sched = testing::MakeSchedulerClientCert(dir);
  ASSERT_FALSE(sched.cert.empty()) << "openssl failed";
  // Another CA's client certificate (MakeTestCerts' CN=duet-bridge).
  const std::string other_dir = k8s::testing::MakeTempDir();
  k8s::testing::TlsFiles other = k8s::testing::MakeTestCerts(other_dir);
  ASSERT_FALSE(other.client_cert.empty()) << "openssl failed";

  ServerOptions o;
  o.tls.cert_file = server_tls.cert;
  o.tls.key_file = server_tls.key;
  o.tls.client_ca_file = sched.ca;
  auto server = Start(o);
  ASSERT_NE(server, nullptr);
  const std::string body = testing::Testdata("filter_args.json");

  HttpClient none(server->port(), server_tls.ca);
  EXPECT_FALSE(none.Post("/duet/filter", body).ok());
  EXPECT_FALSE(none.Get("/healthz").ok());
  HttpClient wrong_ca(server->port(), server_tls.ca, other.client_cert, other.client_key);
  EXPECT_FALSE(wrong_ca.Post("/duet/filter", body).ok());
  EXPECT_FALSE(wrong_ca.Post("/duet/bind", R"({"PodName":"p","PodNamespace":"kube-system","PodUID":"u","Node":"n"})").ok());
  // The server CA's own client certificate is not the client CA's either.
  HttpClient server_ca_client(server->port(), server_tls.ca, server_tls.client_cert,
                              server_tls.client_key);
  EXPECT_FALSE(server_ca_client.Get("/healthz").ok());
  // Plain HTTP gets nothing.
  HttpClient plain(server->port());
  EXPECT_FALSE(plain.Get("/healthz").ok());
  // Nothing those clients sent reached a handler; each failed handshake is
  // counted by why (the server may finish its side just after the client
  // has seen the alert: wait a little for the counts).
  const std::vector<std::string> reasons = {"no_certificate", "bad_certificate", "not_tls"};
  auto counted = [&](const std::string& m) {
    for (const std::string& reason : reasons) {
      if (!::testing::Matches(::testing::ContainsRegex(absl::StrCat(
              "duet_extender_tls_failures_total\\{reason=\"", reason, "\"\\} [1-9]")))(m)) {
        return false;
      }
    }
    return true;
  };
  EXPECT_TRUE(fakes::WaitFor([&] { return counted(Metrics()); }, absl::Seconds(5),
                             "each refused handshake to be counted"))
      << Metrics();
  const std::string refused = Metrics();
  EXPECT_THAT(refused, ::testing::Not(HasSubstr("duet_extender_requests_total{")));

  HttpClient scheduler(server->port(), server_tls.ca, sched.cert, sched.key);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<testing::Reply> r = scheduler.Post("/duet/filter", body);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(json::parse(r->body), testing::TestdataJson("filter_result.json"));
  }
  EXPECT_TRUE(scheduler.connected());
  EXPECT_THAT(Metrics(), HasSubstr("duet_extender_requests_total{code=\"200\",verb=\"filter\"} 2"));
  server->Stop();
  k8s::testing::RemoveTree(dir);
  k8s::testing::RemoveTree(other_dir);
}

TEST_F(HttpTest, WhoMayListenWhere) {
  const std::string dir = k8s::testing::MakeTempDir();
  k8s::testing::TlsFiles tls = k8s::testing::MakeTestCerts(dir);
  ASSERT_FALSE(tls.cert.empty()) << "openssl failed";
  // Client certificates need HTTPS: plain HTTP with a client CA is refused.
  ServerOptions o;
  o.tls.client_ca_file = tls.ca;
  auto s = ExtenderServer::Start(&extender_, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(),
            "extender.tls.client_ca_file: client certificates are checked only over HTTPS; set "
            "tls.cert_file and tls.key_file too");
  // A client CA that cannot be read is named.
  o.tls.cert_file = tls.cert;
  o.tls.key_file = tls.key;
  o.tls.client_ca_file = dir + "/missing-ca.crt";
  s = ExtenderServer::Start(&extender_, o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("extender.tls.client_ca_file"));
  // Beyond loopback without client certificates: refused, plain or TLS...
  for (bool https : {false, true}) {
    ServerOptions open;
    open.listen = "0.0.0.0:0";
    if (https) {
      open.tls.cert_file = tls.cert;
      open.tls.key_file = tls.key;
    }
    s = ExtenderServer::Start(&extender_, open);
    ASSERT_FALSE(s.ok()) << https;
    EXPECT_THAT(std::string(s.status().message()),
                HasSubstr("is beyond loopback without client certificates"));
    EXPECT_THAT(std::string(s.status().message()),
                HasSubstr("extender.allow_unauthenticated: true"));
    // ...unless accepted on purpose, which is said at error level.
    open.allow_unauthenticated = true;
    auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
    spdlog::default_logger()->sinks().push_back(ring);
    auto accepted = Start(open);
    spdlog::default_logger()->sinks().pop_back();
    ASSERT_NE(accepted, nullptr);
    std::vector<std::string> errors;
    for (const spdlog::details::log_msg_buffer& m : ring->last_raw()) {
      if (m.level == spdlog::level::err) errors.emplace_back(m.payload.data(), m.payload.size());
    }
    EXPECT_THAT(errors, ::testing::ElementsAre(absl::StrCat(
                            "extender.listen 0.0.0.0:0 is ", https ? "HTTPS" : "plain HTTP",
                            " beyond loopback without client certificates "
                            "(extender.allow_unauthenticated: true): any peer that reaches it may "
                            "bind pods to nodes with duet-bridge's permission")));
  }
  // With client certificates, any address.
  ServerOptions mtls;
  mtls.listen = "0.0.0.0:0";
  mtls.tls.cert_file = tls.cert;
  mtls.tls.key_file = tls.key;
  mtls.tls.client_ca_file = tls.ca;
  auto server = Start(mtls);
  ASSERT_NE(server, nullptr);
  HttpClient c(server->port(), tls.ca, tls.client_cert, tls.client_key);
  absl::StatusOr<testing::Reply> r = c.Get("/healthz");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  // The other settings' checks.
  ServerOptions names;
  names.scheduler_names = {};
  s = ExtenderServer::Start(&extender_, names);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("extender.scheduler_names"));
  names.scheduler_names = {"duet", ""};
  s = ExtenderServer::Start(&extender_, names);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(), "extender.scheduler_names[1]: must not be empty");
  server->Stop();
  k8s::testing::RemoveTree(dir);
}

// A body nested deeper than kMaxJsonDepth is refused with 400 before a DOM is
// built (a megabyte of '[' would cost hundreds of MiB), on every verb and
// both parse paths, and the server goes on serving.
TEST_F(HttpTest, DeepJsonIsRefusedBeforeParsing) {
  auto server = Start({});
  ASSERT_NE(server, nullptr);
  HttpClient c(server->port());
  const uint64_t seq = ledger_.seq();
  auto nested = [](int depth) {
    return std::string(static_cast<size_t>(depth), '[') + std::string(static_cast<size_t>(depth), ']');
  };
  // The usual shape (the fast path) with a deep value inside the pod: a
  // pod 60 deep is served, one past the limit is not.
  json args = testing::TestdataJson("filter_args.json");
  auto with_deep_pod = [&](int depth) {
    std::string body = args.dump();
    const std::string marker = "\"spec\":{";
    body.insert(body.find(marker) + marker.size(), "\"x\":" + nested(depth) + ",");
    return body;
  };
  absl::StatusOr<testing::Reply> r = c.Post("/duet/filter", with_deep_pod(58));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200) << r->body;
  r = c.Post("/duet/filter", with_deep_pod(100));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 400);
  EXPECT_THAT(r->body, HasSubstr("deeper than 64 levels"));
  r = c.Post("/duet/prioritize", with_deep_pod(100));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 400);
  EXPECT_THAT(r->body, HasSubstr("deeper than 64 levels"));

  // A million levels (2 MB, under max_request_bytes): refused, and no DOM
  // was built for it (the peak memory barely moves).
  const std::string deep = nested(1000000);
  const long before = PeakRssKib();
  for (const char* verb : {"/duet/filter", "/duet/prioritize", "/duet/bind"}) {
    r = c.Post(verb, deep);
    ASSERT_TRUE(r.ok()) << verb << ": " << r.status();
    EXPECT_EQ(r->status, 400) << verb;
    EXPECT_THAT(r->body, HasSubstr("deeper than 64 levels")) << verb;
  }
  r = c.Post("/duet/bind", "{\"PodName\":" + nested(70000) + "}");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 400);
  EXPECT_THAT(r->body, HasSubstr("deeper than 64 levels"));
  const long after = PeakRssKib();
  ASSERT_GT(before, 0);
  EXPECT_LT(after - before, 64 * 1024) << "KiB of peak memory for the deep bodies";

  // Still serving, on the same connection.
  r = c.Get("/healthz");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(c.connected());
  EXPECT_EQ(ledger_.seq(), seq);
  EXPECT_THAT(Metrics(), HasSubstr("duet_extender_requests_total{code=\"400\",verb=\"filter\"} 2"));
  EXPECT_THAT(Metrics(), HasSubstr("duet_extender_binds_total{result=\"invalid\"} 2"));
}

TEST(JsonDepthTest, CountsObjectsAndArrays) {
  EXPECT_TRUE(CheckJsonDepth("{}", 1).ok());
  EXPECT_TRUE(CheckJsonDepth(R"({"a":[1,{"b":2}],"c":{}})", 3).ok());
  EXPECT_FALSE(CheckJsonDepth(R"({"a":[1,{"b":2}],"c":{}})", 2).ok());
  EXPECT_EQ(CheckJsonDepth("[[[]]]", 2).message(),
            "the body nests JSON objects and arrays deeper than 2 levels (the extender's limit)");
  // Brackets inside strings are not nesting; text that is not JSON is left
  // to the parser that follows.
  EXPECT_TRUE(CheckJsonDepth(R"({"a":"[[[[[[["})", 1).ok());
  EXPECT_TRUE(CheckJsonDepth("not json", 1).ok());
}

}  // namespace
}  // namespace extender
}  // namespace duet
