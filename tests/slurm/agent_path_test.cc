// spank_duet's agent path, the parts that need no Slurm: plugstack agent=
// (plugin_args.c), the step's GPU list (agent_path.c), which must read
// Slurm's lists as the gRPC client does (step_devices.h), and the Hold sent
// in init_post_opt and answered in user_init, against a fake step agent on a
// unix socket (the real one and real Slurm: step_agent_e2e_test).

#include <stdarg.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/step_agent/step_wire.h"
#include "gtest/gtest.h"
#include "slurm_plugin/agent_path.h"
#include "slurm_plugin/plugin_args.h"
#include "slurm_plugin/step_devices.h"

// slurmstepd's side of agent_path.c: the step's environment, its ids and the
// plugin's log lines.
namespace {
std::map<std::string, std::string> g_env;
uint32_t g_job_id = 0;
uint32_t g_step_id = 0;
std::mutex g_log_mu;
std::vector<std::string> g_log;

void Log(const char* fmt, va_list ap) {
  char line[2048];
  vsnprintf(line, sizeof(line), fmt, ap);
  std::lock_guard<std::mutex> lock(g_log_mu);
  g_log.emplace_back(line);
}
}  // namespace

extern "C" {
spank_err_t spank_getenv(spank_t, const char* name, char* buf, int len) {
  auto it = g_env.find(name);
  if (it == g_env.end()) return static_cast<spank_err_t>(ESPANK_ENV_NOEXIST);
  if (static_cast<int>(it->second.size()) >= len) return static_cast<spank_err_t>(ESPANK_NOSPACE);
  memcpy(buf, it->second.c_str(), it->second.size() + 1);
  return static_cast<spank_err_t>(ESPANK_SUCCESS);
}
spank_err_t spank_setenv(spank_t, const char* name, const char* value, int) {
  g_env[name] = value;
  return static_cast<spank_err_t>(ESPANK_SUCCESS);
}
spank_err_t spank_get_item(spank_t, spank_item_t item, ...) {
  va_list ap;
  va_start(ap, item);
  uint32_t* out = va_arg(ap, uint32_t*);
  va_end(ap);
  if (item == S_JOB_ID) *out = g_job_id;
  else if (item == S_JOB_STEPID) *out = g_step_id;
  else return static_cast<spank_err_t>(ESPANK_ERROR);
  return static_cast<spank_err_t>(ESPANK_SUCCESS);
}
void slurm_info(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  Log(fmt, ap);
  va_end(ap);
}
void slurm_debug(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  Log(fmt, ap);
  va_end(ap);
}
}

namespace duet::spank {
namespace {

TEST(AgentPathTest, PlugstackAgentIsAUnixSocketPath) {
  duet_spank_args a;
  char err[256];
  const char* none[] = {"tpu=no"};
  ASSERT_EQ(duet_spank_parse_args(1, none, &a, err, sizeof err), 0) << err;
  EXPECT_STREQ(a.agent, "");  // default: every step through bridge=
  const char* ok[] = {"agent=unix:///run/duet/agent.sock"};
  ASSERT_EQ(duet_spank_parse_args(1, ok, &a, err, sizeof err), 0) << err;
  EXPECT_STREQ(a.agent, "unix:///run/duet/agent.sock");
  const std::string too_long = "agent=unix:///" + std::string(107, 'a');
  for (const std::string& bad : {std::string("agent=/run/duet/agent.sock"),
                                std::string("agent=unix://run/agent.sock"),
                                std::string("agent=127.0.0.1:9"), std::string("agent="),
                                too_long}) {
    const char* args[] = {bad.c_str()};
    EXPECT_EQ(duet_spank_parse_args(1, args, &a, err, sizeof err), -1) << bad;
    EXPECT_NE(std::string(err).find("plugstack argument \"agent="), std::string::npos) << err;
  }
}

TEST(AgentPathTest, GpuListsReadAsTheGrpcClientReadsThem) {
  for (const char* list : {"0", "3,1", "0-3", "2,0-1,7", "5,5,4-6", "0-63", ""}) {
    unsigned got[64];
    const int n = duet_agent_parse_gpus(list, got, 64);
    auto want = GpusFromEnv(list, "", "");
    ASSERT_TRUE(want.ok()) << list;
    ASSERT_EQ(n, static_cast<int>(want->size())) << list;
    EXPECT_EQ(std::vector<uint32_t>(got, got + n), *want) << list;
  }
  for (const char* bad : {"NoDevFiles", "GPU-1234", "1-", "3-1", ",", "1,", "-1", "0-64", " 1",
                          "99999999999"}) {
    unsigned got[64];
    EXPECT_EQ(duet_agent_parse_gpus(bad, got, 64), -1) << bad;
  }
}


// A step agent on a unix socket: records each request and answers it with
// `hold_code` for a Hold (0: granted) and OK for a Release; while closed
// (Close) it holds its answers back until Open.
class FakeAgent {
 public:
  struct Call {
    uint8_t type;
    uint32_t job_id, step_id;
    std::vector<uint32_t> gpus;
  };

