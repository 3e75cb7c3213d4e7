// The slurm.key credential (auth/slurm clusters): the plugin's side
// (spank::SlurmKeyCredential, slurm_key::Make) against the bridge's
// (SlurmKeyAuth), with real key files and a fake clock; the replay memory;
// slurm.credential_max_age. No cluster: the
// SPANK path through real slurmstepd is in SlurmE2eTest on 24.11 and 26.05.

#include "bridge/slurm/slurm_key_auth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bridge/config/config.h"
#include "common/credential/munge_payload.h"
#include "common/credential/replay_memory.h"
#include "common/credential/request_digest.h"
#include "common/credential/slurm_key_cred.h"
#include "common/reason.h"
#include "gtest/gtest.h"
#include "slurm_plugin/bridge_client.h"
#include "tests/slurm/credential_bindings.h"
#include "slurm_plugin/plugin_config.h"
#include "tests/fakes/fake_clock.h"

namespace duet {
namespace {

using fakes::FakeClock;

using ::duet::testing::HoldBinding;
using ::duet::testing::ReleaseBinding;

std::string Why(const absl::Status& s) {
  const auto m = ReasonMetadata(s);
  auto it = m.find("why");
  return it == m.end() ? "" : it->second;
}

class SlurmKeyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/duet-slurmkey.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    key_path_ = WriteKey("slurm.key", std::string(64, 'k') + "0123456789", 0600);
    // A whole second, so that ages in whole seconds are exact (the fake
    // clock never goes back, so one ahead of real time).
    clock_.SetNow(absl::FromUnixSeconds(absl::ToUnixSeconds(absl::Now()) + 1));
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  std::string WriteKey(const std::string& name, const std::string& bytes, mode_t mode) {
    const std::string p = dir_ + "/" + name;
    std::ofstream(p, std::ios::binary) << bytes;
    chmod(p.c_str(), mode);
    return p;
  }
  std::unique_ptr<SlurmKeyAuth> Auth(size_t max_remembered = 1024,
                                     absl::Duration max_age = absl::Seconds(10)) {
    SlurmKeyAuthOptions o;
    o.key_file = key_path_;
    o.clock = &clock_;
    o.max_remembered = max_remembered;
    o.max_age = max_age;
    auto a = SlurmKeyAuth::Create(o);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? std::move(*a) : nullptr;
  }
  // What the plugin sends for `b`, made `age` before the fake clock's now.
  std::string Cred(const slurm_munge::Binding& b, absl::Duration age = absl::ZeroDuration(),
                   const std::string& key_path = "") {
    return CredFor(slurm_munge::Payload(b), age, key_path);
  }
  std::string CredFor(const std::string& payload, absl::Duration age = absl::ZeroDuration(),
                      const std::string& key_path = "") {
    auto key = slurm_key::LoadDerivedKey(key_path.empty() ? key_path_ : key_path);
    EXPECT_TRUE(key.ok()) << key.status();
    auto c = slurm_key::Make(*key, payload, absl::ToUnixSeconds(clock_.Now() - age));
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
  const slurm_munge::Binding hold = HoldBinding("gke-a", 12, 0, {0, 1});
  auto c = spank::SlurmKeyCredential(key_path_, slurm_munge::Payload(hold));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(absl::StartsWith(*c, slurm_key::kPrefix)) << *c;
  std::string who;
  EXPECT_TRUE(auth->Check(*c, hold, &who).ok());
  EXPECT_EQ(who, "slurm job=12 step=0 credential=slurm_key");
  // The same credential again: a replay.
  absl::Status s = auth->Check(*c, hold);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_EQ(ReasonOf(s), v1::reason::kCredentialRefused);
  EXPECT_EQ(Why(s), "replayed");
  EXPECT_EQ(ReasonMetadata(s)["node"], "gke-a");
  EXPECT_TRUE(absl::StrContains(s.message(), "replayed")) << s;
  // A job-level Release (no step) has its own payload.
  c = spank::SlurmKeyCredential(key_path_, slurm_munge::Payload(ReleaseBinding("gke-a", 12, {})));
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(auth->Check(*c, ReleaseBinding("gke-a", 12, {})).ok());
}

// Issue 25 item 8: a Hold's credential is no Release's, and a credential
// for some devices or one step is no other's.
TEST_F(SlurmKeyTest, ACredentialServesNoOtherCallStepNodeOrDevices) {
  auto auth = Auth();
  const slurm_munge::Binding hold = HoldBinding("gke-a", 12, 0, {0});
  const std::string c = Cred(hold);
  absl::Status s = auth->Check(c, ReleaseBinding("gke-a", 12, 0));
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_EQ(ReasonOf(s), v1::reason::kCredentialRefused);
  EXPECT_EQ(Why(s), "wrong_method") << s;
  for (const slurm_munge::Binding& other :
       {HoldBinding("gke-a", 13, 0), HoldBinding("gke-a", 12, 1), HoldBinding("gke-b", 12, 0),
        HoldBinding("gke-a", 12, {}), HoldBinding("gke-a", 12, 0, {1}),
        HoldBinding("gke-a", 12, 0, {0, 1})}) {
    s = auth->Check(c, other);
    EXPECT_TRUE(absl::IsPermissionDenied(s)) << slurm_munge::Payload(other) << " " << s;
    EXPECT_EQ(Why(s), "wrong_request") << s;
  }
  // None of the refusals spent it: the right call still goes through.
  EXPECT_TRUE(auth->Check(c, hold).ok());
  // The previous release's duet/v2 payload binds the same way.
  const std::string previous = CredFor(slurm_munge::PreviousPayload(hold));
  EXPECT_EQ(Why(auth->Check(previous, ReleaseBinding("gke-a", 12, 0))), "wrong_method");
  EXPECT_EQ(Why(auth->Check(previous, HoldBinding("gke-a", 12, 0, {1}))), "wrong_request");
  EXPECT_TRUE(auth->Check(previous, hold).ok());
  // A payload of no version this bridge knows.
  s = auth->Check(CredFor("duet/v9 Hold node=5:gke-a"), hold);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_EQ(Why(s), "wrong_version") << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "\"duet/v9\"")) << s;
}

