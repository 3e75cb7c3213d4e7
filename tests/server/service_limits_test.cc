// LedgerService's limits at the gRPC boundary, over real gRPC: what a caller
// who reaches the port (no identity needed) could do before. Read answers
// are bounded (ListNodes with 200,000 copies of one name built a 90 MB
// answer), one peer cannot take every WatchNodes slot, names and amounts are
// checked before anything is looked up, authorized or journaled, and errors
// quote bad input only in part.

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bridge/api/validate.h"
#include "bridge/server/durability.h"
#include "bridge/server/service.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "proto/duet/v1/error_reason.h"
#include "tests/fakes/wait.h"

namespace duet {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;


std::map<std::string, std::string> InfoMetadata(const grpc::Status& s) {
  google::rpc::ErrorInfo info;
  if (!v1::ErrorInfoOf(s, &info)) return {};
  return {info.metadata().begin(), info.metadata().end()};
}

// A ledger of two shared nodes served on loopback TCP and on a unix socket:
// two callers the service can tell apart (peer 127.0.0.1 and the socket).
class ServiceLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"gke-a", "gke-b"}) {
      NodeSpec n;
      n.name = name;
      n.cpus = 16;
      n.memory_mib = 65536;
      for (uint32_t i = 0; i < 2; ++i) {
        DeviceSpec d;
        d.index = i;
        n.devices.push_back(d);
      }
      ASSERT_TRUE(ledger_.UpsertNode(n).ok());
    }
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    // Before the server goes: the call threads drain its last events.
    if (service_ != nullptr) service_->StopCallThreads();
    if (!socket_.empty()) ::unlink(socket_.c_str());
  }

  void Start(LedgerService::Options options = {}) {
    service_ = std::make_unique<LedgerService>(&ledger_, durability_.get(), &hub_, nullptr, options);
    socket_ = ::testing::TempDir() + "duet-service-limits-" + std::to_string(::getpid()) + ".sock";
    ::unlink(socket_.c_str());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
    service_->RegisterWith(&builder);
    server_ = builder.BuildAndStart();
    if (server_ != nullptr) service_->StartCallThreads();
    ASSERT_NE(server_, nullptr);
    tcp_ = Stub(Channel("127.0.0.1:" + std::to_string(port_)));
    unix_ = Stub(Channel("unix:" + socket_));
  }
  // A new connection each time; answers of any size are received (so that
  // the test sees an unbounded answer, not the client's 4 MiB limit).
  static std::shared_ptr<grpc::Channel> Channel(const std::string& target) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetInt("grpc.use_local_subchannel_pool", 1);  // no connection shared between channels
    return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  }
  static std::unique_ptr<v1::Ledger::Stub> Stub(std::shared_ptr<grpc::Channel> channel) {
    return v1::Ledger::NewStub(std::move(channel));
  }

  grpc::Status ListNodes(const v1::ListNodesRequest& req, v1::ListNodesResponse* resp) {
    grpc::ClientContext ctx;
    return tcp_->ListNodes(&ctx, req, resp);
  }
  grpc::Status Hold(const v1::HoldRequest& req) {
    grpc::ClientContext ctx;
    v1::HoldResponse resp;
    return tcp_->Hold(&ctx, req, &resp);
  }
  grpc::Status PlacePod(const v1::PlacePodRequest& req) {
    grpc::ClientContext ctx;
    v1::Holding resp;
    return tcp_->PlacePod(&ctx, req, &resp);
  }
  v1::ListHoldingsResponse Holdings() {
    grpc::ClientContext ctx;
    v1::ListHoldingsResponse resp;
    EXPECT_TRUE(tcp_->ListHoldings(&ctx, v1::ListHoldingsRequest(), &resp).ok());
    return resp;
  }
  static v1::HoldRequest PodHold(const std::string& node, const std::string& ns,
                                 const std::string& name, const std::string& uid = "uid-1") {
    v1::HoldRequest req;
    req.set_node(node);
    req.mutable_owner()->mutable_pod()->set_uid(uid);
    req.mutable_owner()->mutable_pod()->set_namespace_(ns);
    req.mutable_owner()->mutable_pod()->set_name(name);
    req.mutable_count()->set_kind(v1::DEVICE_KIND_GPU);
    req.mutable_count()->set_count(1);
    return req;
  }
  static v1::PlacePodRequest Place(const std::string& uid, uint64_t memory_mib) {
    v1::PlacePodRequest req;
    req.mutable_pod()->set_uid(uid);
    req.mutable_pod()->set_namespace_("ml");
    req.mutable_pod()->set_name("p");
    req.set_node("gke-a");
    req.set_gpus(1);
    req.set_cpus(1);
    req.set_memory_mib(memory_mib);
    return req;
  }

  // A context whose stream ends by itself: a stream that should have been
  // refused but was not fails the test instead of hanging it.
  static std::unique_ptr<grpc::ClientContext> Bounded() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return ctx;
  }
  // A WatchNodes stream of gke-a on `stub`, open once its initial state came.
  struct Watch {
    std::unique_ptr<grpc::ClientContext> ctx = Bounded();
    std::unique_ptr<grpc::ClientReader<v1::NodeEvent>> reader;
    bool open = false;
    // The stream's status: the server's for a refused stream (cancelling
    // one that already ended could race its status and read CANCELLED).
    grpc::Status Close() {
      if (open) ctx->TryCancel();
      return reader->Finish();
    }
  };
  static Watch OpenWatch(v1::Ledger::Stub* stub) {
    Watch w;
    v1::WatchNodesRequest req;
    req.add_names("gke-a");
    w.reader = stub->WatchNodes(w.ctx.get(), req);
    v1::NodeEvent ev;
    w.open = w.reader->Read(&ev) && ev.type() == v1::NodeEvent::TYPE_INITIAL;
    return w;
  }

  Ledger ledger_;
  std::unique_ptr<Durability> durability_ = NewImmediateDurability();
  WatchHub hub_;
  std::unique_ptr<LedgerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string socket_;
  int port_ = 0;
  std::unique_ptr<v1::Ledger::Stub> tcp_;
  std::unique_ptr<v1::Ledger::Stub> unix_;
};

