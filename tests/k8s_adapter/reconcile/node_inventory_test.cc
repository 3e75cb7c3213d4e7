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
  EXPECT_EQ(d.topology.host, "0f1e2d3c4b5a69788796a5b4c3d2e1f0");
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

// DRA pools (docs/dra.md): ResourceSlices in fake_dra_driver.py's shapes
// (testdata/make_dra_slices.py writes the fixture).
nlohmann::json DraSlices(const std::string& which) { return Golden("dra_resource_slices.json").at(which); }

std::string Uuid(const nlohmann::json& slice, int device) {
  return slice["spec"]["devices"][device]["attributes"]["uuid"]["string"].get<std::string>();
}

TEST(DraSliceTest, WholeGpusAtTheirMinorsWithUuids) {
  nlohmann::json obj = DraSlices("nvidia");
  auto s = DraSliceFromObject(obj);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->driver, "gpu.nvidia.com");
  EXPECT_EQ(s->node, "dra-gpu-1");
  EXPECT_EQ(s->pool, "dra-gpu-1");
  EXPECT_EQ(s->generation, 1);
  EXPECT_EQ(s->slice_count, 1);
  ASSERT_EQ(s->gpus.size(), 8u);
  EXPECT_EQ(s->gpus.at(3), Uuid(obj, 3));
  EXPECT_TRUE(s->tpus.empty());
  // MIG and vfio siblings are not whole GPUs.
  auto mig = DraSliceFromObject(DraSlices("nvidia_mig_vfio"));
  ASSERT_TRUE(mig.ok()) << mig.status();
  std::vector<uint32_t> minors;
  for (const auto& [m, uuid] : mig->gpus) minors.push_back(m);
  EXPECT_THAT(minors, ElementsAre(0u, 1u));
  // The qualified attribute name is read too.
  nlohmann::json& attrs = obj["spec"]["devices"][0]["attributes"];
  attrs["gpu.nvidia.com/uuid"] = attrs["uuid"];
  attrs.erase("uuid");
  EXPECT_EQ(DraSliceFromObject(obj)->gpus.at(0), Uuid(DraSlices("nvidia"), 0));
}

TEST(DraSliceTest, TpuChipsAndMalformedSlices) {
  auto s = DraSliceFromObject(DraSlices("tpu"));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->tpus, ElementsAre(0u, 1u, 2u, 3u));
  EXPECT_TRUE(s->gpus.empty());
  nlohmann::json bad = DraSlices("tpu");
  bad["spec"]["pool"].erase("name");
  EXPECT_EQ(DraSliceFromObject(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = DraSlices("tpu");
  bad["spec"]["pool"]["resourceSliceCount"] = 0;
  EXPECT_THAT(DraSliceFromObject(bad).status().message(), HasSubstr("resourceSliceCount"));
}

TEST(DraSliceTest, HighestGenerationOfCompletePoolsOnly) {
  DraSlice old_gen{"gpu.nvidia.com", "n", "n", 1, 1, {{0, "a"}, {1, "b"}, {2, "c"}}, {}};
  DraSlice new_gen{"gpu.nvidia.com", "n", "n", 2, 1, {{0, "a"}}, {}};
  DraNodeDevices d;
  MergeDraSlices({&old_gen, &new_gen}, &d);
  EXPECT_EQ(d.gpus, (std::map<uint32_t, std::string>{{0, "a"}}));
  // Generation 3 announces two slices; one is there: nothing known yet.
  DraSlice half{"gpu.nvidia.com", "n", "n", 3, 2, {{0, "x"}}, {}};
  DraSlice tpu{"tpu.google.com", "n", "n", 1, 1, {}, {0, 1}};
  d = DraNodeDevices{};
  MergeDraSlices({&old_gen, &new_gen, &half, &tpu}, &d);
  EXPECT_TRUE(d.gpus.empty());
  EXPECT_THAT(d.tpus, ElementsAre(0u, 1u));  // another driver's pool is complete
  DraSlice other_half{"gpu.nvidia.com", "n", "n", 3, 2, {{1, "y"}}, {}};
  d = DraNodeDevices{};
  MergeDraSlices({&half, &other_half}, &d);
  EXPECT_EQ(d.gpus, (std::map<uint32_t, std::string>{{0, "x"}, {1, "y"}}));
}

TEST(NodeSpecFromNodeTest, DraGpusReplaceCapacity) {
  nlohmann::json n = Golden("gke_a3_h100_node.json");
  n["status"]["capacity"].erase("nvidia.com/gpu");
  DraNodeDevices dra;
  dra.gpus_from_dra = true;
  EXPECT_EQ(NodeSpecFromNode(n, dra, nullptr).status().code(), absl::StatusCode::kNotFound);
  dra.gpus = {{0, "GPU-a"}, {1, "GPU-b"}, {2, ""}};
  std::vector<std::string> warnings;
  auto spec = NodeSpecFromNode(n, dra, &warnings);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(warnings.empty());
  ASSERT_EQ(spec->devices.size(), 3u);
  EXPECT_EQ(spec->devices[1].index, 1u);
  EXPECT_EQ(spec->devices[1].id, "GPU-b");
  EXPECT_EQ(spec->devices[1].model, "nvidia-h100-80gb");
  EXPECT_EQ(spec->devices[2].id, "gke-duet-shared-h100-5f2a9c1e-x7kq/gpu2");  // no uuid published
  // Capacity beside the slices: the slices win, with a warning.
  n["status"]["capacity"]["nvidia.com/gpu"] = "8";
  spec = NodeSpecFromNode(n, dra, &warnings);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->devices.size(), 3u);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("nvidia.com/gpu capacity 8 beside gpu.nvidia.com"));
  // Minors with a gap: refused (Slurm's GRES indices are 0..n-1).
  dra.gpus.erase(1);
  auto gap = NodeSpecFromNode(n, dra, nullptr);
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(gap.status().message(), HasSubstr("GPU minors [0,2]"));
}

TEST(NodeSpecFromNodeTest, DraTpuChips) {
  nlohmann::json n = Golden("gke_ct5lp_tpu_node.json");
  n["status"]["capacity"].erase("google.com/tpu");
  DraNodeDevices dra;
  dra.tpus_from_dra = true;
  dra.tpus = {0, 1, 2, 3};
  auto spec = NodeSpecFromNode(n, dra, nullptr);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->devices.size(), 4u);
  EXPECT_EQ(spec->devices[3].kind, DeviceKind::kTpu);
  EXPECT_EQ(spec->devices[3].index, 3u);
  EXPECT_EQ(spec->devices[3].id, "gke-duet-shared-v5e-2b7d41aa-9m3f/tpu3");
  EXPECT_EQ(spec->devices[3].topology.tpu_host_bounds, "2x2");
  // A GPU driver that owns nothing here leaves TPUs alone; capacity without
  // the flag is still read.
  n = Golden("gke_ct5lp_tpu_node.json");
  DraNodeDevices gpus_only;
  gpus_only.gpus_from_dra = true;
  EXPECT_EQ(NodeSpecFromNode(n, gpus_only, nullptr)->devices.size(), 4u);
}

}  // namespace
}  // namespace k8s
}  // namespace duet