TEST_F(SlurmKeyTest, ForgedAndOldCredentialsAreRefused) {
  auto auth = Auth();
  const slurm_munge::Binding hold = HoldBinding("gke-a", 12, 0);
  // Made with another cluster's key.
  const std::string other = WriteKey("other.key", std::string(64, 'x'), 0600);
  absl::Status s = auth->Check(Cred(hold, absl::ZeroDuration(), other), hold);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_EQ(Why(s), "bad_signature");
  // A good credential with its time moved (the MAC covers it).
  std::string moved = Cred(hold);
  const size_t t = moved.find(':') + 1;
  moved[t] = moved[t] == '1' ? '2' : '1';
  s = auth->Check(moved, hold);
  EXPECT_EQ(Why(s), "bad_signature") << s;
  // ... or its payload swapped for another request's.
  std::vector<std::string> parts = absl::StrSplit(Cred(hold), ':');
  std::vector<std::string> other_parts = absl::StrSplit(Cred(HoldBinding("gke-a", 12, 0, {3})), ':');
  parts[3] = other_parts[3];
  s = auth->Check(absl::StrJoin(parts, ":"), HoldBinding("gke-a", 12, 0, {3}));
  EXPECT_EQ(Why(s), "bad_signature") << s;
  // An older plugin's duet-key1 credential is refused by its version.
  s = auth->Check(std::string(slurm_key::kOldPrefix) + "1700000000:" + std::string(32, 'a') + ":" +
                      std::string(64, 'b'),
                  hold);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_EQ(Why(s), "wrong_version");
  EXPECT_TRUE(absl::StrContains(s.message(), "duet/v3")) << s;
  // Malformed ones.
  for (const std::string& bad :
       {std::string("MUNGE:abc"), std::string(slurm_key::kPrefix) + "1:2",
        std::string(slurm_key::kPrefix) + "x:" + std::string(32, 'a') + ":YQ:" + std::string(64, 'b'),
        std::string(slurm_key::kPrefix) + "1:" + std::string(32, 'A') + ":YQ:" + std::string(64, 'b'),
        std::string(slurm_key::kPrefix) + "-5:" + std::string(32, 'a') + ":YQ:" + std::string(64, 'b'),
        std::string(slurm_key::kPrefix) + "1:" + std::string(32, 'a') + "::" + std::string(64, 'b'),
        std::string(slurm_key::kPrefix) + "1:" + std::string(32, 'a') + ":YQ:" + std::string(63, 'b')}) {
    s = auth->Check(bad, hold);
    EXPECT_TRUE(absl::IsUnauthenticated(s)) << bad << " " << s;
    EXPECT_EQ(Why(s), "malformed") << bad;
  }
  // None at all.
  s = auth->Check("", hold);
  EXPECT_TRUE(absl::IsUnauthenticated(s));
  EXPECT_EQ(Why(s), "missing");
  EXPECT_TRUE(absl::StrContains(s.message(), "auth=slurm_key")) << s;
}

