// LedgerService on its own: what happens when the journal cannot persist.

#include "bridge/server/service.h"

#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace duet {
namespace {

class FailingDurability final : public Durability {
 public:
  void WhenDurable(uint64_t, std::function<void(absl::Status)> done) override {
    done(absl::UnavailableError("disk full"));
  }
};

TEST(LedgerServiceTest, AJournalFailureStopsGrantingAndSaysWhy) {
  Ledger ledger;
  NodeSpec n;
  n.name = "a";
  n.devices.push_back(DeviceSpec{});
  ASSERT_TRUE(ledger.UpsertNode(n).ok());
  FailingDurability durability;
  WatchHub hub;
  Metrics metrics(&ledger);
  LedgerService service(&ledger, &durability, &hub, &metrics, {});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto stub = v1::Ledger::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));

  v1::HoldRequest req;
  req.set_node("a");
  req.mutable_owner()->mutable_slurm_job()->set_job_id(1);
  req.mutable_count()->set_kind(v1::DEVICE_KIND_GPU);
  req.mutable_count()->set_count(1);
  grpc::ClientContext c1;
  v1::HoldResponse r1;
  grpc::Status s1 = stub->Hold(&c1, req, &r1);
  EXPECT_EQ(s1.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s1.error_message(), ::testing::HasSubstr("could not persist the change: disk full"));
  EXPECT_FALSE(service.serving());
  EXPECT_THAT(metrics.Render(), ::testing::HasSubstr("duet_serving 0"));

  // From now on nothing is granted; reads still work.
  req.mutable_owner()->mutable_slurm_job()->set_job_id(2);
  grpc::ClientContext c2;
  v1::HoldResponse r2;
  grpc::Status s2 = stub->Hold(&c2, req, &r2);
  EXPECT_EQ(s2.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s2.error_message(), ::testing::HasSubstr("not granting"));
  EXPECT_EQ(ledger.holding_count(), 1u);  // only the first, never acknowledged
  grpc::ClientContext c3;
  v1::ListNodesResponse nodes;
  EXPECT_TRUE(stub->ListNodes(&c3, v1::ListNodesRequest(), &nodes).ok());
  server->Shutdown();
}

}  // namespace
}  // namespace duet
