#include "k8s_adapter/kube_client.h"

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "k8s_adapter/kubeconfig/kubeconfig_file.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace k8s {
namespace {

using ::testing::HasSubstr;
using testing::FakeApiServer;
using testing::GoldenNode;

std::unique_ptr<KubeClient> ClientFor(const std::string& url, KubeConfig c = {},
                                      KubeClientOptions o = {}) {
  c.server = url;
  auto client = NewCurlKubeClient(c, o);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

TEST(KubeClientTest, CrudAndErrorMapping) {
  FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  fake.Put(GoldenNode("gke_a3_h100_node.json", "n1"));
  auto client = ClientFor(fake.url());

  auto node = client->Get("/api/v1/nodes/n1");
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(nlohmann::json::parse(*node)["metadata"]["name"], "n1");

  absl::Status missing = client->Get("/api/v1/nodes/nope").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("nodes \"nope\" not found"));

  const std::string pod = R"({"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"i"}]}})";
  ASSERT_TRUE(client->Post("/api/v1/namespaces/default/pods", pod).ok());
  EXPECT_EQ(client->Post("/api/v1/namespaces/default/pods", pod).status().code(),
            absl::StatusCode::kAlreadyExists);

  auto patched = client->Patch("/api/v1/namespaces/default/pods/p",
                               R"({"metadata":{"annotations":{"duet.dev/x":"1"}}})", PatchType::kMerge);
  ASSERT_TRUE(patched.ok()) << patched.status();
  EXPECT_EQ(nlohmann::json::parse(*patched)["metadata"]["annotations"]["duet.dev/x"], "1");

  const std::string binding =
      R"({"apiVersion":"v1","kind":"Binding","metadata":{"name":"p"},"target":{"kind":"Node","name":"n1"}})";
  ASSERT_TRUE(client->Post("/api/v1/namespaces/default/pods/p/binding", binding).ok());
  EXPECT_EQ(client->Post("/api/v1/namespaces/default/pods/p/binding", binding).status().code(),
            absl::StatusCode::kAborted);  // already bound: a conflict

  // Lease update with a stale resourceVersion: ABORTED.
  const std::string lease = R"({"metadata":{"name":"l"},"spec":{"holderIdentity":"a"}})";
  auto created = client->Post("/apis/coordination.k8s.io/v1/namespaces/duet/leases", lease);
  ASSERT_TRUE(created.ok()) << created.status();
  nlohmann::json l = nlohmann::json::parse(*created);
  l["spec"]["holderIdentity"] = "b";
  ASSERT_TRUE(client->Put("/apis/coordination.k8s.io/v1/namespaces/duet/leases/l", l.dump()).ok());
  EXPECT_EQ(client->Put("/apis/coordination.k8s.io/v1/namespaces/duet/leases/l", l.dump()).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_TRUE(client->Delete("/apis/coordination.k8s.io/v1/namespaces/duet/leases/l").ok());
  EXPECT_EQ(client->Delete("/apis/coordination.k8s.io/v1/namespaces/duet/leases/l").status().code(),
            absl::StatusCode::kNotFound);

  // What went over the wire.
  bool saw_patch = false;
  for (const auto& r : fake.Requests()) {
    if (r["method"] == "PATCH") {
      saw_patch = true;
      EXPECT_EQ(r["content_type"], "application/merge-patch+json");
    }
  }
  EXPECT_TRUE(saw_patch);
}

TEST(KubeClientTest, ConnectionRefusedIsUnavailable) {
  auto client = ClientFor("http://127.0.0.1:1");
  EXPECT_EQ(client->Get("/api").status().code(), absl::StatusCode::kUnavailable);
}

