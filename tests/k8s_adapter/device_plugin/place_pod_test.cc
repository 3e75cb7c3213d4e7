// The bridge's PlacePod RPC (what duet-node asks for a pod that bypassed the
// duet scheduler), through the generated stub: with Slurm (a scripted
// SlurmClient behind the real Placeholders) and without (a ledger hold).

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bridge/server/service.h"
#include "bridge/slurm/placeholders.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "proto/duet/v1/error_reason.h"
#include "tests/fakes/fake_slurm.h"
#include "tests/fakes/ledger_server.h"

namespace duet {
namespace {

using ::testing::HasSubstr;

class PlacePodTest : public ::testing::Test {
 protected:
  void Start(bool with_slurm) {
    NodeSpec n;
    n.name = "gke-a";
    n.cpus = 32;
    for (uint32_t i = 0; i < 4; ++i) {
      DeviceSpec d;
      d.index = i;
      n.devices.push_back(d);
    }
    ASSERT_TRUE(ledger_.UpsertNode(n).ok());
    slurm_.set_allocation(absl::UnavailableError("not scripted"));
    if (with_slurm) placeholders_.emplace(&ledger_, &slurm_);
    LedgerService::Options o;
    o.placeholders = with_slurm ? &*placeholders_ : nullptr;
    o.pod_holds.load = [this](const NodeView&) { return load_; };
    o.pod_holds.on_placeholder = [this](const std::string& node, const placement::NodeLoad& l) {
      told_.emplace_back(node, l);
    };
    server_ = std::make_unique<fakes::LedgerServer>(&ledger_, "127.0.0.1:0", o);
    ASSERT_TRUE(server_->ok());
    stub_ = v1::Ledger::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_.reset(); }

  grpc::Status Place(uint32_t gpus, uint32_t tpus, v1::Holding* out,
                     const std::string& uid = "u1") {
    v1::PlacePodRequest r;
    r.mutable_pod()->set_uid(uid);
    r.mutable_pod()->set_namespace_("ml");
    r.mutable_pod()->set_name("rogue");
    r.set_node("gke-a");
    r.set_gpus(gpus);
    r.set_tpus(tpus);
    r.set_cpus(2);
    r.set_memory_mib(4096);
    grpc::ClientContext ctx;
    return stub_->PlacePod(&ctx, r, out);
  }

  Ledger ledger_;
  placement::NodeLoad load_;  // what the node's Slurm jobs hold (SlurmNodeLoads)
  std::vector<std::pair<std::string, placement::NodeLoad>> told_;  // placeholders' loads
  // Answers AllocatePlaceholder from a script; records what it was asked.
  fakes::FakeSlurmClient slurm_;
  std::optional<Placeholders> placeholders_;
  std::unique_ptr<fakes::LedgerServer> server_;
  std::unique_ptr<v1::Ledger::Stub> stub_;
};

TEST_F(PlacePodTest, WithSlurmRecordsTheDevicesSlurmChose) {
  Start(true);
  SlurmAllocation a;
  a.job_id = 314;
  a.devices.node = "gke-a";
  a.devices.gpus = {1, 2};
  slurm_.set_allocation(a);
  v1::Holding h;
  grpc::Status st = Place(2, 0, &h);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(h.owner().placeholder().job_id(), 314u);
  EXPECT_EQ(h.owner().placeholder().pod_uid(), "u1");
  ASSERT_EQ(h.devices_size(), 2);
  EXPECT_EQ(h.devices(0).index(), 1u);
  EXPECT_EQ(h.devices(1).index(), 2u);
  ASSERT_EQ(slurm_.asked().size(), 1u);
  EXPECT_EQ(slurm_.asked()[0].gpus, 2u);
  EXPECT_EQ(slurm_.asked()[0].cpus, 2u);
  EXPECT_EQ(slurm_.asked()[0].memory_mib, 4096u);
  EXPECT_EQ(slurm_.asked()[0].node, "gke-a");
  // Asked again (a retried Allocate): the same holding, no second job.
  v1::Holding again;
  ASSERT_TRUE(Place(2, 0, &again).ok());
  EXPECT_EQ(again.owner().placeholder().job_id(), 314u);
  EXPECT_EQ(slurm_.asked().size(), 1u);
}

// What broke: PlacePod made placeholders the per-node CPU/memory loads never
// heard of (the extender's bind told them), so the extender's filter saw the
// node emptier than Slurm did until the next sync pass.
TEST_F(PlacePodTest, WithSlurmTellsTheNodeLoadsAndCountsThemFirst) {
  Start(true);
  SlurmAllocation a;
  a.job_id = 315;
  a.devices.node = "gke-a";
  a.devices.gpus = {0};
  slurm_.set_allocation(a);
  v1::Holding h;
  grpc::Status st = Place(1, 0, &h);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(told_.size(), 1u);
  EXPECT_EQ(told_[0].first, "gke-a");
  EXPECT_EQ(told_[0].second.cpu_milli, 2000u);
  EXPECT_EQ(told_[0].second.memory_mib, 4096u);

  // A node whose CPUs Slurm's jobs hold is refused before Slurm is asked,
  // with the reason the extender's bind gives.
  load_ = placement::NodeLoad{31000, 0};  // 1 of 32 CPUs left, 2 asked
  st = Place(1, 0, &h, "u2");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(v1::ReasonOf(st), v1::reason::kNoRoom);
  EXPECT_THAT(st.error_message(), HasSubstr("pod ml/rogue on gke-a: "));
  EXPECT_EQ(slurm_.asked().size(), 1u);
}

TEST_F(PlacePodTest, WithSlurmNoRoomIsResourceExhaustedAndRecordsNothing) {
  Start(true);
  slurm_.set_allocation(absl::ResourceExhaustedError("Requested node configuration is not available"));
  v1::Holding h;
  grpc::Status st = Place(2, 0, &h);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("pod ml/rogue on gke-a: Requested node configuration"));
  EXPECT_EQ(ledger_.holding_count(), 0u);
}

TEST_F(PlacePodTest, WithoutSlurmHoldsAnyFreeDevicesAsThePod) {
  Start(false);
  HoldRequest slurm;
  slurm.node = "gke-a";
  slurm.owner = Owner::SlurmJob(9);
  slurm.devices = {{DeviceKind::kGpu, 0, kWholeDevice}};
  ASSERT_TRUE(ledger_.Hold(slurm).ok());
  v1::Holding h;
  grpc::Status st = Place(3, 0, &h);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(h.owner().pod().uid(), "u1");
  ASSERT_EQ(h.devices_size(), 3);
  for (const auto& d : h.devices()) EXPECT_NE(d.index(), 0u);
  // No room for a second pod.
  v1::Holding none;
  st = Place(1, 0, &none, "u2");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("pod ml/rogue on gke-a"));
}

TEST_F(PlacePodTest, MalformedRequestsAreRefusedByField) {
  Start(false);
  v1::Holding h;
  EXPECT_EQ(Place(0, 0, &h).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  grpc::Status st = Place(1, 1, &h);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("one device kind at a time"));
  st = Place(1, 0, &h, "");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::PlacePodRequest r;
  r.mutable_pod()->set_uid("u9");
  r.set_node("nope");
  r.set_gpus(1);
  grpc::ClientContext ctx;
  EXPECT_EQ(stub_->PlacePod(&ctx, r, &h).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(ledger_.holding_count(), 0u);
}

}  // namespace
}  // namespace duet
