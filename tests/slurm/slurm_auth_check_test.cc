// SlurmAuthCheck: libslurm's search for a credential source, on temporary
// directories standing in for /run, with real listening unix sockets.

#include "bridge/slurm/slurm_auth_check.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A unix socket at `path`: listening until destroyed, or (Close) left behind
// with nothing listening, as a dead sackd leaves it.
class UnixListener {
 public:
  explicit UnixListener(const std::string& path) {
    fs::create_directories(fs::path(path).parent_path());
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
        << path << ": " << std::strerror(errno);
    EXPECT_EQ(::listen(fd_, 4), 0);
  }
  ~UnixListener() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

class SlurmAuthCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/duet-auth.XXXXXX";  // short: unix socket paths are limited
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    env_.root = root_;
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string Run(const std::string& rel) const { return root_ + "/run/" + rel; }

  std::string WriteConf(const std::string& text) const {
    const std::string path = root_ + "/slurm.conf";
    std::ofstream(path) << text;
    return path;
  }

  static SlurmAuthConf SlurmConf(const std::string& cluster = "duettest") {
    return {"auth/slurm", cluster, "use_client_ids"};
  }

  std::string root_;
  SlurmAuthEnv env_;
};

TEST_F(SlurmAuthCheckTest, SearchOrderIsLibslurmsClusterThenFixedPaths) {
  EXPECT_THAT(SackSocketSearchOrder("c1", env_),
              ElementsAre(Run("slurm-c1/sack.socket"), Run("slurm/sack.socket"),
                          Run("slurmctld/sack.socket"), Run("slurmdbd/sack.socket")));
  EXPECT_THAT(SackSocketSearchOrder("", env_),
              ElementsAre(Run("slurm/sack.socket"), Run("slurmctld/sack.socket"),
                          Run("slurmdbd/sack.socket")));
  env_.sack_socket_env = "/somewhere/sack.socket";
  EXPECT_THAT(SackSocketSearchOrder("c1", env_), ElementsAre("/somewhere/sack.socket"));
}

TEST_F(SlurmAuthCheckTest, NoSackSocketIsNoneWithEveryPathTriedAndWhatToDo) {
  const SlurmAuthCheck c = CheckSlurmAuth(SlurmConf(), env_);
  EXPECT_EQ(c.source, SlurmAuthSource::kNone);
  EXPECT_FALSE(c.ready());
  ASSERT_EQ(c.tried.size(), 4u);
  EXPECT_EQ(c.tried[0], Run("slurm-duettest/sack.socket") + " (No such file or directory)");
  const std::string d = c.Describe();
  EXPECT_THAT(d, HasSubstr("no way to authenticate to slurmctld"));
  EXPECT_THAT(d, HasSubstr(Run("slurmdbd/sack.socket")));
  EXPECT_THAT(d, HasSubstr("sackd"));
  EXPECT_THAT(d, HasSubstr("SLURM_SACK_SOCKET"));
}

TEST_F(SlurmAuthCheckTest, FindsAListeningSackSocketAnywhereInTheOrder) {
  UnixListener ctld(Run("slurmctld/sack.socket"));
  SlurmAuthCheck c = CheckSlurmAuth(SlurmConf(), env_);
  EXPECT_EQ(c.source, SlurmAuthSource::kSackSocket);
  EXPECT_EQ(c.path, Run("slurmctld/sack.socket"));
  EXPECT_THAT(c.tried, IsEmpty());
  // An earlier one in libslurm's order wins.
  UnixListener cluster(Run("slurm-duettest/sack.socket"));
  c = CheckSlurmAuth(SlurmConf(), env_);
  EXPECT_EQ(c.path, Run("slurm-duettest/sack.socket"));
}

TEST_F(SlurmAuthCheckTest, ASocketFileNobodyListensOnDoesNotCount) {
  UnixListener sackd(Run("slurm/sack.socket"));
  ASSERT_TRUE(CheckSlurmAuth(SlurmConf(), env_).ready());
  sackd.Close();  // the file stays, as a killed sackd leaves it
  ASSERT_TRUE(fs::exists(Run("slurm/sack.socket")));
  const SlurmAuthCheck c = CheckSlurmAuth(SlurmConf(), env_);
  EXPECT_EQ(c.source, SlurmAuthSource::kNone);
  EXPECT_EQ(c.tried[1], Run("slurm/sack.socket") + " (Connection refused)");
}

TEST_F(SlurmAuthCheckTest, SlurmSackSocketEnvIsTheOnlyPlaceTried) {
  UnixListener sackd(Run("slurm/sack.socket"));
  env_.sack_socket_env = root_ + "/elsewhere.socket";
  SlurmAuthCheck c = CheckSlurmAuth(SlurmConf(), env_);
  EXPECT_EQ(c.source, SlurmAuthSource::kNone);  // no fallback, as libslurm
  EXPECT_THAT(c.tried, ElementsAre(root_ + "/elsewhere.socket (No such file or directory)"));
  UnixListener there(root_ + "/elsewhere.socket");
  c = CheckSlurmAuth(SlurmConf(), env_);
  EXPECT_EQ(c.source, SlurmAuthSource::kSackSocket);
  EXPECT_EQ(c.path, root_ + "/elsewhere.socket");
}

