// A node's GKE block in Slurm (docs/gangs.md 4, docs/slurm-versions.md),
// against a real slurmctld + slurmds (label: slurm). On every version the
// block and sub-block are node features a job can ask for; where libslurm is
// 25.05 or newer the cluster runs topology/block with blocks b1 and b2, and a
// node created with block b1 is also in Slurm's block b1.

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bridge/slurm/libslurm_client.h"
#include "bridge/slurm/slurm_sync.h"
#include "common/slurm/slurm_compat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/slurm/slurm_cluster_fixture.h"
#include "tests/slurm/test_node_spec.h"

namespace duet {
namespace {

using ::duet::testing::CmdResult;
using ::duet::testing::TestSlurmCluster;
using ::testing::Contains;

constexpr bool kTopology = slurm_compat::kNodeTopology;

TestSlurmCluster::Options ClusterOptions() {
  TestSlurmCluster::Options o;
  if (kTopology) {
    // Blocks without nodes: dynamic nodes join them at creation. Empty
    // blocks need BlockSizes (the base block's node count).
    o.extra_conf = "TopologyPlugin=topology/block";
    o.topology_conf = "BlockName=b1\nBlockName=b2\nBlockSizes=1";
  }
  return o;
}

class SlurmTopologyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = TestSlurmCluster::Get(ClusterOptions());
    ASSERT_TRUE(cluster_->ok());
    client_ = std::make_unique<LibSlurmClient>();
  }

  // Creates the node as SlurmSync does (SlurmNodeFor, block_topology
  // "default", topology.conf's name) and starts its slurmd.
  void AddNode(const std::string& name, int idx, const std::string& block,
               const std::string& subblock) {
    NodeSpec spec = duet::testing::TestNodeSpec(name, idx, 8);
    spec.labels["cloud.google.com/gce-topology-block"] = block;
    if (!subblock.empty()) spec.labels["cloud.google.com/gce-topology-subblock"] = subblock;
    NodeView view;
    for (DeviceSpec& d : spec.devices) {
      DeviceState s;
      s.spec = d;
      view.devices.push_back(std::move(s));
    }
    spec.devices.clear();
    view.spec = spec;
    SlurmSyncOptions options;
    options.block_topology = "default";
    const SlurmNodeConfig c = SlurmNodeFor(view, options);
    EXPECT_EQ(c.topology, "default:" + block);
    ASSERT_TRUE(client_->CreateNode(c).ok()) << cluster_->Log("slurmctld.log");
    cluster_->StartSlurmd(name, idx, 8, 16000, 8, duet::testing::kTestGpuModel);
    ASSERT_TRUE(cluster_->WaitNodeState(name, "IDLE")) << cluster_->Log("slurmctld.log");
  }

  // The node a job runs on, once RUNNING.
  std::string JobNode(uint32_t job) {
    if (!cluster_->WaitJobState(job, "RUNNING")) return "";
    CmdResult r = cluster_->Cli(absl::StrCat("squeue -h -j ", job, " -o %N"));
    return std::string(absl::StripAsciiWhitespace(r.out));
  }

  TestSlurmCluster* cluster_ = nullptr;
  std::unique_ptr<LibSlurmClient> client_;
};

TEST_F(SlurmTopologyTest, CreatedNodeCarriesItsBlockAndJobsAskForIt) {
  AddNode("tp-a", 51, "b1", "s1");
  AddNode("tp-b", 52, "b2", "s2");

  absl::StatusOr<std::optional<SlurmNodeInfo>> a = client_->GetNode("tp-a");
  ASSERT_TRUE(a.ok() && a->has_value()) << a.status();
  EXPECT_THAT((*a)->features, Contains("block-b1"));
  EXPECT_THAT((*a)->features, Contains("subblock-s1"));
  CmdResult show = cluster_->Cli("scontrol show node tp-a");
  if (kTopology) {
    EXPECT_EQ((*a)->topology, "default:b1");
    EXPECT_TRUE(absl::StrContains(show.out, "Topology=default:b1")) << show.out;
    // Slurm's block b1 now holds the node.
    CmdResult topo = cluster_->Cli("scontrol show topology");
    bool in_b1 = false;
    for (absl::string_view line : absl::StrSplit(topo.out, '\n')) {
      if (absl::StartsWith(line, "BlockName=b1 ") && absl::StrContains(line, "Nodes=tp-a")) {
        in_b1 = true;
      }
    }
    EXPECT_TRUE(in_b1) << topo.out;
  } else {
    // Before 25.05 node lines know no Topology=: the line carries none.
    EXPECT_EQ((*a)->topology, "");
    SlurmNodeConfig line;
    line.name = "x";
    line.topology = "default:b1";
    EXPECT_FALSE(absl::StrContains(SlurmNodeLine(line), "Topology="));
  }

  // A job that asks for a block by feature lands on that block's node.
  for (const auto& [block, node] : {std::pair<std::string, std::string>{"b1", "tp-a"},
                                    {"b2", "tp-b"}}) {
    const uint32_t job = cluster_->Sbatch(
        absl::StrCat("-N1 --constraint=block-", block, " --wrap 'sleep 30'"));
    ASSERT_NE(job, 0u);
    EXPECT_EQ(JobNode(job), node) << "block " << block;
    cluster_->Cli(absl::StrCat("scancel ", job));
  }
}

TEST_F(SlurmTopologyTest, ABlockSlurmDoesNotNameStillGetsTheNodeCreated) {
  // b9 is in no topology.conf: 25.11 refuses the node line, and the client
  // creates the node without Topology=; earlier versions have no Topology=
  // or take it without a block. The feature names the block everywhere.
  AddNode("tp-c", 53, "b9", "");
  absl::StatusOr<std::optional<SlurmNodeInfo>> c = client_->GetNode("tp-c");
  ASSERT_TRUE(c.ok() && c->has_value()) << c.status();
  EXPECT_THAT((*c)->features, Contains("block-b9"));
  if (!kTopology) {
    EXPECT_EQ((*c)->topology, "");
  }
}

}  // namespace
}  // namespace duet
