// Who may change the ledger, against the real Bridge over gRPC, on its TCP
// port and on its unix socket:
// - Slurm owners' Hold/Release need slurm.credential whether or not
//   slurm.enabled (the SPANK plugin calls the bridge either way);
// - a mutation that needs no credential on a listener beyond loopback is
//   refused at start unless grpc.allow_insecure, and every open one is said
//   at start and in duet_open_access;
// - the unix socket gets grpc.unix_socket_mode, and a directory anyone may
//   write to is refused.

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "bridge/server/bridge.h"
#include "common/credential/munge_payload.h"
#include "common/credential/request_digest.h"
#include "common/credential/slurm_key_cred.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
#include "tests/slurm/credential_bindings.h"

namespace duet {
namespace {

using ::testing::HasSubstr;

constexpr char kInventory[] = R"(nodes:
  - name: gke-a
    cpus: 32
    memory_mib: 65536
    gpus: {count: 8, model: h100}
)";
constexpr char kSlurmKey[] = "0123456789abcdef0123456789abcdef";

class BridgeAccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("duet-access-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "nodes.yaml") << kInventory;
    // slurm.enabled stays false throughout: the bridge does not talk to
    // slurmctld, as in the chart's default.
    config_.grpc.listen = "127.0.0.1:0";
    config_.grpc.unix_socket = (dir_ / "run" / "bridge.sock").string();
    config_.metrics.listen = "";
    config_.journal.dir = (dir_ / "journal").string();
    config_.journal.fsync = false;
    config_.inventory.source = "file";
    config_.inventory.file = (dir_ / "nodes.yaml").string();
    // A munged that is not there: nothing here may depend on the machine's.
    config_.slurm.munge_socket = (dir_ / "no-munged.socket").string();
  }
  void TearDown() override {
    bridge_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Start() {
    absl::Status valid = ValidateConfig(config_);
    ASSERT_TRUE(valid.ok()) << valid;
    auto b = Bridge::Start(config_);
    ASSERT_TRUE(b.ok()) << b.status();
    bridge_ = std::move(*b);
    tcp_ = v1::Ledger::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(bridge_->grpc_port()),
                            grpc::InsecureChannelCredentials()));
    unix_ = v1::Ledger::NewStub(grpc::CreateChannel("unix:" + config_.grpc.unix_socket,
                                                    grpc::InsecureChannelCredentials()));
  }

  // Both listeners, named for failure messages.
  std::vector<std::pair<std::string, v1::Ledger::Stub*>> Listeners() {
    return {{"tcp", tcp_.get()}, {"unix", unix_.get()}};
  }

  static grpc::Status Hold(v1::Ledger::Stub* stub, const v1::HoldRequest& req,
                           const std::string& slurm_key_cred = "") {
    grpc::ClientContext ctx;
    if (!slurm_key_cred.empty()) ctx.AddMetadata(slurm_key::kMetadataKey, slurm_key_cred);
    v1::HoldResponse resp;
    return stub->Hold(&ctx, req, &resp);
  }
  static grpc::Status Release(v1::Ledger::Stub* stub, const v1::ReleaseRequest& req,
                              const std::string& slurm_key_cred = "") {
    grpc::ClientContext ctx;
    if (!slurm_key_cred.empty()) ctx.AddMetadata(slurm_key::kMetadataKey, slurm_key_cred);
    v1::ReleaseResponse resp;
    return stub->Release(&ctx, req, &resp);
  }

  // A made-up job holding every free GPU: what an unchecked caller did.
  static v1::HoldRequest FakeJobTakesAll(uint32_t job) {
    v1::HoldRequest r;
    r.set_node("gke-a");
    r.mutable_owner()->mutable_slurm_job()->set_job_id(job);
    r.mutable_count()->set_kind(v1::DEVICE_KIND_GPU);
    r.mutable_count()->set_count(6);
    return r;
  }
  static v1::HoldRequest StepHolds(uint32_t job, uint32_t step, std::vector<uint32_t> gpus) {
    return testing::SlurmHoldRequest("gke-a", job, step, gpus);
  }
  static v1::ReleaseRequest StepRelease(uint32_t job, uint32_t step) {
    return testing::SlurmReleaseRequest("gke-a", job, step);
  }

  // A running step's GPUs 0 and 1, held as the SPANK plugin had them held.
  void RunningStepHolds() {
    HoldRequest step;
    step.node = "gke-a";
    step.owner = Owner::SlurmStep(7, 0);
    step.devices = {{DeviceKind::kGpu, 0, kWholeDevice}, {DeviceKind::kGpu, 1, kWholeDevice}};
    ASSERT_TRUE(bridge_->ledger()->Hold(step).ok());
  }
  // What the ledger holds on gke-a, as "owner: gpus".
  std::vector<std::string> Holdings() {
    std::vector<std::string> out;
    for (const Holding& h : bridge_->ledger()->ListHoldings("gke-a")) {
      std::string line = h.owner.ToString() + ":";
      for (const HeldDevice& d : h.devices) line += " " + std::to_string(d.index);
      out.push_back(line);
    }
    return out;
  }

  std::filesystem::path dir_;
  Config config_;
  std::unique_ptr<Bridge> bridge_;
  std::unique_ptr<v1::Ledger::Stub> tcp_;
  std::unique_ptr<v1::Ledger::Stub> unix_;
};

