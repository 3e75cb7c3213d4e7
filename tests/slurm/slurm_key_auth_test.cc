// The slurm.key credential (auth/slurm clusters): the plugin's side
// (spank::SlurmKeyCredential, slurm_key::Make) against the bridge's
// (SlurmKeyAuth), with real key files and a fake clock. No cluster: the
// SPANK path through real slurmstepd is in SlurmE2eTest on 24.11 and 26.05.

#include "bridge/slurm/slurm_key_auth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bridge/config/config.h"
#include "common/credential/slurm_key_cred.h"
#include "gtest/gtest.h"
#include "slurm_plugin/bridge_client.h"
#include "slurm_plugin/plugin_config.h"
#include "tests/fakes/fake_clock.h"

namespace duet {
namespace {

using fakes::FakeClock;

Owner Step(uint32_t job, uint32_t step) { return Owner::SlurmStep(job, step); }
Owner Job(uint32_t job) { return Owner::SlurmJob(job); }

class SlurmKeyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/duet-slurmkey.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    key_path_ = WriteKey("slurm.key", std::string(64, 'k') + "0123456789", 0600);
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  std::string WriteKey(const std::string& name, const std::string& bytes, mode_t mode) {
    const std::string p = dir_ + "/" + name;
    std::ofstream(p, std::ios::binary) << bytes;
    chmod(p.c_str(), mode);
    return p;
  }
  std::unique_ptr<SlurmKeyAuth> Auth(size_t max_remembered = 1024) {
    SlurmKeyAuthOptions o;
    o.key_file = key_path_;
    o.clock = &clock_;
    o.max_remembered = max_remembered;
    auto a = SlurmKeyAuth::Create(o);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? std::move(*a) : nullptr;
  }
  // What the plugin sends, made at the fake clock's now.
  std::string Cred(const std::string& node, uint32_t job, std::optional<uint32_t> step,
                   const char* method, absl::Duration age = absl::ZeroDuration(),
                   const std::string& key_path = "") {
    auto key = slurm_key::LoadDerivedKey(key_path.empty() ? key_path_ : key_path);
    EXPECT_TRUE(key.ok()) << key.status();
    auto c = slurm_key::Make(*key, node, job, step, method, absl::ToUnixSeconds(clock_.Now() - age));
    EXPECT_TRUE(c.ok()) << c.status();
    return *c;
  }

