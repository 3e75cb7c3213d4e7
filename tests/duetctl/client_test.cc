#include "duetctl/client.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fakes/ledger_server.h"

namespace duet::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

NodeSpec GpuNode(const std::string& name, int gpus) {
  NodeSpec spec;
  spec.name = name;
  spec.cpus = 8;
  for (int i = 0; i < gpus; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kGpu;
    d.index = i;
    d.id = absl::StrCat("GPU-", name, "-", i);
    d.model = "nvidia-l4";
    spec.devices.push_back(d);
  }
  return spec;
}

HoldRequest HoldDevices(const std::string& node, const Owner& owner,
                        std::vector<uint32_t> indices) {
  HoldRequest r;
  r.node = node;
  r.owner = owner;
  for (uint32_t i : indices) r.devices.push_back({DeviceKind::kGpu, i, kWholeDevice});
  return r;
}

// duet-bridge's service (fakes::LedgerServer) over a ledger of two nodes
// with a Slurm step's and a pod's holdings.
class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.ok());
    address_ = absl::StrCat("127.0.0.1:", server_.port());
    ASSERT_TRUE(ledger_.UpsertNode(GpuNode("gke-a", 4)).ok());
    ASSERT_TRUE(ledger_.UpsertNode(GpuNode("gke-b", 2)).ok());
    ASSERT_TRUE(ledger_.Hold(HoldDevices("gke-a", Owner::SlurmStep(12, 0), {0, 1})).ok());
    ASSERT_TRUE(ledger_.Hold(HoldDevices("gke-b", Owner::Pod("uid-1", "ml", "train"), {1})).ok());
  }

  Client Connect(const std::string& server) {
    ClientOptions options;
    options.server = server;
    options.timeout = absl::Seconds(5);
    auto channel = MakeChannel(options);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return Client(*channel, options);
  }

  Ledger ledger_;
  fakes::LedgerServer server_{&ledger_, "127.0.0.1:0"};
  std::string address_;
};

TEST_F(ClientTest, ListNodesReturnsEveryNodeOrTheNamedOnes) {
  Client client = Connect(address_);
  auto all = client.ListNodes({});
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->nodes_size(), 2);
  EXPECT_EQ(all->nodes(0).name(), "gke-a");
  EXPECT_EQ(all->nodes(0).devices(0).holders(0).owner().slurm_step().job_id(), 12u);

  auto one = client.ListNodes({"gke-b"});
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->nodes_size(), 1);
  EXPECT_EQ(one->nodes(0).name(), "gke-b");
}

TEST_F(ClientTest, ListHoldingsForOneNode) {
  Client client = Connect(address_);
  auto holds = client.ListHoldings("gke-a");
  ASSERT_TRUE(holds.ok()) << holds.status();
  ASSERT_EQ(holds->holdings_size(), 1);
  EXPECT_EQ(holds->holdings(0).node(), "gke-a");
  EXPECT_EQ(holds->holdings(0).devices_size(), 2);
  EXPECT_EQ(holds->holdings(0).devices(1).id(), "GPU-gke-a-1");
}