// Hole A with the default credential (munge): no credential, no change, on
// either listener, although the bridge does not sync with Slurm.
TEST_F(BridgeAccessTest, SlurmOwnersNeedTheDefaultCredentialWithSlurmOff) {
  ASSERT_FALSE(config_.slurm.enabled);
  ASSERT_EQ(config_.slurm.EffectiveCredential(), "munge");
  Start();
  if (HasFatalFailure()) return;
  RunningStepHolds();
  const std::vector<std::string> before = Holdings();
  ASSERT_EQ(before.size(), 1u);
  for (const auto& [name, stub] : Listeners()) {
    grpc::Status released = Release(stub, StepRelease(7, 0));
    EXPECT_EQ(released.error_code(), grpc::StatusCode::UNAUTHENTICATED) << name;
    EXPECT_THAT(released.error_message(), HasSubstr("has no munge credential")) << name;
    grpc::Status held = Hold(stub, FakeJobTakesAll(424242));
    EXPECT_EQ(held.error_code(), grpc::StatusCode::UNAUTHENTICATED) << name;
    EXPECT_THAT(held.error_message(), HasSubstr("has no munge credential")) << name;
  }
  // A credential munged cannot check is no credential either.
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-duet-munge", "MUNGE:forged:");
    v1::HoldResponse resp;
    EXPECT_EQ(tcp_->Hold(&ctx, FakeJobTakesAll(424243), &resp).error_code(),
              grpc::StatusCode::UNAVAILABLE);
  }
  EXPECT_EQ(Holdings(), before);
  const std::string metrics = bridge_->metrics()->Render();
  EXPECT_THAT(metrics,
              HasSubstr("duet_slurm_credential_refusals_total{credential=\"munge\",why=\"missing\"} 4"));
  // Pods (auth.mode none here) still get the free GPUs: nothing fake holds them.
  v1::HoldRequest pod;
  pod.set_node("gke-a");
  pod.mutable_owner()->mutable_pod()->set_uid("u1");
  pod.mutable_owner()->mutable_pod()->set_namespace_("ml");
  pod.mutable_owner()->mutable_pod()->set_name("infer-0");
  pod.mutable_count()->set_kind(v1::DEVICE_KIND_GPU);
  pod.mutable_count()->set_count(6);
  EXPECT_TRUE(Hold(tcp_.get(), pod).ok());
}