  std::string dir_;
  std::string key_path_;
  FakeClock clock_;
};

TEST_F(SlurmKeyTest, ThePluginsCredentialIsAcceptedOnceForItsOwnCall) {
  auto auth = Auth();
  // The plugin's own function (reads the key as root, stamps real time).
  clock_.SetNow(absl::Now());
  auto c = spank::SlurmKeyCredential(key_path_, "gke-a", 12, 0, "Hold");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(absl::StartsWith(*c, slurm_key::kPrefix)) << *c;
  SlurmKeyAuth::Why why;
  EXPECT_TRUE(auth->Check(*c, "Hold", "gke-a", Step(12, 0), &why).ok());
  EXPECT_EQ(why, SlurmKeyAuth::Why::kNone);
  // The same credential again: a replay.
  absl::Status s = auth->Check(*c, "Hold", "gke-a", Step(12, 0), &why);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_EQ(why, SlurmKeyAuth::Why::kReplayed);
  EXPECT_TRUE(absl::StrContains(s.message(), "replayed")) << s;
  // A job-level Release (no step) has its own payload.
  c = spank::SlurmKeyCredential(key_path_, "gke-a", 12, std::nullopt, "Release");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(auth->Check(*c, "Release", "gke-a", Job(12)).ok());
}

TEST_F(SlurmKeyTest, ACredentialServesNoOtherJobStepNodeOrCall) {
  auto auth = Auth();
  const std::string c = Cred("gke-a", 12, 0, "Hold");
  struct Case {
    const char* method;
    const char* node;
    Owner owner;
  } cases[] = {
      {"Hold", "gke-a", Step(13, 0)},   // another job
      {"Hold", "gke-a", Step(12, 1)},   // another step
      {"Hold", "gke-b", Step(12, 0)},   // another node
      {"Release", "gke-a", Step(12, 0)},  // another call
      {"Hold", "gke-a", Job(12)},       // the job, not the step
  };
  for (const Case& k : cases) {
    SlurmKeyAuth::Why why;
    absl::Status s = auth->Check(c, k.method, k.node, k.owner, &why);
    EXPECT_TRUE(absl::IsUnauthenticated(s)) << k.method << " " << k.node << " " << s;
    EXPECT_EQ(why, SlurmKeyAuth::Why::kBadMac) << s;
  }
  // None of the refusals spent it: the right call still goes through.
  EXPECT_TRUE(auth->Check(c, "Hold", "gke-a", Step(12, 0)).ok());
}

TEST_F(SlurmKeyTest, ForgedCredentialsAreRefused) {
  auto auth = Auth();
  SlurmKeyAuth::Why why;
  // Made with another cluster's key.
  const std::string other = WriteKey("other.key", std::string(64, 'x'), 0600);
  absl::Status s = auth->Check(Cred("gke-a", 12, 0, "Hold", absl::ZeroDuration(), other), "Hold",
                               "gke-a", Step(12, 0), &why);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_EQ(why, SlurmKeyAuth::Why::kBadMac);
  // A good credential with its time moved (the MAC covers it).
  std::string c = Cred("gke-a", 12, 0, "Hold");
  std::string moved = c;
  const size_t t = moved.find(':') + 1;
  moved[t] = moved[t] == '1' ? '2' : '1';
  s = auth->Check(moved, "Hold", "gke-a", Step(12, 0), &why);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_TRUE(why == SlurmKeyAuth::Why::kBadMac || why == SlurmKeyAuth::Why::kExpired);
  // Malformed ones.
  for (const std::string& bad :
       {std::string("MUNGE:abc"), std::string(slurm_key::kPrefix) + "1:2",
        std::string(slurm_key::kPrefix) + "x:" + std::string(32, 'a') + ":" + std::string(64, 'b'),
        std::string(slurm_key::kPrefix) + "1:" + std::string(32, 'A') + ":" + std::string(64, 'b'),
        std::string(slurm_key::kPrefix) + "-5:" + std::string(32, 'a') + ":" + std::string(64, 'b'),
        std::string(slurm_key::kPrefix) + "1:" + std::string(32, 'a') + ":" + std::string(63, 'b')}) {
    s = auth->Check(bad, "Hold", "gke-a", Step(12, 0), &why);
    EXPECT_TRUE(absl::IsUnauthenticated(s)) << bad << " " << s;
    EXPECT_EQ(why, SlurmKeyAuth::Why::kMalformed) << bad;
  }
  // None at all.
  s = auth->Check("", "Hold", "gke-a", Step(12, 0), &why);
  EXPECT_TRUE(absl::IsUnauthenticated(s));
  EXPECT_EQ(why, SlurmKeyAuth::Why::kMissing);
  EXPECT_TRUE(absl::StrContains(s.message(), "auth=slurm_key")) << s;
  // Pods need none.
  EXPECT_TRUE(auth->Check("", "Hold", "gke-a", Owner::Pod("uid-1", "ns", "p")).ok());
}

TEST_F(SlurmKeyTest, OldAndFutureCredentialsAreRefused) {
  auto auth = Auth();
  SlurmKeyAuth::Why why;
  EXPECT_TRUE(auth->Check(Cred("n", 1, 0, "Hold", absl::Minutes(4)), "Hold", "n", Step(1, 0)).ok());
  absl::Status s =
      auth->Check(Cred("n", 1, 0, "Hold", absl::Minutes(6)), "Hold", "n", Step(1, 0), &why);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_EQ(why, SlurmKeyAuth::Why::kExpired);
  s = auth->Check(Cred("n", 1, 0, "Hold", -absl::Minutes(6)), "Hold", "n", Step(1, 0), &why);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_EQ(why, SlurmKeyAuth::Why::kExpired);
}

TEST_F(SlurmKeyTest, TheReplayMemoryIsBoundedAndForgetsExpiredCredentials) {
  auto auth = Auth(/*max_remembered=*/2);
  EXPECT_TRUE(auth->Check(Cred("n", 1, 0, "Hold"), "Hold", "n", Step(1, 0)).ok());
  EXPECT_TRUE(auth->Check(Cred("n", 1, 1, "Hold"), "Hold", "n", Step(1, 1)).ok());
  SlurmKeyAuth::Why why;
  absl::Status s = auth->Check(Cred("n", 1, 2, "Hold"), "Hold", "n", Step(1, 2), &why);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_EQ(why, SlurmKeyAuth::Why::kFull);
  // Once the first two have expired their nonces are forgotten.
  clock_.Advance(absl::Minutes(5) + absl::Seconds(1));
  EXPECT_TRUE(auth->Check(Cred("n", 1, 2, "Hold"), "Hold", "n", Step(1, 2)).ok());
}

TEST_F(SlurmKeyTest, KeyFilesAreCheckedLikeSlurmChecksThem) {
  auto good = slurm_key::LoadDerivedKey(key_path_);
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(*good, slurm_key::DeriveKey(std::string(64, 'k') + "0123456789"));
  EXPECT_NE(*good, std::string(64, 'k') + "0123456789");  // never the key itself
  // Kubernetes mounts Secrets through symlinks.
  const std::string link = dir_ + "/link.key";
  ASSERT_EQ(symlink(key_path_.c_str(), link.c_str()), 0);
  EXPECT_TRUE(slurm_key::LoadDerivedKey(link).ok());

  auto missing = slurm_key::LoadDerivedKey(dir_ + "/nope.key");
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "nope.key"));
  auto open_mode = slurm_key::LoadDerivedKey(WriteKey("open.key", std::string(64, 'k'), 0644));
  EXPECT_TRUE(absl::IsFailedPrecondition(open_mode.status())) << open_mode.status();
  EXPECT_TRUE(absl::StrContains(open_mode.status().message(), "0644")) << open_mode.status();
  auto tiny = slurm_key::LoadDerivedKey(WriteKey("tiny.key", "short", 0600));
  EXPECT_TRUE(absl::IsFailedPrecondition(tiny.status())) << tiny.status();
  auto dir = slurm_key::LoadDerivedKey(dir_);
  EXPECT_FALSE(dir.ok());

  SlurmKeyAuthOptions o;
  o.key_file = dir_ + "/nope.key";
  EXPECT_TRUE(absl::IsNotFound(SlurmKeyAuth::Create(o).status()));
  o.key_file = key_path_;
  o.ttl = absl::Milliseconds(10);
  EXPECT_TRUE(absl::IsInvalidArgument(SlurmKeyAuth::Create(o).status()));

  EXPECT_EQ(slurm_key::DefaultKeyPath("/etc/slurm/slurm.conf"), "/etc/slurm/slurm.key");
  EXPECT_EQ(slurm_key::DefaultKeyPath("/x/y.conf"), "/x/slurm.key");
  EXPECT_EQ(spank::SlurmKeyPath("/k"), "/k");
}

