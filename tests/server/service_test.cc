// LedgerService on its own: what happens when the journal cannot persist,
// and the reason (google.rpc.ErrorInfo) each refusal carries.

#include "bridge/server/service.h"

#include <functional>
#include <memory>

#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "proto/duet/v1/error_reason.h"

namespace duet {
namespace {

class FailingDurability final : public Durability {
 public:
  void WhenDurable(uint64_t, std::function<void(absl::Status)> done) override {
    done(absl::UnavailableError("disk full"));
  }
};

// A server that, when it goes, shuts down and stops its service's step
// threads first (they drain the server's last events).
using ServerPtr = std::unique_ptr<grpc::Server, std::function<void(grpc::Server*)>>;

// Serves `service` on a loopback port; sets `*stub` to a client of it.
ServerPtr Serve(LedgerService* service, std::unique_ptr<v1::Ledger::Stub>* stub) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  service->RegisterWith(&builder);
  ServerPtr server(builder.BuildAndStart().release(), [service](grpc::Server* s) {
    s->Shutdown();
    service->StopCallThreads();
    delete s;
  });
  if (server == nullptr) return nullptr;
  service->StartCallThreads();
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
  EXPECT_EQ(v1::ReasonOf(s1), v1::reason::kNotServing);
  EXPECT_FALSE(service.serving());
  EXPECT_THAT(metrics.Render(), ::testing::HasSubstr("duet_serving 0"));

  // From now on nothing is granted; reads still work.
  req.mutable_owner()->mutable_slurm_job()->set_job_id(2);
  grpc::ClientContext c2;
  v1::HoldResponse r2;
  grpc::Status s2 = stub->Hold(&c2, req, &r2);
  EXPECT_EQ(s2.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s2.error_message(), ::testing::HasSubstr("not granting"));
  EXPECT_EQ(v1::ReasonOf(s2), v1::reason::kNotServing);
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

// ---------------------------------------------------------------------------
// Reasons: callers decide on ErrorInfo.reason, never on the message.

class ReasonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    NodeSpec a;
    a.name = "a";
    for (uint32_t i = 0; i < 4; ++i) {
      DeviceSpec d;
      d.index = i;
      a.devices.push_back(d);
    }
    ASSERT_TRUE(ledger_.UpsertNode(a).ok());
    NodeSpec c = a;
    c.name = "c";
    c.state = NodeState::kCordoned;
    ASSERT_TRUE(ledger_.UpsertNode(c).ok());
    ASSERT_TRUE(ledger_.Hold(Named("a", Owner::Pod("uid-1", "ml", "train"), {0})).ok());
    ASSERT_TRUE(ledger_.Hold(Named("a", Owner::SlurmJob(5), {1})).ok());
    server_ = Serve(&service_, &stub_);
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  static HoldRequest Named(const std::string& node, const Owner& owner,
                           std::vector<uint32_t> gpus) {
    HoldRequest r;
    r.node = node;
    r.owner = owner;
    for (uint32_t g : gpus) r.devices.push_back({DeviceKind::kGpu, g, kWholeDevice});
    return r;
  }
  static v1::HoldRequest Wire(const std::string& node, bool pod, std::vector<uint32_t> gpus) {
    v1::HoldRequest req;
    req.set_node(node);
    if (pod) {
      req.mutable_owner()->mutable_pod()->set_uid("uid-9");
      req.mutable_owner()->mutable_pod()->set_namespace_("ml");
      req.mutable_owner()->mutable_pod()->set_name("new");
    } else {
      req.mutable_owner()->mutable_slurm_step()->set_job_id(8);
      req.mutable_owner()->mutable_slurm_step()->set_step_id(0);
    }
    for (uint32_t g : gpus) {
      auto* d = req.mutable_devices()->add_devices();
      d->set_kind(v1::DEVICE_KIND_GPU);
      d->set_index(g);
    }
    return req;
  }
  grpc::Status Hold(const v1::HoldRequest& req) {
    grpc::ClientContext ctx;
    v1::HoldResponse resp;
    return stub_->Hold(&ctx, req, &resp);
  }
  static std::map<std::string, std::string> Metadata(const grpc::Status& s) {
    google::rpc::ErrorInfo info;
    if (!v1::ErrorInfoOf(s, &info)) return {};
    EXPECT_EQ(info.domain(), "duet.dev");
    return {info.metadata().begin(), info.metadata().end()};
  }