// Hole A with slurm.credential slurm_key: the key is loaded and checked with
// Slurm off; a valid credential works on both listeners, none does not.
TEST_F(BridgeAccessTest, SlurmKeyCredentialIsCheckedWithSlurmOff) {
  const std::string key_file = (dir_ / "slurm.key").string();
  std::ofstream(key_file) << kSlurmKey;
  std::filesystem::permissions(key_file, std::filesystem::perms::owner_read |
                                             std::filesystem::perms::owner_write);
  config_.slurm.credential = "slurm_key";
  config_.slurm.key_file = key_file;
  Start();
  if (HasFatalFailure()) return;
  const std::string derived = slurm_key::DeriveKey(kSlurmKey);
  // What the plugin attaches to `request` (request_digest.h).
  auto cred = [&](const auto& request) {
    auto made = slurm_key::Make(derived, slurm_munge::Payload(*slurm_munge::BindingOf(request)),
                                absl::ToUnixSeconds(absl::Now()));
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? *made : "";
  };
  for (const auto& [name, stub] : Listeners()) {
    EXPECT_EQ(Hold(stub, StepHolds(7, 0, {0, 1})).error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << name;
    // Another step's credential does not serve this one.
    EXPECT_EQ(Hold(stub, StepHolds(7, 0, {0, 1}), cred(StepHolds(7, 1, {0, 1}))).error_code(),
              grpc::StatusCode::PERMISSION_DENIED)
        << name;
  }
  EXPECT_TRUE(Holdings().empty());
  ASSERT_TRUE(Hold(tcp_.get(), StepHolds(7, 0, {0, 1}), cred(StepHolds(7, 0, {0, 1}))).ok());
  ASSERT_TRUE(Hold(unix_.get(), StepHolds(8, 0, {2}), cred(StepHolds(8, 0, {2}))).ok());
  EXPECT_THAT(Holdings(), ::testing::UnorderedElementsAre("slurm job 7 step 0: 0 1",
                                                          "slurm job 8 step 0: 2"));
  for (const auto& [name, stub] : Listeners()) {
    EXPECT_EQ(Release(stub, StepRelease(7, 0)).error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << name;
  }
  EXPECT_EQ(Holdings().size(), 2u);
  EXPECT_TRUE(Release(unix_.get(), StepRelease(7, 0), cred(StepRelease(7, 0))).ok());
  EXPECT_TRUE(Release(tcp_.get(), StepRelease(8, 0), cred(StepRelease(8, 0))).ok());
  EXPECT_TRUE(Holdings().empty());
}

// Hole B: an open door beyond loopback is refused at start; taken with
// grpc.allow_insecure, every open listener is said at error level (beyond
// loopback, and every Slurm one) or as a warning, and in duet_open_access.
TEST_F(BridgeAccessTest, OpenDoorsAreRefusedBeyondLoopbackOrSaidAtStart) {
  config_.grpc.listen = "0.0.0.0:0";  // no auth section: auth.mode none
  absl::Status refused = ValidateConfig(config_);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("grpc.listen: 0.0.0.0:0 is plaintext TCP beyond loopback with auth.mode "
                        "none: any peer that reaches it may hold and release devices for any "
                        "pod"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("grpc.allow_insecure: true"));

  config_.grpc.allow_insecure = true;
  config_.slurm.credential = "none";
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256);
  spdlog::default_logger()->sinks().push_back(ring);
  Start();
  spdlog::default_logger()->sinks().pop_back();
  if (HasFatalFailure()) return;
  std::vector<std::string> errors, warnings;
  for (const spdlog::details::log_msg_buffer& m : ring->last_raw()) {
    const std::string text(m.payload.data(), m.payload.size());
    if (m.level == spdlog::level::err) errors.push_back(text);
    if (m.level == spdlog::level::warn) warnings.push_back(text);
  }
  const std::string sock = config_.grpc.unix_socket;
  const std::vector<std::string> want_errors = {
      "grpc.listen 0.0.0.0:0 is plaintext TCP beyond loopback with auth.mode none: any peer "
      "that reaches it may hold and release devices for any pod",
      "grpc.listen 0.0.0.0:0 is plaintext TCP beyond loopback with slurm.credential none: any "
      "peer that reaches it may hold and release devices as any Slurm job or step",
      "grpc.unix_socket " + sock +
          " is a unix socket, mode 0660 with slurm.credential none: any local process allowed "
          "to connect may hold and release devices as any Slurm job or step"};
  EXPECT_THAT(errors, ::testing::IsSupersetOf(want_errors));
  EXPECT_THAT(warnings, ::testing::Contains("grpc.unix_socket " + sock +
                                            " is a unix socket, mode 0660 with auth.mode none: "
                                            "any local process allowed to connect may hold and "
                                            "release devices for any pod"));
  const std::string metrics = bridge_->metrics()->Render();
  EXPECT_THAT(metrics, HasSubstr("duet_open_access{listener=\"grpc.listen\",what=\"pods\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("duet_open_access{listener=\"grpc.listen\",what=\"slurm\"} 1"));
  EXPECT_THAT(metrics,
              HasSubstr("duet_open_access{listener=\"grpc.unix_socket\",what=\"slurm\"} 1"));
  // As said: open. A made-up Slurm job holds GPUs with no credential.
  EXPECT_TRUE(Hold(tcp_.get(), FakeJobTakesAll(424242)).ok());
}

// The defaults close the Slurm door: duet_open_access says 0 for it.
TEST_F(BridgeAccessTest, DefaultsSayWhatIsOpen) {
  Start();
  if (HasFatalFailure()) return;
  const std::string metrics = bridge_->metrics()->Render();
  EXPECT_THAT(metrics, HasSubstr("duet_open_access{listener=\"grpc.listen\",what=\"pods\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("duet_open_access{listener=\"grpc.listen\",what=\"slurm\"} 0"));
  EXPECT_THAT(metrics,
              HasSubstr("duet_open_access{listener=\"grpc.unix_socket\",what=\"slurm\"} 0"));
}

// Hole C: the socket has grpc.unix_socket_mode right after start, whatever
// the process umask (0 here, as some service managers leave it), and the
// bridge still answers on it.
TEST_F(BridgeAccessTest, UnixSocketGetsItsMode) {
  const mode_t umask_before = ::umask(0);
  Start();
  ::umask(umask_before);
  if (HasFatalFailure()) return;
  struct stat st {};
  ASSERT_EQ(::stat(config_.grpc.unix_socket.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  // The directory the bridge made for it is not everyone's to write either.
  ASSERT_EQ(::stat((dir_ / "run").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  bridge_.reset();

  config_.grpc.unix_socket_mode = 0600;
  Start();
  if (HasFatalFailure()) return;
  ASSERT_EQ(::stat(config_.grpc.unix_socket.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  v1::ListNodesResponse nodes;
  grpc::ClientContext ctx;
  EXPECT_TRUE(unix_->ListNodes(&ctx, v1::ListNodesRequest(), &nodes).ok());
}

TEST_F(BridgeAccessTest, ASocketDirectoryAnyoneMayWriteIsRefused) {
  const std::filesystem::path run = dir_ / "run";
  std::filesystem::create_directories(run);
  ::chmod(run.c_str(), 0777);
  ASSERT_TRUE(ValidateConfig(config_).ok());
  auto b = Bridge::Start(config_);
  ASSERT_FALSE(b.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(b.status())) << b.status();
  EXPECT_THAT(std::string(b.status().message()),
              HasSubstr("grpc.unix_socket " + config_.grpc.unix_socket + ": its directory " +
                        run.string() + " (mode 0777) is writable by every user without the "
                        "sticky bit"));
  ::chmod(run.c_str(), 01777);  // sticky, as /tmp: others cannot replace the socket
  b = Bridge::Start(config_);
  EXPECT_TRUE(b.ok()) << b.status();
}

}  // namespace
}  // namespace duet
