#include "k8s_adapter/kubeconfig/kubeconfig_file.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "k8s_adapter/kube_client.h"

namespace duet {
namespace k8s {
namespace {

using ::testing::HasSubstr;

constexpr char kKubeconfig[] = R"(apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: gke
  cluster:
    server: https://34.1.2.3
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
- name: local
  cluster:
    server: http://127.0.0.1:8080
    insecure-skip-tls-verify: true
contexts:
- name: dev
  context: {cluster: gke, user: admin, namespace: duet-system}
- name: local
  context: {cluster: local, user: certs}
users:
- name: admin
  user:
    token: abc.def
- name: certs
  user:
    client-certificate: certs/client.crt
    client-key-data: a2V5
)";

TEST(KubeconfigTest, CurrentContextWithTokenAndCaData) {
  auto c = ParseKubeconfig(kKubeconfig, "/home/dev/.kube");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server, "https://34.1.2.3");
  EXPECT_EQ(c->token, "abc.def");
  EXPECT_EQ(c->ca_pem, "-----BEGIN CERTIFICATE-----\n");
  EXPECT_EQ(c->namespace_, "duet-system");
  EXPECT_FALSE(c->insecure_skip_tls_verify);
}

TEST(KubeconfigTest, NamedContextWithClientCertificateRelativePath) {
  auto c = ParseKubeconfig(kKubeconfig, "/home/dev/.kube", "local");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server, "http://127.0.0.1:8080");
  EXPECT_TRUE(c->insecure_skip_tls_verify);
  EXPECT_EQ(c->client_cert_file, "/home/dev/.kube/certs/client.crt");
  EXPECT_EQ(c->client_key_pem, "key");
  EXPECT_TRUE(c->token.empty());
}

