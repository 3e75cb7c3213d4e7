// The whole command line: RunCli in-process for the many cases, and the real
// duetctl binary (DUETCTL_BIN) for what only a process shows: environment,
// exit codes, and --watch ended by Ctrl-C.

#include "duetctl/cli.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/fakes/ledger_server.h"
#include "tests/fakes/wait.h"

extern char** environ;

namespace duet::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kTable[] =
    "NODE    STATE   KIND   MODEL       TOTAL   SLURM   PODS   FREE\n"
    "gke-a   Ready   gpu    nvidia-l4   4       2       0.5    1.5\n"
    "gke-b   Ready   gpu    nvidia-l4   2       0       1      1\n"
    "2 nodes; gpu: 6 total, 2 slurm, 1.5 pods, 2.5 free\n";

NodeSpec GpuNode(const std::string& name, int gpus) {
  NodeSpec spec;
  spec.name = name;
  for (int i = 0; i < gpus; ++i) {
    DeviceSpec d;
    d.index = i;
    d.id = absl::StrCat("GPU-", name, "-", i);
    d.model = "nvidia-l4";
    spec.devices.push_back(d);
  }
  return spec;
}

HoldRequest HoldDevices(const std::string& node, const Owner& owner, std::vector<uint32_t> indices,
                        uint32_t milli = kWholeDevice) {
  HoldRequest r;
  r.node = node;
  r.owner = owner;
  for (uint32_t i : indices) r.devices.push_back({DeviceKind::kGpu, i, milli});
  return r;
}

struct Result {
  int rc = -1;
  std::string out;
  std::string err;
};

// A child process with its stdout and stderr on pipes.
struct Child {
  pid_t pid = -1;
  int out = -1;
  int err = -1;
};

Child Spawn(const std::vector<std::string>& args, const std::vector<std::string>& extra_env) {
  // Everything exec needs is built before fork: the test process has gRPC
  // threads, so the child may only call async-signal-safe functions.
  std::vector<std::string> env_strings = extra_env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "DUET_SERVER=", 12) != 0) env_strings.push_back(*e);
  }
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = {DUETCTL_BIN};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);

  int out[2], err[2];
  EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
  EXPECT_EQ(pipe2(err, O_CLOEXEC), 0);
  Child c;
  c.pid = fork();
  if (c.pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  c.out = out[0];
  c.err = err[0];
  return c;
}

// Reads `fd` into *buf until it contains `needle` (true) or EOF/timeout.
bool ReadUntil(int fd, const std::string& needle, absl::Duration timeout, std::string* buf) {
  const absl::Time deadline = absl::Now() + timeout;
  while (buf->find(needle) == std::string::npos) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(fd, chunk, sizeof chunk);
    if (n <= 0) return buf->find(needle) != std::string::npos;
    buf->append(chunk, n);
  }
  return true;
}

int WaitExit(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

Result RunBinary(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  Child c = Spawn(args, env);
  Result r;
  ReadUntil(c.out, std::string(1, '\0'), absl::Seconds(30), &r.out);  // to EOF
  ReadUntil(c.err, std::string(1, '\0'), absl::Seconds(30), &r.err);
  close(c.out);
  close(c.err);
  r.rc = WaitExit(c.pid);
  return r;
}

std::string Unreachable() { return absl::StrCat("unix:///tmp/duetctl-cli-test-", getpid(), ".sock"); }

// duet-bridge's service (fakes::LedgerServer) over a ledger of two nodes
// with a Slurm step's and two pods' holdings.
class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.ok());
    address_ = absl::StrCat("127.0.0.1:", server_.port());
    Ledger& l = ledger_;
    ASSERT_TRUE(l.UpsertNode(GpuNode("gke-b", 2)).ok());
    ASSERT_TRUE(l.UpsertNode(GpuNode("gke-a", 4)).ok());
    ASSERT_TRUE(l.Hold(HoldDevices("gke-a", Owner::SlurmStep(12, 0), {0, 1})).ok());
    ASSERT_TRUE(l.Hold(HoldDevices("gke-a", Owner::Pod("uid-i", "ml", "infer"), {2}, 500)).ok());
    ASSERT_TRUE(l.Hold(HoldDevices("gke-b", Owner::Pod("uid-t", "ml", "train"), {1})).ok());
  }

  // RunCli in-process with --server pointing at the server.
  Result Run(std::vector<std::string> args, bool with_server = true) {
    if (with_server) args.insert(args.begin(), {"--server", address_});
    std::ostringstream out, err;
    CliEnv env;
    env.out = &out;
    env.err = &err;
    Result r;
    r.rc = RunCli(args, env);
    r.out = out.str();
    r.err = err.str();
    return r;
  }

  Ledger ledger_;
  fakes::LedgerServer server_{&ledger_, "127.0.0.1:0"};
  std::string address_;
};