TEST_F(ClientTest, UnknownNodeSaysHowToListNodes) {
  Client client = Connect(address_);
  auto node = client.GetNode("nope");
  EXPECT_EQ(node.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(node.status().message(), "no node named nope (duetctl nodes lists them)");
}

TEST_F(ClientTest, StandbyIsRecognisedByItsReasonNotItsMessage) {
  // A standby's answer worded unlike duet-bridge's own: the client must
  // recognise it by its reason, not its text.
  fakes::LedgerServer standby("127.0.0.1:0", {"this replica follows; ask the leader"});
  ASSERT_TRUE(standby.ok());
  const std::string address = absl::StrCat("127.0.0.1:", standby.port());
  Client client = Connect(address);
  auto nodes = client.ListNodes({});
  EXPECT_EQ(nodes.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(nodes.status().message()),
              StartsWith(absl::StrCat("duet-bridge at ", address,
                                      " is a standby replica (this replica follows; ask the "
                                      "leader). Point --server or ")));
  // Every read, the workload too (duet-bridge's standby once left GetWorkload
  // unimplemented, and duetctl workload said so instead of "standby").
  auto workload = client.GetWorkload();
  EXPECT_EQ(workload.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(workload.status().message()), HasSubstr("is a standby replica"));
}

TEST_F(ClientTest, UnreachableServerIsNotTakenForAStandby) {
  const std::string server = absl::StrCat("unix:///tmp/duetctl-test-", getpid(), "-none.sock");
  Client client = Connect(server);
  auto nodes = client.ListNodes({});
  EXPECT_EQ(nodes.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(nodes.status().message()), Not(HasSubstr("standby")));
}

TEST_F(ClientTest, UnreachableServerSaysWhereAndWhatToDo) {
  const std::string server = absl::StrCat("unix:///tmp/duetctl-test-", getpid(), "-none.sock");
  Client client = Connect(server);
  auto nodes = client.ListNodes({});
  EXPECT_EQ(nodes.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(nodes.status().message()),
              StartsWith(absl::StrCat("cannot reach duet-bridge at ", server, ": ")));
  EXPECT_THAT(std::string(nodes.status().message()),
              HasSubstr(". Is it running? Set --server or DUET_SERVER."));
}

TEST_F(ClientTest, WatchSeesInitialStateThenAnUpdateAfterAHold) {
  Client client = Connect(address_);
  std::unique_ptr<NodeWatch> watch = client.WatchNodes({"gke-b"});
  v1::NodeEvent event;
  ASSERT_EQ(watch->Next(absl::Seconds(10), &event), NodeWatch::Result::kEvent);
  EXPECT_EQ(event.type(), v1::NodeEvent::TYPE_INITIAL);
  EXPECT_EQ(event.node().name(), "gke-b");
  EXPECT_EQ(event.node().devices(0).holders_size(), 0);

  // A hold on a node not watched is not sent; one on gke-b is.
  ASSERT_TRUE(ledger_.Hold(HoldDevices("gke-a", Owner::SlurmJob(13), {3})).ok());
  ASSERT_TRUE(ledger_.Hold(HoldDevices("gke-b", Owner::SlurmJob(14), {0})).ok());
  ASSERT_EQ(watch->Next(absl::Seconds(10), &event), NodeWatch::Result::kEvent);
  EXPECT_EQ(event.type(), v1::NodeEvent::TYPE_UPDATED);
  EXPECT_EQ(event.node().name(), "gke-b");
  ASSERT_EQ(event.node().devices(0).holders_size(), 1);
  EXPECT_EQ(event.node().devices(0).holders(0).owner().slurm_job().job_id(), 14u);

  EXPECT_EQ(watch->Next(absl::Milliseconds(100), &event), NodeWatch::Result::kTimeout);
}

TEST_F(ClientTest, WatchOfAnUnknownNodeSaysHowToListNodes) {
  Client client = Connect(address_);
  std::unique_ptr<NodeWatch> watch = client.WatchNodes({"nope"});
  v1::NodeEvent event;
  ASSERT_EQ(watch->Next(absl::Seconds(10), &event), NodeWatch::Result::kDone);
  EXPECT_EQ(watch->status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(watch->status().message(), "no node named nope (duetctl nodes lists them)");
}

TEST_F(ClientTest, CancelledWatchEndsWithOk) {
  Client client = Connect(address_);
  std::unique_ptr<NodeWatch> watch = client.WatchNodes({});
  v1::NodeEvent event;
  ASSERT_EQ(watch->Next(absl::Seconds(10), &event), NodeWatch::Result::kEvent);
  watch->Cancel();
  NodeWatch::Result r;
  while ((r = watch->Next(absl::Seconds(10), &event)) == NodeWatch::Result::kEvent) {
  }
  EXPECT_EQ(r, NodeWatch::Result::kDone);
  EXPECT_TRUE(watch->status().ok()) << watch->status();
}

TEST_F(ClientTest, WatchBrokenByTheServerSaysItWasLost) {
  Client client = Connect(address_);
  std::unique_ptr<NodeWatch> watch = client.WatchNodes({});
  v1::NodeEvent event;
  ASSERT_EQ(watch->Next(absl::Seconds(10), &event), NodeWatch::Result::kEvent);
  server_.CloseWatches("duet-bridge is shutting down");  // what duet-bridge's shutdown does
  NodeWatch::Result r;
  while ((r = watch->Next(absl::Seconds(10), &event)) == NodeWatch::Result::kEvent) {
  }
  EXPECT_EQ(r, NodeWatch::Result::kDone);
  EXPECT_EQ(watch->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(watch->status().message(),
            absl::StrCat("lost duet-bridge at ", address_,
                         ": duet-bridge is shutting down. Run the command again once it is back."));
}

TEST_F(ClientTest, WatchOfUnreachableServerEndsWithTheCannotReachMessage) {
  Client client = Connect(absl::StrCat("unix:///tmp/duetctl-test-", getpid(), "-none.sock"));
  std::unique_ptr<NodeWatch> watch = client.WatchNodes({});
  v1::NodeEvent event;
  EXPECT_EQ(watch->Next(absl::Seconds(10), &event), NodeWatch::Result::kDone);
  EXPECT_EQ(watch->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(watch->status().message()), StartsWith("cannot reach duet-bridge at unix:///tmp/"));
}

TEST(MakeChannel, TlsFlagsMustBeConsistent) {
  ClientOptions o;
  o.cert_file = "c.pem";
  auto r = MakeChannel(o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("--cert-file and --key-file"));
  o.key_file = "k.pem";
  r = MakeChannel(o);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("need --ca-file"));
  o.ca_file = "/nonexistent/ca.pem";
  r = MakeChannel(o);
  EXPECT_THAT(std::string(r.status().message()), StartsWith("--ca-file: cannot read /nonexistent/ca.pem"));
}

TEST(ChannelTarget, BarePathIsAUnixSocket) {
  EXPECT_EQ(ChannelTarget("/run/duet/bridge.sock"), "unix:///run/duet/bridge.sock");
  EXPECT_EQ(ChannelTarget("unix:///x.sock"), "unix:///x.sock");
  EXPECT_EQ(ChannelTarget("bridge:8443"), "bridge:8443");
}

}  // namespace
}  // namespace duet::ctl