// slurm.credential_max_age: 1s, and credentials made 2s before now and 2s
// after it (clock skew the other way) are refused as expired.
TEST_F(SlurmKeyTest, CredentialsOlderThanTheMaxAgeAreRefused) {
  auto auth = Auth(1024, absl::Seconds(1));
  const slurm_munge::Binding hold = HoldBinding("n", 1, 0);
  absl::Status ok = auth->Check(Cred(hold, absl::Seconds(1)), hold);
  EXPECT_TRUE(ok.ok()) << ok;
  absl::Status s = auth->Check(Cred(hold, absl::Seconds(2)), hold);
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;
  EXPECT_EQ(ReasonOf(s), v1::reason::kCredentialRefused);
  EXPECT_EQ(Why(s), "expired");
  EXPECT_TRUE(absl::StrContains(s.message(), "slurm.credential_max_age 1s")) << s;
  s = auth->Check(Cred(hold, -absl::Seconds(2)), hold);
  EXPECT_EQ(Why(s), "expired") << s;
  // One accepted now is dead for a new leader a lease later, whatever its
  // replay memory: the bound that replaces shared memory across failover.
  const std::string c = Cred(hold);
  auto next_leader = Auth(1024, absl::Seconds(1));
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(Why(next_leader->Check(c, hold)), "expired");
}

TEST_F(SlurmKeyTest, TheReplayMemoryIsBoundedAndForgetsExpiredCredentials) {
  auto auth = Auth(/*max_remembered=*/2);
  EXPECT_TRUE(auth->Check(Cred(HoldBinding("n", 1, 0)), HoldBinding("n", 1, 0)).ok());
  EXPECT_TRUE(auth->Check(Cred(HoldBinding("n", 1, 1)), HoldBinding("n", 1, 1)).ok());
  absl::Status s = auth->Check(Cred(HoldBinding("n", 1, 2)), HoldBinding("n", 1, 2));
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_EQ(Why(s), "full");
  // Once the first two have expired their nonces are forgotten.
  clock_.Advance(absl::Seconds(11));
  EXPECT_TRUE(auth->Check(Cred(HoldBinding("n", 1, 2)), HoldBinding("n", 1, 2)).ok());
}

