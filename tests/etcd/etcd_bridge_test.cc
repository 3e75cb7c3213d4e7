// The duet-bridge binary with journal.etcd over TLS (a real etcd with
// --client-cert-auth, tests/etcd/etcd_server.h): it starts and logs its
// ledger there with the client certificate of journal.etcd.tls, and it
// refuses an unreadable TLS file at start, naming the field, before it
// campaigns for the lease (a standby would otherwise find out at takeover).

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "bridge/etcd/etcd_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/etcd/etcd_server.h"
#include "tests/fakes/free_port.h"
#include "tests/fakes/wait.h"

namespace duet {
namespace {

using testing::EtcdServer;
using ::testing::HasSubstr;
using ::testing::Not;

class EtcdBridgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdServer::Available()) {
      GTEST_SKIP() << EtcdServer::kBinary << " is missing (Debian package etcd-server)";
    }
    ASSERT_TRUE(etcd_.Start().ok()) << etcd_.Log();
    dir_ = std::filesystem::temp_directory_path() / absl::StrCat("duet-etcd-bridge-", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  // Writes the config (journal.etcd over TLS with `tls`, then `extra`) and
  // starts duet-bridge on it, its output in dir_/bridge.log.
  void Start(const etcd::TlsOptions& tls, const std::string& extra = "") {
    const std::string cfg = dir_ + "/bridge.yaml";
    std::ofstream(cfg) << "grpc: {listen: \"127.0.0.1:" << fakes::FreePort()
                       << "\", shutdown_grace: 1s}\n"
                       << "metrics: {listen: \"\"}\n"
                       << "journal:\n"
                       << "  etcd:\n"
                       << "    endpoints: [\"" << etcd_.endpoint() << "\"]\n"
                       << "    prefix: /duet/bridge\n"
                       << "    tls: {ca_file: \"" << tls.ca_file << "\", cert_file: \""
                       << tls.cert_file << "\", key_file: \"" << tls.key_file << "\"}\n"
                       << "inventory: {source: embedded}\n"
                       << "log_level: info\n"
                       << extra;
    const std::string log = dir_ + "/bridge.log";
    pid_ = ::fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execl(DUET_BRIDGE_BIN, DUET_BRIDGE_BIN, "--config", cfg.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }

  // The exit status once duet-bridge has exited within `timeout`, else -1.
  int WaitExit(absl::Duration timeout) {
    int status = 0;
    if (!fakes::WaitFor([&] { return ::waitpid(pid_, &status, WNOHANG) == pid_; }, timeout,
                        "duet-bridge to exit")) {
      return -1;
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  std::string Log() const {
    std::ifstream in(dir_ + "/bridge.log");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  size_t KeysUnder(const std::string& prefix) {
    etcd::Client c({{etcd_.endpoint()}, absl::Seconds(2), etcd_.ClientTls()});
    auto r = c.Range(prefix, etcd::PrefixEnd(prefix), 0, 0);
    return r.ok() ? r->kvs.size() : 0;
  }

  EtcdServer etcd_{EtcdServer::Options{/*tls=*/true}};
  std::string dir_;
  pid_t pid_ = -1;
};

TEST_F(EtcdBridgeTest, TheBridgeLogsItsLedgerInEtcdOverTls) {
  Start(etcd_.ClientTls());
  // The fence, then a record per node of the embedded inventory, written
  // with the client certificate.
  EXPECT_TRUE(fakes::WaitFor([&] { return KeysUnder("/duet/bridge/log/") > 0; },
                             fakes::kWaitTimeout, "the bridge's records in etcd"))
      << Log();
  EXPECT_EQ(KeysUnder("/duet/bridge/fence"), 1u);
  ASSERT_EQ(::kill(pid_, SIGTERM), 0);
  EXPECT_EQ(WaitExit(absl::Seconds(20)), 0) << Log();
}

TEST_F(EtcdBridgeTest, AnUnreadableKeyStopsTheBridgeBeforeLeaderElection) {
  etcd::TlsOptions tls = etcd_.ClientTls();
  tls.key_file = dir_ + "/missing.key";
  // Leader election with a kubeconfig that does not exist: a bridge that
  // got as far as campaigning would fail on that instead.
  Start(tls, "kubernetes:\n  kubeconfig: " + dir_ + "/missing-kubeconfig\n" +
                 "  leader_election: {enabled: true, namespace: duet}\n");
  EXPECT_EQ(WaitExit(absl::Seconds(20)), 1) << Log();
  EXPECT_THAT(Log(), HasSubstr("journal.etcd.tls.key_file: cannot read " + tls.key_file));
  EXPECT_THAT(Log(), Not(HasSubstr("kubeconfig")));
  EXPECT_EQ(KeysUnder("/duet/"), 0u);
}

}  // namespace
}  // namespace duet
