// duet-node's step agent (k8s_adapter/device_plugin/step_agent.h) on a real
// unix socket, with a recording forwarder in place of the bridge link: what
// it forwards, what it answers, what it refuses.

#include "k8s_adapter/device_plugin/step_agent.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/credential/munge_payload.h"
#include "common/credential/request_digest.h"
#include "common/credential/slurm_key_cred.h"
#include "gtest/gtest.h"
#include "proto/duet/v1/error_reason.h"

namespace duet::node {
namespace {

std::string SocketPath() { return absl::StrCat("/tmp/duet-step-agent-test-", getpid(), ".sock"); }

int Connect(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `frame`, reads the whole reply (the agent closes after it).
std::vector<uint8_t> Exchange(const std::string& path, const std::vector<uint8_t>& frame) {
  const int fd = Connect(path);
  EXPECT_GE(fd, 0);
  if (fd < 0) return {};
  EXPECT_EQ(write(fd, frame.data(), frame.size()), static_cast<ssize_t>(frame.size()));
  shutdown(fd, SHUT_WR);
  std::vector<uint8_t> out;
  uint8_t buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  close(fd);
  return out;
}

duet_wire_reply Decode(const std::vector<uint8_t>& frame) {
  duet_wire_reply r{};
  char err[256] = "";
  EXPECT_EQ(duet_wire_decode_reply(frame.data(), frame.size(), &r, err, sizeof err), 0) << err;
  return r;
}

std::vector<uint8_t> Frame(const duet_wire_request& r) {
  std::vector<uint8_t> buf(DUET_WIRE_MAX_FRAME);
  char err[256] = "";
  const long n = duet_wire_encode_request(&r, buf.data(), buf.size(), err, sizeof err);
  EXPECT_GT(n, 0) << err;
  buf.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return buf;
}

class StepAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto agent = StepAgent::Start(
        SocketPath(),
        [this](const StepCall& c) {
          absl::MutexLock lock(&mu_);
          calls_.push_back(c);
          return answer_;
        },
        absl::Seconds(7));
    ASSERT_TRUE(agent.ok()) << agent.status();
    agent_ = *std::move(agent);
  }
  void TearDown() override { agent_.reset(); }

  std::vector<StepCall> Calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

