// The journal's one-writer lock (bridge/journal/journal.h) with the real
// duet-bridge binary: a second duet-bridge given the journal.dir of a running
// one exits non-zero, naming the running one's pid, without touching its
// files; the first keeps serving, and a restart recovers what it granted.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "duet/v1/duet.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"

namespace duet {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::map<std::string, std::string> DirContents(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    out[e.path().filename().string()] = Slurp(e.path());
  }
  return out;
}

class JournalLockDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("duet-journal-lock-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "nodes.yaml") << "nodes:\n  - {name: n0, gpus: {count: 8}}\n";
    // Two configurations that differ only in their socket: the journal is
    // what they share.
    for (const char* name : {"a", "b"}) {
      std::ofstream(dir_ / (std::string(name) + ".yaml"))
          << "grpc: {listen: \"\", unix_socket: " << Socket(name) << "}\n"
          << "metrics: {listen: \"\"}\n"
          << "journal: {dir: " << (dir_ / "journal").string() << ", fsync: false}\n"
          << "inventory: {source: file, file: " << (dir_ / "nodes.yaml").string() << "}\n"
          << "log_level: warn\n";
    }
  }
  void TearDown() override {
    for (pid_t pid : {a_, b_}) {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
    fs::remove_all(dir_);
  }

  std::string Socket(const std::string& name) const { return (dir_ / (name + ".sock")).string(); }

  // Starts duet-bridge with `<name>.yaml`, its output in `<name>.log`.
  pid_t Spawn(const std::string& name) {
    const std::string cfg = (dir_ / (name + ".yaml")).string();
    const std::string log = (dir_ / (name + ".log")).string();
    const pid_t pid = fork();
    if (pid == 0) {
      FILE* out = std::freopen(log.c_str(), "a", stdout);
      if (out != nullptr) dup2(fileno(stdout), 2);
      execl(DUET_BRIDGE_BIN, DUET_BRIDGE_BIN, "--config", cfg.c_str(), (char*)nullptr);
      _exit(127);
    }
    return pid;
  }

  static bool Serves(const std::string& socket, std::chrono::milliseconds wait) {
    auto channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
    return channel->WaitForConnected(std::chrono::system_clock::now() + wait);
  }

  static grpc::Status Hold(const std::string& socket, uint32_t job) {
    auto stub = v1::Ledger::NewStub(
        grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::HoldRequest req;
    req.set_node("n0");
    req.mutable_owner()->mutable_pod()->set_uid("uid-" + std::to_string(job));
    req.mutable_count()->set_kind(v1::DEVICE_KIND_GPU);
    req.mutable_count()->set_count(2);
    v1::HoldResponse resp;
    return stub->Hold(&ctx, req, &resp);
  }

  static int HoldingCount(const std::string& socket) {
    auto stub = v1::Ledger::NewStub(
        grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ListHoldingsResponse resp;
    if (!stub->ListHoldings(&ctx, v1::ListHoldingsRequest(), &resp).ok()) return -1;
    return resp.holdings_size();
  }

  fs::path dir_;
  pid_t a_ = -1;
  pid_t b_ = -1;
};

TEST_F(JournalLockDaemonTest, ASecondBridgeOnTheSameJournalExitsNamingTheFirst) {
  a_ = Spawn("a");
  ASSERT_GT(a_, 0);
  ASSERT_TRUE(Serves(Socket("a"), std::chrono::seconds(30))) << Slurp(dir_ / "a.log");
  const grpc::Status held = Hold(Socket("a"), 1);
  ASSERT_TRUE(held.ok()) << held.error_message();
  const std::map<std::string, std::string> before = DirContents(dir_ / "journal");

  b_ = Spawn("b");
  ASSERT_GT(b_, 0);
  // Refused at start: it exits; before the fix it came up and served.
  int status = 0;
  bool exited = false;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!exited && std::chrono::steady_clock::now() < end) {
    exited = waitpid(b_, &status, WNOHANG) == b_;
    if (!exited && Serves(Socket("b"), std::chrono::milliseconds(100))) break;
  }
  ASSERT_TRUE(exited) << "a second duet-bridge on the same journal is running:\n"
                      << Slurp(dir_ / "b.log");
  b_ = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << "status " << status;
  const std::string log = Slurp(dir_ / "b.log");
  EXPECT_NE(log.find("journal " + (dir_ / "journal").string() + " is in use by another process"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("LOCK held by pid " + std::to_string(a_) + " on host "), std::string::npos)
      << log;
  EXPECT_EQ(DirContents(dir_ / "journal"), before);

  // The first one is undisturbed; a clean restart recovers both holdings.
  const grpc::Status held_again = Hold(Socket("a"), 2);
  ASSERT_TRUE(held_again.ok()) << held_again.error_message();
  EXPECT_EQ(HoldingCount(Socket("a")), 2);
  ASSERT_EQ(kill(a_, SIGTERM), 0);
  ASSERT_EQ(waitpid(a_, &status, 0), a_);
  a_ = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  // The lock file stays, naming the old pid; it blocks nothing.
  a_ = Spawn("a");
  ASSERT_GT(a_, 0);
  ASSERT_TRUE(Serves(Socket("a"), std::chrono::seconds(30))) << Slurp(dir_ / "a.log");
  EXPECT_EQ(HoldingCount(Socket("a")), 2);
}

}  // namespace
}  // namespace duet
