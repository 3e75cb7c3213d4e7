// The real duet-bridge and duetctl binaries:
// - kill -9 of duet-bridge during a burst of concurrent holdings: after a
//   restart on the same journal, every acknowledged holding is there with its
//   devices, every acknowledged release is gone, and no device is held by two
//   owner groups (invariants I1 and I3);
// - SIGTERM shuts down cleanly (exit 0) and loses nothing;
// - duetctl shows what the bridge holds.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "duet/v1/duet.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"

namespace duet {
namespace {

namespace fs = std::filesystem;

constexpr int kNodes = 20;

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("duet-crash-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream inv(dir_ / "nodes.yaml");
    inv << "nodes:\n";
    for (int i = 0; i < kNodes; ++i) inv << "  - {name: n" << i << ", gpus: {count: 8}}\n";
    inv.close();
    std::ofstream cfg(dir_ / "bridge.yaml");
    cfg << "grpc: {listen: \"\", unix_socket: " << (dir_ / "bridge.sock").string() << "}\n"
        << "metrics: {listen: \"\"}\n"
        << "journal: {dir: " << (dir_ / "journal").string() << ", snapshot_every: 500}\n"
        << "inventory: {source: file, file: " << (dir_ / "nodes.yaml").string() << "}\n"
        // Slurm steps below hold with no credential (the unix socket only).
        << "slurm: {credential: none}\n"
        << "log_level: warn\n";
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    fs::remove_all(dir_);
  }

  void StartBridge() {
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      const std::string cfg = (dir_ / "bridge.yaml").string();
      execl(DUET_BRIDGE_BIN, DUET_BRIDGE_BIN, "--config", cfg.c_str(), (char*)nullptr);
      _exit(127);
    }
    channel_ = grpc::CreateChannel("unix:" + (dir_ / "bridge.sock").string(),
                                   grpc::InsecureChannelCredentials());
    ASSERT_TRUE(channel_->WaitForConnected(std::chrono::system_clock::now() +
                                           std::chrono::seconds(20)))
        << "duet-bridge did not come up";
    stub_ = v1::Ledger::NewStub(channel_);
  }

  void KillBridge() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  fs::path dir_;
  pid_t pid_ = -1;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Ledger::Stub> stub_;
};

struct Acked {
  std::string node;
  std::set<uint32_t> devices;
};

