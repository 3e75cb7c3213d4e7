// Every error LedgerService answers quotes client input only in part
// (issue 25): a caller who reaches the port may put megabytes, newlines and
// terminal escapes in any string field of any request, and what comes back
// (the message, and the details' metadata) is short and free of control
// bytes, whichever field it was. Over real gRPC, one field at a time.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bridge/server/durability.h"
#include "bridge/server/service.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace duet {
namespace {

// A megabyte behind an escape sequence and a newline.
const std::string& Hostile() {
  static const std::string* s =
      new std::string("\x1b[31m\n" + std::string(1 << 20, 'x') + "\r\x1b]0;t\x07");
  return *s;
}

bool HasControlBytes(const std::string& s) {
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) return true;
  }
  return false;
}

class ServiceEchoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    NodeSpec n;
    n.name = "gke-a";
    n.cpus = 16;
    n.memory_mib = 65536;
    for (uint32_t i = 0; i < 2; ++i) {
      DeviceSpec d;
      d.index = i;
      n.devices.push_back(d);
    }
    ASSERT_TRUE(ledger_.UpsertNode(n).ok());
    service_ = std::make_unique<LedgerService>(&ledger_, durability_.get(), &hub_, nullptr,
                                               LedgerService::Options());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    service_->RegisterWith(&builder);
    server_ = builder.BuildAndStart();
    if (server_ != nullptr) service_->StartCallThreads();
    ASSERT_NE(server_, nullptr);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    stub_ = v1::Ledger::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials(), args));
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    // Before the server goes: the call threads drain its last events.
    if (service_ != nullptr) service_->StopCallThreads();
  }

  static void Bound(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  }
  grpc::Status Hold(const v1::HoldRequest& req) {
    grpc::ClientContext ctx;
    Bound(&ctx);
    v1::HoldResponse resp;
    return stub_->Hold(&ctx, req, &resp);
  }
  grpc::Status Release(const v1::ReleaseRequest& req) {
    grpc::ClientContext ctx;
    Bound(&ctx);
    v1::ReleaseResponse resp;
    return stub_->Release(&ctx, req, &resp);
  }
  grpc::Status PlacePod(const v1::PlacePodRequest& req) {
    grpc::ClientContext ctx;
    Bound(&ctx);
    v1::Holding resp;
    return stub_->PlacePod(&ctx, req, &resp);
  }

  static v1::HoldRequest PodHold() {
    v1::HoldRequest req;
    req.set_node("gke-a");
    req.mutable_owner()->mutable_pod()->set_uid("uid-1");
    req.mutable_owner()->mutable_pod()->set_namespace_("ml");
    req.mutable_owner()->mutable_pod()->set_name("p");
    req.mutable_count()->set_kind(v1::DEVICE_KIND_GPU);
    req.mutable_count()->set_count(1);
    return req;
  }
  static v1::PlacePodRequest Place() {
    v1::PlacePodRequest req;
    req.mutable_pod()->set_uid("uid-7");
    req.mutable_pod()->set_namespace_("ml");
    req.mutable_pod()->set_name("p");
    req.set_node("gke-a");
    req.set_gpus(1);
    req.set_cpus(1);
    req.set_memory_mib(1024);
    return req;
  }

  Ledger ledger_;
  std::unique_ptr<Durability> durability_ = NewImmediateDurability();
  WatchHub hub_;
  std::unique_ptr<LedgerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<v1::Ledger::Stub> stub_;
};

