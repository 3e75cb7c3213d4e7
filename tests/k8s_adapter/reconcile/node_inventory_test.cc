#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "k8s_adapter/reconcile/node_inventory.h"

namespace duet {
namespace k8s {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

nlohmann::json Golden(const std::string& name) {
  std::ifstream in(std::string(DUET_K8S_TESTDATA) + "/" + name);
  std::ostringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

void SetReady(nlohmann::json* node, const char* status) {
  for (auto& c : (*node)["status"]["conditions"]) {
    if (c["type"] == "Ready") c["status"] = status;
  }
}

TEST(NodeSpecFromNodeTest, GkeA3H100) {
  auto spec = NodeSpecFromNode(Golden("gke_a3_h100_node.json"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "gke-duet-shared-h100-5f2a9c1e-x7kq");
  EXPECT_EQ(spec->cpus, 207u);  // allocatable 207690m
  EXPECT_EQ(spec->memory_mib, 1857318648u / 1024);
  EXPECT_EQ(spec->pool, "shared-h100");
  EXPECT_EQ(spec->zone, "us-central1-a");
  EXPECT_EQ(spec->state, NodeState::kReady);
  EXPECT_EQ(spec->labels.at("node.kubernetes.io/instance-type"), "a3-highgpu-8g");
  ASSERT_EQ(spec->devices.size(), 8u);
  const DeviceSpec& d = spec->devices[7];
  EXPECT_EQ(d.kind, DeviceKind::kGpu);
  EXPECT_EQ(d.index, 7u);
  EXPECT_EQ(d.id, "gke-duet-shared-h100-5f2a9c1e-x7kq/gpu7");
  EXPECT_EQ(d.model, "nvidia-h100-80gb");
  EXPECT_EQ(d.capacity_milli, kWholeDevice);
  EXPECT_EQ(d.topology.block, "a1b2c3d4e5f60718293a4b5c6d7e8f90");
  EXPECT_EQ(d.topology.subblock, "9a8b7c6d5e4f30211203f4e5d6c7b8a9");
  EXPECT_EQ(d.topology.nvlink_domain, "");
}

TEST(NodeSpecFromNodeTest, GpuCliqueIsTheNvlinkDomain) {
  nlohmann::json n = Golden("gke_a3_h100_node.json");
  n["metadata"]["labels"]["nvidia.com/gpu.clique"] = "cluster-uuid.1";
  auto spec = NodeSpecFromNode(n);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->devices[0].topology.nvlink_domain, "cluster-uuid.1");
}

// slurm.nodes: adopt reads Slinky's hostname-override annotation; it is the
// one annotation the inventory keeps (beside the labels).
TEST(NodeSpecFromNodeTest, KeepsSlinkysHostnameOverrideOnly) {
  nlohmann::json n = Golden("gke_a3_h100_node.json");
  n["metadata"]["annotations"]["nodeset.slinky.slurm.net/hostname-override"] = "slurm-7";
  n["metadata"]["annotations"]["node.alpha.kubernetes.io/ttl"] = "0";
  auto spec = NodeSpecFromNode(n);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->labels.at("nodeset.slinky.slurm.net/hostname-override"), "slurm-7");
  EXPECT_EQ(spec->labels.count("node.alpha.kubernetes.io/ttl"), 0u);
}

TEST(NodeSpecFromNodeTest, GkeCt5lpTpuV5e) {
  auto spec = NodeSpecFromNode(Golden("gke_ct5lp_tpu_node.json"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->cpus, 111u);
  EXPECT_EQ(spec->pool, "shared-v5e");
  EXPECT_EQ(spec->zone, "us-west4-a");
  ASSERT_EQ(spec->devices.size(), 4u);
  const DeviceSpec& d = spec->devices[3];
  EXPECT_EQ(d.kind, DeviceKind::kTpu);
  EXPECT_EQ(d.id, "gke-duet-shared-v5e-2b7d41aa-9m3f/tpu3");
  EXPECT_EQ(d.model, "tpu-v5-lite-podslice");
  EXPECT_EQ(d.topology.tpu_host_bounds, "2x2");
  EXPECT_EQ(d.topology.tpu_topology, "2x2");
  EXPECT_THAT(d.topology.tpu_subslice_shapes, ElementsAre("1x1", "2x2"));
}

TEST(NodeSpecFromNodeTest, MultiHostTpuSliceHasNoSubslices) {
  nlohmann::json n = Golden("gke_ct5lp_tpu_node.json");
  n["metadata"]["labels"]["cloud.google.com/gke-tpu-topology"] = "4x4";
  auto spec = NodeSpecFromNode(n);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->devices[0].topology.tpu_topology, "4x4");
  EXPECT_EQ(spec->devices[0].topology.tpu_host_bounds, "2x2");
  EXPECT_TRUE(spec->devices[0].topology.tpu_subslice_shapes.empty());
}

TEST(NodeSpecFromNodeTest, CordonAndReadiness) {
  nlohmann::json n = Golden("gke_a3_h100_node.json");
  n["spec"]["unschedulable"] = true;
  EXPECT_EQ(NodeSpecFromNode(n)->state, NodeState::kCordoned);
  SetReady(&n, "Unknown");  // NotReady wins over cordoned
  EXPECT_EQ(NodeSpecFromNode(n)->state, NodeState::kNotReady);
  n["spec"].erase("unschedulable");
  SetReady(&n, "False");
  EXPECT_EQ(NodeSpecFromNode(n)->state, NodeState::kNotReady);
  n["status"].erase("conditions");
  EXPECT_EQ(NodeSpecFromNode(n)->state, NodeState::kNotReady);
  nlohmann::json d = Golden("gke_a3_h100_node.json");
  d["metadata"]["deletionTimestamp"] = "2026-12-02T10:00:00Z";
  EXPECT_EQ(NodeSpecFromNode(d)->state, NodeState::kCordoned);
}

TEST(NodeSpecFromNodeTest, NoAcceleratorsIsNotFound) {
  nlohmann::json n = Golden("gke_a3_h100_node.json");
  n["status"]["capacity"].erase("nvidia.com/gpu");
  EXPECT_EQ(NodeSpecFromNode(n).status().code(), absl::StatusCode::kNotFound);
  n["status"]["capacity"]["nvidia.com/gpu"] = "0";  // driver not installed yet
  EXPECT_EQ(NodeSpecFromNode(n).status().code(), absl::StatusCode::kNotFound);
}

TEST(NodeSpecFromNodeTest, MalformedIsInvalidArgumentNamingTheField) {
  nlohmann::json n = Golden("gke_a3_h100_node.json");
  n["status"]["capacity"]["nvidia.com/gpu"] = "eight";
  auto s = NodeSpecFromNode(n).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("status.capacity[nvidia.com/gpu]"));
  n["status"]["capacity"]["nvidia.com/gpu"] = 8;
  EXPECT_EQ(NodeSpecFromNode(n).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NodeSpecFromNode(nlohmann::json::object()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NodeSpecFromNode(nlohmann::json{{"metadata", {{"name", 7}}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  n["status"]["capacity"]["nvidia.com/gpu"] = "100000";
  EXPECT_EQ(NodeSpecFromNode(n).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace k8s
}  // namespace duet
