// duet-node's Kubernetes API flags (k8s_adapter/device_plugin/kube_flags.h):
// which combinations are refused, and the config each accepted one gives.

#include "k8s_adapter/device_plugin/kube_flags.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet {
namespace node {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

KubeFlags Flags(const std::string& server, const std::string& token_file,
                const std::string& ca_file = "", bool disabled = false) {
  KubeFlags f;
  f.server = server;
  f.token_file = token_file;
  f.ca_file = ca_file;
  f.disabled = disabled;
  return f;
}

TEST(KubeFlagsTest, RefusesFlagsThatDoNotGoTogether) {
  EXPECT_TRUE(ValidateKubeFlags(KubeFlags{}).ok());  // in-cluster
  EXPECT_TRUE(ValidateKubeFlags(Flags("", "", "", true)).ok());
  EXPECT_TRUE(ValidateKubeFlags(Flags("https://api.example:6443", "/t", "", false)).ok());
  EXPECT_TRUE(ValidateKubeFlags(Flags("https://10.0.0.1", "/t", "/ca", false)).ok());

  absl::Status no_token = ValidateKubeFlags(Flags("https://api.example:6443", "", "", false));
  EXPECT_EQ(no_token.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(no_token), HasSubstr("--kube-server: needs --kube-token-file"));
  EXPECT_THAT(Message(ValidateKubeFlags(Flags("", "/t", "", false))),
              HasSubstr("--kube-token-file, --kube-ca-file: need --kube-server"));
  EXPECT_THAT(Message(ValidateKubeFlags(Flags("", "", "/ca", false))),
              HasSubstr("--kube-token-file, --kube-ca-file: need --kube-server"));
  for (const char* bad :
       {"http://api.example:8080", "api.example:6443", "https://", "https:///x"}) {
    absl::Status s = ValidateKubeFlags(Flags(bad, "/t", "", false));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(Message(s), HasSubstr("--kube-server: must be https://host[:port]")) << bad;
  }
  EXPECT_THAT(Message(ValidateKubeFlags(Flags("https://a", "/t", "", true))),
              HasSubstr("--no-kubernetes: cannot be given with --kube-server"));
  EXPECT_THAT(Message(ValidateKubeFlags(Flags("", "", "/ca", true))), HasSubstr("--no-kubernetes"));
}

class KubeFlagsFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/duet_kube_flags_" + std::to_string(getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(KubeFlagsFilesTest, NamedServerReadsItsFilesNow) {
  std::ofstream(dir_ + "/token") << "  tok-1\n";
  std::ofstream(dir_ + "/ca.crt") << "pem";
  auto c = KubeConfigFromFlags(
      Flags("https://api.example:6443", dir_ + "/token", dir_ + "/ca.crt", false));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->has_value());
  EXPECT_EQ((*c)->server, "https://api.example:6443");
  EXPECT_EQ((*c)->token, "tok-1");
  EXPECT_EQ((*c)->token_file, dir_ + "/token");  // re-read as it rotates
  EXPECT_EQ((*c)->ca_file, dir_ + "/ca.crt");

  auto no_ca = KubeConfigFromFlags(Flags("https://a", dir_ + "/token", "", false));
  ASSERT_TRUE(no_ca.ok()) << no_ca.status();
  EXPECT_EQ((*no_ca)->ca_file, "");  // system roots

  auto missing_ca =
      KubeConfigFromFlags(Flags("https://a", dir_ + "/token", dir_ + "/nope.crt", false));
  EXPECT_EQ(missing_ca.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(missing_ca.status()),
              HasSubstr("--kube-ca-file: cannot read " + dir_ + "/nope.crt"));

  auto missing_token = KubeConfigFromFlags(Flags("https://a", dir_ + "/nope", "", false));
  EXPECT_EQ(missing_token.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(missing_token.status()), HasSubstr("--kube-token-file: cannot read"));

  std::ofstream(dir_ + "/empty") << "\n";
  auto empty = KubeConfigFromFlags(Flags("https://a", dir_ + "/empty", "", false));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(empty.status()), HasSubstr("--kube-token-file: " + dir_ + "/empty is empty"));
}

TEST_F(KubeFlagsFilesTest, NoFlagsIsInClusterAndNoKubernetesIsNone) {
  auto none = KubeConfigFromFlags(Flags("", "", "", true), dir_);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());

  unsetenv("KUBERNETES_SERVICE_HOST");
  unsetenv("KUBERNETES_SERVICE_PORT");
  EXPECT_EQ(KubeConfigFromFlags(KubeFlags{}, dir_).status().code(),
            absl::StatusCode::kFailedPrecondition);
  std::ofstream(dir_ + "/token") << "sa-token\n";
  std::ofstream(dir_ + "/ca.crt") << "pem";
  setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  auto in_cluster = KubeConfigFromFlags(KubeFlags{}, dir_);
  unsetenv("KUBERNETES_SERVICE_HOST");
  unsetenv("KUBERNETES_SERVICE_PORT");
  ASSERT_TRUE(in_cluster.ok()) << in_cluster.status();
  ASSERT_TRUE(in_cluster->has_value());
  EXPECT_EQ((*in_cluster)->server, "https://10.0.0.1:443");
  EXPECT_EQ((*in_cluster)->token, "sa-token");
  EXPECT_EQ((*in_cluster)->ca_file, dir_ + "/ca.crt");
}

}  // namespace
}  // namespace node
}  // namespace duet
