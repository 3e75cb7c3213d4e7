// Issue 25 (item 8 and the rest of item 4) at the gRPC boundary: the
// plugin's own client (spank::BridgeClient) against LedgerService checking
// slurm.key credentials as duet-bridge does, over a real gRPC connection.
// - a credential binds the method and the request: a Hold's credential is
//   refused on Release, one for other devices is refused, each with reason
//   CREDENTIAL_REFUSED and its why, and the plugin's one-line message;
// - every successful mutation leaves one audit line naming who, what, node
//   and devices; the audit log's rate limit drops and counts.

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bridge/server/audit.h"
#include "bridge/server/metrics.h"
#include "bridge/server/service.h"
#include "bridge/slurm/slurm_key_auth.h"
#include "common/credential/munge_payload.h"
#include "common/credential/request_digest.h"
#include "common/credential/slurm_key_cred.h"
#include "common/grpc/status.h"
#include "common/reason.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "proto/duet/v1/error_reason.h"
#include "slurm_plugin/bridge_client.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
#include "tests/fakes/fake_clock.h"
#include "tests/slurm/credential_bindings.h"

namespace duet {
namespace {

using ::testing::HasSubstr;

constexpr char kSlurmKey[] = "0123456789abcdef0123456789abcdef-test-cluster-key";

// The audit lines a ring sink got.
std::vector<std::string> Lines(const std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt>& ring) {
  std::vector<std::string> out;
  for (const spdlog::details::log_msg_buffer& m : ring->last_raw()) {
    out.emplace_back(m.payload.data(), m.payload.size());
  }
  return out;
}

class CredentialAuditTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/duet-credaudit.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    key_file_ = dir_ + "/slurm.key";
    std::ofstream(key_file_) << kSlurmKey;
    chmod(key_file_.c_str(), 0600);

    NodeSpec n;
    n.name = "gke-a";
    for (uint32_t i = 0; i < 4; ++i) {
      DeviceSpec d;
      d.index = i;
      n.devices.push_back(d);
    }
    ASSERT_TRUE(ledger_.UpsertNode(n).ok());

    SlurmKeyAuthOptions ko;
    ko.key_file = key_file_;
    auto made = SlurmKeyAuth::Create(ko);
    ASSERT_TRUE(made.ok()) << made.status();
    key_auth_ = std::move(*made);

    ring_ = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
    AuditLog::Options ao;
    ao.logger = std::make_shared<spdlog::logger>("audit-test", ring_);
    ao.metrics = &metrics_;
    audit_ = std::make_unique<AuditLog>(ao);