TEST(KubeClientTest, SlowServerHitsTheRequestTimeout) {
  FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  fake.Control("slow", {{"delay_ms", 1500}});
  KubeClientOptions o;
  o.request_timeout = absl::Milliseconds(300);
  auto client = ClientFor(fake.url(), {}, o);
  EXPECT_EQ(client->Get("/api/v1/nodes").status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(KubeClientTest, ReplyOverTheLimitIsResourceExhausted) {
  FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  for (int i = 0; i < 5; ++i) fake.Put(GoldenNode("gke_a3_h100_node.json", "n" + std::to_string(i)));
  KubeClientOptions o;
  o.max_response_bytes = 4096;
  auto client = ClientFor(fake.url(), {}, o);
  EXPECT_EQ(client->Get("/api/v1/nodes").status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(KubeClientTest, HttpsWithCaAndToken) {
  const std::string dir = testing::MakeTempDir();
  testing::TlsFiles tls = testing::MakeTestCerts(dir);
  ASSERT_FALSE(tls.ca.empty()) << "openssl failed";
  FakeApiServer fake({"--tls-cert", tls.cert, "--tls-key", tls.key, "--token", "s3cret"});
  ASSERT_TRUE(fake.ok());

  KubeConfig good;
  good.ca_file = tls.ca;
  good.token = "s3cret";
  auto ok = ClientFor(fake.url(), good)->Get("/api/v1/nodes");
  EXPECT_TRUE(ok.ok()) << ok.status();

  // CA as PEM text (kubeconfig certificate-authority-data).
  KubeConfig pem;
  {
    std::ifstream in(tls.ca);
    std::ostringstream ss;
    ss << in.rdbuf();
    pem.ca_pem = ss.str();
  }
  pem.token = "s3cret";
  EXPECT_TRUE(ClientFor(fake.url(), pem)->Get("/api/v1/nodes").ok());

  KubeConfig bad_token = good;
  bad_token.token = "wrong";
  EXPECT_EQ(ClientFor(fake.url(), bad_token)->Get("/api/v1/nodes").status().code(),
            absl::StatusCode::kUnauthenticated);

  KubeConfig no_ca;  // system store: the test CA is unknown
  no_ca.token = "s3cret";
  absl::Status s = ClientFor(fake.url(), no_ca)->Get("/api/v1/nodes").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);

  KubeConfig insecure = no_ca;
  insecure.insecure_skip_tls_verify = true;
  EXPECT_TRUE(ClientFor(fake.url(), insecure)->Get("/api/v1/nodes").ok());

  KubeConfig missing_ca;
  missing_ca.server = fake.url();
  missing_ca.ca_file = dir + "/nope.crt";
  EXPECT_EQ(NewCurlKubeClient(missing_ca).status().code(), absl::StatusCode::kInvalidArgument);
  testing::RemoveTree(dir);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(KubeClientTest, ClientCertificateFromFilesAndFromKubeconfigData) {
  const std::string dir = testing::MakeTempDir();
  testing::TlsFiles tls = testing::MakeTestCerts(dir);
  ASSERT_FALSE(tls.client_cert.empty()) << "openssl failed";
  // The fake wants a token or a client certificate signed by its CA.
  FakeApiServer fake({"--tls-cert", tls.cert, "--tls-key", tls.key, "--client-ca", tls.ca, "--token", "t"});
  ASSERT_TRUE(fake.ok());
  KubeConfig anon;
  anon.ca_file = tls.ca;
  EXPECT_EQ(ClientFor(fake.url(), anon)->Get("/api").status().code(), absl::StatusCode::kUnauthenticated);

  KubeConfig files = anon;
  files.client_cert_file = tls.client_cert;
  files.client_key_file = tls.client_key;
  auto r = ClientFor(fake.url(), files)->Get("/api");
  EXPECT_TRUE(r.ok()) << r.status();

  // A kubeconfig with everything inline (base64 -data fields).
  const std::string kubeconfig = absl::StrCat(
      "apiVersion: v1\nkind: Config\ncurrent-context: dev\n",
      "clusters: [{name: fake, cluster: {server: ", fake.url(), ", certificate-authority-data: ",
      absl::Base64Escape(Slurp(tls.ca)), "}}]\n",
      "contexts: [{name: dev, context: {cluster: fake, user: bridge}}]\n",
      "users: [{name: bridge, user: {client-certificate-data: ", absl::Base64Escape(Slurp(tls.client_cert)),
      ", client-key-data: ", absl::Base64Escape(Slurp(tls.client_key)), "}}]\n");
  auto kc = ParseKubeconfig(kubeconfig, dir);
  ASSERT_TRUE(kc.ok()) << kc.status();
  auto client = NewCurlKubeClient(*kc);
  ASSERT_TRUE(client.ok()) << client.status();
  r = (*client)->Get("/api/v1/nodes");
  EXPECT_TRUE(r.ok()) << r.status();
  testing::RemoveTree(dir);
}

TEST(KubeClientTest, TokenFileIsReread) {
  const std::string dir = testing::MakeTempDir();
  FakeApiServer fake({"--token", "t2"});
  ASSERT_TRUE(fake.ok());
  { std::ofstream(dir + "/token") << "t1\n"; }
  KubeConfig c;
  c.token_file = dir + "/token";
  KubeClientOptions o;
  o.token_reload = absl::ZeroDuration();
  auto client = ClientFor(fake.url(), c, o);
  EXPECT_EQ(client->Get("/api").status().code(), absl::StatusCode::kUnauthenticated);
  { std::ofstream(dir + "/token") << "t2\n"; }
  EXPECT_TRUE(client->Get("/api").ok());
  testing::RemoveTree(dir);
}

TEST(KubeClientTest, StreamDeliversLinesAndCancels) {
  FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  auto client = ClientFor(fake.url());
  std::atomic<bool> cancel{false};
  std::atomic<int> lines{0};
  absl::Status result;
  std::thread t([&] {
    StreamOptions so;
    so.cancel = &cancel;
    result = client->Stream("/api/v1/nodes?watch=true&resourceVersion=0", so,
                            [&](absl::string_view line) {
                              nlohmann::json f = nlohmann::json::parse(line, nullptr, false);
                              EXPECT_FALSE(f.is_discarded()) << line;
                              ++lines;
                              return absl::OkStatus();
                            });
  });
  ASSERT_TRUE(testing::WaitFor([&] { return fake.OpenWatches() == 1; }));
  fake.Put(GoldenNode("gke_a3_h100_node.json", "n1"));
  fake.Put(GoldenNode("gke_ct5lp_tpu_node.json", "n2"));
  ASSERT_TRUE(testing::WaitFor([&] { return lines == 2; }));
  const absl::Time t0 = absl::Now();
  cancel = true;
  t.join();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(3));
  EXPECT_EQ(result.code(), absl::StatusCode::kCancelled);
}

TEST(KubeClientTest, StreamErrors) {
  FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  auto client = ClientFor(fake.url());
  fake.Put(GoldenNode("gke_a3_h100_node.json", "n1"));
  auto ignore = [](absl::string_view) { return absl::OkStatus(); };
  StreamOptions small;
  small.max_line_bytes = 1024;  // a Node frame is ~8 KiB
  absl::Status s = client->Stream("/api/v1/nodes?watch=1&resourceVersion=0", small, ignore);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("watch frame larger than 1024 bytes"));

  EXPECT_EQ(client->Stream("/api/v1/nope?watch=1", {}, ignore).code(), absl::StatusCode::kNotFound);

  // Dropped mid-stream: UNAVAILABLE. The first watch above, which the
  // client left, must be gone from the fake first: "drop" goes to the
  // watches open at that moment, and the count below must be this one's.
  ASSERT_TRUE(testing::WaitFor([&] { return fake.OpenWatches() == 0; }));
  std::thread t([&] {
    s = client->Stream("/api/v1/nodes?watch=1&resourceVersion=0", {}, ignore);
  });
  ASSERT_TRUE(testing::WaitFor([&] { return fake.OpenWatches() == 1; }));
  fake.Control("drop");
  t.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;

  // The callback's error ends the stream and is returned.
  s = client->Stream("/api/v1/nodes?watch=1&resourceVersion=0", {},
                     [](absl::string_view) { return absl::DataLossError("stop"); });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);

  // Idle: no bytes for the idle timeout.
  StreamOptions idle;
  idle.idle_timeout = absl::Seconds(1);
  const absl::Time t0 = absl::Now();
  s = client->Stream("/api/v1/nodes?watch=1&resourceVersion=999999", idle, ignore);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
}

}  // namespace
}  // namespace k8s
}  // namespace duet
