// spank_duet.so in real srun/sbatch/slurmstepd against a real ledger served
// over gRPC (label: slurm).

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bridge/ledger/ledger.h"
#include "gtest/gtest.h"
#include "tests/slurm/slurm_cluster_fixture.h"
#include "tests/fakes/ledger_server.h"

namespace duet {
namespace {

using ::duet::testing::CmdResult;
using ::duet::testing::TestSlurmCluster;
using ::duet::testing::WaitFor;

std::string Socket() { return absl::StrCat("/tmp/duet-spank-test-", getpid(), ".sock"); }

std::string PlugstackLine(const std::string& args) {
  return absl::StrCat("required ", DUET_SPANK_SO, " ", args);
}

NodeSpec Spec(const std::string& name, int gpus, int tpus) {
  NodeSpec s;
  s.name = name;
  s.cpus = 8;
  s.memory_mib = 16000;
  for (int i = 0; i < gpus; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kGpu;
    d.index = i;
    d.model = "h100";
    s.devices.push_back(d);
  }
  for (int i = 0; i < tpus; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kTpu;
    d.index = i;
    d.model = "v5e";
    s.devices.push_back(d);
  }
  return s;
}

class SpankDuetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TestSlurmCluster::Options o;
    o.spank = absl::StrCat(DUET_SPANK_SO, ":bridge=unix://", Socket(), " timeout_ms=2000 tpu=yes");
    o.extra_conf = extra_conf_;
    cluster_ = TestSlurmCluster::Get(o);
    ASSERT_TRUE(cluster_->ok());
    server_ = std::make_unique<fakes::LedgerServer>(&ledger_, "unix://" + Socket());
    ASSERT_TRUE(server_->ok());
  }
  void TearDown() override {
    server_.reset();
    unlink(Socket().c_str());
  }

  // A node in Slurm (created with scontrol: this test is about the plugin,
  // not node sync) and, unless `in_ledger` is false, in the ledger.
  void AddNode(const std::string& name, int idx, int gpus, int tpus, bool in_ledger = true) {
    if (in_ledger) {
      ASSERT_TRUE(ledger_.UpsertNode(Spec(name, gpus, tpus)).ok());
    }
    std::string gres;
    if (gpus) gres = absl::StrCat("gpu:h100:", gpus);
    if (tpus) gres += absl::StrCat(gres.empty() ? "" : ",", "tpu:v5e:", tpus);
    CmdResult r = duet::testing::RunCmd(cluster_->Script(
        absl::StrCat("create ", cluster_->root(), " ", name, " ", idx, " 'CPUs=8 RealMemory=16000",
                     gres.empty() ? "" : " Gres=" + gres, "'")));
    ASSERT_EQ(r.rc, 0) << r.out;
    cluster_->StartSlurmd(name, idx, 8, 16000, gpus, "h100", tpus, "v5e");
    ASSERT_TRUE(cluster_->WaitNodeState(name, "IDLE")) << cluster_->Log("slurmctld.log");
  }

  void SetPlugstack(const std::string& args) {
    std::ofstream(cluster_->root() + "/etc/plugstack.conf") << PlugstackLine(args) << "\n";
  }
  void RestorePlugstack() {
    SetPlugstack(absl::StrCat("bridge=unix://", Socket(), " timeout_ms=2000 tpu=yes"));
  }

  // slurm.conf lines for this process's cluster (a fixture that needs some
  // sets them in its constructor).
  std::string extra_conf_;
  Ledger ledger_;
  TestSlurmCluster* cluster_ = nullptr;
  std::unique_ptr<fakes::LedgerServer> server_;
};

TEST_F(SpankDuetTest, HelpListsTheOption) {
  CmdResult r = cluster_->Cli("srun --help");
  EXPECT_NE(r.out.find("--duet-show"), std::string::npos) << r.out;
  r = cluster_->Cli("sbatch --help");
  EXPECT_NE(r.out.find("--duet-show"), std::string::npos) << r.out;
}

