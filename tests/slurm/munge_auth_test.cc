// MungeAuth (bridge side) against credentials from the plugin's MungeEncode,
// through the real munged of a test cluster (label: slurm).

#include "bridge/slurm/munge_auth.h"

#include <sys/wait.h>
#include <unistd.h>

#include "bridge/config/config.h"
#include "common/credential/munge_payload.h"
#include "gtest/gtest.h"
#include "slurm_plugin/bridge_client.h"
#include "tests/slurm/slurm_cluster_fixture.h"

namespace duet {
namespace {

using ::duet::testing::TestSlurmCluster;

class MungeAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = TestSlurmCluster::Get();
    ASSERT_TRUE(cluster_->ok());
    socket_ = cluster_->root() + "/munge/munge.socket.2";
    auth_ = std::make_unique<MungeAuth>(MungeAuthOptions{socket_, 0});
  }
  std::string Encode(const std::string& payload) {
    auto c = spank::MungeEncode(socket_, payload);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : "";
  }
  // A credential encoded by uid `uid` (a child process that drops to it).
  std::string EncodeAs(uid_t uid, const std::string& payload) {
    int fds[2];
    if (pipe(fds) != 0) return "";
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      if (setgid(65534) != 0 || setuid(uid) != 0) _exit(2);
      auto c = spank::MungeEncode(socket_, payload);
      if (!c.ok()) _exit(3);
      if (write(fds[1], c->data(), c->size()) != static_cast<ssize_t>(c->size())) _exit(4);
      _exit(0);
    }
    close(fds[1]);
    std::string out;
    char buf[1024];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, n);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    return out;
  }

  TestSlurmCluster* cluster_ = nullptr;
  std::string socket_;
  std::unique_ptr<MungeAuth> auth_;
};

TEST_F(MungeAuthTest, ValidCredentialForExactlyThisStepIsAccepted) {
  const Owner step = Owner::SlurmStep(12, 0);
  EXPECT_TRUE(auth_->Check(Encode("duet/v1 node=gke-a job=12 step=0"), "Hold", "gke-a", step).ok());
  const Owner job = Owner::SlurmJob(12);
  EXPECT_TRUE(auth_->Check(Encode(slurm_munge::Payload("gke-a", 12, std::nullopt)), "Release",
                           "gke-a", job)
                  .ok());
  // Pods and placeholders need none.
  EXPECT_TRUE(auth_->Check("", "Hold", "gke-a", Owner::Pod("uid-1", "default", "web")).ok());
}

TEST_F(MungeAuthTest, MissingForgedReplayedAreUnauthenticated) {
  const Owner step = Owner::SlurmStep(12, 0);
  absl::Status s = auth_->Check("", "Hold", "gke-a", step);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_NE(s.message().find("has no munge credential"), absl::string_view::npos) << s;

  std::string cred = Encode(slurm_munge::Payload("gke-a", 12, 0));
  std::string forged = cred;
  forged[forged.size() / 2] = forged[forged.size() / 2] == 'A' ? 'B' : 'A';
  s = auth_->Check(forged, "Hold", "gke-a", step);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_NE(s.message().find("munge credential rejected"), absl::string_view::npos) << s;
  s = auth_->Check("MUNGE:not-a-credential:", "Hold", "gke-a", step);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;

  ASSERT_TRUE(auth_->Check(cred, "Hold", "gke-a", step).ok());
  s = auth_->Check(cred, "Hold", "gke-a", step);  // the same credential again
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_NE(s.message().find("Replayed credential"), absl::string_view::npos) << s;
}

TEST_F(MungeAuthTest, OtherJobStepNodeOrUidIsPermissionDenied) {
  const Owner step = Owner::SlurmStep(12, 0);
  for (const std::string& payload :
       {slurm_munge::Payload("gke-a", 13, 0), slurm_munge::Payload("gke-a", 12, 1),
        slurm_munge::Payload("gke-b", 12, 0), slurm_munge::Payload("gke-a", 12, std::nullopt)}) {
    absl::Status s = auth_->Check(Encode(payload), "Hold", "gke-a", step);
    EXPECT_TRUE(absl::IsPermissionDenied(s)) << payload << ": " << s;
    EXPECT_NE(s.message().find("not \"duet/v1 node=gke-a job=12 step=0\""),
              absl::string_view::npos)
        << s;
  }
  // A user (not root, not SlurmUser) cannot speak for slurmstepd.
  absl::Status s =
      auth_->Check(EncodeAs(65534, slurm_munge::Payload("gke-a", 12, 0)), "Hold", "gke-a", step);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_NE(s.message().find("uid 65534"), absl::string_view::npos) << s;
  // ... unless it is the configured SlurmUser.
  MungeAuth with_user(MungeAuthOptions{socket_, 65534});
  EXPECT_TRUE(
      with_user.Check(EncodeAs(65534, slurm_munge::Payload("gke-a", 12, 0)), "Hold", "gke-a", step)
          .ok());
}

TEST_F(MungeAuthTest, UnreachableMungedIsUnavailable) {
  MungeAuth auth(MungeAuthOptions{"/nonexistent/munge.socket", 0});
  absl::Status s =
      auth.Check(Encode(slurm_munge::Payload("gke-a", 12, 0)), "Hold", "gke-a", Owner::SlurmStep(12, 0));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  auto c = spank::MungeEncode("/nonexistent/munge.socket", "x");
  EXPECT_FALSE(c.ok());
}

// The slurm.require_munge / munge_socket / munge_uid keys (no cluster).
TEST(MungeConfigTest, DefaultsValuesAndBadTypes) {
  auto c = ParseConfig("slurm: {enabled: true}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->slurm.require_munge);
  EXPECT_EQ(c->slurm.munge_socket, "");
  EXPECT_EQ(c->slurm.munge_uid, 0u);
  c = ParseConfig(
      "slurm: {enabled: true, require_munge: false, munge_socket: /run/m.sock, munge_uid: 64030}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->slurm.require_munge);
  EXPECT_EQ(c->slurm.munge_socket, "/run/m.sock");
  EXPECT_EQ(c->slurm.munge_uid, 64030u);
  c = ParseConfig("slurm: {require_munge: sometimes}\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("slurm.require_munge"), absl::string_view::npos)
      << c.status();
  c = ParseConfig("slurm: {munge_uid: -1}\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("slurm.munge_uid"), absl::string_view::npos) << c.status();
}

}  // namespace
}  // namespace duet