  absl::Mutex mu_;
  std::vector<StepCall> calls_;
  grpc::Status answer_ = grpc::Status::OK;
  std::unique_ptr<StepAgent> agent_;
};

TEST_F(StepAgentTest, SocketIsRootsOnly) {
  struct stat st {};
  ASSERT_EQ(stat(SocketPath().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(StepAgentTest, ForwardsAHoldWithTheStepsCredentialAndAnswersOk) {
  duet_wire_request r{};
  r.type = DUET_WIRE_HOLD_STEP;
  strcpy(r.node, "gke-a-1");
  r.job_id = 12;
  r.step_id = 0;
  r.n_gpus = 2;
  r.gpus[0] = 3;
  r.gpus[1] = 5;
  r.cred_kind = DUET_WIRE_CRED_MUNGE;
  strcpy(r.cred, "MUNGE:cred:");
  r.timeout_ms = 1500;
  const duet_wire_reply reply = Decode(Exchange(SocketPath(), Frame(r)));
  EXPECT_EQ(reply.code, 0u);
  const std::vector<StepCall> calls = Calls();
  ASSERT_EQ(calls.size(), 1u);
  const StepCall& c = calls[0];
  EXPECT_TRUE(c.hold);
  EXPECT_EQ(c.hold_request.node(), "gke-a-1");
  EXPECT_EQ(c.hold_request.owner().slurm_step().job_id(), 12u);
  EXPECT_EQ(c.hold_request.owner().slurm_step().step_id(), 0u);
  ASSERT_EQ(c.hold_request.devices().devices_size(), 2);
  EXPECT_EQ(c.hold_request.devices().devices(1).index(), 5u);
  EXPECT_EQ(c.hold_request.devices().devices(1).kind(), v1::DEVICE_KIND_GPU);
  EXPECT_EQ(c.credential_key, slurm_munge::kMetadataKey);
  EXPECT_EQ(c.credential, "MUNGE:cred:");
  EXPECT_EQ(c.timeout, absl::Milliseconds(1500));
  // The bridge computes the same binding the step's credential carries.
  EXPECT_EQ(slurm_munge::BindingOf(c.hold_request)->method, "Hold");
}

TEST_F(StepAgentTest, ReleaseOfAJobUsesTheAgentsTimeoutAndTheSlurmKeyMetadata) {
  duet_wire_request r{};
  r.type = DUET_WIRE_RELEASE_JOB;
  strcpy(r.node, "gke-a-1");
  r.job_id = 12;
  r.cred_kind = DUET_WIRE_CRED_SLURM_KEY;
  strcpy(r.cred, "duet-key2:x");
  EXPECT_EQ(Decode(Exchange(SocketPath(), Frame(r))).code, 0u);
  const std::vector<StepCall> calls = Calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_FALSE(calls[0].hold);
  EXPECT_EQ(calls[0].release_request.owner().slurm_job().job_id(), 12u);
  EXPECT_EQ(calls[0].credential_key, slurm_key::kMetadataKey);
  EXPECT_EQ(calls[0].timeout, absl::Seconds(7));
}

TEST_F(StepAgentTest, TheBridgesRefusalComesBackWithItsReasonAndMetadata) {
  answer_ = v1::StatusWithReason(grpc::StatusCode::FAILED_PRECONDITION,
                                 "pod default/web holds gpu 3", "POD_EVICTING",
                                 {{"wait_s", "30"}, {"holder", "default/web"}});
  duet_wire_request r{};
  r.type = DUET_WIRE_HOLD_STEP;
  strcpy(r.node, "gke-a-1");
  r.job_id = 12;
  r.n_gpus = 1;
  const duet_wire_reply reply = Decode(Exchange(SocketPath(), Frame(r)));
  EXPECT_EQ(reply.code, static_cast<uint32_t>(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_STREQ(reply.reason, "POD_EVICTING");
  EXPECT_STREQ(reply.message, "Hold: pod default/web holds gpu 3");
  EXPECT_STREQ(duet_wire_reply_meta(&reply, "wait_s"), "30");
  EXPECT_STREQ(duet_wire_reply_meta(&reply, "holder"), "default/web");
  EXPECT_EQ(Calls()[0].credential_key, "");  // none sent: none forwarded
}

TEST_F(StepAgentTest, BadFramesAreRefusedAndNothingIsForwarded) {
  std::vector<uint8_t> frame = {'D', 9, DUET_WIRE_HOLD_STEP, 0, 0, 0, 0, 0};
  duet_wire_reply reply = Decode(Exchange(SocketPath(), frame));
  EXPECT_EQ(reply.code, static_cast<uint32_t>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_NE(std::string(reply.message).find("version 9, this build speaks 1"), std::string::npos)
      << reply.message;
  frame = {'D', 1, DUET_WIRE_HOLD_STEP, 0, 0, 0, 0, 3, 42, 0, 0};
  reply = Decode(Exchange(SocketPath(), frame));
  EXPECT_EQ(reply.code, static_cast<uint32_t>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_NE(std::string(reply.message).find("unknown field"), std::string::npos)
      << reply.message;
  EXPECT_TRUE(Calls().empty());
}

TEST_F(StepAgentTest, StopRemovesTheSocket) {
  agent_->Stop();
  EXPECT_EQ(access(SocketPath().c_str(), F_OK), -1);
  EXPECT_EQ(Connect(SocketPath()), -1);
  agent_->Stop();  // idempotent
}

TEST(StepAgentStartTest, ABadPathIsRefusedByName) {
  auto a = StepAgent::Start("relative.sock", [](const StepCall&) { return grpc::Status::OK; },
                            absl::Seconds(1));
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("--step-agent-socket \"relative.sock\""), std::string::npos);
  a = StepAgent::Start("/nonexistent-dir/agent.sock",
                       [](const StepCall&) { return grpc::Status::OK; }, absl::Seconds(1));
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("/nonexistent-dir/agent.sock"), std::string::npos);
}

}  // namespace
}  // namespace duet::node