TEST_F(SpankDuetTest, StepSeesExactlyItsGpusAndIsRegisteredWhileItRuns) {
  AddNode("sp-a", 21, 8, 0);
  ASSERT_TRUE(ledger_.Hold({"sp-a", Owner::Pod("uid-9", "default", "web-9"),
                            {{DeviceKind::kGpu, 7, kWholeDevice}}, std::nullopt, 0, std::nullopt})
                  .ok());
  auto run = std::async(std::launch::async, [&] {
    return cluster_->Cli(
        "srun -w sp-a --gres=gpu:3 --duet-show sh -c 'echo CVD=$CUDA_VISIBLE_DEVICES; sleep 2'");
  });
  // While the step runs, the ledger shows it holding exactly its GPUs.
  bool seen = WaitFor([&] {
    for (const Holding& h : ledger_.ListHoldings("sp-a")) {
      if (h.owner.kind == OwnerKind::kSlurmStep && h.devices.size() == 3) return true;
    }
    return false;
  });
  CmdResult r = run.get();
  EXPECT_TRUE(seen);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("CVD=0,1,2\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("on sp-a got gpu 0,1,2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pod default/web-9 holds gpu 7"), std::string::npos) << r.out;
  // Released at exit.
  EXPECT_TRUE(WaitFor([&] { return ledger_.ListHoldings("sp-a").size() == 1; }));
}

TEST_F(SpankDuetTest, StepOnAPodsDeviceIsRefusedOthersRun) {
  AddNode("sp-b", 22, 8, 0);
  // An allocation with no step yet: GPUs 0,1.
  CmdResult alloc = cluster_->Cli("salloc --no-shell -w sp-b --gres=gpu:2 2>&1");
  ASSERT_EQ(alloc.rc, 0) << alloc.out;
  uint32_t job = 0;
  ASSERT_EQ(sscanf(alloc.out.c_str() + alloc.out.find("Granted job allocation") + 23, "%u", &job),
            1)
      << alloc.out;
  // The ledger says a pod holds GPU 1 (a pod that bypassed Slurm).
  ASSERT_TRUE(ledger_.Hold({"sp-b", Owner::Pod("uid-1", "default", "web-1"),
                            {{DeviceKind::kGpu, 1, kWholeDevice}}, std::nullopt, 0, std::nullopt})
                  .ok());
  CmdResult refused = cluster_->Cli(absl::StrCat("srun --jobid=", job, " --gres=gpu:2 true"));
  EXPECT_NE(refused.rc, 0);
  EXPECT_NE(refused.out.find("refused on node sp-b"), std::string::npos) << refused.out;
  EXPECT_NE(refused.out.find("gpu 1 is held by pod default/web-1"), std::string::npos) << refused.out;
  EXPECT_NE(refused.out.find("pod default/web-1"), std::string::npos) << refused.out;
  // The same job's next step, on GPU 0 only, runs.
  CmdResult ok = cluster_->Cli(absl::StrCat("srun --jobid=", job,
                                            " --gres=gpu:1 sh -c 'echo CVD=$CUDA_VISIBLE_DEVICES'"));
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_NE(ok.out.find("CVD=0"), std::string::npos) << ok.out;
  // Another job on the node runs.
  CmdResult other = cluster_->Cli("srun -w sp-b --gres=gpu:2 sh -c 'echo CVD=$CUDA_VISIBLE_DEVICES'");
  EXPECT_EQ(other.rc, 0) << other.out;
  EXPECT_NE(other.out.find("CVD=2,3"), std::string::npos) << other.out;
  cluster_->Cli(absl::StrCat("scancel ", job));
  // Only the pod's holding is left.
  EXPECT_TRUE(WaitFor([&] { return ledger_.ListHoldings("sp-b").size() == 1; }));
}

// What broke: the client module let a step through on any NOT_FOUND whose
// message named "node" and the node, and the ledger's answer for a device it
// does not know ("node sp-d gpu 2 does not exist") has that shape. Now it
// passes only on the reason NODE_NOT_SHARED; DEVICE_UNKNOWN refuses.
TEST_F(SpankDuetTest, StepOnAGpuTheLedgerDoesNotKnowOnASharedNodeIsRefusedNeverRunsUnregistered) {
  AddNode("sp-d", 25, 4, 0);
  // Slurm has 4 GPUs on sp-d; duet's inventory of the node lists 2.
  ASSERT_TRUE(ledger_.UpsertNode(Spec("sp-d", 2, 0)).ok());
  CmdResult refused = cluster_->Cli("srun -w sp-d --gres=gpu:4 sh -c 'echo STEP-RAN'");
  EXPECT_NE(refused.rc, 0) << refused.out;
  EXPECT_EQ(refused.out.find("STEP-RAN"), std::string::npos) << refused.out;
  EXPECT_NE(refused.out.find("refused on node sp-d"), std::string::npos) << refused.out;
  EXPECT_NE(refused.out.find("Slurm gave it gpu 2, which duet's inventory of this shared node "
                             "does not list"),
            std::string::npos)
      << refused.out;
  EXPECT_TRUE(ledger_.ListHoldings("sp-d").empty());
  // GPUs the ledger knows still run, registered while they do.
  CmdResult ok = cluster_->Cli("srun -w sp-d --gres=gpu:2 sh -c 'echo STEP-RAN'");
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_NE(ok.out.find("STEP-RAN"), std::string::npos) << ok.out;
}

// A node the bridge does not know is not shared with Kubernetes: nothing to
// fence, the step runs (the bridge answers NODE_NOT_SHARED).
TEST_F(SpankDuetTest, StepOnANodeTheBridgeDoesNotKnowStillRuns) {
  AddNode("sp-s", 26, 2, 0, /*in_ledger=*/false);
  CmdResult r = cluster_->Cli("srun -w sp-s --gres=gpu:2 sh -c 'echo CVD=$CUDA_VISIBLE_DEVICES'");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("CVD=0,1"), std::string::npos) << r.out;
  EXPECT_EQ(ledger_.GetNode("sp-s"), nullptr);
}