TEST(KubeconfigTest, ErrorsNameThePlace) {
  auto missing = ParseKubeconfig(kKubeconfig, "", "nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("contexts: no entry named \"nope\""));

  auto exec = ParseKubeconfig(R"(current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: https://x}}]
users: [{name: u, user: {exec: {command: gke-gcloud-auth-plugin}}}]
)", "");
  EXPECT_EQ(exec.status().code(), absl::StatusCode::kUnimplemented);

  auto b64 = ParseKubeconfig(R"(current-context: c
contexts: [{name: c, context: {cluster: k}}]
clusters: [{name: k, cluster: {server: https://x, certificate-authority-data: "!!!"}}]
)", "");
  EXPECT_THAT(b64.status().message(), HasSubstr("clusters[k].cluster.certificate-authority-data"));

  auto yaml = ParseKubeconfig("clusters: [", "");
  EXPECT_EQ(yaml.status().code(), absl::StatusCode::kInvalidArgument);

  auto noserver = ParseKubeconfig(R"(current-context: c
contexts: [{name: c, context: {cluster: k}}]
clusters: [{name: k, cluster: {}}]
)", "");
  EXPECT_THAT(noserver.status().message(), HasSubstr("server: must be set"));
  EXPECT_EQ(LoadKubeconfig("/nonexistent/kubeconfig").status().code(), absl::StatusCode::kNotFound);
}

// Issue 25, item 7: yaml-cpp keeps the first of two equal keys (client-go
// the last), so a repeated key would make the bridge read another server or
// user than kubectl with the same file. Refused, naming the key and lines.
TEST(KubeconfigTest, RepeatedKeyOrEntryNameIsRefused) {
  auto key = ParseKubeconfig(R"(current-context: c
contexts: [{name: c, context: {cluster: k}}]
clusters:
- name: k
  cluster:
    server: https://good
    server: https://evil
)", "");
  EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(key.status().message(),
            "kubeconfig: clusters[0].cluster.server: key given twice in one mapping (line 6 and "
            "line 7); YAML keeps only one of them, so the file is refused");

  auto top = ParseKubeconfig(R"(current-context: c
current-context: d
contexts: [{name: c, context: {cluster: k}}, {name: d, context: {cluster: k}}]
clusters: [{name: k, cluster: {server: https://x}}]
)", "");
  EXPECT_THAT(top.status().message(),
              HasSubstr("current-context: key given twice in one mapping (line 1 and line 2)"));

  auto entry = ParseKubeconfig(R"(current-context: c
contexts: [{name: c, context: {cluster: k}}]
clusters:
- {name: k, cluster: {server: https://good}}
- {name: k, cluster: {server: https://evil}}
)", "");
  EXPECT_EQ(entry.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(entry.status().message(),
              HasSubstr("clusters[1].name: \"k\" is also clusters[0].name; each name must be "
                        "unique"));

  // The same key in two different mappings is no repeat.
  EXPECT_TRUE(ParseKubeconfig(kKubeconfig, "").ok());
}

TEST(KubeconfigTest, ResolveReadsTheFileOrFallsBackToInCluster) {
  const std::string dir = ::testing::TempDir() + "/duet_k8s_kc_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/kubeconfig";
  std::ofstream(path) << kKubeconfig;
  auto c = ResolveKubeConfig(path, "local");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server, "http://127.0.0.1:8080");
  EXPECT_EQ(c->client_cert_file, dir + "/certs/client.crt");
  unsetenv("KUBERNETES_SERVICE_HOST");
  EXPECT_EQ(ResolveKubeConfig("").status().code(), absl::StatusCode::kFailedPrecondition);
  auto bad = ResolveKubeConfig(path, "nope");
  EXPECT_THAT(bad.status().message(), HasSubstr(path + ": contexts: no entry"));
  std::filesystem::remove_all(dir);
}

TEST(InClusterTest, ReadsServiceAccountAndEnvironment) {
  const std::string dir = ::testing::TempDir() + "/duet_k8s_sa_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/token") << "tok-123\n";
  std::ofstream(dir + "/ca.crt") << "pem";
  std::ofstream(dir + "/namespace") << "duet-system";
  unsetenv("KUBERNETES_SERVICE_HOST");
  EXPECT_EQ(InClusterConfig(dir).status().code(), absl::StatusCode::kFailedPrecondition);
  setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  auto c = InClusterConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server, "https://10.0.0.1:443");
  EXPECT_EQ(c->token, "tok-123");
  EXPECT_EQ(c->token_file, dir + "/token");
  EXPECT_EQ(c->ca_file, dir + "/ca.crt");
  EXPECT_EQ(c->namespace_, "duet-system");
  setenv("KUBERNETES_SERVICE_HOST", "fd00::1", 1);
  EXPECT_EQ(InClusterConfig(dir)->server, "https://[fd00::1]:443");
  std::filesystem::remove(dir + "/token");
  EXPECT_EQ(InClusterConfig(dir).status().code(), absl::StatusCode::kNotFound);
  unsetenv("KUBERNETES_SERVICE_HOST");
  unsetenv("KUBERNETES_SERVICE_PORT");
  std::filesystem::remove_all(dir);
}

TEST(StatusFromHttpTest, MapsCodesAndKeepsTheMessage) {
  const char* gone = R"j({"kind":"Status","status":"Failure","message":"too old resource version: 5 (9)",
                         "reason":"Expired","code":410})j";
  absl::Status s = StatusFromHttp(410, gone);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(s.message(), HasSubstr("too old resource version"));
  EXPECT_EQ(StatusFromHttp(409, R"({"kind":"Status","reason":"AlreadyExists","message":"x"})").code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(StatusFromHttp(409, R"({"kind":"Status","reason":"Conflict","message":"x"})").code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(StatusFromHttp(401, "").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(StatusFromHttp(403, "").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(StatusFromHttp(404, "").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(StatusFromHttp(422, "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StatusFromHttp(429, "").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(StatusFromHttp(503, "<html>").code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(StatusFromHttp(201, "").ok());
  EXPECT_EQ(QueryEscape("a=b,c in (d)"), "a%3Db%2Cc%20in%20%28d%29");
}

// Found by the informer fuzz target: a body whose kind, message or reason is
// not a string made nlohmann throw out of StatusFromHttp (a reply from a
// proxy or a broken server would end the informer's thread, and the bridge).
TEST(StatusFromHttpTest, WronglyTypedStatusFieldsAreNoException) {
  absl::Status s = StatusFromHttp(410, R"({"kind":410})");
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(s.message(), HasSubstr(R"({"kind":410})"));
  s = StatusFromHttp(409, R"({"kind":"Status","reason":7,"message":["x"]})");
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(StatusFromHttp(500, "[1,2]").code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace k8s
}  // namespace duet