TEST_F(SlurmAuthCheckTest, MungeUsesAuthInfoSocketElseTheDefault) {
  SlurmAuthConf conf{"auth/munge", "duettest", ""};
  SlurmAuthCheck c = CheckSlurmAuth(conf, env_);
  EXPECT_EQ(c.source, SlurmAuthSource::kNone);
  EXPECT_THAT(c.tried, ElementsAre(Run("munge/munge.socket.2") + " (No such file or directory)"));
  EXPECT_THAT(c.Describe(), HasSubstr("munged"));
  {
    UnixListener munged(Run("munge/munge.socket.2"));
    c = CheckSlurmAuth(conf, env_);
    EXPECT_EQ(c.source, SlurmAuthSource::kMungeSocket);
  }
  conf.auth_info = "ttl=60, socket=" + root_ + "/m.sock";
  UnixListener munged(root_ + "/m.sock");
  c = CheckSlurmAuth(conf, env_);
  EXPECT_EQ(c.source, SlurmAuthSource::kMungeSocket);
  EXPECT_EQ(c.path, root_ + "/m.sock");
  // No AuthType: Slurm's default, munge.
  conf.auth_type = "";
  EXPECT_EQ(CheckSlurmAuth(conf, env_).auth_type, "auth/munge");
}

TEST_F(SlurmAuthCheckTest, OtherAuthTypesAndUnreadableConfAreUnchecked) {
  SlurmAuthCheck c = CheckSlurmAuth({"auth/jwt", "x", ""}, env_);
  EXPECT_EQ(c.source, SlurmAuthSource::kUnchecked);
  EXPECT_TRUE(c.ready());
  c = CheckSlurmAuthForConf(root_ + "/missing.conf", env_);
  EXPECT_EQ(c.source, SlurmAuthSource::kUnchecked);
  EXPECT_THAT(c.note, HasSubstr("missing.conf"));
}

TEST_F(SlurmAuthCheckTest, ReadsTheConfAsSlurmDoes) {
  const std::string path = WriteConf(
      "# AuthType=auth/munge\n"
      "clustername=first\n"
      "  AUTHTYPE = auth/slurm   # Slinky's\n"
      "AuthInfo=\"use_client_ids\"\n"
      "ClusterName=second\n"
      "NodeName=a CPUs=1\n");
  absl::StatusOr<SlurmAuthConf> conf = ReadSlurmAuthConf(path);
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_EQ(conf->auth_type, "auth/slurm");
  EXPECT_EQ(conf->cluster_name, "second");
  EXPECT_EQ(conf->auth_info, "use_client_ids");
  UnixListener sackd(Run("slurm-second/sack.socket"));
  EXPECT_EQ(CheckSlurmAuthForConf(path, env_).path, Run("slurm-second/sack.socket"));
}

TEST_F(SlurmAuthCheckTest, MonitorFollowsASackdThatComesAndGoes) {
  SlurmAuthMonitor monitor(WriteConf("AuthType=auth/slurm\nClusterName=c\n"), env_);
  EXPECT_EQ(monitor.Check().source, SlurmAuthSource::kNone);
  monitor.OnPassFailed();
  EXPECT_EQ(monitor.last().source, SlurmAuthSource::kNone);
  {
    UnixListener sackd(Run("slurm/sack.socket"));
    monitor.OnPassFailed();  // checks again
    EXPECT_EQ(monitor.last().source, SlurmAuthSource::kSackSocket);
    monitor.OnPassSucceeded();
  }
  EXPECT_EQ(monitor.Check().source, SlurmAuthSource::kNone);
}

// The monitor's log: the first result, a failed pass once per failing
// stretch, and every change; never the same news twice in a row.
TEST_F(SlurmAuthCheckTest, MonitorSaysItAtStartOnTheFirstFailedPassAndOnEachChange) {
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  spdlog::default_logger()->sinks().push_back(ring);
  auto count = [&](const std::string& needle) {
    int n = 0;
    for (const std::string& line : ring->last_formatted()) n += absl::StrContains(line, needle);
    return n;
  };
  SlurmAuthMonitor monitor(WriteConf("AuthType=auth/slurm\nClusterName=c\n"), env_);
  monitor.Check();
  EXPECT_EQ(count("[error] slurm auth: no way to authenticate to slurmctld"), 1);
  monitor.Check();  // no change: nothing new
  monitor.OnPassFailed();
  monitor.OnPassFailed();
  monitor.Check();
  EXPECT_EQ(count("a Slurm sync pass failed and duet-bridge has no way to authenticate"), 1);
  EXPECT_EQ(count("[error]"), 2);
  monitor.OnPassSucceeded();  // a later failing stretch is said again
  monitor.OnPassFailed();
  EXPECT_EQ(count("a Slurm sync pass failed"), 2);
  {
    UnixListener sackd(Run("slurm/sack.socket"));
    monitor.Check();
    monitor.Check();
    EXPECT_EQ(count("[info] slurm auth: now AuthType=auth/slurm: credentials from the sack "
                    "socket " + Run("slurm/sack.socket")),
              1);
    monitor.OnPassFailed();  // failed for another reason: nothing about auth
    EXPECT_EQ(count("a Slurm sync pass failed"), 2);
  }
  monitor.Check();
  EXPECT_EQ(count("[error] slurm auth: now no way to authenticate"), 1);
  spdlog::default_logger()->sinks().pop_back();
}

TEST(LibslurmConfPathTest, ConfiguredThenEnvThenDefault) {
  EXPECT_EQ(LibslurmConfPath("/a/slurm.conf"), "/a/slurm.conf");
  const char* old = getenv("SLURM_CONF");
  const std::string saved = old ? old : "";
  setenv("SLURM_CONF", "/b/slurm.conf", 1);
  EXPECT_EQ(LibslurmConfPath(""), "/b/slurm.conf");
  unsetenv("SLURM_CONF");
  EXPECT_EQ(LibslurmConfPath(""), "/etc/slurm/slurm.conf");
  if (old != nullptr) setenv("SLURM_CONF", saved.c_str(), 1);
}

}  // namespace
}  // namespace duet
