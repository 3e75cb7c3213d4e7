// duet-node's step agent (k8s_adapter/device_plugin/step_agent.h) on a real
// unix socket, with a recording forwarder in place of the bridge link: what
// it forwards, what it answers, what it refuses, and its queue of releases
// (answered at once, sent after, retried while the bridge is out of reach).

#include "k8s_adapter/device_plugin/step_agent.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <future>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/credential/munge_payload.h"
#include "common/credential/request_digest.h"
#include "common/credential/slurm_key_cred.h"
#include "gtest/gtest.h"
#include "proto/duet/v1/error_reason.h"
#include "tests/fakes/wait.h"

namespace duet::node {
namespace {

using ::duet::fakes::WaitFor;

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
  // An agent that never answers fails the test instead of hanging it.
  timeval tv{static_cast<time_t>(absl::ToInt64Seconds(fakes::kWaitTimeout)), 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
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
          ++entered_;
          // A closed gate holds the bridge's answer back.
          mu_.Await(absl::Condition(&gate_open_));
          if (!script_.empty()) {
            grpc::Status s = script_.front();
            script_.erase(script_.begin());
            return s;
          }
          return answer_;
        },
        absl::Seconds(7));
    ASSERT_TRUE(agent.ok()) << agent.status();
    agent_ = *std::move(agent);
  }
  void TearDown() override {
    SetGate(true);  // a failed test may leave a forward waiting
    agent_.reset();
  }

  std::vector<StepCall> Calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

  void SetAnswer(grpc::Status s) {
    absl::MutexLock lock(&mu_);
    answer_ = std::move(s);
  }
  void SetGate(bool open) {
    absl::MutexLock lock(&mu_);
    gate_open_ = open;
  }
  int Entered() {
    absl::MutexLock lock(&mu_);
    return entered_;
  }
  void Script(std::vector<grpc::Status> answers) {
    absl::MutexLock lock(&mu_);
    script_ = std::move(answers);
  }

  absl::Mutex mu_;
  std::vector<StepCall> calls_;
  grpc::Status answer_ = grpc::Status::OK;
  bool gate_open_ = true;
  int entered_ = 0;
  std::vector<grpc::Status> script_;  // answered first, in order
  std::unique_ptr<StepAgent> agent_;
};

duet_wire_request StepRelease(uint32_t job, uint32_t step) {
  duet_wire_request r{};
  r.type = DUET_WIRE_RELEASE_STEP;
  strcpy(r.node, "gke-a-1");
  r.job_id = job;
  r.step_id = step;
  r.cred_kind = DUET_WIRE_CRED_MUNGE;
  strcpy(r.cred, "MUNGE:release:");
  return r;
}

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
  ASSERT_TRUE(WaitFor([&] { return Calls().size() == 1; }, fakes::kWaitTimeout, "the release"));
  const std::vector<StepCall> calls = Calls();
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

// The step does not wait for the bridge's Release: the agent answers
// "queued" while the bridge has not answered yet, then sends it.
TEST_F(StepAgentTest, AReleaseIsAnsweredQueuedBeforeTheBridgeAnswers) {
  SetGate(false);
  const duet_wire_reply reply = Decode(Exchange(SocketPath(), Frame(StepRelease(12, 3))));
  EXPECT_EQ(reply.code, 0u);
  EXPECT_STREQ(duet_wire_reply_meta(&reply, "queued"), "1");
  EXPECT_EQ(agent_->QueuedReleases(), 1u);
  ASSERT_TRUE(WaitFor([&] { return Entered() == 1; }, fakes::kWaitTimeout, "the forward"));
  SetGate(true);
  ASSERT_TRUE(WaitFor([&] { return agent_->QueuedReleases() == 0; }, fakes::kWaitTimeout,
                      "the queue to empty"));
  const std::vector<StepCall> calls = Calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_FALSE(calls[0].hold);
  EXPECT_EQ(calls[0].release_request.owner().slurm_step().job_id(), 12u);
  EXPECT_EQ(calls[0].release_request.owner().slurm_step().step_id(), 3u);
  EXPECT_EQ(calls[0].credential, "MUNGE:release:");
}