TEST_F(CliTest, NodesPrintsOneRowPerNodeAndModelWithASummary) {
  Result r = Run({"nodes"});
  EXPECT_EQ(r.rc, kExitOk) << r.err;
  EXPECT_EQ(r.out, kTable);
  EXPECT_EQ(r.err, "");
}

TEST_F(CliTest, GlobalFlagsMayFollowTheSubcommand) {
  Result r = Run({"nodes", "--server", address_, "--timeout", "2s"}, false);
  EXPECT_EQ(r.rc, kExitOk) << r.err;
  EXPECT_EQ(r.out, kTable);
}

TEST_F(CliTest, ServerFromEnvironmentWhenNoFlag) {
  std::ostringstream out, err;
  CliEnv env;
  env.out = &out;
  env.err = &err;
  env.server_env = address_;
  EXPECT_EQ(RunCli({"nodes"}, env), kExitOk) << err.str();
  EXPECT_EQ(out.str(), kTable);
}

TEST_F(CliTest, NamedNodesAndMissingOnes) {
  // duet-bridge refuses a list that names an unknown node; duetctl shows
  // what exists and names what does not.
  Result r = Run({"nodes", "gke-b", "nope", "nix"});
  EXPECT_EQ(r.rc, kExitRpcError);
  EXPECT_THAT(r.out, StartsWith("NODE"));
  EXPECT_THAT(r.out, HasSubstr("gke-b"));
  EXPECT_THAT(r.out, Not(HasSubstr("gke-a")));
  EXPECT_EQ(r.err,
            "duetctl: no node named nope (duetctl nodes lists them)\n"
            "duetctl: no node named nix (duetctl nodes lists them)\n");

  Result one = Run({"nodes", "nope"});
  EXPECT_EQ(one.rc, kExitRpcError);
  EXPECT_EQ(one.out, "");
  EXPECT_EQ(one.err, "duetctl: no node named nope (duetctl nodes lists them)\n");

  Result watch = Run({"nodes", "--watch", "nope"});
  EXPECT_EQ(watch.rc, kExitRpcError);
  EXPECT_EQ(watch.err, "duetctl: no node named nope (duetctl nodes lists them)\n");

  Result holds = Run({"holds", "--node", "nope"});
  EXPECT_EQ(holds.rc, kExitRpcError);
  EXPECT_EQ(holds.out, "");
  EXPECT_EQ(holds.err, "duetctl: no node named nope (duetctl nodes lists them)\n");
}

TEST_F(CliTest, NodesJson) {
  Result r = Run({"nodes", "--json"});
  ASSERT_EQ(r.rc, kExitOk) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["nodes"].size(), 2u);
  EXPECT_EQ(j["nodes"][0]["name"], "gke-a");
  EXPECT_EQ(j["nodes"][0]["models"][0]["slurm"], 2);
  EXPECT_DOUBLE_EQ(j["nodes"][0]["models"][0]["pods"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["summary"]["kinds"][0]["free"].get<double>(), 2.5);
}

TEST_F(CliTest, HoldsOnOneNode) {
  Result r = Run({"holds", "--node", "gke-a"});
  ASSERT_EQ(r.rc, kExitOk) << r.err;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << r.out;
  EXPECT_THAT(lines[0], StartsWith("NODE    OWNER           DEVICES     SINCE"));
  EXPECT_THAT(lines[1], StartsWith("gke-a   job 12 step 0   gpu0-1      "));
  EXPECT_THAT(lines[2], StartsWith("gke-a   pod ml/infer    gpu2@500m   "));
  EXPECT_THAT(lines[2], ::testing::EndsWith("s"));  // granted just now: "0s" or "1s"
}

TEST_F(CliTest, HoldsEverywhereAsJson) {
  Result r = Run({"holds", "--json"});
  ASSERT_EQ(r.rc, kExitOk) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["holdings"].size(), 3u);
  EXPECT_EQ(j["holdings"][2]["node"], "gke-b");
  EXPECT_EQ(j["holdings"][2]["owner_text"], "pod ml/train");
  EXPECT_EQ(j["holdings"][2]["devices"][0]["id"], "GPU-gke-b-1");
}

TEST_F(CliTest, HoldsOnANodeWithoutHoldings) {
  ASSERT_TRUE(ledger_.UpsertNode(GpuNode("gke-c", 1)).ok());
  Result r = Run({"holds", "--node", "gke-c"});
  EXPECT_EQ(r.rc, kExitOk) << r.err;
  EXPECT_EQ(r.out, "No holdings on node gke-c.\n");
}

TEST_F(CliTest, HoldsOnAnUnknownNodeIsAnError) {
  Result r = Run({"holds", "--node", "nope"});
  EXPECT_EQ(r.rc, kExitRpcError);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "duetctl: no node named nope (duetctl nodes lists them)\n");
}

