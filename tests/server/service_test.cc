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

// Serves `service` on a loopback port; sets `*stub` to a client of it.
std::unique_ptr<grpc::Server> Serve(LedgerService* service, std::unique_ptr<v1::Ledger::Stub>* stub) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return nullptr;
  *stub = v1::Ledger::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  return server;
}

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
  std::unique_ptr<v1::Ledger::Stub> stub;
  auto server = Serve(&service, &stub);
  ASSERT_NE(server, nullptr);

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

class ImmediateDurability final : public Durability {
 public:
  void WhenDurable(uint64_t, std::function<void(absl::Status)> done) override {
    done(absl::OkStatus());
  }
};

// A Slurm step refused because a placeholder holds its GPU is tried once
// more when resolve_slurm_conflict released something (Slurm said the
// placeholder's job had ended), and refused as before when it did not. Pod
// owners never reach the hook.
TEST(LedgerServiceTest, SlurmConflictIsRetriedOnlyWhenTheHookReleasedSomething) {
  Ledger ledger;
  NodeSpec n;
  n.name = "a";
  for (uint32_t i = 0; i < 2; ++i) {
    DeviceSpec d;
    d.index = i;
    n.devices.push_back(d);
  }
  ASSERT_TRUE(ledger.UpsertNode(n).ok());
  const Owner placeholder = Owner::Placeholder(7, "uid-p");
  HoldRequest ph;
  ph.node = "a";
  ph.owner = placeholder;
  ph.devices = {{DeviceKind::kGpu, 0, kWholeDevice}, {DeviceKind::kGpu, 1, kWholeDevice}};
  ASSERT_TRUE(ledger.Hold(ph).ok());

  ImmediateDurability durability;
  WatchHub hub;
  bool placeholder_ended = false;
  std::vector<std::string> calls;
  LedgerService::Options o;
  o.resolve_slurm_conflict = [&](const HoldRequest& r) {
    calls.push_back(r.owner.ToString());
    if (!placeholder_ended) return false;
    return ledger.Release("a", placeholder).value().released;
  };
  LedgerService service(&ledger, &durability, &hub, nullptr, o);
  std::unique_ptr<v1::Ledger::Stub> stub;
  auto server = Serve(&service, &stub);
  ASSERT_NE(server, nullptr);
  auto hold = [&](bool step) {
    v1::HoldRequest req;
    req.set_node("a");
    if (step) {
      req.mutable_owner()->mutable_slurm_step()->set_job_id(8);
      req.mutable_owner()->mutable_slurm_step()->set_step_id(0);
    } else {
      req.mutable_owner()->mutable_pod()->set_uid("uid-q");
    }
    v1::HeldDevice* d = req.mutable_devices()->add_devices();
    d->set_kind(v1::DEVICE_KIND_GPU);
    d->set_index(1);
    grpc::ClientContext ctx;
    v1::HoldResponse resp;
    return stub->Hold(&ctx, req, &resp);
  };

  // The placeholder is live: refused, naming it; the hook was asked once.
  grpc::Status s = hold(true);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("placeholder"));
  EXPECT_EQ(calls.size(), 1u);
  // A pod owner is never resolved against Slurm.
  EXPECT_EQ(hold(false).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(calls.size(), 1u);
  // The placeholder's job ended in Slurm: released by the hook, step granted.
  placeholder_ended = true;
  s = hold(true);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(calls.size(), 2u);
  EXPECT_FALSE(ledger.FindHolding("a", placeholder).has_value());
  EXPECT_TRUE(ledger.CheckInvariants().ok());
  server->Shutdown();
}

}  // namespace
}  // namespace duet
