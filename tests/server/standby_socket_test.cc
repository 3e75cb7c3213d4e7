// The standby's unix socket (issue 25, leftovers): a replica that stands by
// under kubernetes.leader_election serves the health service and a Ledger
// that answers UNAVAILABLE on grpc.unix_socket, before the leader binds the
// same path. Its socket is made as the leader's is (bridge_access_test.cc,
// "Hole C"): grpc.unix_socket_mode whatever the umask, a directory anyone
// may write refused, and a socket another process serves left alone.

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "bridge/server/leadership.h"
#include "bridge/server/standby_ledger.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"

namespace duet {
namespace {

using ::testing::HasSubstr;

class StandbySocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("duet-standby-socket-", ::getpid(), "-",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    ::chmod(dir_.c_str(), 0755);
    config_.grpc.listen = "";  // the socket alone
    config_.grpc.unix_socket = (dir_ / "run" / "bridge.sock").string();
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // The health service's answer for `service` over the socket.
  std::string Health(const std::string& service) {
    auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
        "unix:" + config_.grpc.unix_socket, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    const grpc::Status s = stub->Check(&ctx, req, &resp);
    if (!s.ok()) return absl::StrCat("error ", s.error_code(), ": ", s.error_message());
    return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
  }

  mode_t ModeOf(const std::filesystem::path& p) {
    struct stat st {};
    EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
    return st.st_mode & 07777;
  }

  std::filesystem::path dir_;
  Config config_;
  StandbyLedger ledger_;
};

// Before, the standby's socket took 0777 & ~umask: under a umask of 0 (as
// some service managers leave it) every local user could connect.
TEST_F(StandbySocketTest, SocketGetsItsModeWhateverTheUmask) {
  config_.grpc.unix_socket_mode = 0600;
  const mode_t umask_before = ::umask(0);
  auto server = StartStandbyGrpc(config_, &ledger_);
  ::umask(umask_before);
  ASSERT_TRUE(server.ok()) << server.status();
  struct stat st {};
  ASSERT_EQ(::stat(config_.grpc.unix_socket.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  // The directory it made is not everyone's to write either.
  EXPECT_EQ(ModeOf(dir_ / "run"), 0755u);
  // And it serves there: NOT_SERVING, as a standby does.
  EXPECT_EQ(Health(""), "NOT_SERVING");
  EXPECT_EQ(Health("duet"), "NOT_SERVING");
  (*server)->Shutdown();

  // The default mode, 0660, under the same umask.
  config_.grpc.unix_socket_mode = 0660;
  ::umask(0);
  server = StartStandbyGrpc(config_, &ledger_);
  ::umask(umask_before);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(ModeOf(config_.grpc.unix_socket), 0660u);
  (*server)->Shutdown();
}

TEST_F(StandbySocketTest, ADirectoryAnyoneMayWriteIsRefused) {
  const std::filesystem::path run = dir_ / "run";
  std::filesystem::create_directories(run);
  ::chmod(run.c_str(), 0777);
  auto server = StartStandbyGrpc(config_, &ledger_);
  ASSERT_FALSE(server.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(server.status())) << server.status();
  EXPECT_THAT(std::string(server.status().message()),
              HasSubstr("grpc.unix_socket " + config_.grpc.unix_socket + ": its directory " +
                        run.string() + " (mode 0777) is writable by every user without the "
                        "sticky bit"));
  EXPECT_FALSE(std::filesystem::exists(config_.grpc.unix_socket));

  ::chmod(run.c_str(), 01777);  // sticky, as /tmp: others cannot replace the socket
  server = StartStandbyGrpc(config_, &ledger_);
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->Shutdown();
}

// Before, a second standby (or a standby started beside a leader on the
// same path) removed the socket that the first one served on, and took its
// callers.
TEST_F(StandbySocketTest, ASocketAnotherProcessServesIsLeftAlone) {
  auto first = StartStandbyGrpc(config_, &ledger_);
  ASSERT_TRUE(first.ok()) << first.status();
  struct stat before {};
  ASSERT_EQ(::stat(config_.grpc.unix_socket.c_str(), &before), 0);

  StandbyLedger other;
  auto second = StartStandbyGrpc(config_, &other);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
  EXPECT_EQ(second.status().message(),
            "grpc.unix_socket " + config_.grpc.unix_socket + ": another process is serving on it");
  struct stat after {};
  ASSERT_EQ(::stat(config_.grpc.unix_socket.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);  // the same socket, not a new one
  EXPECT_EQ(Health(""), "NOT_SERVING");
  (*first)->Shutdown();
}

}  // namespace
}  // namespace duet