TEST_F(SpankDuetTest, TpuStepSeesItsTpuVariables) {
  AddNode("sp-t", 23, 0, 4);
  CmdResult r = cluster_->Cli("srun -w sp-t --gres=tpu:2 env");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("TPU_VISIBLE_CHIPS=0,1\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("TPU_CHIPS_PER_PROCESS_BOUNDS=1,2,1\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("TPU_PROCESS_BOUNDS=1,1,1\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("CUDA_VISIBLE_DEVICES"), std::string::npos) << r.out;
}

TEST_F(SpankDuetTest, UnreachableBridgeFollowsPolicyAndBadArgsAreRejected) {
  AddNode("sp-c", 24, 8, 0);
  SetPlugstack("bridge=unix:///nonexistent/duet.sock timeout_ms=300 tpu=no");
  CmdResult r = cluster_->Cli("srun -w sp-c --gres=gpu:1 true");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("unreachable"), std::string::npos) << r.out;
  SetPlugstack("bridge=unix:///nonexistent/duet.sock timeout_ms=300 tpu=no on_unreachable=allow");
  r = cluster_->Cli("srun -w sp-c --gres=gpu:1 true");
  EXPECT_EQ(r.rc, 0) << r.out;
  SetPlugstack("bridge=unix:///x.sock bogus=1");
  r = cluster_->Cli("srun -w sp-c true");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("bogus=1"), std::string::npos) << r.out;
  RestorePlugstack();
  // A step without devices needs no bridge at all.
  r = cluster_->Cli("srun -w sp-c true");
  EXPECT_EQ(r.rc, 0) << r.out;
}