  explicit FakeAgent(std::string path) : path_(std::move(path)) {
    unlink(path_.c_str());
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path_.c_str());
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << path_;
    EXPECT_EQ(listen(fd_, 16), 0);
    thread_ = std::thread([this] { Loop(); });
  }
  ~FakeAgent() {
    Open();
    shutdown(fd_, SHUT_RDWR);
    thread_.join();
    close(fd_);
    unlink(path_.c_str());
  }
  void set_hold_code(uint32_t code, const char* reason) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_code_ = code;
    hold_reason_ = reason;
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  std::vector<Call> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  // Waits (up to 5 s) until `n` requests have arrived.
  bool WaitForCalls(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(5), [&] { return calls_.size() >= n; });
  }

 private:
  void Loop() {
    for (;;) {
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      uint8_t frame[DUET_WIRE_MAX_FRAME];
      size_t got = 0;
      while (got < DUET_WIRE_HEADER) {
        const ssize_t r = read(c, frame + got, DUET_WIRE_HEADER - got);
        if (r <= 0) break;
        got += static_cast<size_t>(r);
      }
      uint8_t type = 0;
      uint32_t body = 0;
      char err[256];
      if (got < DUET_WIRE_HEADER ||
          duet_wire_parse_header(frame, got, &type, &body, err, sizeof err) != 0) {
        close(c);
        continue;
      }
      while (got < DUET_WIRE_HEADER + body) {
        const ssize_t r = read(c, frame + got, DUET_WIRE_HEADER + body - got);
        if (r <= 0) break;
        got += static_cast<size_t>(r);
      }
      static duet_wire_request req;
      ASSERT_EQ(duet_wire_decode_request(frame, got, &req, err, sizeof err), 0) << err;
      duet_wire_reply reply{};
      {
        std::unique_lock<std::mutex> lock(mu_);
        calls_.push_back(
            {req.type, req.job_id, req.step_id, std::vector<uint32_t>(req.gpus, req.gpus + req.n_gpus)});
        if (req.type == DUET_WIRE_HOLD_STEP) {
          reply.code = hold_code_;
          snprintf(reply.reason, sizeof reply.reason, "%s", hold_reason_.c_str());
          snprintf(reply.message, sizeof reply.message, "fake agent says %s", hold_reason_.c_str());
        }
        cv_.notify_all();
        cv_.wait(lock, [&] { return open_; });
      }
      const long n = duet_wire_encode_reply(&reply, frame, sizeof frame, err, sizeof err);
      ASSERT_GT(n, 0) << err;
      ASSERT_EQ(write(c, frame, static_cast<size_t>(n)), n);
      close(c);
    }
  }

  std::string path_;
  int fd_ = -1;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  std::vector<Call> calls_;
  uint32_t hold_code_ = 0;
  std::string hold_reason_;
};

