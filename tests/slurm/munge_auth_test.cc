// MungeAuth (bridge side) against credentials from the plugin's MungeEncode,
// through the real munged of a test cluster (label: slurm).

#include "bridge/slurm/munge_auth.h"

#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bridge/config/config.h"
#include "common/credential/munge_payload.h"
#include "common/credential/request_digest.h"
#include "common/reason.h"
#include "gtest/gtest.h"
#include "slurm_plugin/bridge_client.h"
#include "tests/slurm/credential_bindings.h"
#include "tests/fakes/fake_clock.h"
#include "tests/slurm/slurm_cluster_fixture.h"

namespace duet {
namespace {

using ::duet::testing::TestSlurmCluster;

using ::duet::testing::HoldBinding;
using ::duet::testing::ReleaseBinding;

std::string Why(const absl::Status& s) {
  const auto m = ReasonMetadata(s);
  auto it = m.find("why");
  return it == m.end() ? "" : it->second;
}

class MungeAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = TestSlurmCluster::Get();
    ASSERT_TRUE(cluster_->ok());
    socket_ = cluster_->root() + "/munge/munge.socket.2";
    auth_ = std::make_unique<MungeAuth>(Options());
  }
  MungeAuthOptions Options(uint32_t slurm_uid = 0) {
    MungeAuthOptions o;
    o.socket = socket_;
    o.slurm_uid = slurm_uid;
    return o;
  }
  std::string Encode(const std::string& payload) {
    auto c = spank::MungeEncode(socket_, payload);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : "";
  }
  std::string Encode(const slurm_munge::Binding& b) { return Encode(slurm_munge::Payload(b)); }
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

TEST_F(MungeAuthTest, ValidCredentialForExactlyThisCallIsAccepted) {
  const slurm_munge::Binding hold = HoldBinding("gke-a", 12, 0);
  EXPECT_EQ(slurm_munge::Payload(hold),
            "duet/v3 Hold node=5:gke-a owner=slurm_step:12.0 devices=1:0:0 generation=0");
  std::string who;
  EXPECT_TRUE(auth_->Check(Encode(hold), hold, &who).ok());
  EXPECT_EQ(who, "slurm job=12 step=0 uid=0 credential=munge");
  const slurm_munge::Binding job = ReleaseBinding("gke-a", 12, std::nullopt);
  EXPECT_TRUE(auth_->Check(Encode(job), job).ok());
}

TEST_F(MungeAuthTest, MissingForgedReplayedAreUnauthenticatedWithAReason) {
  const slurm_munge::Binding hold = HoldBinding("gke-a", 12, 0);
  absl::Status s = auth_->Check("", hold);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_EQ(ReasonOf(s), v1::reason::kCredentialRefused);
  EXPECT_EQ(Why(s), "missing");
  EXPECT_NE(s.message().find("has no munge credential"), absl::string_view::npos) << s;

  std::string cred = Encode(hold);
  std::string forged = cred;
  forged[forged.size() / 2] = forged[forged.size() / 2] == 'A' ? 'B' : 'A';
  s = auth_->Check(forged, hold);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_EQ(Why(s), "bad_signature") << s;
  EXPECT_NE(s.message().find("munge credential rejected"), absl::string_view::npos) << s;
  s = auth_->Check("MUNGE:not-a-credential:", hold);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;

  ASSERT_TRUE(auth_->Check(cred, hold).ok());
  s = auth_->Check(cred, hold);  // the same credential again
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_EQ(Why(s), "replayed") << s;
}

// Issue 25 item 8: the munge payload names the method and the request, so
// a Hold captured on the wire is no Release, and serves no other step or
// devices.
TEST_F(MungeAuthTest, AHoldsCredentialIsNoReleaseAndServesNoOtherRequest) {
  const slurm_munge::Binding hold = HoldBinding("gke-a", 12, 0, {0});
  absl::Status s = auth_->Check(Encode(hold), ReleaseBinding("gke-a", 12, 0));
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_EQ(ReasonOf(s), v1::reason::kCredentialRefused);
  EXPECT_EQ(Why(s), "wrong_method") << s;
  for (const slurm_munge::Binding& other :
       {HoldBinding("gke-a", 13, 0), HoldBinding("gke-a", 12, 1), HoldBinding("gke-b", 12, 0),
        HoldBinding("gke-a", 12, std::nullopt), HoldBinding("gke-a", 12, 0, {1}),
        HoldBinding("gke-a", 12, 0, {0, 1})}) {
    s = auth_->Check(Encode(other), hold);
    EXPECT_TRUE(absl::IsPermissionDenied(s)) << slurm_munge::Payload(other) << ": " << s;
    EXPECT_EQ(Why(s), "wrong_request") << s;
    EXPECT_NE(s.message().find(absl::StrCat("not \"", slurm_munge::Payload(hold), "\"")),
              absl::string_view::npos)
        << s;
  }
  // The previous release's duet/v2 payload (the SHA-256 of the same text)
  // binds the same way: accepted for exactly this call, refused for another.
  EXPECT_TRUE(auth_->Check(Encode(slurm_munge::PreviousPayload(hold)), hold).ok());
  s = auth_->Check(Encode(slurm_munge::PreviousPayload(HoldBinding("gke-a", 12, 0, {1}))), hold);
  EXPECT_EQ(Why(s), "wrong_request") << s;
  s = auth_->Check(Encode(slurm_munge::PreviousPayload(hold)), ReleaseBinding("gke-a", 12, 0));
  EXPECT_EQ(Why(s), "wrong_method") << s;
  // An older plugin's duet/v1 payload is refused by its version.
  s = auth_->Check(Encode(std::string("duet/v1 node=gke-a job=12 step=0")), hold);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_EQ(Why(s), "wrong_version") << s;
  EXPECT_NE(s.message().find("\"duet/v1\""), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("accepts duet/v3 (or the previous release's duet/v2)"),
            absl::string_view::npos)
      << s;
}

// slurm.credential_max_age against munge's encode time: 1s, checked 2s
// after the encode (a fake clock ahead of munged's), and 2s before it.
TEST_F(MungeAuthTest, CredentialsOlderThanTheMaxAgeAreExpired) {
  auto auth_at = [&](const fakes::FakeClock* clock) {
    MungeAuthOptions o = Options();
    o.max_age = absl::Seconds(1);
    o.clock = clock;
    return std::make_unique<MungeAuth>(o);
  };
  const fakes::FakeClock later(absl::Now() + absl::Seconds(3));
  const fakes::FakeClock earlier(absl::Now() - absl::Seconds(3));
  const slurm_munge::Binding hold = HoldBinding("gke-a", 12, 0);
  absl::Status s = auth_at(&later)->Check(Encode(hold), hold);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_EQ(Why(s), "expired") << s;
  EXPECT_NE(s.message().find("slurm.credential_max_age 1s"), absl::string_view::npos) << s;
  EXPECT_EQ(Why(auth_at(&earlier)->Check(Encode(hold), hold)), "expired");
  MungeAuthOptions o = Options();
  o.max_age = absl::Seconds(2);
  EXPECT_TRUE(MungeAuth(o).Check(Encode(hold), hold).ok());
}

TEST_F(MungeAuthTest, OnlyRootOrSlurmUserMaySpeakForSlurmstepd) {
  const slurm_munge::Binding hold = HoldBinding("gke-a", 12, 0);
  absl::Status s = auth_->Check(EncodeAs(65534, slurm_munge::Payload(hold)), hold);
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_EQ(Why(s), "wrong_uid") << s;
  EXPECT_NE(s.message().find("uid 65534"), absl::string_view::npos) << s;
  // ... unless it is the configured SlurmUser.
  MungeAuth with_user(Options(65534));
  EXPECT_TRUE(with_user.Check(EncodeAs(65534, slurm_munge::Payload(hold)), hold).ok());
}

TEST_F(MungeAuthTest, UnreachableMungedIsUnavailable) {
  MungeAuthOptions o = Options();
  o.socket = "/nonexistent/munge.socket";
  MungeAuth auth(o);
  const slurm_munge::Binding hold = HoldBinding("gke-a", 12, 0);
  absl::Status s = auth.Check(Encode(hold), hold);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_EQ(ReasonOf(s), "");
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