  Ledger ledger_;
  ImmediateDurability durability_;
  WatchHub hub_;
  LedgerService service_{&ledger_, &durability_, &hub_, nullptr, {}};
  std::unique_ptr<v1::Ledger::Stub> stub_;
  ServerPtr server_;
};

TEST_F(ReasonTest, UnknownNodeIsNodeNotShared) {
  grpc::Status s = Hold(Wire("slurm-only", false, {0}));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(v1::ReasonOf(s), v1::reason::kNodeNotShared);
  EXPECT_EQ(Metadata(s)["node"], "slurm-only");

  grpc::ClientContext ctx;
  v1::GetNodeRequest get;
  get.set_name("slurm-only");
  v1::Node node;
  EXPECT_EQ(v1::ReasonOf(stub_->GetNode(&ctx, get, &node)), v1::reason::kNodeNotShared);
}

// What broke: the ledger's "node a gpu 9 does not exist" has the shape of
// an unknown node's NOT_FOUND (it names "node" and the node), and the SPANK
// client module let such a step run unregistered.
TEST_F(ReasonTest, UnknownDeviceOnASharedNodeIsDeviceUnknownNotNodeNotShared) {
  grpc::Status s = Hold(Wire("a", false, {2, 9}));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("node a"));
  EXPECT_EQ(v1::ReasonOf(s), v1::reason::kDeviceUnknown);
  EXPECT_EQ(Metadata(s)["node"], "a");
  EXPECT_EQ(Metadata(s)["device"], "gpu 9");
}

TEST_F(ReasonTest, ConflictsNameTheHoldersClass) {
  grpc::Status on_pod = Hold(Wire("a", false, {0}));
  EXPECT_EQ(on_pod.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(v1::ReasonOf(on_pod), v1::reason::kHeldByPod);
  EXPECT_EQ(Metadata(on_pod)["device"], "gpu 0");
  EXPECT_EQ(Metadata(on_pod)["holder"], Owner::Pod("uid-1", "ml", "train").ToString());

  grpc::Status on_slurm = Hold(Wire("a", true, {1}));
  EXPECT_EQ(on_slurm.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(v1::ReasonOf(on_slurm), v1::reason::kHeldBySlurm);
  EXPECT_EQ(Metadata(on_slurm)["holder"], Owner::SlurmJob(5).ToString());
}

TEST_F(ReasonTest, CountWithoutRoomIsNoRoomAlsoThroughPlacePod) {
  v1::HoldRequest req = Wire("a", true, {});
  req.mutable_count()->set_kind(v1::DEVICE_KIND_GPU);
  req.mutable_count()->set_count(3);
  grpc::Status s = Hold(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(v1::ReasonOf(s), v1::reason::kNoRoom);

  // PlacePod prefixes the message with the pod; the reason survives.
  v1::PlacePodRequest place;
  place.mutable_pod()->set_uid("uid-7");
  place.mutable_pod()->set_namespace_("ml");
  place.mutable_pod()->set_name("big");
  place.set_node("a");
  place.set_gpus(3);
  grpc::ClientContext ctx;
  v1::Holding holding;
  grpc::Status p = stub_->PlacePod(&ctx, place, &holding);
  EXPECT_EQ(p.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(p.error_message(), ::testing::StartsWith("pod ml/big on a: "));
  EXPECT_EQ(v1::ReasonOf(p), v1::reason::kNoRoom);

  place.set_node("slurm-only");
  grpc::ClientContext ctx2;
  EXPECT_EQ(v1::ReasonOf(stub_->PlacePod(&ctx2, place, &holding)), v1::reason::kNodeNotShared);
}

TEST_F(ReasonTest, CordonedNodeStaleGenerationAndAnotherHoldingHaveTheirReasons) {
  grpc::Status cordoned = Hold(Wire("c", true, {0}));
  EXPECT_EQ(cordoned.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(v1::ReasonOf(cordoned), v1::reason::kNodeNotReady);
  EXPECT_EQ(Metadata(cordoned)["state"], "cordoned");

  v1::HoldRequest stale = Wire("a", false, {2});
  stale.set_expected_generation(1);
  grpc::Status aborted = Hold(stale);
  EXPECT_EQ(aborted.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(v1::ReasonOf(aborted), v1::reason::kStaleGeneration);

  ASSERT_TRUE(Hold(Wire("a", false, {2})).ok());
  grpc::Status again = Hold(Wire("a", false, {3}));
  EXPECT_EQ(again.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(v1::ReasonOf(again), v1::reason::kAlreadyHeld);
}

TEST_F(ReasonTest, BadInputCarriesNoReason) {
  v1::HoldRequest req = Wire("a", false, {});
  grpc::Status s = Hold(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(v1::ReasonOf(s), "");
}

}  // namespace
}  // namespace duet