class EarlyHoldTest : public ::testing::Test {
 protected:
  void SetUp() override {
    duet_agent_forget();
    g_env.clear();
    {
      std::lock_guard<std::mutex> lock(g_log_mu);
      g_log.clear();
    }
    g_job_id = 41;
    g_step_id = 0;
    setenv("SLURMD_NODENAME", "gke-a-1", 1);
    dir_ = std::filesystem::temp_directory_path() /
           ("duet-agent-path-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    sock_ = (dir_ / "agent.sock").string();
    const std::string agent = "agent=unix://" + sock_;
    const char* argv[] = {agent.c_str(), "auth=none", "tpu=no"};
    char err[256];
    ASSERT_EQ(duet_spank_parse_args(3, argv, &args_, err, sizeof err), 0) << err;
  }
  void TearDown() override {
    duet_agent_forget();
    std::filesystem::remove_all(dir_);
  }
  static bool Logged(const std::string& needle) {
    std::lock_guard<std::mutex> lock(g_log_mu);
    for (const std::string& l : g_log) {
      if (l.find(needle) != std::string::npos) return true;
    }
    return false;
  }

  std::filesystem::path dir_;
  std::string sock_;
  duet_spank_args args_{};
};

TEST_F(EarlyHoldTest, HoldSentInInitPostOptIsAnsweredInUserInitAndReleasedAtExit) {
  FakeAgent agent(sock_);
  agent.Close();
  g_env["SLURM_STEP_GPUS"] = "1,3";
  duet_agent_start_hold(nullptr, &args_);
  // The Hold is on its way before user_init: the agent has it already, and
  // answers once user_init is about to read.
  ASSERT_TRUE(agent.WaitForCalls(1));
  agent.Open();
  EXPECT_TRUE(Logged("sent in init_post_opt"));
  char err[512] = "";
  ASSERT_EQ(duet_agent_user_init(nullptr, &args_, err, sizeof err), 0) << err;
  EXPECT_TRUE(Logged("answered")) << "user_init read the early Hold's answer";
  EXPECT_TRUE(duet_agent_registered());
  EXPECT_EQ(g_env["CUDA_VISIBLE_DEVICES"], "1,3");
  duet_agent_exit(nullptr, &args_);
  ASSERT_TRUE(agent.WaitForCalls(2));
  const auto calls = agent.calls();
  ASSERT_EQ(calls.size(), 2u) << "one Hold, not two: user_init did not ask again";
  EXPECT_EQ(calls[0].type, DUET_WIRE_HOLD_STEP);
  EXPECT_EQ(calls[0].job_id, 41u);
  EXPECT_EQ(calls[0].gpus, (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(calls[1].type, DUET_WIRE_RELEASE_STEP);
  EXPECT_EQ(calls[1].step_id, 0u);
}

TEST_F(EarlyHoldTest, RefusalOfTheEarlyHoldRefusesTheStepAndNothingIsReleased) {
  FakeAgent agent(sock_);
  agent.set_hold_code(9, "POD_HOLDS_DEVICE");
  g_env["SLURM_STEP_GPUS"] = "0";
  duet_agent_start_hold(nullptr, &args_);
  char err[512] = "";
  EXPECT_EQ(duet_agent_user_init(nullptr, &args_, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("fake agent says POD_HOLDS_DEVICE"), std::string::npos) << err;
  EXPECT_FALSE(duet_agent_registered());
  duet_agent_exit(nullptr, &args_);
  EXPECT_EQ(agent.calls().size(), 1u);
}

TEST_F(EarlyHoldTest, GpusChangedBeforeUserInitRefuseTheStepAndExitReleasesTheEarlyHold) {
  FakeAgent agent(sock_);
  g_env["SLURM_STEP_GPUS"] = "0";
  duet_agent_start_hold(nullptr, &args_);
  g_env["SLURM_STEP_GPUS"] = "1";  // as another SPANK plugin might
  char err[512] = "";
  EXPECT_EQ(duet_agent_user_init(nullptr, &args_, err, sizeof err), -1);
  EXPECT_NE(std::string(err).find("its GPUs changed between"), std::string::npos) << err;
  EXPECT_TRUE(duet_agent_registered()) << "the early Hold was granted: exit releases it";
  duet_agent_exit(nullptr, &args_);
  ASSERT_TRUE(agent.WaitForCalls(2));
  const auto calls = agent.calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].gpus, std::vector<uint32_t>{0});
  EXPECT_EQ(calls[1].type, DUET_WIRE_RELEASE_STEP);
}

TEST_F(EarlyHoldTest, StepThatNeverReachesUserInitReleasesItsEarlyHoldAtExit) {
  FakeAgent agent(sock_);
  g_env["SLURM_JOB_GPUS"] = "2";
  g_step_id = 0xfffffffbu;  // the batch step: its job's import goes too
  duet_agent_start_hold(nullptr, &args_);
  EXPECT_TRUE(duet_agent_registered()) << "an unanswered early Hold is exit's to settle";
  duet_agent_exit(nullptr, &args_);
  ASSERT_TRUE(agent.WaitForCalls(3));
  const auto calls = agent.calls();
  EXPECT_EQ(calls[0].type, DUET_WIRE_HOLD_STEP);
  EXPECT_EQ(calls[1].type, DUET_WIRE_RELEASE_STEP);
  EXPECT_EQ(calls[2].type, DUET_WIRE_RELEASE_JOB);
}

TEST_F(EarlyHoldTest, ExternStepAndUsersOwnCudaVisibleDevicesSendNothingEarly) {
  FakeAgent agent(sock_);
  g_env["SLURM_JOB_GPUS"] = "0";
  g_step_id = 0xfffffffcu;  // extern: no user_init, lives as long as the job
  duet_agent_start_hold(nullptr, &args_);
  EXPECT_FALSE(duet_agent_registered());
  duet_agent_forget();
  // A CUDA_VISIBLE_DEVICES of the user's own shell is not Slurm's list: the
  // Hold waits for user_init, which reads the lists as they are then.
  g_env.clear();
  g_step_id = 4;
  g_env["CUDA_VISIBLE_DEVICES"] = "5";
  duet_agent_start_hold(nullptr, &args_);
  EXPECT_FALSE(duet_agent_registered());
  char err[512] = "";
  ASSERT_EQ(duet_agent_user_init(nullptr, &args_, err, sizeof err), 0) << err;
  // The agent answers in the order it was asked: user_init's answer came,
  // so anything sent before it has been recorded. One call: user_init's.
  ASSERT_EQ(agent.calls().size(), 1u);
  EXPECT_EQ(agent.calls()[0].gpus, std::vector<uint32_t>{5});
  EXPECT_FALSE(Logged("sent in init_post_opt"));
}

TEST_F(EarlyHoldTest, AgentDownAtInitPostOptIsAskedAgainInUserInit) {
  g_env["SLURM_STEP_GPUS"] = "0";
  duet_agent_start_hold(nullptr, &args_);  // nobody listens yet
  EXPECT_FALSE(duet_agent_registered());
  EXPECT_TRUE(Logged("not sent, user_init asks again"));
  FakeAgent agent(sock_);
  char err[512] = "";
  ASSERT_EQ(duet_agent_user_init(nullptr, &args_, err, sizeof err), 0) << err;
  EXPECT_TRUE(duet_agent_registered());
  EXPECT_EQ(agent.calls().size(), 1u);
}

}  // namespace
}  // namespace duet::spank
