// duet-bridge end to end in one process: the real Bridge (journal, inventory
// file, gRPC on a free port, metrics) driven through the generated gRPC stub.

#include "bridge/server/bridge.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/fakes/wait.h"

namespace duet {
namespace {

using ::testing::HasSubstr;

constexpr char kInventory[] = R"(nodes:
  - name: gke-a
    cpus: 32
    memory_mib: 65536
    pool: shared
    gpus: {count: 8, model: h100}
  - name: gke-t
    cpus: 16
    memory_mib: 32768
    tpus: {count: 4, model: v5e, host_bounds: 2x2}
)";

// A bridge on a free loopback port, journal and inventory file in `dir`, no
// metrics listener. Slurm owners' calls carry no credential here (these tests
// drive the ledger through gRPC; bridge_access_test checks the credential).
Config LocalConfig(const std::filesystem::path& dir) {
  Config c;
  c.grpc.listen = "127.0.0.1:0";
  c.metrics.listen = "";
  c.journal.dir = (dir / "journal").string();
  c.inventory.source = "file";
  c.inventory.file = (dir / "nodes.yaml").string();
  c.slurm.credential = "none";
  return c;
}

class BridgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("duet-bridge-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "nodes.yaml") << kInventory;
    config_ = LocalConfig(dir_);
    config_.grpc.max_message_bytes = 64 * 1024;
    Start();
  }
  void TearDown() override {
    bridge_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Start() {
    ASSERT_TRUE(ValidateConfig(config_).ok());
    auto b = Bridge::Start(config_);
    ASSERT_TRUE(b.ok()) << b.status();
    bridge_ = std::move(*b);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(bridge_->grpc_port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Ledger::NewStub(channel_);
  }

  grpc::Status Hold(const v1::HoldRequest& req, v1::HoldResponse* resp = nullptr) {
    grpc::ClientContext ctx;
    v1::HoldResponse local;
    return stub_->Hold(&ctx, req, resp ? resp : &local);
  }

  static v1::HoldRequest StepCount(const std::string& node, uint32_t job, uint32_t n) {
    v1::HoldRequest r;
    r.set_node(node);
    r.mutable_owner()->mutable_slurm_step()->set_job_id(job);
    r.mutable_count()->set_kind(v1::DEVICE_KIND_GPU);
    r.mutable_count()->set_count(n);
    return r;
  }

  static v1::HoldRequest PodDevices(const std::string& node, const std::string& uid,
                                    std::vector<uint32_t> idx) {
    v1::HoldRequest r;
    r.set_node(node);
    r.mutable_owner()->mutable_pod()->set_uid(uid);
    r.mutable_owner()->mutable_pod()->set_namespace_("ml");
    r.mutable_owner()->mutable_pod()->set_name("infer-" + uid);
    for (uint32_t i : idx) {
      auto* d = r.mutable_devices()->add_devices();
      d->set_kind(v1::DEVICE_KIND_GPU);
      d->set_index(i);
    }
    return r;
  }

  std::filesystem::path dir_;
  Config config_;
  std::unique_ptr<Bridge> bridge_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Ledger::Stub> stub_;
};

TEST_F(BridgeTest, ListsTheInventory) {
  grpc::ClientContext ctx;
  v1::ListNodesResponse resp;
  ASSERT_TRUE(stub_->ListNodes(&ctx, v1::ListNodesRequest(), &resp).ok());
  ASSERT_EQ(resp.nodes_size(), 2);
  EXPECT_EQ(resp.nodes(0).name(), "gke-a");
  EXPECT_EQ(resp.nodes(0).devices_size(), 8);
  EXPECT_EQ(resp.nodes(1).devices(0).kind(), v1::DEVICE_KIND_TPU);
  EXPECT_EQ(resp.nodes(1).devices(0).topology().tpu_host_bounds(), "2x2");
}

TEST_F(BridgeTest, HoldConflictNamesTheHolderAndReleaseIsIdempotent) {
  v1::HoldResponse pod;
  ASSERT_TRUE(Hold(PodDevices("gke-a", "u1", {2, 3}), &pod).ok());
  EXPECT_TRUE(pod.created());
  EXPECT_EQ(pod.holding().devices(0).id(), "gke-a/gpu2");

  v1::HoldRequest step = StepCount("gke-a", 11, 1);
  step.clear_count();
  auto* d = step.mutable_devices()->add_devices();
  d->set_kind(v1::DEVICE_KIND_GPU);
  d->set_index(3);
  grpc::Status s = Hold(step);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("node gke-a gpu 3 is held by pod ml/infer-u1 (uid u1)"));

  // A retry of the pod's hold succeeds without a second grant.
  v1::HoldResponse again;
  ASSERT_TRUE(Hold(PodDevices("gke-a", "u1", {2, 3}), &again).ok());
  EXPECT_FALSE(again.created());

  v1::ReleaseRequest rel;
  rel.set_node("gke-a");
  *rel.mutable_owner() = PodDevices("gke-a", "u1", {}).owner();
  for (bool expect : {true, false}) {
    grpc::ClientContext ctx;
    v1::ReleaseResponse resp;
    ASSERT_TRUE(stub_->Release(&ctx, rel, &resp).ok());
    EXPECT_EQ(resp.released(), expect);
  }
  EXPECT_TRUE(Hold(step).ok());
}

TEST_F(BridgeTest, BadInputGetsTheRightCodeAndChangesNothing) {
  const uint64_t seq = bridge_->ledger()->seq();
  struct Case {
    v1::HoldRequest req;
    grpc::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({StepCount("nope", 1, 1), grpc::StatusCode::NOT_FOUND, "unknown node nope"});
  cases.push_back({StepCount("gke-a", 1, 0), grpc::StatusCode::INVALID_ARGUMENT, "count"});
  cases.push_back({StepCount("gke-a", 1, 9), grpc::StatusCode::INVALID_ARGUMENT, "more than node"});
  cases.push_back({StepCount("gke-a", 0, 1), grpc::StatusCode::INVALID_ARGUMENT, "job_id"});
  cases.push_back({StepCount("", 1, 1), grpc::StatusCode::INVALID_ARGUMENT, "node"});
  cases.push_back({PodDevices("gke-a", "", {1}), grpc::StatusCode::INVALID_ARGUMENT, "uid"});
  cases.push_back({PodDevices("gke-a", std::string(300, 'u'), {1}),
                   grpc::StatusCode::INVALID_ARGUMENT, "uid"});
  cases.push_back({PodDevices("gke-a", "u", {8}), grpc::StatusCode::NOT_FOUND, "gpu 8"});
  cases.push_back({PodDevices("gke-a", "u", {1, 1}), grpc::StatusCode::INVALID_ARGUMENT, "twice"});
  v1::HoldRequest no_owner = StepCount("gke-a", 1, 1);
  no_owner.clear_owner();
  cases.push_back({no_owner, grpc::StatusCode::INVALID_ARGUMENT, "owner"});
  v1::HoldRequest no_kind = StepCount("gke-a", 1, 1);
  no_kind.mutable_count()->set_kind(v1::DEVICE_KIND_UNSPECIFIED);
  cases.push_back({no_kind, grpc::StatusCode::INVALID_ARGUMENT, "count.kind"});
  v1::HoldRequest huge = StepCount("gke-a", 1, 1);
  huge.set_node(std::string(100 * 1024, 'n'));  // over grpc.max_message_bytes
  cases.push_back({huge, grpc::StatusCode::RESOURCE_EXHAUSTED, ""});
  for (const Case& c : cases) {
    grpc::Status s = Hold(c.req);
    EXPECT_EQ(s.error_code(), c.code) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message));
  }
  EXPECT_EQ(bridge_->ledger()->seq(), seq);
  EXPECT_EQ(bridge_->ledger()->holding_count(), 0u);
  // Duplicate owner: same owner, other devices.
  ASSERT_TRUE(Hold(PodDevices("gke-a", "u", {1})).ok());
  grpc::Status dup = Hold(PodDevices("gke-a", "u", {2}));
  EXPECT_EQ(dup.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(dup.error_message(), HasSubstr("already holds gpu1"));
  const std::string metrics = bridge_->metrics()->Render();
  EXPECT_THAT(metrics, HasSubstr("duet_holdings_refused_total{reason=\"invalid_argument\"} 9"));
  EXPECT_THAT(metrics, HasSubstr("duet_holdings_refused_total{reason=\"already_exists\"} 1"));
}

TEST_F(BridgeTest, GetNodeAndListHoldingsOfUnknownNodeAreNotFound) {
  grpc::ClientContext c1;
  v1::Node node;
  v1::GetNodeRequest g;
  g.set_name("zzz");
  EXPECT_EQ(stub_->GetNode(&c1, g, &node).error_code(), grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext c2;
  v1::ListHoldingsRequest l;
  l.set_node("zzz");
  v1::ListHoldingsResponse lr;
  EXPECT_EQ(stub_->ListHoldings(&c2, l, &lr).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(BridgeTest, HoldingsSurviveARestart) {
  ASSERT_TRUE(Hold(PodDevices("gke-a", "u1", {0, 1})).ok());
  ASSERT_TRUE(Hold(StepCount("gke-a", 12, 3)).ok());
  bridge_.reset();
  Start();
  grpc::ClientContext ctx;
  v1::ListHoldingsResponse resp;
  ASSERT_TRUE(stub_->ListHoldings(&ctx, v1::ListHoldingsRequest(), &resp).ok());
  ASSERT_EQ(resp.holdings_size(), 2);
  EXPECT_TRUE(bridge_->ledger()->CheckInvariants().ok());
  EXPECT_EQ(bridge_->ledger()->GetNode("gke-a")->devices[4].used_milli, 1000u);
}

TEST_F(BridgeTest, WatchSendsInitialStateThenUpdates) {
  grpc::ClientContext ctx;
  v1::WatchNodesRequest req;
  req.add_names("gke-a");
  auto reader = stub_->WatchNodes(&ctx, req);
  v1::NodeEvent ev;
  ASSERT_TRUE(reader->Read(&ev));
  EXPECT_EQ(ev.type(), v1::NodeEvent::TYPE_INITIAL);
  EXPECT_EQ(ev.node().name(), "gke-a");
  const uint64_t gen = ev.node().generation();
  ASSERT_TRUE(Hold(PodDevices("gke-a", "w", {5})).ok());
  v1::HoldRequest tpu = StepCount("gke-t", 1, 1);
  tpu.mutable_count()->set_kind(v1::DEVICE_KIND_TPU);
  ASSERT_TRUE(Hold(tpu).ok());  // another node: not sent to this stream
  ASSERT_TRUE(reader->Read(&ev));
  EXPECT_EQ(ev.type(), v1::NodeEvent::TYPE_UPDATED);
  EXPECT_EQ(ev.node().name(), "gke-a");
  EXPECT_GT(ev.node().generation(), gen);
  EXPECT_EQ(ev.node().devices(5).holders(0).owner().pod().uid(), "w");
  ctx.TryCancel();
}

TEST_F(BridgeTest, WatchOfUnknownNodeIsNotFound) {
  grpc::ClientContext ctx;
  v1::WatchNodesRequest req;
  req.add_names("zzz");
  auto reader = stub_->WatchNodes(&ctx, req);
  v1::NodeEvent ev;
  EXPECT_FALSE(reader->Read(&ev));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(BridgeTest, AnAddressInUseIsNamedAtStartUp) {
  Config other = config_;
  other.grpc.listen = "127.0.0.1:" + std::to_string(bridge_->grpc_port());
  other.journal.dir = (dir_ / "journal2").string();
  auto second = Bridge::Start(other);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("grpc.listen " + other.grpc.listen));
}

TEST_F(BridgeTest, ALiveUnixSocketIsNotStolen) {
  bridge_.reset();
  config_.grpc.unix_socket = (dir_ / "bridge.sock").string();
  Start();
  Config other = config_;
  other.grpc.listen = "";
  other.journal.dir = (dir_ / "journal2").string();
  auto second = Bridge::Start(other);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("another process is serving on it"));
  // A stale socket file (bound, then its process gone) is replaced.
  bridge_.reset();
  std::filesystem::remove(config_.grpc.unix_socket);
  {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, config_.grpc.unix_socket.c_str());
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ::close(fd);
  }
  ASSERT_TRUE(std::filesystem::is_socket(config_.grpc.unix_socket));
  auto third = Bridge::Start(other);
  EXPECT_TRUE(third.ok()) << third.status();
}

TEST_F(BridgeTest, HealthIsServing) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

// Regression (found by bench/soak): a journal that failed (every change
// refused from then on) left the bridge reporting SERVING, so nothing took it
// out of service. The journal fails here through the test-only seam.
TEST_F(BridgeTest, AFailedJournalTurnsHealthNotServing) {
  bridge_.reset();
  const std::string control = (dir_ / "journal-fault").string();
  setenv("DUET_TEST_JOURNAL_FAULT_FILE", control.c_str(), 1);
  Start();
  unsetenv("DUET_TEST_JOURNAL_FAULT_FILE");
  auto health = grpc::health::v1::Health::NewStub(channel_);
  auto status = [&] {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
    return s.ok() ? resp.status() : grpc::health::v1::HealthCheckResponse::UNKNOWN;
  };
  ASSERT_TRUE(Hold(StepCount("gke-a", 5, 2)).ok());
  EXPECT_EQ(status(), grpc::health::v1::HealthCheckResponse::SERVING);

  std::ofstream(control) << "EIO\n";
  grpc::Status refused = Hold(StepCount("gke-a", 6, 1));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  std::filesystem::remove(control);
  EXPECT_TRUE(fakes::WaitFor(
      [&] { return status() == grpc::health::v1::HealthCheckResponse::NOT_SERVING; },
      absl::Seconds(5)));
  // Failed for good: the disk working again changes nothing.
  EXPECT_EQ(Hold(StepCount("gke-a", 7, 1)).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(BridgeTest, InventoryFileChangesReachTheLedger) {
  bridge_.reset();
  config_.inventory.reload_period = absl::Milliseconds(100);
  Start();
  ASSERT_TRUE(Hold(StepCount("gke-a", 5, 2)).ok());
  // gke-a leaves the file while held: it turns GONE; gke-t leaves and goes.
  const auto written = std::filesystem::last_write_time(dir_ / "nodes.yaml");
  std::ofstream(dir_ / "nodes.yaml") << "nodes:\n  - name: gke-new\n    gpus: {count: 2}\n";
  // The reload looks at the mtime: make it differ whatever the file
  // system's timestamp granularity.
  std::filesystem::last_write_time(dir_ / "nodes.yaml", written + std::chrono::seconds(1));
  // A reload adds and updates the file's nodes first, then removes the rest:
  // wait for the whole of it (under load the check could fall in between).
  auto replaced = [&] {
    auto a = bridge_->ledger()->GetNode("gke-a");
    return bridge_->ledger()->GetNode("gke-new") != nullptr &&
           bridge_->ledger()->GetNode("gke-t") == nullptr && a != nullptr &&
           a->spec.state == NodeState::kGone;
  };
  EXPECT_TRUE(fakes::WaitFor(replaced, fakes::kWaitTimeout, "the reloaded inventory"));
  ASSERT_NE(bridge_->ledger()->GetNode("gke-new"), nullptr);
  EXPECT_EQ(bridge_->ledger()->GetNode("gke-t"), nullptr);
  ASSERT_NE(bridge_->ledger()->GetNode("gke-a"), nullptr);
  EXPECT_EQ(bridge_->ledger()->GetNode("gke-a")->spec.state, NodeState::kGone);
}

TEST_F(BridgeTest, MetricsPassPromtool) {
  ASSERT_TRUE(Hold(PodDevices("gke-a", "u1", {0})).ok());
  EXPECT_EQ(Hold(StepCount("nope", 1, 1)).error_code(), grpc::StatusCode::NOT_FOUND);
  const std::string text = bridge_->metrics()->Render();
  EXPECT_THAT(text, HasSubstr(
      "duet_devices{node=\"gke-a\",kind=\"gpu\",model=\"h100\",holder=\"pod\"} 1"));
  EXPECT_THAT(text, HasSubstr("duet_holdings_granted_total{owner_kind=\"pod\"} 1"));
  EXPECT_THAT(text, HasSubstr("duet_rpc_duration_seconds_count{method=\"Hold\"} 2"));
  EXPECT_THAT(text, HasSubstr("duet_journal_fsync_duration_seconds_count"));
  const std::string path = (dir_ / "metrics.txt").string();
  std::ofstream(path) << text;
  const std::string promtool = std::getenv("PROMTOOL") ? std::getenv("PROMTOOL") : "promtool";
  const int rc = std::system((promtool + " check metrics < " + path + " > " + path + ".out 2>&1").c_str());
  std::ifstream out(path + ".out");
  std::string report((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << "promtool check metrics failed (is Debian's prometheus package installed?):\n"
                   << report;
}

}  // namespace
}  // namespace duet

namespace duet {
namespace {

std::string Slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// An empty directory of this process under the system's temp dir.
std::filesystem::path FreshDir(const std::string& prefix) {
  const auto dir = std::filesystem::temp_directory_path() / (prefix + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// TLS with client certificates: a client with a certificate from the
// configured CA gets in; one without a certificate does not.
TEST(BridgeTlsTest, ClientCertificatesAreVerified) {
  const auto dir = FreshDir("duet-tls-test-");
  const std::string d = dir.string();
  const std::string script =
      "set -e; cd " + d + "; exec >openssl.log 2>&1;"
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 -subj /CN=duet-test-ca;"
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext;"
      "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost;"
      "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 1 -extfile san.ext;"
      "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=slurmstepd;"
      "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 1";
  ASSERT_EQ(std::system(("bash -c \"" + script + "\"").c_str()), 0) << Slurp(dir / "openssl.log");
  std::ofstream(dir / "nodes.yaml") << "nodes: [{name: a, gpus: {count: 2}}]\n";

  Config config = LocalConfig(dir);
  config.grpc.tls.cert_file = d + "/server.crt";
  config.grpc.tls.key_file = d + "/server.key";
  config.grpc.tls.client_ca_file = d + "/ca.crt";
  ASSERT_TRUE(ValidateConfig(config).ok());
  auto bridge = Bridge::Start(config);
  ASSERT_TRUE(bridge.ok()) << bridge.status();
  const std::string target = "127.0.0.1:" + std::to_string((*bridge)->grpc_port());

  auto list = [&](const grpc::SslCredentialsOptions& opts) {
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    auto stub = v1::Ledger::NewStub(
        grpc::CreateCustomChannel(target, grpc::SslCredentials(opts), args));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListNodesResponse resp;
    return stub->ListNodes(&ctx, v1::ListNodesRequest(), &resp);
  };
  grpc::SslCredentialsOptions with_cert;
  with_cert.pem_root_certs = Slurp(dir / "ca.crt");
  with_cert.pem_private_key = Slurp(dir / "client.key");
  with_cert.pem_cert_chain = Slurp(dir / "client.crt");
  EXPECT_TRUE(list(with_cert).ok());
  grpc::SslCredentialsOptions without_cert;
  without_cert.pem_root_certs = with_cert.pem_root_certs;
  EXPECT_FALSE(list(without_cert).ok());
  // Plaintext to a TLS port fails too.
  auto plain = v1::Ledger::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListNodesResponse resp;
  EXPECT_FALSE(plain->ListNodes(&ctx, v1::ListNodesRequest(), &resp).ok());
  bridge->reset();
  std::filesystem::remove_all(dir);
}

// slurm.credential: slurm_key reads the cluster's slurm.key before anything
// else starts (libslurm included): a missing or world-readable key stops the
// bridge with the file named, and the journal directory is never created.
TEST(BridgeSlurmKeyTest, AMissingOrInsecureKeyStopsTheBridgeFirst) {
  const auto dir = FreshDir("duet-slurmkey-test-");
  const std::string d = dir.string();
  Config config = LocalConfig(dir);
  config.slurm.enabled = true;
  config.slurm.conf_path = d + "/slurm.conf";  // never read: the key fails first
  config.slurm.credential = "slurm_key";
  config.slurm.key_file = d + "/slurm.key";
  ASSERT_TRUE(ValidateConfig(config).ok());

  auto bridge = Bridge::Start(config);
  ASSERT_FALSE(bridge.ok());
  EXPECT_TRUE(absl::IsNotFound(bridge.status())) << bridge.status();
  EXPECT_THAT(std::string(bridge.status().message()),
              HasSubstr("slurm.credential: slurm_key: slurm.key " + d + "/slurm.key"));

  std::ofstream(d + "/slurm.key") << std::string(64, 'k');
  std::filesystem::permissions(d + "/slurm.key", std::filesystem::perms::owner_read |
                                                     std::filesystem::perms::others_read);
  bridge = Bridge::Start(config);
  ASSERT_FALSE(bridge.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(bridge.status())) << bridge.status();
  EXPECT_THAT(std::string(bridge.status().message()), HasSubstr("insecure mode 0404"));
  EXPECT_FALSE(std::filesystem::exists(d + "/journal"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace duet