// ---------------------------------------------------------------------------
// 1. Read answers are bounded by the ledger, not by the request.

TEST_F(ServiceLimitsTest, TwoHundredThousandCopiesOfOneNameAreRefusedWithNoAnswer) {
  Start();
  v1::ListNodesRequest req;
  for (int i = 0; i < 200000; ++i) req.add_names("gke-a");
  v1::ListNodesResponse resp;
  grpc::Status s = ListNodes(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("at most 5000"));
  EXPECT_EQ(resp.ByteSizeLong(), 0u);
}

TEST_F(ServiceLimitsTest, ANameListedTwiceIsRefusedEvenUnderTheCap) {
  Start();
  v1::ListNodesRequest req;
  for (size_t i = 0; i < kMaxNamesPerRequest; ++i) req.add_names(i % 2 ? "gke-a" : "gke-b");
  v1::ListNodesResponse resp;
  grpc::Status s = ListNodes(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("\"gke-b\" is listed twice"));
  EXPECT_EQ(resp.nodes_size(), 0);
  EXPECT_EQ(v1::ReasonOf(s), "");  // malformed: no reason (proto/README.md)

  // Distinct names are answered once each.
  v1::ListNodesRequest two;
  two.add_names("gke-b");
  two.add_names("gke-a");
  v1::ListNodesResponse nodes;
  ASSERT_TRUE(ListNodes(two, &nodes).ok());
  ASSERT_EQ(nodes.nodes_size(), 2);
  EXPECT_EQ(nodes.nodes(0).name(), "gke-b");
}