TEST_F(DaemonTest, Kill9DuringABurstLosesNoAcknowledgedHolding) {
  std::mutex mu;
  std::map<std::string, Acked> live;  // owner key -> acknowledged holding
  std::set<std::string> released;      // acknowledged releases
  std::atomic<uint64_t> next_owner{1};
  int acked_total = 0;

  for (int round = 0; round < 3; ++round) {
    StartBridge();
    if (HasFatalFailure()) return;
    std::atomic<bool> stop{false};
    std::vector<std::thread> clients;
    for (int t = 0; t < 8; ++t) {
      clients.emplace_back([&, t] {
        std::mt19937 rng(round * 100 + t);
        auto stub = v1::Ledger::NewStub(channel_);
        std::vector<std::string> mine;
        while (!stop.load()) {
          grpc::ClientContext ctx;
          ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
          if (!mine.empty() && rng() % 3 == 0) {
            const std::string key = mine.back();
            v1::ReleaseRequest rel;
            {
              std::lock_guard<std::mutex> l(mu);
              rel.set_node(live.at(key).node);
            }
            rel.mutable_owner()->mutable_pod()->set_uid(key);
            v1::ReleaseResponse resp;
            const bool ok = stub->Release(&ctx, rel, &resp).ok();
            std::lock_guard<std::mutex> l(mu);
            // An unanswered release may or may not have happened: the key is
            // no longer checked either way.
            live.erase(key);
            if (ok) released.insert(key);
            mine.pop_back();
            continue;
          }
          const std::string key = "uid-" + std::to_string(next_owner++);
          v1::HoldRequest req;
          req.set_node("n" + std::to_string(rng() % kNodes));
          req.mutable_owner()->mutable_pod()->set_uid(key);
          req.mutable_count()->set_kind(v1::DEVICE_KIND_GPU);
          req.mutable_count()->set_count(1 + rng() % 3);
          v1::HoldResponse resp;
          if (stub->Hold(&ctx, req, &resp).ok()) {
            Acked a{req.node(), {}};
            for (const auto& d : resp.holding().devices()) a.devices.insert(d.index());
            std::lock_guard<std::mutex> l(mu);
            live[key] = a;
            ++acked_total;
            mine.push_back(key);
          }
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300 + 200 * round));
    KillBridge();  // mid-burst: calls are in flight
    stop = true;
    for (auto& c : clients) c.join();
  }

  StartBridge();
  if (HasFatalFailure()) return;
  grpc::ClientContext ctx;
  v1::ListHoldingsResponse holdings;
  ASSERT_TRUE(stub_->ListHoldings(&ctx, v1::ListHoldingsRequest(), &holdings).ok());
  std::map<std::string, Acked> recovered;
  for (const auto& h : holdings.holdings()) {
    Acked a{h.node(), {}};
    for (const auto& d : h.devices()) a.devices.insert(d.index());
    recovered[h.owner().pod().uid()] = a;
  }
  ASSERT_GT(acked_total, 50) << "the burst was too small to prove anything";
  for (const auto& [key, a] : live) {
    auto it = recovered.find(key);
    ASSERT_NE(it, recovered.end()) << "acknowledged holding of " << key << " was lost";
    EXPECT_EQ(it->second.node, a.node);
    EXPECT_EQ(it->second.devices, a.devices) << key;
  }
  for (const auto& key : released) {
    EXPECT_EQ(recovered.count(key), 0u) << "acknowledged release of " << key << " was lost";
  }
  // I1 over the recovered state: every device has at most one holder (all
  // holdings here are whole devices of distinct pods).
  grpc::ClientContext ctx2;
  v1::ListNodesResponse nodes;
  ASSERT_TRUE(stub_->ListNodes(&ctx2, v1::ListNodesRequest(), &nodes).ok());
  ASSERT_EQ(nodes.nodes_size(), kNodes);
  for (const auto& n : nodes.nodes()) {
    for (const auto& d : n.devices()) {
      EXPECT_LE(d.holders_size(), 1) << n.name() << " gpu " << d.index();
      EXPECT_LE(d.used_milli(), d.capacity_milli());
    }
  }
  std::cout << "acknowledged holds: " << acked_total << ", live after 3 kills: " << live.size()
            << ", recovered holdings: " << recovered.size() << "\n";
}

TEST_F(DaemonTest, SigtermShutsDownCleanlyAndDuetctlShowsTheHoldings) {
  StartBridge();
  if (HasFatalFailure()) return;
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    v1::HoldRequest req;
    req.set_node("n1");
    req.mutable_owner()->mutable_slurm_step()->set_job_id(100 + i);
    req.mutable_count()->set_kind(v1::DEVICE_KIND_GPU);
    req.mutable_count()->set_count(2);
    v1::HoldResponse resp;
    ASSERT_TRUE(stub_->Hold(&ctx, req, &resp).ok());
  }
  const std::string ctl = std::string(DUETCTL_BIN) + " --server unix://" +
                          (dir_ / "bridge.sock").string();
  auto run = [](const std::string& cmd, int* rc) {
    std::string out;
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    *rc = WEXITSTATUS(pclose(p));
    return out;
  };
  int rc = -1;
  const std::string nodes = run(ctl + " nodes n1 n2", &rc);
  EXPECT_EQ(rc, 0) << nodes;
  EXPECT_NE(nodes.find("n1"), std::string::npos) << nodes;
  // 6 of n1's 8 GPUs are held by Slurm steps.
  EXPECT_NE(nodes.find("8       6       0      2"), std::string::npos) << nodes;
  const std::string holds = run(ctl + " holds --node n1", &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(holds.find("job 101"), std::string::npos) << holds;
  run(ctl + " node nope", &rc);
  EXPECT_EQ(rc, 1);

  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(pid_, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid_, &status, 0), pid_);
  pid_ = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));

  StartBridge();
  if (HasFatalFailure()) return;
  grpc::ClientContext ctx;
  v1::ListHoldingsResponse holdings;
  ASSERT_TRUE(stub_->ListHoldings(&ctx, v1::ListHoldingsRequest(), &holdings).ok());
  EXPECT_EQ(holdings.holdings_size(), 3);
}

}  // namespace
}  // namespace duet