TEST_F(CliTest, NodeInDetail) {
  Result r = Run({"node", "gke-a"});
  ASSERT_EQ(r.rc, kExitOk) << r.err;
  EXPECT_THAT(r.out, StartsWith("Name:         gke-a\nState:        Ready\n"));
  EXPECT_THAT(r.out, HasSubstr("gpu    2       GPU-gke-a-2   nvidia-l4   500m    pod ml/infer (500m)\n"));
  EXPECT_THAT(r.out, HasSubstr("gpu    3       GPU-gke-a-3   nvidia-l4   0m      -\n"));
}

TEST_F(CliTest, UnknownNodeSaysHowToListNodes) {
  Result r = Run({"node", "nope"});
  EXPECT_EQ(r.rc, kExitRpcError);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "duetctl: no node named nope (duetctl nodes lists them)\n");
}

TEST_F(CliTest, UnreachableServer) {
  Result r = Run({"--server", Unreachable(), "holds"}, false);
  EXPECT_EQ(r.rc, kExitRpcError);
  EXPECT_THAT(r.err, StartsWith(absl::StrCat("duetctl: cannot reach duet-bridge at ",
                                             Unreachable(), ": ")));
  EXPECT_THAT(r.err, HasSubstr("Is it running? Set --server or DUET_SERVER.\n"));
}

TEST_F(CliTest, UsageErrorsExitTwo) {
  EXPECT_EQ(Run({}).rc, kExitUsage);
  EXPECT_EQ(Run({"nodes", "--bogus"}).rc, kExitUsage);
  EXPECT_EQ(Run({"node"}).rc, kExitUsage);  // NAME is required
  Result typo = Run({"nodez"}, false);
  EXPECT_EQ(typo.rc, kExitUsage);
  EXPECT_EQ(typo.err, "duetctl: unknown command \"nodez\" (duetctl --help lists them)\n");
  Result timeout = Run({"--timeout", "soon", "nodes"});
  EXPECT_EQ(timeout.rc, kExitUsage);
  EXPECT_THAT(timeout.err, HasSubstr("--timeout: \"soon\" is not a positive duration"));
  Result tls = Run({"--cert-file", "c.pem", "nodes"});
  EXPECT_EQ(tls.rc, kExitUsage);
  EXPECT_THAT(tls.err, HasSubstr("--cert-file and --key-file"));
}

TEST_F(CliTest, HelpAndVersionExitZero) {
  Result help = Run({"--help"}, false);
  EXPECT_EQ(help.rc, kExitOk);
  EXPECT_THAT(help.out, HasSubstr("--server"));
  Result version = Run({"version"}, false);
  EXPECT_EQ(version.rc, kExitOk);
  EXPECT_THAT(version.out, StartsWith("duetctl "));
}

// --- the real binary ---------------------------------------------------------

// Issue 25, item 1: a hold journaled with a namespace holding a newline and
// an ANSI escape (the bridge's gRPC checks now refuse such a name, but a
// ledger replayed from an older journal may still carry one). Through the
// bridge's own service and the real binary, `duetctl holds` prints it on one
// line with the escape visible; --json carries it exactly.
TEST_F(CliTest, BinaryHoldsPrintsAHostileNamespaceEscapedOnOneLine) {
  ASSERT_TRUE(ledger_.UpsertNode(GpuNode("gke-c", 1)).ok());
  ASSERT_TRUE(
      ledger_.Hold(HoldDevices("gke-c", Owner::Pod("uid-h", "ml\n\x1b[31m", "x"), {0})).ok());

  Result r = RunBinary({"--server", address_, "holds", "--node", "gke-c"});
  ASSERT_EQ(r.rc, 0) << r.err;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << r.out;
  EXPECT_THAT(lines[1], StartsWith("gke-c   pod ml\\n\\x1b[31m/x   gpu0   "));
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;

  Result json = RunBinary({"--server", address_, "holds", "--node", "gke-c", "--json"});
  ASSERT_EQ(json.rc, 0) << json.err;
  EXPECT_EQ(json.out.find('\x1b'), std::string::npos) << json.out;
  const auto j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["holdings"][0]["owner"]["namespace"], "ml\n\x1b[31m");

  Result node = Run({"node", "gke-c"});
  ASSERT_EQ(node.rc, kExitOk) << node.err;
  EXPECT_THAT(node.out, HasSubstr("pod ml\\n\\x1b[31m/x\n"));
  EXPECT_EQ(node.out.find('\x1b'), std::string::npos) << node.out;
}

TEST_F(CliTest, BinaryTakesServerFromEnvironment) {
  Result r = RunBinary({"nodes"}, {absl::StrCat("DUET_SERVER=", address_)});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, kTable);
}