    LedgerService::Options o;
    SlurmKeyAuth* auth = key_auth_.get();
    o.authorize_slurm_owner = [auth](const SlurmCallerCredentials& c,
                                     const slurm_munge::Binding& want, std::string* who) {
      return auth->Check(c.slurm_key, want, who);
    };
    o.audit = audit_.get();
    service_ = std::make_unique<LedgerService>(&ledger_, durability_.get(), &hub_, &metrics_, o);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    service_->RegisterWith(&builder);
    server_ = builder.BuildAndStart();
    if (server_ != nullptr) service_->StartCallThreads();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Ledger::NewStub(grpc::CreateChannel(Target(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    // Before the server goes: the call threads drain its last events.
    if (service_ != nullptr) service_->StopCallThreads();
    std::system(("rm -rf " + dir_).c_str());
  }
  std::string Target() const { return absl::StrCat("127.0.0.1:", port_); }
  // The plugin's client, as spank_duet makes it with plugstack auth=slurm_key.
  std::unique_ptr<spank::BridgeClient> Plugin() {
    auto c = std::make_unique<spank::BridgeClient>(Target(), 5000);
    c->UseAuth(spank::StepAuth::kSlurmKey, "", key_file_);
    return c;
  }
  // What the plugin would attach to `request`.
  template <typename Request>
  std::string Credential(const Request& request) {
    auto made = slurm_key::Make(slurm_key::DeriveKey(kSlurmKey),
                                slurm_munge::Payload(*slurm_munge::BindingOf(request)),
                                absl::ToUnixSeconds(absl::Now()));
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? *made : "";
  }
  static v1::HoldRequest StepHold(uint32_t job, uint32_t step, std::vector<uint32_t> gpus) {
    return testing::SlurmHoldRequest("gke-a", job, step, gpus);
  }
  static v1::ReleaseRequest StepRelease(uint32_t job, uint32_t step) {
    return testing::SlurmReleaseRequest("gke-a", job, step);
  }
  static std::string WhyOf(const grpc::Status& s) {
    google::rpc::ErrorInfo info;
    if (!v1::ErrorInfoOf(s, &info)) return "";
    auto it = info.metadata().find("why");
    return it == info.metadata().end() ? "" : it->second;
  }

  std::string dir_;
  std::string key_file_;
  Ledger ledger_;
  std::unique_ptr<Durability> durability_ = NewImmediateDurability();
  WatchHub hub_;
  Metrics metrics_{&ledger_};
  std::unique_ptr<SlurmKeyAuth> key_auth_;
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> ring_;
  std::unique_ptr<AuditLog> audit_;
  std::unique_ptr<LedgerService> service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Ledger::Stub> stub_;
};

TEST_F(CredentialAuditTest, AHoldsCredentialIsRefusedOnReleaseWithItsReason) {
  const v1::HoldRequest hold = StepHold(12, 0, {0, 1});
  const std::string cred = Credential(hold);
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata(slurm_key::kMetadataKey, cred);
    v1::HoldResponse resp;
    ASSERT_TRUE(stub_->Hold(&ctx, hold, &resp).ok());
  }
  // Captured off the wire and presented as a Release of the same step.
  grpc::ClientContext ctx;
  ctx.AddMetadata(slurm_key::kMetadataKey, cred);
  v1::ReleaseResponse resp;
  const grpc::Status s = stub_->Release(&ctx, StepRelease(12, 0), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_EQ(v1::ReasonOf(s), v1::reason::kCredentialRefused);
  EXPECT_EQ(WhyOf(s), "wrong_method");
  EXPECT_EQ(ledger_.holding_count(), 1u) << "a refused Release changed the ledger";
  // What spank_duet prints on the user's stderr: one line with the why.
  const std::string line = spank::DescribeCredentialRefusal(FromGrpc(s, "Release"));
  EXPECT_THAT(line, HasSubstr("duet-bridge refused this step's credential (why=wrong_method"));
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_EQ(spank::DescribeCredentialRefusal(absl::UnavailableError("x")), "");
}

TEST_F(CredentialAuditTest, ACredentialForOtherDevicesOrAnotherStepIsRefused) {
  for (const v1::HoldRequest& made_for : {StepHold(12, 0, {0}), StepHold(12, 1, {0, 1}),
                                          StepHold(13, 0, {0, 1}), StepHold(12, 0, {0, 1, 2})}) {
    grpc::ClientContext ctx;
    ctx.AddMetadata(slurm_key::kMetadataKey, Credential(made_for));
    v1::HoldResponse resp;
    const grpc::Status s = stub_->Hold(&ctx, StepHold(12, 0, {0, 1}), &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << made_for.DebugString();
    EXPECT_EQ(v1::ReasonOf(s), v1::reason::kCredentialRefused);
    EXPECT_EQ(WhyOf(s), "wrong_request") << s.error_message();
  }
  EXPECT_EQ(ledger_.holding_count(), 0u);
  EXPECT_TRUE(Lines(ring_).empty()) << "refusals are not audited as mutations";
}

TEST_F(CredentialAuditTest, AStepsHoldAndReleaseLeaveAuditLinesWithWhoAndDevices) {
  auto plugin = Plugin();
  spank::StepDevices devices;
  devices.gpus = {1, 3};
  ASSERT_TRUE(plugin->HoldStep("gke-a", 12, 0, devices).ok());
  ASSERT_TRUE(plugin->ReleaseStep("gke-a", 12, 0).ok());
  // A retried Release finds nothing: audited, unchanged.
  ASSERT_TRUE(plugin->ReleaseStep("gke-a", 12, 0).ok());
  EXPECT_THAT(
      Lines(ring_),
      ::testing::ElementsAre(
          "audit method=Hold who=\"slurm job=12 step=0 credential=slurm_key\" node=gke-a "
          "owner=\"slurm job 12 step 0\" devices=gpu1,gpu3 changed=true",
          "audit method=Release who=\"slurm job=12 step=0 credential=slurm_key\" node=gke-a "
          "owner=\"slurm job 12 step 0\" devices=gpu1,gpu3 changed=true",
          "audit method=Release who=\"slurm job=12 step=0 credential=slurm_key\" node=gke-a "
          "owner=\"slurm job 12 step 0\" devices=\"\" changed=false"));
  const std::string m = metrics_.Render();
  EXPECT_THAT(m, HasSubstr("duet_audit_records_total{method=\"Hold\"} 1"));
  EXPECT_THAT(m, HasSubstr("duet_audit_records_total{method=\"Release\"} 2"));
}

TEST_F(CredentialAuditTest, AnUncheckedCallIsAuditedAsUnauthenticatedWithItsPeer) {
  v1::HoldRequest pod;
  pod.set_node("gke-a");
  pod.mutable_owner()->mutable_pod()->set_uid("uid-1");
  pod.mutable_owner()->mutable_pod()->set_namespace_("default");
  pod.mutable_owner()->mutable_pod()->set_name("web");
  v1::HeldDevice* d = pod.mutable_devices()->add_devices();
  d->set_kind(v1::DEVICE_KIND_GPU);
  d->set_index(2);
  grpc::ClientContext ctx;
  v1::HoldResponse resp;
  ASSERT_TRUE(stub_->Hold(&ctx, pod, &resp).ok());
  const std::vector<std::string> lines = Lines(ring_);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("audit method=Hold who=unauthenticated(ipv4:127.0.0.1:"));
  EXPECT_THAT(lines[0], HasSubstr("devices=gpu2 changed=true"));
}

TEST(AuditLogTest, TheRateLimitDropsCountsAndSaysSo) {
  Ledger ledger;
  Metrics metrics(&ledger);
  fakes::FakeClock clock;
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
  AuditLog::Options o;
  o.rate_per_second = 1;
  o.burst = 2;
  o.clock = &clock;
  o.metrics = &metrics;
  o.logger = std::make_shared<spdlog::logger>("audit-rate", ring);
  AuditLog log(o);
  AuditRecord r{"Hold", "user=system:serviceaccount:duet:duet-node node=gke-a", "gke-a",
                "pod default/web", "gpu0", true};
  EXPECT_TRUE(log.Record(r));
  EXPECT_TRUE(log.Record(r));
  EXPECT_FALSE(log.Record(r));  // the burst is spent
  EXPECT_FALSE(log.Record(r));
  EXPECT_EQ(log.dropped(), 2u);
  EXPECT_EQ(Lines(ring).size(), 2u);
  clock.Advance(absl::Seconds(1));
  EXPECT_TRUE(log.Record(r));
  const std::vector<std::string> lines = Lines(ring);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[2], HasSubstr(" dropped=2"));
  EXPECT_THAT(lines[0], ::testing::Not(HasSubstr("dropped=")));
  const std::string m = metrics.Render();
  EXPECT_THAT(m, HasSubstr("duet_audit_records_total{method=\"Hold\"} 3"));
  EXPECT_THAT(m, HasSubstr("duet_audit_dropped_total{method=\"Hold\"} 2"));
}

TEST(AuditLogTest, ValuesAreQuotedSoALineCannotBeForged) {
  AuditRecord r{"Hold", "user=a\"b c\naudit method=Release", "n", "o", "", true};
  EXPECT_EQ(FormatAuditLine(r, 0),
            "audit method=Hold who=\"user=a\\\"b c?audit method=Release\" node=n owner=o "
            "devices=\"\" changed=true");
}

}  // namespace
}  // namespace duet