TEST_F(ServiceLimitsTest, MoreNamesThanTheCapAreRefusedAndTheCapItselfIsNot) {
  Start();
  v1::ListNodesRequest req;
  for (size_t i = 0; i < kMaxNamesPerRequest; ++i) req.add_names("n-" + std::to_string(i));
  v1::ListNodesResponse resp;
  // At the cap the names are looked up (and none of these exists).
  grpc::Status at_cap = ListNodes(req, &resp);
  EXPECT_EQ(at_cap.error_code(), grpc::StatusCode::NOT_FOUND) << at_cap.error_message();
  EXPECT_EQ(v1::ReasonOf(at_cap), v1::reason::kNodeNotShared);

  req.add_names("gke-a");
  grpc::Status over = ListNodes(req, &resp);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << over.error_message();
  EXPECT_THAT(over.error_message(), HasSubstr("5001 names; at most 5000"));

  // WatchNodes' names follow the same rules.
  std::unique_ptr<grpc::ClientContext> ctx = Bounded();
  v1::WatchNodesRequest watch;
  watch.mutable_names()->CopyFrom(req.names());
  auto reader = tcp_->WatchNodes(ctx.get(), watch);
  v1::NodeEvent ev;
  if (reader->Read(&ev)) {
    ADD_FAILURE() << "a stream of 5001 names was not refused";
    ctx->TryCancel();
  }
  grpc::Status w = reader->Finish();
  EXPECT_EQ(w.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << w.error_message();
  EXPECT_THAT(w.error_message(), HasSubstr("at most 5000"));

  std::unique_ptr<grpc::ClientContext> ctx2 = Bounded();
  v1::WatchNodesRequest dup;
  dup.add_names("gke-a");
  dup.add_names("gke-a");
  auto reader2 = tcp_->WatchNodes(ctx2.get(), dup);
  if (reader2->Read(&ev)) {
    ADD_FAILURE() << "a stream naming gke-a twice was not refused";
    ctx2->TryCancel();
  }
  grpc::Status d = reader2->Finish();
  EXPECT_EQ(d.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << d.error_message();
  EXPECT_THAT(d.error_message(), HasSubstr("listed twice"));
}

// ---------------------------------------------------------------------------
// 2. Watch slots: per caller as well as in total.

TEST_F(ServiceLimitsTest, OneCallerCannotTakeEveryWatchSlot) {
  Start();  // the defaults: 16 per caller, 256 in all
  const int cap = LedgerService::Options().max_watch_streams_per_caller;
  ASSERT_EQ(cap, 16);
  // Two connections from one address are one caller (as in the report).
  std::unique_ptr<v1::Ledger::Stub> tcp2 = Stub(Channel("127.0.0.1:" + std::to_string(port_)));
  std::vector<Watch> mine;
  for (int i = 0; i < cap; ++i) {
    mine.push_back(OpenWatch(i % 2 ? tcp_.get() : tcp2.get()));
    ASSERT_TRUE(mine.back().open) << "stream " << i;
  }
  Watch refused = OpenWatch(tcp2.get());
  EXPECT_FALSE(refused.open);
  grpc::Status s = refused.Close();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_EQ(v1::ReasonOf(s), v1::reason::kTooManyWatches);
  EXPECT_EQ(InfoMetadata(s)["scope"], "caller");
  EXPECT_EQ(InfoMetadata(s)["limit"], "16");

  // Another caller (the unix socket) still gets a stream...
  Watch other = OpenWatch(unix_.get());
  EXPECT_TRUE(other.open);
  // ...and a closed stream gives its slot back.
  mine.back().Close();
  mine.pop_back();
  // The slot comes back when OnDone runs, on a gRPC thread: ask until it has.
  Watch again;
  EXPECT_TRUE(fakes::WaitFor([&] {
    if (again.reader != nullptr) {
      again.reader->Finish();
      again.reader.reset();  // before its context goes
    }
    again = OpenWatch(tcp_.get());
    return again.open;
  }, absl::Seconds(10), "a closed stream's slot to come back"));
  again.Close();
  other.Close();
  for (Watch& w : mine) w.Close();
}

TEST_F(ServiceLimitsTest, TheTotalLimitStaysAndSaysSo) {
  LedgerService::Options o;
  o.max_watch_streams = 2;
  Start(o);
  Watch a = OpenWatch(tcp_.get());
  Watch b = OpenWatch(tcp_.get());
  ASSERT_TRUE(a.open);
  ASSERT_TRUE(b.open);
  Watch c = OpenWatch(unix_.get());
  EXPECT_FALSE(c.open);
  grpc::Status s = c.Close();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(v1::ReasonOf(s), v1::reason::kTooManyWatches);
  EXPECT_EQ(InfoMetadata(s)["scope"], "total");
  EXPECT_EQ(InfoMetadata(s)["limit"], "2");
  a.Close();
  b.Close();
}

// A watcher that reads nothing while the node changes thousands of times
// falls more than max_watch_queue events behind: it is told TYPE_RESYNC and
// then gets the node as it is now, and the stream goes on. The state after a
// resync is never older than what the stream had already sent (it was, in
// about one run in three, when a write ended on another thread while the
// state was being read).
TEST_F(ServiceLimitsTest, AWatcherThatFallsBehindIsToldToResyncThenGetsTheStateNow) {
  LedgerService::Options o;
  o.max_watch_queue = 4;
  Start(o);
  ledger_.AddListener(&hub_);
  struct Unlisten {
    Ledger* ledger;
    WatchHub* hub;
    ~Unlisten() { ledger->RemoveListener(hub); }
  } unlisten{&ledger_, &hub_};
  Watch w = OpenWatch(tcp_.get());
  ASSERT_TRUE(w.open);
  // Changes far faster than one write at a time sends them, and more than
  // the connection's flow-control windows hold: the queue overflows.
  HoldRequest h;
  h.node = "gke-a";
  h.owner = Owner::Pod("uid-9", "ml", "train");
  h.devices = {{DeviceKind::kGpu, 0, 0}};
  for (int i = 0; i < 20000; ++i) {
    ASSERT_TRUE(ledger_.Hold(h).ok());
    ASSERT_TRUE(ledger_.Release("gke-a", h.owner).ok());
  }
  const uint64_t now = ledger_.GetNode("gke-a")->generation;
  // Read up to the state as it is now. Each resync is followed by the node
  // as it was then, never older than what came before it.
  v1::NodeEvent ev;
  int read = 0;
  int resyncs = 0;
  uint64_t last = 0;
  bool after_resync = false;
  std::deque<std::string> recent;
  while (last != now && w.reader->Read(&ev)) {
    ++read;
    recent.push_back(absl::StrCat(ev.type(), ":", ev.node().generation()));
    if (recent.size() > 12) recent.pop_front();
    if (ev.type() == v1::NodeEvent::TYPE_RESYNC) {
      ++resyncs;
      after_resync = true;
      continue;
    }
    if (after_resync) {
      EXPECT_EQ(ev.type(), v1::NodeEvent::TYPE_UPDATED);
    }
    after_resync = false;
    EXPECT_EQ(ev.node().name(), "gke-a");
    EXPECT_GE(ev.node().generation(), last)
        << "event " << read << "; the last (type:generation): " << absl::StrJoin(recent, " ");
    last = ev.node().generation();
  }
  EXPECT_EQ(last, now);
  EXPECT_GT(resyncs, 0);
  EXPECT_LT(read, 40000) << "every change was sent";
  // Still a live stream: the next change arrives.
  ASSERT_TRUE(ledger_.Hold(h).ok());
  ASSERT_TRUE(w.reader->Read(&ev));
  EXPECT_EQ(ev.type(), v1::NodeEvent::TYPE_UPDATED);
  EXPECT_GT(ev.node().generation(), now);
  ASSERT_TRUE(ledger_.Release("gke-a", h.owner).ok());
  w.Close();
}

// ---------------------------------------------------------------------------
// 3. Names and amounts are checked before anything is held or journaled.

TEST_F(ServiceLimitsTest, ANamespaceWithAnEscapeSequenceIsRefusedAndNothingIsHeld) {
  Start();
  const std::string before = Holdings().SerializeAsString();
  const std::string evil = "ml\n\x1b[31m";
  grpc::Status hold = Hold(PodHold("gke-a", evil, "train"));
  EXPECT_EQ(hold.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << hold.error_message();
  EXPECT_THAT(hold.error_message(), HasSubstr("pod.namespace: \"ml\\x0a\\x1b[31m\""));
  EXPECT_THAT(hold.error_message(), Not(HasSubstr("\n")));
  EXPECT_EQ(v1::ReasonOf(hold), "");

  v1::PlacePodRequest place = Place("uid-2", 1024);
  place.mutable_pod()->set_namespace_(evil);
  grpc::Status placed = PlacePod(place);
  EXPECT_EQ(placed.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << placed.error_message();

  EXPECT_EQ(ledger_.holding_count(), 0u);
  EXPECT_EQ(Holdings().SerializeAsString(), before);
}

TEST_F(ServiceLimitsTest, PodSideNamesFollowKubernetesRules) {
  Start();
  struct Case {
    v1::HoldRequest req;
    const char* field;
  };
  const Case cases[] = {
      {PodHold("gke-a", "ML", "train"), "pod.namespace"},
      {PodHold("gke-a", std::string(64, 'a'), "train"), "pod.namespace"},
      {PodHold("gke-a", "ml", "train_0"), "pod.name"},
      {PodHold("gke-a", "ml", "-train"), "pod.name"},
      {PodHold("GKE-A", "ml", "train"), "node"},
      {PodHold("gke-a", "ml", "train", "uid\x7f"), "pod.uid"},
      {PodHold("gke-a", "ml", "train", "uid 1"), "pod.uid"},
  };
  for (const Case& c : cases) {
    grpc::Status s = Hold(c.req);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.field << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(std::string(c.field) + ": ")) << c.field;
  }
  EXPECT_EQ(ledger_.holding_count(), 0u);
  // Dotted names and the longest label are fine.
  EXPECT_TRUE(Hold(PodHold("gke-a", std::string(63, 'n'), "web-0.v2")).ok());

  // A Slurm step names its node as slurmd does: on a node the ledger does
  // not share it still learns NODE_NOT_SHARED (its cue to run unregistered).
  v1::HoldRequest step;
  step.set_node("GPU_Node01");
  step.mutable_owner()->mutable_slurm_step()->set_job_id(8);
  step.mutable_devices()->add_devices()->set_kind(v1::DEVICE_KIND_GPU);
  grpc::Status s = Hold(step);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_EQ(v1::ReasonOf(s), v1::reason::kNodeNotShared);
  // ...but not with a control character.
  step.set_node("gpu\r01");
  EXPECT_EQ(Hold(step).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// The DRA lending mode's owners are duet-bridge's own: no caller holds or
// releases a claim or lend owner, whatever its credentials.
TEST_F(ServiceLimitsTest, ClaimAndLendOwnersAreRefusedToCallers) {
  Start();
  HoldRequest lend;
  lend.node = "gke-a";
  lend.owner = Owner::Lend(5, "gke-a");
  lend.devices = {{DeviceKind::kGpu, 0, 0}};
  ASSERT_TRUE(ledger_.Hold(lend).ok());
  const std::string before = Holdings().SerializeAsString();
  v1::HoldRequest claim = PodHold("gke-a", "ml", "train");
  claim.mutable_owner()->mutable_claim()->set_job_id(5);
  claim.mutable_owner()->mutable_claim()->set_uid("claim-uid");
  grpc::Status s = Hold(claim);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("claim owners are duet-bridge's own"));
  v1::ReleaseRequest release;
  release.set_node("gke-a");
  release.mutable_owner()->mutable_lend()->set_job_id(5);
  release.mutable_owner()->mutable_lend()->set_node("gke-a");
  grpc::ClientContext ctx;
  v1::ReleaseResponse resp;
  s = tcp_->Release(&ctx, release, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("lend owners are duet-bridge's own"));
  EXPECT_EQ(Holdings().SerializeAsString(), before);
  EXPECT_TRUE(ledger_.FindHolding("gke-a", lend.owner).has_value());
}

// A gang's slots are duet-bridge's own too (docs/gangs.md): no caller holds
// or releases one.
TEST_F(ServiceLimitsTest, GangSlotOwnersAreRefusedToCallers) {
  Start();
  HoldRequest held;
  held.node = "gke-a";
  held.owner = Owner::GangSlot(5, "podgroup/ml/train", 0);
  held.devices = {{DeviceKind::kGpu, 0, 0}};
  ASSERT_TRUE(ledger_.Hold(held).ok());
  const std::string before = Holdings().SerializeAsString();
  v1::HoldRequest hold = PodHold("gke-a", "ml", "train");
  hold.mutable_owner()->mutable_gang_slot()->set_job_id(5);
  hold.mutable_owner()->mutable_gang_slot()->set_gang("podgroup/ml/train");
  hold.mutable_owner()->mutable_gang_slot()->set_slot(1);
  grpc::Status s = Hold(hold);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("gang_slot owners are duet-bridge's own"));
  v1::ReleaseRequest release;
  release.set_node("gke-a");
  release.mutable_owner()->mutable_gang_slot()->set_job_id(5);
  release.mutable_owner()->mutable_gang_slot()->set_gang("podgroup/ml/train");
  release.mutable_owner()->mutable_gang_slot()->set_slot(0);
  grpc::ClientContext ctx;
  v1::ReleaseResponse resp;
  s = tcp_->Release(&ctx, release, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("gang_slot owners are duet-bridge's own"));
  EXPECT_EQ(Holdings().SerializeAsString(), before);
  EXPECT_TRUE(ledger_.FindHolding("gke-a", held.owner).has_value());
}

TEST_F(ServiceLimitsTest, PlacePodRefusesAmountsBeyondAnyNode) {
  Start();
  grpc::Status s = PlacePod(Place("uid-3", std::numeric_limits<uint64_t>::max()));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("memory_mib"));
  v1::PlacePodRequest cpus = Place("uid-4", 1024);
  cpus.set_cpus(kMaxPodCpus + 1);
  EXPECT_EQ(PlacePod(cpus).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::PlacePodRequest gpus = Place("uid-5", 1024);
  gpus.set_gpus(std::numeric_limits<uint32_t>::max());
  EXPECT_EQ(PlacePod(gpus).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ledger_.holding_count(), 0u);

  // The node had room all along: a sane pod is placed.
  grpc::Status ok = PlacePod(Place("uid-6", 1024));
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(ledger_.holding_count(), 1u);
}

TEST_F(ServiceLimitsTest, AnErrorQuotesAHugeNameOnlyInPart) {
  Start();
  const std::string huge(3 << 20, 'x');
  std::vector<grpc::Status> answers;
  {
    grpc::ClientContext ctx;
    v1::GetNodeRequest req;
    req.set_name(huge);
    v1::Node node;
    answers.push_back(tcp_->GetNode(&ctx, req, &node));
  }
  {
    grpc::ClientContext ctx;
    v1::ListHoldingsRequest req;
    req.set_node(huge);
    v1::ListHoldingsResponse resp;
    answers.push_back(tcp_->ListHoldings(&ctx, req, &resp));
  }
  {
    v1::ListNodesRequest req;
    req.add_names(huge);
    v1::ListNodesResponse resp;
    answers.push_back(ListNodes(req, &resp));
  }
  {
    v1::PlacePodRequest req = Place("uid-7", 1024);
    req.set_node(huge);
    answers.push_back(PlacePod(req));
  }
  for (const grpc::Status& s : answers) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message().size();
    EXPECT_LT(s.error_message().size(), 300u);
    EXPECT_LT(s.error_details().size(), 300u);
    EXPECT_THAT(s.error_message(), HasSubstr("(3145728 bytes)"));
  }
}

TEST(ServiceEchoTest, QuotesABoundedEscapedPrefix) {
  EXPECT_EQ(Echo("gke-a"), "\"gke-a\"");
  EXPECT_EQ(Echo("a\n\"\\"), "\"a\\x0a\\x22\\x5c\"");
  EXPECT_EQ(Echo(std::string(kMaxEchoBytes, 'x')), "\"" + std::string(kMaxEchoBytes, 'x') + "\"");
  EXPECT_EQ(Echo(std::string(100, 'x')),
            "\"" + std::string(kMaxEchoBytes, 'x') + "\"\xE2\x80\xA6(100 bytes)");
  // Escapes count against the bound too.
  EXPECT_LT(Echo(std::string(1000, '\x1b')).size(), kMaxEchoBytes + 32);
}

}  // namespace
}  // namespace duet