// slurmd's Prolog runs before a batch step starts: this one says it is
// there (the go file) and waits for the test (the ready file).
std::string PrologPath() { return absl::StrCat("/tmp/duet-spank-test-", getpid(), ".prolog"); }
std::string GoFile() { return PrologPath() + ".go"; }
std::string ReadyFile() { return PrologPath() + ".ready"; }
std::string JobOutput() { return PrologPath() + ".out"; }

class SpankDuetCtldRestartTest : public SpankDuetTest {
 protected:
  SpankDuetCtldRestartTest() { extra_conf_ = "Prolog=" + PrologPath(); }
  void TearDown() override {
    SpankDuetTest::TearDown();
    for (const std::string& f : {PrologPath(), GoFile(), ReadyFile(), JobOutput()}) {
      unlink(f.c_str());
    }
  }
};

// slurmctld restarting just as a batch step starts (an upgrade, a failover,
// its pod moved): the TPU probe's RPC in slurm_spank_init_post_opt meets a
// connection slurmctld's end closes, asks again, and the step runs once
// slurmctld is back. (The step was refused before: seen in CI when a test
// stopped slurmctld right after its job started.)
TEST_F(SpankDuetCtldRestartTest, ABatchStepStartingWhileSlurmctldRestartsRunsOnceItIsBack) {
  AddNode("sp-r", 27, 0, 0, /*in_ledger=*/false);
  {
    std::ofstream prolog(PrologPath());
    prolog << "#!/bin/sh\ntouch " << GoFile() << "\ni=0\nwhile [ ! -e " << ReadyFile()
           << " ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done\nexit 0\n";
  }
  ASSERT_EQ(chmod(PrologPath().c_str(), 0755), 0);
  const int port = std::atoi(
      duet::testing::RunCmd(absl::StrCat("sed -n 's/^SlurmctldPort=//p' ", cluster_->conf()))
          .out.c_str());
  ASSERT_GT(port, 0);
  const uint32_t job =
      cluster_->Sbatch(absl::StrCat("-w sp-r -o ", JobOutput(), " --wrap 'echo ran'"));
  ASSERT_NE(job, 0u) << cluster_->Log("slurmctld.log");
  ASSERT_TRUE(WaitFor([] { return access(GoFile().c_str(), F_OK) == 0; }, absl::Seconds(30)))
      << cluster_->Log("slurmd-sp-r.log");

  // slurmctld goes; in its place, until the probe has asked again, a
  // listener that takes each connection, reads the request and closes.
  cluster_->CtldStop();
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << strerror(errno);
  ASSERT_EQ(listen(fd, 16), 0);
  std::atomic<bool> stop{false};
  std::atomic<int> closed{0};
  std::thread closer([&] {
    while (!stop.load()) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 100) != 1) continue;
      const int c = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      char buf[4096];
      pollfd in{c, POLLIN, 0};
      if (poll(&in, 1, 1000) == 1) (void)read(c, buf, sizeof(buf));
      close(c);
      closed.fetch_add(1);
    }
  });
  std::ofstream(ReadyFile()).close();
  const bool retried = WaitFor(
      [&] { return absl::StrContains(cluster_->Log("slurmd-sp-r.log"), "slurmctld unreachable"); },
      absl::Seconds(20));
  stop.store(true);
  closer.join();
  close(fd);
  ASSERT_TRUE(cluster_->CtldStart());
  EXPECT_TRUE(retried) << closed.load() << " connections closed\n"
                       << cluster_->Log("slurmd-sp-r.log");
  // The batch script ran (a refused batch step never starts it).
  EXPECT_TRUE(WaitFor([&] { return cluster_->JobEnded(job); }, absl::Seconds(60)));
  std::ifstream out(JobOutput());
  std::string line;
  EXPECT_TRUE(std::getline(out, line) && line == "ran")
      << "job output: '" << line << "'\n" << cluster_->Log("slurmd-sp-r.log");
}

}  // namespace
}  // namespace duet
