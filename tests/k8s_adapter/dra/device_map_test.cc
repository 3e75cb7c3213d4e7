// DeviceMap over ResourceSlices shaped as tests/fakes/fake_dra_driver.py
// publishes them (testdata/dra/*.json, printed by its functions): every
// unmappable reason, pool generations and incomplete pools, TPU hosts, and
// the gauge.

#include "k8s_adapter/dra/device_map.h"

#include <fstream>
#include <sstream>
#include <atomic>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace duet {
namespace k8s_dra {
namespace {

using json = nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::vector<std::string> kDrivers = {"gpu.nvidia.com", "tpu.google.com"};

std::vector<json> Slices(const std::string& file) {
  std::ifstream in(std::string(DUET_K8S_TESTDATA) + "/dra/" + file);
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str());
  return j.get<std::vector<json>>();
}

std::string Uuid(const json& slice, size_t i) {
  return slice["spec"]["devices"][i]["attributes"]["uuid"]["string"];
}

// The inventory of node gpu-node-1 as the ledger would have it: GPU i with
// the uuid the driver publishes for gpu-i.
LedgerInventory GpuNode(const json& slice, int gpus) {
  LedgerInventory inv;
  auto& devs = inv[slice["spec"]["nodeName"]];
  for (int i = 0; i < gpus; ++i) {
    std::string id;
    for (const json& d : slice["spec"]["devices"]) {
      if (d["name"] == "gpu-" + std::to_string(i)) id = d["attributes"]["uuid"]["string"];
    }
    devs.push_back({DeviceKind::kGpu, static_cast<uint32_t>(i), id});
  }
  return inv;
}

std::string Why(const DeviceMap& m, const std::string& node) {
  std::string why;
  EXPECT_FALSE(m.Lendable(node, &why));
  return why;
}

TEST(DeviceMapTest, WholeGpusMapByMinorBothWays) {
  DeviceMap m(kDrivers);
  auto slices = Slices("nvidia_2gpu.json");
  ASSERT_TRUE(m.Update(slices, GpuNode(slices[0], 2)).ok());
  std::string why;
  EXPECT_TRUE(m.Lendable("gpu-node-1", &why)) << why;
  const dra::DraDevice gpu1{"gpu.nvidia.com", "gpu-node-1", "gpu-1"};
  EXPECT_THAT(m.NodeDevices("gpu-node-1"),
              ElementsAre(dra::DraDevice{"gpu.nvidia.com", "gpu-node-1", "gpu-0"}, gpu1));
  ASSERT_TRUE(m.ToLedger(gpu1).has_value());
  EXPECT_EQ(*m.ToLedger(gpu1), (dra::LedgerDevice{"gpu-node-1", DeviceKind::kGpu, 1}));
  EXPECT_EQ(m.ToDra(dra::LedgerDevice{"gpu-node-1", DeviceKind::kGpu, 1}), gpu1);
  EXPECT_FALSE(m.ToDra(dra::LedgerDevice{"gpu-node-1", DeviceKind::kGpu, 2}).has_value());
  EXPECT_FALSE(m.ToLedger({"gpu.nvidia.com", "other", "gpu-1"}).has_value());
  EXPECT_TRUE(m.UnmappableNodes().empty());
}

// Update says which nodes' mapping changed (their DeviceTaintRules need a
// look): a node that became lendable or not, or whose devices differ.
TEST(DeviceMapTest, UpdateNamesTheNodesWhoseMappingChanged) {
  DeviceMap m(kDrivers);
  auto gpu = Slices("nvidia_2gpu.json");
  auto tpu = Slices("tpu_4chip.json");
  LedgerInventory inv = GpuNode(gpu[0], 2);
  const std::string tpu_node = tpu[0]["spec"]["nodeName"];
  for (uint32_t i = 0; i < 4; ++i) inv[tpu_node].push_back({DeviceKind::kTpu, i, ""});
  std::vector<json> both = gpu;
  both.insert(both.end(), tpu.begin(), tpu.end());
  std::vector<std::string> changed;
  ASSERT_TRUE(m.Update(both, inv, &changed).ok());
  EXPECT_THAT(changed, ElementsAre("gpu-node-1", tpu_node));
  // The same again: nothing changed.
  ASSERT_TRUE(m.Update(both, inv, &changed).ok());
  EXPECT_THAT(changed, ElementsAre());
  // The GPU node's ids no longer match: it is no longer lendable.
  LedgerInventory swapped = inv;
  std::swap(swapped["gpu-node-1"][0].id, swapped["gpu-node-1"][1].id);
  ASSERT_TRUE(m.Update(both, swapped, &changed).ok());
  EXPECT_THAT(changed, ElementsAre("gpu-node-1"));
  // The TPU node's slices gone.
  ASSERT_TRUE(m.Update(gpu, inv, &changed).ok());
  EXPECT_THAT(changed, ElementsAre("gpu-node-1", tpu_node));
}

TEST(DeviceMapTest, TheMinorNotTheOrderDecides) {
  // The ledger's GPU 0 is /dev/nvidia1 and GPU 1 /dev/nvidia0 on some hosts:
  // the inventory passes the minor as the index, so only the ids matter.
  DeviceMap m(kDrivers);
  auto slices = Slices("nvidia_2gpu.json");
  LedgerInventory inv = GpuNode(slices[0], 2);
  std::swap(inv["gpu-node-1"][0].id, inv["gpu-node-1"][1].id);
  ASSERT_TRUE(m.Update(slices, inv).ok());
  EXPECT_EQ(Why(m, "gpu-node-1"), "uuid_mismatch");
  EXPECT_THAT(m.UnmappableNodes()["gpu-node-1"].detail, HasSubstr("/dev/nvidia0"));
  EXPECT_TRUE(m.NodeDevices("gpu-node-1").empty());
  EXPECT_FALSE(m.ToLedger({"gpu.nvidia.com", "gpu-node-1", "gpu-0"}).has_value());
}

TEST(DeviceMapTest, AnEmptyIdIsNotChecked) {
  DeviceMap m(kDrivers);
  auto slices = Slices("nvidia_2gpu.json");
  LedgerInventory inv = GpuNode(slices[0], 2);
  for (auto& d : inv["gpu-node-1"]) d.id.clear();
  ASSERT_TRUE(m.Update(slices, inv).ok());
  EXPECT_TRUE(m.Lendable("gpu-node-1", nullptr));
}

TEST(DeviceMapTest, MigAndVfioSiblingsMakeTheNodeUnmappable) {
  DeviceMap m(kDrivers);
  auto mig = Slices("nvidia_mig.json");
  auto vfio = Slices("nvidia_vfio.json");
  LedgerInventory inv = GpuNode(mig[0], 2);
  inv.merge(GpuNode(vfio[0], 2));
  std::vector<json> all = mig;
  all.push_back(vfio[0]);
  ASSERT_TRUE(m.Update(all, inv).ok());
  EXPECT_EQ(Why(m, "gpu-node-2"), "mig_devices");
  EXPECT_EQ(Why(m, "gpu-node-3"), "vfio_devices");
  EXPECT_FALSE(m.ToLedger({"gpu.nvidia.com", "gpu-node-2", "gpu-0"}).has_value());
  EXPECT_EQ(m.UnmappableCounts()["mig_devices"], 1);
  EXPECT_EQ(m.UnmappableCounts()["vfio_devices"], 1);
}

TEST(DeviceMapTest, APartitionTypeIsRefusedToo) {
  DeviceMap m(kDrivers);
  auto slices = Slices("nvidia_2gpu.json");
  slices[0]["spec"]["devices"][1]["name"] = "gpu-1-part-0";
  slices[0]["spec"]["devices"][1]["attributes"]["type"]["string"] = "partition";
  ASSERT_TRUE(m.Update(slices, GpuNode(slices[0], 1)).ok());
  EXPECT_EQ(Why(m, "gpu-node-1"), "mig_devices");
}

TEST(DeviceMapTest, ADeviceWithoutLedgerTwinAndALedgerDeviceWithoutSlice) {
  auto slices = Slices("nvidia_2gpu.json");
  DeviceMap m(kDrivers);
  ASSERT_TRUE(m.Update(slices, GpuNode(slices[0], 1)).ok());  // gpu-1 has no twin
  EXPECT_EQ(Why(m, "gpu-node-1"), "unknown_device");
  LedgerInventory three = GpuNode(slices[0], 2);
  three["gpu-node-1"].push_back({DeviceKind::kGpu, 2, ""});
  ASSERT_TRUE(m.Update(slices, three).ok());
  EXPECT_EQ(Why(m, "gpu-node-1"), "unpublished_device");
  // A name that is not gpu-<minor>.
  slices[0]["spec"]["devices"][1]["name"] = "gpu-01";
  ASSERT_TRUE(m.Update(slices, GpuNode(slices[0], 2)).ok());
  EXPECT_EQ(Why(m, "gpu-node-1"), "unknown_device");
}

TEST(DeviceMapTest, TwoDevicesForOneLedgerDevice) {
  auto slices = Slices("nvidia_2gpu.json");
  json other = slices[0];
  other["metadata"]["name"] = "second";
  other["spec"]["pool"]["name"] = "gpu-node-1-b";
  slices.push_back(other);
  DeviceMap m(kDrivers);
  ASSERT_TRUE(m.Update(slices, GpuNode(slices[0], 2)).ok());
  EXPECT_EQ(Why(m, "gpu-node-1"), "duplicate_device");
}

TEST(DeviceMapTest, ANodeWithoutSlicesAndANodeOutsideTheLedger) {
  auto slices = Slices("nvidia_2gpu.json");
  DeviceMap m(kDrivers);
  LedgerInventory inv;
  inv["gpu-node-9"].push_back({DeviceKind::kGpu, 0, ""});
  ASSERT_TRUE(m.Update(slices, inv).ok());
  EXPECT_EQ(Why(m, "gpu-node-9"), "no_slices");
  // gpu-node-1 publishes but is not a lending node: not duet's, not counted.
  EXPECT_EQ(Why(m, "gpu-node-1"), "not_in_ledger");
  EXPECT_EQ(m.UnmappableNodes().size(), 1u);
  EXPECT_FALSE(m.ToLedger({"gpu.nvidia.com", "gpu-node-1", "gpu-0"}).has_value());
}

TEST(DeviceMapTest, OnlyTheNewestGenerationCounts) {
  auto slices = Slices("nvidia_2gpu.json");
  const LedgerInventory inv = GpuNode(slices[0], 2);
  json old = slices[0];
  old["metadata"]["name"] = "old";
  old["spec"]["devices"][0]["attributes"]["uuid"]["string"] = "GPU-stale";
  old["spec"]["devices"][1]["name"] = "gpu-1-mig-19-0-1";
  slices[0]["spec"]["pool"]["generation"] = 2;
  DeviceMap m(kDrivers);
  ASSERT_TRUE(m.Update({old, slices[0]}, inv).ok());
  EXPECT_TRUE(m.Lendable("gpu-node-1", nullptr));
  // The other way round, the old generation is the newest: refused.
  old["spec"]["pool"]["generation"] = 3;
  ASSERT_TRUE(m.Update({old, slices[0]}, inv).ok());
  EXPECT_EQ(Why(m, "gpu-node-1"), "mig_devices");
}

TEST(DeviceMapTest, AnIncompletePoolIsRefusedUntilAllSlicesAreThere) {
  auto slices = Slices("nvidia_2gpu.json");
  const LedgerInventory inv = GpuNode(slices[0], 2);
  json a = slices[0], b = slices[0];
  a["spec"]["pool"]["resourceSliceCount"] = 2;
  b["spec"]["pool"]["resourceSliceCount"] = 2;
  a["spec"]["devices"].erase(1);
  b["spec"]["devices"].erase(0);
  b["metadata"]["name"] = "part-2";
  DeviceMap m(kDrivers);
  ASSERT_TRUE(m.Update({a}, inv).ok());
  EXPECT_EQ(Why(m, "gpu-node-1"), "incomplete_pool");
  EXPECT_THAT(m.UnmappableNodes()["gpu-node-1"].detail, HasSubstr("1 of its 2"));
  ASSERT_TRUE(m.Update({a, b}, inv).ok());
  EXPECT_TRUE(m.Lendable("gpu-node-1", nullptr));
  EXPECT_EQ(m.NodeDevices("gpu-node-1").size(), 2u);
}

TEST(DeviceMapTest, TpuChipsMapByNameWithTheSharedUuid) {
  auto slices = Slices("tpu_4chip.json");
  LedgerInventory inv;
  // The ledger's ids are per chip; the driver's uuid is one per host: not
  // compared.
  for (uint32_t i = 0; i < 4; ++i) inv["tpu-node-1"].push_back({DeviceKind::kTpu, i, "chip-" + std::to_string(i)});
  DeviceMap m(kDrivers);
  ASSERT_TRUE(m.Update(slices, inv).ok());
  EXPECT_EQ(Uuid(slices[0], 0), Uuid(slices[0], 3));
  EXPECT_EQ(m.NodeDevices("tpu-node-1").size(), 4u);
  EXPECT_EQ(m.ToLedger({"tpu.google.com", "tpu-node-1", "accel2"}),
            (dra::LedgerDevice{"tpu-node-1", DeviceKind::kTpu, 2}));
  // A host is lent whole: a chip the driver does not publish refuses it.
  inv["tpu-node-1"].push_back({DeviceKind::kTpu, 4, ""});
  ASSERT_TRUE(m.Update(slices, inv).ok());
  EXPECT_EQ(Why(m, "tpu-node-1"), "unpublished_device");
}

TEST(DeviceMapTest, DriversThatDoNotLendAreIgnored) {
  auto slices = Slices("nvidia_2gpu.json");
  DeviceMap m({"tpu.google.com"});
  ASSERT_TRUE(m.Update(slices, GpuNode(slices[0], 2)).ok());
  // The node's GPUs are not lent by any driver: nothing to map, no slices.
  EXPECT_EQ(Why(m, "gpu-node-1"), "no_slices");
}

TEST(DeviceMapTest, AMalformedSliceChangesNothing) {
  auto slices = Slices("nvidia_2gpu.json");
  DeviceMap m(kDrivers);
  ASSERT_TRUE(m.Update(slices, GpuNode(slices[0], 2)).ok());
  json bad = slices[0];
  bad["spec"]["pool"].erase("generation");
  absl::Status s = m.Update({bad}, GpuNode(slices[0], 2));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("ResourceSlice gpu-node-1-gpu.nvidia.com"));
  EXPECT_TRUE(m.Lendable("gpu-node-1", nullptr));
  EXPECT_EQ(m.Update({json{{"kind", "Pod"}}}, {}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceMapTest, TheGaugeCountsNodesByReason) {
  auto registry = std::make_shared<prometheus::Registry>();
  DeviceMap m(kDrivers, registry.get());
  auto mig = Slices("nvidia_mig.json");
  LedgerInventory inv = GpuNode(mig[0], 2);
  inv["gpu-node-9"].push_back({DeviceKind::kGpu, 0, ""});
  ASSERT_TRUE(m.Update(mig, inv).ok());
  const std::string text = prometheus::TextSerializer().Serialize(registry->Collect());
  EXPECT_THAT(text, HasSubstr("duet_dra_unmappable_nodes{reason=\"mig_devices\"} 1"));
  EXPECT_THAT(text, HasSubstr("duet_dra_unmappable_nodes{reason=\"no_slices\"} 1"));
  EXPECT_THAT(text, HasSubstr("duet_dra_unmappable_nodes{reason=\"uuid_mismatch\"} 0"));
}

TEST(DeviceMapTest, ReadersSeeOneWholeSnapshotWhileUpdatesSwap) {
  // Two maps alternate: gpu-0 and gpu-1 both mapped, or the node refused. A
  // reader never sees half of one.
  auto slices = Slices("nvidia_2gpu.json");
  const LedgerInventory good = GpuNode(slices[0], 2), bad = GpuNode(slices[0], 1);
  DeviceMap m(kDrivers);
  ASSERT_TRUE(m.Update(slices, good).ok());
  std::atomic<bool> done{false};
  std::atomic<int> torn{0};
  std::thread reader([&] {
    while (!done.load()) {
      const size_t n = m.NodeDevices("gpu-node-1").size();
      if (n != 0 && n != 2) torn.fetch_add(1);
    }
  });
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(m.Update(slices, i % 2 ? good : bad).ok());
  done.store(true);
  reader.join();
  EXPECT_EQ(torn.load(), 0);
}

}  // namespace
}  // namespace k8s_dra
}  // namespace duet
