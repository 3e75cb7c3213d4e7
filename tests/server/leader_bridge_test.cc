// duet-bridge under kubernetes.leader_election: two real duet-bridge
// processes against the fake API server (tests/fakes/fake_apiserver.py).
// One leads and serves; the other is a standby (health NOT_SERVING, no
// ledger: UNAVAILABLE, duet_leader 0). kill -9 of the leader → the standby takes
// over once the lease expires and serves; a leader that cannot renew exits
// with status 3; SIGTERM gives the lease up.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "duet/v1/duet.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/fakes/free_port.h"
#include "tests/k8s_adapter/fake_server.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using k8s::testing::FakeApiServer;
using k8s::testing::WaitFor;

using fakes::FreePort;

constexpr absl::Duration kLease = absl::Seconds(2);
constexpr absl::Duration kRetry = absl::Milliseconds(200);

struct Replica {
  std::string name;
  int grpc_port = 0;
  int metrics_port = 0;
  pid_t pid = -1;
  // A fresh channel (own subchannel pool) per call: no reconnect backoff
  // carried over from the time the port was closed.
  std::shared_ptr<grpc::Channel> Channel() const {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(grpc_port),
                                     grpc::InsecureChannelCredentials(), args);
  }
};

class LeaderBridgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fake_.ok());
    dir_ = k8s::testing::MakeTempDir();
    k8s::testing::WriteKubeconfig(dir_ + "/kubeconfig", fake_.url(), "duet-system");
    k8s::KubeConfig c;
    c.server = fake_.url();
    client_ = *k8s::NewCurlKubeClient(c);
  }
  void TearDown() override {
    for (Replica* r : {&a_, &b_}) {
      if (r->pid > 0) {
        kill(r->pid, SIGKILL);
        waitpid(r->pid, nullptr, 0);
      }
    }
    k8s::testing::RemoveTree(dir_);
  }

  // Starts a replica. `identity_in_config` false: the identity comes from
  // $POD_NAME.
  void Start(Replica* r, const std::string& name, bool identity_in_config,
             const std::string& extra_env = "") {
    r->name = name;
    r->grpc_port = FreePort();
    r->metrics_port = FreePort();
    const std::string cfg = dir_ + "/" + name + ".yaml";
    std::ofstream(cfg) << "grpc: {listen: \"127.0.0.1:" << r->grpc_port << "\", shutdown_grace: 1s}\n"
                       << "metrics: {listen: \"127.0.0.1:" << r->metrics_port << "\"}\n"
                       << "journal: {dir: " << dir_ << "/" << name << "-journal, fsync: false}\n"
                       << "inventory: {source: embedded}\n"
                       << "kubernetes:\n"
                       << "  kubeconfig: " << dir_ << "/kubeconfig\n"
                       << (leader_election_ ? "" : "  watch_pods: false\n")
                       << "  leader_election:\n"
                       << "    enabled: " << (leader_election_ ? "true" : "false") << "\n"
                       << (identity_in_config ? "    identity: " + name + "\n" : "")
                       << "    lease_duration: " << absl::FormatDuration(kLease) << "\n"
                       << "    renew_deadline: 1500ms\n"
                       << "    retry_period: " << absl::FormatDuration(kRetry) << "\n"
                       << "log_level: info\n";
    const std::string pod_env = "POD_NAME=" + name;
    r->pid = fork();
    ASSERT_GE(r->pid, 0);
    if (r->pid == 0) {
      char* envp[] = {const_cast<char*>(pod_env.c_str()),
                      extra_env.empty() ? nullptr : const_cast<char*>(extra_env.c_str()),
                      nullptr};
      execle(DUET_BRIDGE_BIN, DUET_BRIDGE_BIN, "--config", cfg.c_str(), (char*)nullptr, envp);
      _exit(127);
    }

  }

  // "SERVING", "NOT_SERVING", or the RPC error code as text.
  static std::string Health(Replica& r, const std::string& service) {
    auto stub = grpc::health::v1::Health::NewStub(r.Channel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = stub->Check(&ctx, req, &resp);
    if (!s.ok()) return "error " + std::to_string(s.error_code());
    return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
  }
  static grpc::StatusCode ListNodes(Replica& r, int* nodes = nullptr) {
    auto stub = v1::Ledger::NewStub(r.Channel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    v1::ListNodesResponse resp;
    grpc::Status s = stub->ListNodes(&ctx, v1::ListNodesRequest(), &resp);
    if (nodes != nullptr) *nodes = resp.nodes_size();
    return s.error_code();
  }
  // The value of `duet_leader` on the replica's /metrics, or -1.
  int LeaderMetric(Replica& r) {
    k8s::KubeConfig c;
    c.server = "http://127.0.0.1:" + std::to_string(r.metrics_port);
    auto client = k8s::NewCurlKubeClient(c);
    if (!client.ok()) return -1;
    auto body = (*client)->Get("/metrics");
    if (!body.ok()) return -1;
    const size_t at = body->find("\nduet_leader ");
    if (at == std::string::npos) return -1;
    return std::atoi(body->c_str() + at + 13);
  }
  std::string Holder() {
    auto got = client_->Get("/apis/coordination.k8s.io/v1/namespaces/duet-system/leases/duet-bridge");
    if (!got.ok()) return "";
    return nlohmann::json::parse(*got)["spec"].value("holderIdentity", "");
  }
  // Exit status, or -1 if it has not exited within `timeout`.
  static int WaitExit(Replica& r, absl::Duration timeout) {
    int status = 0;
    const bool exited = WaitFor([&] { return waitpid(r.pid, &status, WNOHANG) == r.pid; }, timeout);
    if (!exited) return -1;
    r.pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // Hold of one GPU on gke-h100-a for the pod with this UID.
  static grpc::Status HoldPodGpu(Replica& r, const std::string& uid) {
    auto stub = v1::Ledger::NewStub(r.Channel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::HoldRequest req;
    req.set_node("gke-h100-a");
    req.mutable_owner()->mutable_pod()->set_uid(uid);
    req.mutable_owner()->mutable_pod()->set_namespace_("ml");
    req.mutable_owner()->mutable_pod()->set_name(uid);
    req.mutable_count()->set_kind(v1::DEVICE_KIND_GPU);
    req.mutable_count()->set_count(1);
    v1::HoldResponse resp;
    return stub->Hold(&ctx, req, &resp);
  }
  // The UIDs of the pods holding devices on the replica.
  static std::vector<std::string> PodHolders(Replica& r) {
    auto stub = v1::Ledger::NewStub(r.Channel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::ListHoldingsResponse resp;
    std::vector<std::string> uids;
    if (!stub->ListHoldings(&ctx, v1::ListHoldingsRequest(), &resp).ok()) return {"error"};
    for (const v1::Holding& h : resp.holdings()) {
      if (h.owner().has_pod()) uids.push_back(h.owner().pod().uid());
    }
    return uids;
  }

  FakeApiServer fake_;
  bool leader_election_ = true;  // false: one bridge, kubernetes.leader_election off
  std::string dir_;
  std::unique_ptr<k8s::KubeClient> client_;
  Replica a_, b_;
};

TEST_F(LeaderBridgeTest, StandbyTakesOverWhenTheLeaderDies) {
  Start(&a_, "bridge-a", /*identity_in_config=*/true);
  ASSERT_TRUE(WaitFor([&] { return Health(a_, "") == "SERVING"; }, absl::Seconds(20)));
  EXPECT_EQ(Health(a_, "duet"), "SERVING");
  EXPECT_EQ(Holder(), "bridge-a");
  int nodes = 0;
  EXPECT_EQ(ListNodes(a_, &nodes), grpc::StatusCode::OK);
  EXPECT_GT(nodes, 0);
  EXPECT_EQ(LeaderMetric(a_), 1);

  Start(&b_, "bridge-b", /*identity_in_config=*/false);  // identity from $POD_NAME
  ASSERT_TRUE(WaitFor([&] { return Health(b_, "") == "NOT_SERVING"; }, absl::Seconds(20)));
  // Several lease durations: a keeps renewing; b stays a standby.
  absl::SleepFor(kLease + absl::Seconds(1));
  EXPECT_EQ(Health(b_, ""), "NOT_SERVING");
  EXPECT_EQ(Health(b_, "duet"), "NOT_SERVING");
  EXPECT_EQ(ListNodes(b_), grpc::StatusCode::UNAVAILABLE);  // reads and grants nothing
  EXPECT_EQ(LeaderMetric(b_), 0);
  EXPECT_EQ(Health(a_, ""), "SERVING");
  EXPECT_EQ(Holder(), "bridge-a");

  // The leader crashes without giving the lease up.
  kill(a_.pid, SIGKILL);
  waitpid(a_.pid, nullptr, 0);
  a_.pid = -1;
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(WaitFor([&] { return Health(b_, "") == "SERVING"; }, absl::Seconds(15)));
  const absl::Duration took = absl::Now() - t0;
  std::fprintf(stderr, "takeover: standby serving %s after the leader's kill -9\n",
               absl::FormatDuration(took).c_str());
  // Not before the lease has expired; soon after (+ a retry + start-up).
  EXPECT_GE(took, kLease - kRetry) << took;
  EXPECT_LE(took, kLease + kRetry + absl::Seconds(3)) << took;
  EXPECT_EQ(Holder(), "bridge-b");
  EXPECT_EQ(ListNodes(b_, &nodes), grpc::StatusCode::OK);
  EXPECT_GT(nodes, 0);
  EXPECT_EQ(LeaderMetric(b_), 1);

  // SIGTERM: a clean exit that gives the lease up, but only after one
  // slurm.credential_max_age and a second (here 1s, the floor, + 1s): a Slurm
  // credential b accepted must be expired before a next leader serves.
  const absl::Time t1 = absl::Now();
  kill(b_.pid, SIGTERM);
  // Once it refuses changes, it still holds the lease...
  ASSERT_TRUE(WaitFor([&] { return !HoldPodGpu(b_, "uid-after-sigterm").ok(); },
                      absl::Seconds(10)));
  EXPECT_EQ(Holder(), "bridge-b") << "the lease was given up before the credentials expired";
  // ...and gives it up no sooner than the wait.
  ASSERT_TRUE(WaitFor([&] { return Holder().empty(); }, absl::Seconds(10)));
  EXPECT_GE(absl::Now() - t1, absl::Seconds(2));
  EXPECT_EQ(WaitExit(b_, absl::Seconds(10)), 0);
}

TEST_F(LeaderBridgeTest, LeaderThatCannotRenewExitsForARestart) {
  Start(&a_, "bridge-a", true);
  ASSERT_TRUE(WaitFor([&] { return Health(a_, "") == "SERVING"; }, absl::Seconds(20)));
  fake_.Control("fail", {{"count", 1000000}, {"code", 503}});
  const absl::Time t0 = absl::Now();
  EXPECT_EQ(WaitExit(a_, absl::Seconds(10)), 3);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(8));  // renew_deadline 1.5s + shutdown
}

TEST_F(LeaderBridgeTest, LeaderWhoseJournalFailedExitsAndTheStandbyTakesOver) {
  // The journal's writes fail (a full disk) through the test-only fault
  // layer (bridge/journal/fault_file_layer.h) while its control file says so.
  const std::string control = dir_ + "/journal-fault";
  Start(&a_, "bridge-a", true, "DUET_TEST_JOURNAL_FAULT_FILE=" + control);
  ASSERT_TRUE(WaitFor([&] { return Health(a_, "") == "SERVING"; }, absl::Seconds(20)));
  Start(&b_, "bridge-b", true);
  ASSERT_TRUE(WaitFor([&] { return Health(b_, "") == "NOT_SERVING"; }, absl::Seconds(20)));
  int nodes = 0;
  ASSERT_EQ(ListNodes(a_, &nodes), grpc::StatusCode::OK);

  std::ofstream(control) << "ENOSPC\n";
  EXPECT_FALSE(HoldPodGpu(a_, "uid-full-disk").ok()) << "a grant the journal could not write";
  // The leader gives up (status 3, for a restart) and the standby leads.
  EXPECT_EQ(WaitExit(a_, absl::Seconds(10)), 3);
  ASSERT_TRUE(WaitFor([&] { return Health(b_, "") == "SERVING"; }, absl::Seconds(15)));
  EXPECT_EQ(Holder(), "bridge-b");
  EXPECT_EQ(ListNodes(b_, &nodes), grpc::StatusCode::OK);
}

// Without leader election a failed journal ends the process too (status 3),
// instead of a bridge that stays up refusing every change; its restart
// reopens the journal, recovers what was acknowledged, and grants again.
TEST_F(LeaderBridgeTest, SingleBridgeWhoseJournalFailedExitsAndItsRestartRecovers) {
  leader_election_ = false;
  const std::string control = dir_ + "/journal-fault";
  Start(&a_, "bridge-single", true, "DUET_TEST_JOURNAL_FAULT_FILE=" + control);
  ASSERT_TRUE(WaitFor([&] { return Health(a_, "") == "SERVING"; }, absl::Seconds(20)));
  ASSERT_TRUE(HoldPodGpu(a_, "uid-before").ok());

  std::ofstream(control) << "ENOSPC\n";  // (EIO fails fsyncs; this journal does not fsync)
  EXPECT_FALSE(HoldPodGpu(a_, "uid-during").ok()) << "a grant the journal could not write";
  EXPECT_EQ(WaitExit(a_, absl::Seconds(10)), 3);

  // The disk works again; kubelet's restart (here: ours) recovers.
  fs::remove(control);
  Start(&a_, "bridge-single", true);
  ASSERT_TRUE(WaitFor([&] { return Health(a_, "") == "SERVING"; }, absl::Seconds(20)));
  EXPECT_EQ(PodHolders(a_), std::vector<std::string>{"uid-before"});
  EXPECT_TRUE(HoldPodGpu(a_, "uid-after").ok());
}

}  // namespace
}  // namespace duet