TEST_F(CliTest, BinaryFlagBeatsEnvironment) {
  Result r = RunBinary({"--server", address_, "nodes"},
                       {absl::StrCat("DUET_SERVER=", Unreachable())});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, kTable);
}

TEST_F(CliTest, BinaryUnreachableServerExitsOne) {
  Result r = RunBinary({"nodes"}, {absl::StrCat("DUET_SERVER=", Unreachable())});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, StartsWith(absl::StrCat("duetctl: cannot reach duet-bridge at ",
                                             Unreachable(), ": ")));
  EXPECT_THAT(r.err, HasSubstr("Is it running? Set --server or DUET_SERVER.\n"));
}

TEST_F(CliTest, BinaryUsageErrorExitsTwo) {
  Result r = RunBinary({"holds", "--nod", "x"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, HasSubstr("--help"));
}

TEST_F(CliTest, BinaryWatchRedrawsAfterAHoldAndStopsOnCtrlC) {
  Child c = Spawn({"--server", address_, "nodes", "--watch"}, {});
  std::string out;
  ASSERT_TRUE(ReadUntil(c.out, kTable, absl::Seconds(20), &out)) << out;
  // Wait for the stream itself, so the hold below arrives as an update.
  ASSERT_TRUE(fakes::WaitFor([&] { return server_.watch_streams() != 0; }, fakes::kWaitTimeout,
                             "the watch stream"));
  ASSERT_EQ(server_.watch_streams(), 1);

  ASSERT_TRUE(ledger_.Hold(HoldDevices("gke-a", Owner::SlurmJob(20), {3})).ok());
  const std::string updated =
      "\n"  // not a tty: tables are separated by a blank line
      "NODE    STATE   KIND   MODEL       TOTAL   SLURM   PODS   FREE\n"
      "gke-a   Ready   gpu    nvidia-l4   4       3       0.5    0.5\n"
      "gke-b   Ready   gpu    nvidia-l4   2       0       1      1\n"
      "2 nodes; gpu: 6 total, 3 slurm, 1.5 pods, 1.5 free\n";
  ASSERT_TRUE(ReadUntil(c.out, updated, absl::Seconds(20), &out)) << out;
  EXPECT_THAT(out, StartsWith(kTable));
  EXPECT_THAT(out, Not(HasSubstr("\033[")));  // no screen clearing into a pipe

  kill(c.pid, SIGINT);
  std::string err;
  ReadUntil(c.err, std::string(1, '\0'), absl::Seconds(20), &err);
  EXPECT_EQ(WaitExit(c.pid), 0) << err;
  EXPECT_EQ(err, "");
  close(c.out);
  close(c.err);
}

TEST_F(CliTest, BinaryWatchEndsWhenTheServerEndsTheStream) {
  Child c = Spawn({"--server", address_, "nodes", "--watch", "--json"}, {});
  std::string out;
  ASSERT_TRUE(ReadUntil(c.out, "\n", absl::Seconds(20), &out)) << out;
  EXPECT_EQ(nlohmann::json::parse(out)["summary"]["nodes"], 2);  // one document per line
  ASSERT_TRUE(fakes::WaitFor([&] { return server_.watch_streams() != 0; }, fakes::kWaitTimeout,
                             "the watch stream"));
  // What duet-bridge's shutdown does to its streams.
  server_.CloseWatches("duet-bridge is shutting down");
  std::string err;
  ReadUntil(c.err, std::string(1, '\0'), absl::Seconds(20), &err);
  EXPECT_EQ(WaitExit(c.pid), 1) << err;
  EXPECT_EQ(err, absl::StrCat("duetctl: lost duet-bridge at ", address_,
                              ": duet-bridge is shutting down. Run the command again once it is "
                              "back.\n"));
  close(c.out);
  close(c.err);
}

TEST_F(CliTest, BinaryCtrlCOutsideAWatchStopsAtOnce) {
  // A server that accepts connections but never speaks: the call would wait
  // for --timeout; SIGINT must not.
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(s, 8), 0);
  socklen_t len = sizeof addr;
  getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
  Child c = Spawn({"--server", absl::StrCat("127.0.0.1:", ntohs(addr.sin_port)), "--timeout",
                   "60s", "nodes"},
                  {});
  // Its call is in flight once it has connected.
  pollfd incoming = {s, POLLIN, 0};
  ASSERT_EQ(poll(&incoming, 1, 30'000), 1) << "duetctl did not connect";
  const int conn = accept(s, nullptr, nullptr);
  ASSERT_GE(conn, 0);
  const absl::Time start = absl::Now();
  kill(c.pid, SIGINT);
  EXPECT_EQ(WaitExit(c.pid), 128 + SIGINT);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  close(c.out);
  close(c.err);
  close(conn);
  close(s);
}

}  // namespace
}  // namespace duet::ctl