TEST(ReplayMemoryTest, RemembersUntilExpiryAndRefusesPastItsBound) {
  credential::ReplayMemory m(2);
  const absl::Time t0 = absl::FromUnixSeconds(100);
  EXPECT_EQ(m.Remember("a", t0 + absl::Seconds(5), t0), credential::ReplayMemory::Result::kFirst);
  EXPECT_EQ(m.Remember("a", t0 + absl::Seconds(5), t0), credential::ReplayMemory::Result::kReplayed);
  EXPECT_EQ(m.Remember("b", t0 + absl::Seconds(1), t0), credential::ReplayMemory::Result::kFirst);
  EXPECT_EQ(m.Remember("c", t0 + absl::Seconds(9), t0), credential::ReplayMemory::Result::kFull);
  // "b" expires first although it came second.
  EXPECT_EQ(m.Remember("c", t0 + absl::Seconds(9), t0 + absl::Seconds(2)),
            credential::ReplayMemory::Result::kFirst);
  EXPECT_EQ(m.Remember("a", t0 + absl::Seconds(5), t0 + absl::Seconds(2)),
            credential::ReplayMemory::Result::kReplayed);
  EXPECT_EQ(m.size(), 2u);
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
  o.max_age = absl::Milliseconds(10);
  EXPECT_TRUE(absl::IsInvalidArgument(SlurmKeyAuth::Create(o).status()));

  EXPECT_EQ(slurm_key::DefaultKeyPath("/etc/slurm/slurm.conf"), "/etc/slurm/slurm.key");
  EXPECT_EQ(slurm_key::DefaultKeyPath("/x/y.conf"), "/x/slurm.key");
  EXPECT_EQ(spank::SlurmKeyPath("/k"), "/k");
}

TEST(SlurmCredentialConfigTest, KeysDefaultsAndContradictions) {
  auto c = ParseConfig("slurm: {enabled: true}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->slurm.EffectiveCredential(), "munge");
  EXPECT_EQ(CredentialMaxAge(*c), absl::Seconds(10));
  c = ParseConfig("slurm: {enabled: true, require_munge: false}\n");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->slurm.EffectiveCredential(), "none");
  c = ParseConfig(
      "slurm: {enabled: true, credential: slurm_key, key_file: /etc/slurm/slurm.key, "
      "credential_max_age: 4s}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->slurm.EffectiveCredential(), "slurm_key");
  EXPECT_EQ(c->slurm.key_file, "/etc/slurm/slurm.key");
  EXPECT_EQ(CredentialMaxAge(*c), absl::Seconds(4));
  EXPECT_TRUE(ValidateConfig(*c).ok());
  for (const char* bad : {"slurm: {credential: kerberos}\n",
                          "slurm: {credential: slurm_key, require_munge: false}\n",
                          "slurm: {credential_max_age: 10ms}\n",
                          "slurm: {credential_max_age: 6m}\n",
                          "slurm: {credential_ttl: 5m}\n"}) {
    auto v = ParseConfig(bad);
    absl::Status s = v.ok() ? ValidateConfig(*v) : v.status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad << " " << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "slurm.")) << s;
  }
}

// A credential must be dead before a standby can take over (its replay
// memory starts empty): credential_max_age not shorter than the lease is
// refused; unset, it follows the lease.
TEST(SlurmCredentialConfigTest, MaxAgeMustBeShorterThanATakeover) {
  const std::string le =
      "kubernetes: {leader_election: {enabled: true, lease_duration: 15s, renew_deadline: 10s, "
      "retry_period: 2s}}\n";
  for (const char* age : {"15s", "20s"}) {
    auto c = ParseConfig(le + "slurm: {credential_max_age: " + age + "}\n");
    ASSERT_TRUE(c.ok()) << c.status();
    absl::Status s = ValidateConfig(*c);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << age << " " << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "slurm.credential_max_age")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "kubernetes.leader_election.lease_duration")) << s;
  }
  auto c = ParseConfig(le + "slurm: {credential_max_age: 14s}\n");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(ValidateConfig(*c).ok());
  // Unset: the least gap between the old leader's last call and the new
  // one's first (lease_duration - renew_deadline), within 1s..10s.
  c = ParseConfig(le);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(CredentialMaxAge(*c), absl::Seconds(5));
  EXPECT_TRUE(ValidateConfig(*c).ok());
  c = ParseConfig(
      "kubernetes: {leader_election: {enabled: true, lease_duration: 2s, renew_deadline: 1500ms, "
      "retry_period: 500ms}}\n");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(CredentialMaxAge(*c), absl::Seconds(1));
  EXPECT_TRUE(ValidateConfig(*c).ok());
  // Without leader election there is no takeover to outlast.
  c = ParseConfig("slurm: {credential_max_age: 20s}\n");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(ValidateConfig(*c).ok());
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