// A Hold stays on the step's path: its answer is the bridge's.
TEST_F(StepAgentTest, AHoldWaitsForTheBridge) {
  SetGate(false);
  duet_wire_request r{};
  r.type = DUET_WIRE_HOLD_STEP;
  strcpy(r.node, "gke-a-1");
  r.job_id = 12;
  r.n_gpus = 1;
  auto hold = std::async(std::launch::async, [&] { return Exchange(SocketPath(), Frame(r)); });
  ASSERT_TRUE(WaitFor([&] { return Entered() == 1; }, fakes::kWaitTimeout, "the forward"));
  EXPECT_EQ(hold.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  SetAnswer(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "no"));
  SetGate(true);
  EXPECT_EQ(Decode(hold.get()).code, static_cast<uint32_t>(grpc::StatusCode::PERMISSION_DENIED));
}

// The bridge out of reach (UNAVAILABLE, DEADLINE_EXCEEDED): asked again
// until it answers; any other answer is final.
TEST_F(StepAgentTest, AReleaseIsSentAgainWhileTheBridgeIsOutOfReach) {
  Script({grpc::Status(grpc::StatusCode::UNAVAILABLE, "down"),
          grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "slow"), grpc::Status::OK,
          grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "refused")});
  EXPECT_EQ(Decode(Exchange(SocketPath(), Frame(StepRelease(12, 0)))).code, 0u);
  ASSERT_TRUE(WaitFor([&] { return Calls().size() == 3 && agent_->QueuedReleases() == 0; },
                      fakes::kWaitTimeout, "three tries"));
  EXPECT_EQ(Decode(Exchange(SocketPath(), Frame(StepRelease(12, 1)))).code, 0u);
  ASSERT_TRUE(WaitFor([&] { return Calls().size() == 4 && agent_->QueuedReleases() == 0; },
                      fakes::kWaitTimeout, "the refused release"));
  EXPECT_EQ(Decode(Exchange(SocketPath(), Frame(StepRelease(12, 2)))).code, 0u);
  ASSERT_TRUE(WaitFor([&] { return Calls().size() == 5 && agent_->QueuedReleases() == 0; },
                      fakes::kWaitTimeout, "the next release"));
  const std::vector<StepCall> calls = Calls();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(calls[i].release_request.owner().slurm_step().step_id(), 0u) << i;
  }
  EXPECT_EQ(calls[3].release_request.owner().slurm_step().step_id(), 1u);  // once, refused
  EXPECT_EQ(calls[4].release_request.owner().slurm_step().step_id(), 2u);
}

// A full queue drops nothing: the release beyond it is sent while its step
// waits, and answered with the bridge's answer.
TEST_F(StepAgentTest, BeyondAFullQueueTheStepWaitsForTheBridge) {
  SetGate(false);
  for (size_t i = 0; i < StepAgent::kMaxQueuedReleases; ++i) {
    ASSERT_EQ(Decode(Exchange(SocketPath(), Frame(StepRelease(12, static_cast<uint32_t>(i)))))
                  .code,
              0u)
        << i;
  }
  EXPECT_EQ(agent_->QueuedReleases(), StepAgent::kMaxQueuedReleases);
  auto last = std::async(std::launch::async, [&] {
    return Exchange(SocketPath(), Frame(StepRelease(13, 0)));
  });
  // The sender's call and the last step's own.
  ASSERT_TRUE(WaitFor([&] { return Entered() == 2; }, fakes::kWaitTimeout, "two forwards"));
  EXPECT_EQ(last.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  SetGate(true);
  const duet_wire_reply reply = Decode(last.get());
  EXPECT_EQ(reply.code, 0u);
  EXPECT_EQ(duet_wire_reply_meta(&reply, "queued"), nullptr);
  ASSERT_TRUE(WaitFor([&] { return agent_->QueuedReleases() == 0; }, fakes::kWaitTimeout,
                      "the queue to empty"));
  EXPECT_EQ(Calls().size(), StepAgent::kMaxQueuedReleases + 1);
}

// Stop sends what is queued (once each) and returns, even with the bridge
// out of reach.
TEST_F(StepAgentTest, StopSendsTheQueuedReleasesOnce) {
  SetAnswer(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down"));
  SetGate(false);
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_EQ(Decode(Exchange(SocketPath(), Frame(StepRelease(12, i)))).code, 0u);
  }
  ASSERT_TRUE(WaitFor([&] { return Entered() == 1; }, fakes::kWaitTimeout, "the forward"));
  SetGate(true);
  agent_->Stop();
  EXPECT_EQ(agent_->QueuedReleases(), 0u);
  std::set<uint32_t> steps;
  for (const StepCall& c : Calls()) steps.insert(c.release_request.owner().slurm_step().step_id());
  EXPECT_EQ(steps, (std::set<uint32_t>{0, 1, 2}));
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