TEST(SlurmCredentialConfigTest, KeysDefaultsAndContradictions) {
  auto c = ParseConfig("slurm: {enabled: true}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->slurm.EffectiveCredential(), "munge");
  c = ParseConfig("slurm: {enabled: true, require_munge: false}\n");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->slurm.EffectiveCredential(), "none");
  c = ParseConfig(
      "slurm: {enabled: true, credential: slurm_key, key_file: /etc/slurm/slurm.key, "
      "credential_ttl: 2m}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->slurm.EffectiveCredential(), "slurm_key");
  EXPECT_EQ(c->slurm.key_file, "/etc/slurm/slurm.key");
  EXPECT_EQ(c->slurm.credential_ttl, absl::Minutes(2));
  for (const char* bad : {"slurm: {credential: kerberos}\n",
                          "slurm: {credential: slurm_key, require_munge: false}\n",
                          "slurm: {credential_ttl: 10ms}\n"}) {
    auto v = ParseConfig(bad);
    absl::Status s = v.ok() ? ValidateConfig(*v) : v.status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad << " " << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "slurm.")) << s;
  }
}

TEST(SlurmCredentialArgsTest, PlugstackAuthKeys) {
  auto c = spank::ParsePluginArgs(0, nullptr);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->auth, spank::StepAuth::kMunge);
  const char* key[] = {"auth=slurm_key", "slurm_key=/etc/slurm/slurm.key"};
  c = spank::ParsePluginArgs(2, key);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->auth, spank::StepAuth::kSlurmKey);
  EXPECT_EQ(c->slurm_key, "/etc/slurm/slurm.key");
  const char* off[] = {"munge=no"};
  c = spank::ParsePluginArgs(1, off);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->auth, spank::StepAuth::kNone);
  for (std::vector<const char*> bad :
       {std::vector<const char*>{"auth=kerberos"}, {"slurm_key=relative.key"},
        {"munge=no", "auth=munge"}, {"auth=slurm_key", "munge=yes"}}) {
    c = spank::ParsePluginArgs(static_cast<int>(bad.size()), bad.data());
    EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << bad.back();
    EXPECT_TRUE(absl::StrContains(c.status().message(), bad.back())) << c.status();
  }
}

}  // namespace
}  // namespace duet