TEST_F(ServiceEchoTest, EveryStringFieldOfEveryRequestIsQuotedOnlyInPart) {
  const std::string& h = Hostile();
  struct Case {
    std::string field;
    std::function<grpc::Status()> call;
  };
  std::vector<Case> cases = {
      {"ListNodes names[0]",
       [&] {
         grpc::ClientContext ctx;
         Bound(&ctx);
         v1::ListNodesRequest req;
         req.add_names(h);
         v1::ListNodesResponse resp;
         return stub_->ListNodes(&ctx, req, &resp);
       }},
      {"GetNode name",
       [&] {
         grpc::ClientContext ctx;
         Bound(&ctx);
         v1::GetNodeRequest req;
         req.set_name(h);
         v1::Node resp;
         return stub_->GetNode(&ctx, req, &resp);
       }},
      {"ListHoldings node",
       [&] {
         grpc::ClientContext ctx;
         Bound(&ctx);
         v1::ListHoldingsRequest req;
         req.set_node(h);
         v1::ListHoldingsResponse resp;
         return stub_->ListHoldings(&ctx, req, &resp);
       }},
      {"WatchNodes names[0]",
       [&] {
         grpc::ClientContext ctx;
         Bound(&ctx);
         v1::WatchNodesRequest req;
         req.add_names("gke-a");
         req.add_names(h);
         auto reader = stub_->WatchNodes(&ctx, req);
         v1::NodeEvent ev;
         while (reader->Read(&ev)) {
         }
         return reader->Finish();
       }},
      {"Hold node",
       [&] {
         v1::HoldRequest req = PodHold();
         req.set_node(h);
         return Hold(req);
       }},
      {"Hold owner.pod.uid",
       [&] {
         v1::HoldRequest req = PodHold();
         req.mutable_owner()->mutable_pod()->set_uid(h);
         return Hold(req);
       }},
      {"Hold owner.pod.namespace",
       [&] {
         v1::HoldRequest req = PodHold();
         req.mutable_owner()->mutable_pod()->set_namespace_(h);
         return Hold(req);
       }},
      {"Hold owner.pod.name",
       [&] {
         v1::HoldRequest req = PodHold();
         req.mutable_owner()->mutable_pod()->set_name(h);
         return Hold(req);
       }},
      {"Hold owner.placeholder.pod_uid",
       [&] {
         v1::HoldRequest req = PodHold();
         req.mutable_owner()->mutable_placeholder()->set_job_id(7);
         req.mutable_owner()->mutable_placeholder()->set_pod_uid(h);
         return Hold(req);
       }},
      {"Hold count.model",
       [&] {
         v1::HoldRequest req = PodHold();
         req.mutable_count()->set_model(h);
         return Hold(req);
       }},
      {"Release node",
       [&] {
         v1::ReleaseRequest req;
         req.set_node(h);
         *req.mutable_owner() = PodHold().owner();
         return Release(req);
       }},
      {"Release owner.pod.uid",
       [&] {
         v1::ReleaseRequest req;
         req.set_node("gke-a");
         *req.mutable_owner() = PodHold().owner();
         req.mutable_owner()->mutable_pod()->set_uid(h);
         return Release(req);
       }},
      {"Release owner.pod.namespace",
       [&] {
         v1::ReleaseRequest req;
         req.set_node("gke-a");
         *req.mutable_owner() = PodHold().owner();
         req.mutable_owner()->mutable_pod()->set_namespace_(h);
         return Release(req);
       }},
      {"PlacePod node",
       [&] {
         v1::PlacePodRequest req = Place();
         req.set_node(h);
         return PlacePod(req);
       }},
      {"PlacePod pod.uid",
       [&] {
         v1::PlacePodRequest req = Place();
         req.mutable_pod()->set_uid(h);
         return PlacePod(req);
       }},
      {"PlacePod pod.namespace",
       [&] {
         v1::PlacePodRequest req = Place();
         req.mutable_pod()->set_namespace_(h);
         return PlacePod(req);
       }},
      {"PlacePod pod.name",
       [&] {
         v1::PlacePodRequest req = Place();
         req.mutable_pod()->set_name(h);
         return PlacePod(req);
       }},
  };
  for (const Case& c : cases) {
    const grpc::Status s = c.call();
    EXPECT_FALSE(s.ok()) << c.field;
    EXPECT_NE(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << c.field;
    EXPECT_LT(s.error_message().size(), 400u) << c.field << ": " << s.error_message().size();
    EXPECT_LT(s.error_details().size(), 400u) << c.field << ": " << s.error_details().size();
    EXPECT_FALSE(HasControlBytes(s.error_message())) << c.field << ": " << s.error_message();
  }
  // Nothing of it was held.
  EXPECT_TRUE(ledger_.ListHoldings("").empty());

  // A device's id in a Hold's device list is not the caller's to set: the
  // ledger picks devices by kind and index, and the answer carries the
  // ledger's id, never the caller's.
  v1::HoldRequest req = PodHold();
  v1::HeldDevice* d = req.mutable_devices()->add_devices();
  d->set_kind(v1::DEVICE_KIND_GPU);
  d->set_index(0);
  d->set_id(h);
  grpc::ClientContext ctx;
  Bound(&ctx);
  v1::HoldResponse resp;
  const grpc::Status s = stub_->Hold(&ctx, req, &resp);
  EXPECT_LT(s.error_message().size(), 400u);
  for (const v1::HeldDevice& held : resp.holding().devices()) {
    EXPECT_LT(held.id().size(), 400u);
  }
}

}  // namespace
}  // namespace duet
