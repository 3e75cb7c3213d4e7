// DeviceMap::Apply against a full rebuild: over many random sequences of
// ResourceSlice adds, changes and deletes (pools split into several slices,
// generations bumped, incomplete pools, MIG and VFIO devices, uuid mismatches,
// per-device nodes, drivers duet does not lend) and lending nodes added,
// changed and removed, the map Apply keeps equals the one a fresh
// DeviceMap::Update of the same slices and inventory builds: every node's
// lendability, reason and detail, both directions of the mapping, the nodes
// reported changed, and the duet_dra_unmappable_nodes gauge.

#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "k8s_adapter/dra/device_map.h"
#include "prometheus/text_serializer.h"

namespace duet {
namespace k8s_dra {
namespace {

using json = nlohmann::json;

const std::vector<std::string> kDrivers = {"gpu.nvidia.com", "tpu.google.com"};
const std::vector<std::string> kAllDrivers = {"gpu.nvidia.com", "tpu.google.com",
                                              "other.example.com"};
const std::vector<std::string> kNodes = {"n0", "n1", "n2", "n3", "n4"};
const std::vector<std::string> kPools = {"n0", "n1", "n2", "shared"};
const std::vector<std::string> kDeviceNames = {
    "gpu-0", "gpu-1", "gpu-2", "gpu-0-mig-1g.10gb-0", "gpu-vfio-1", "gpu-01", "accel0", "accel1",
    "weird"};

class Generator {
 public:
  explicit Generator(uint32_t seed) : rng_(seed) {}

  int Int(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  template <typename T>
  const T& Pick(const std::vector<T>& v) {
    return v[static_cast<size_t>(Int(static_cast<int>(v.size())))];
  }

  json Device(bool per_device_node) {
    json d = {{"name", Pick(kDeviceNames)}};
    json attrs = json::object();
    switch (Int(4)) {
      case 0: break;
      case 1: attrs["uuid"] = {{"string", "bad-uuid"}}; break;
      default:
        attrs["uuid"] = {{"string", absl::StrCat("U-", Int(3))}};
    }
    if (Int(8) == 0) attrs["type"] = {{"string", Pick(std::vector<std::string>{"gpu", "mig", "vfio", "mps"})}};
    if (!attrs.empty()) d["attributes"] = attrs;
    if (per_device_node) d["nodeName"] = Pick(kNodes);
    return d;
  }

  // A slice `name` of `pool` (its driver fixed by the pool, mostly NVIDIA).
  json Slice(const std::string& driver, const std::string& pool, int index) {
    const bool per_device = pool == "shared" && Int(2) == 0;
    json spec = {{"driver", driver},
                 {"pool",
                  {{"name", pool}, {"generation", 1 + Int(3)}, {"resourceSliceCount", 1 + Int(2)}}}};
    if (!per_device) {
      spec["nodeName"] = pool == "shared" ? Pick(kNodes) : pool;
      if (Int(10) == 0) spec["nodeName"] = Pick(kNodes);
    }
    json devices = json::array();
    const int n = Int(4);
    for (int i = 0; i < n; ++i) devices.push_back(Device(per_device));
    if (Int(10) != 0) spec["devices"] = devices;
    return {{"apiVersion", "resource.k8s.io/v1"},
            {"kind", "ResourceSlice"},
            {"metadata", {{"name", absl::StrCat(driver.substr(0, 3), "-", pool, "-", index)}}},
            {"spec", spec}};
  }

  // A slice that maps cleanly onto an inventory of Devices(): gpu-0..gpu-n-1
  // with uuid U-<i>, its pool in one slice (mostly) or in two.
  json GoodSlice() {
    const std::string& pool = kPools[static_cast<size_t>(Int(3))];
    const int two = Int(3) == 0 ? 1 : 0;
    const int part = two != 0 ? Int(2) : 0;
    json devices = json::array();
    const int n = 1 + Int(3);
    for (int i = 0; i < n; ++i) {
      if (two != 0 && i % 2 != part) continue;
      devices.push_back({{"name", absl::StrCat("gpu-", i)},
                         {"attributes", {{"uuid", {{"string", absl::StrCat("U-", i)}}}}}});
    }
    json spec = {{"driver", kDrivers[0]},
                 {"nodeName", pool},
                 {"devices", devices},
                 {"pool", {{"name", pool}, {"generation", 1 + Int(2)},
                           {"resourceSliceCount", 1 + two}}}};
    return {{"apiVersion", "resource.k8s.io/v1beta2"},
            {"kind", "ResourceSlice"},
            {"metadata", {{"name", absl::StrCat("gpu-", pool, "-", part)}}},
            {"spec", spec}};
  }

  // Pool "shared" naming its devices per device, for n3 and n4 at once: both
  // may claim the same DRA device (gpu.nvidia.com/shared/gpu-0), which then
  // maps to the first of them that is lendable.
  json SharedSlice() {
    json devices = json::array();
    for (const char* node : {"n3", "n4"}) {
      const int n = 1 + Int(3);
      for (int i = 0; i < n; ++i) {
        devices.push_back({{"name", absl::StrCat("gpu-", i)},
                           {"nodeName", node},
                           {"attributes", {{"uuid", {{"string", absl::StrCat("U-", i)}}}}}});
      }
    }
    json spec = {{"driver", kDrivers[0]},
                 {"devices", devices},
                 {"pool", {{"name", "shared"}, {"generation", 1}, {"resourceSliceCount", 1}}}};
    return {{"apiVersion", "resource.k8s.io/v1"},
            {"kind", "ResourceSlice"},
            {"metadata", {{"name", "gpu-shared-0"}}},
            {"spec", spec}};
  }

  json RandomSlice() {
    if (Int(2) == 0) return Int(4) == 0 ? SharedSlice() : GoodSlice();
    const std::string& driver = Int(6) == 0 ? Pick(kAllDrivers) : kAllDrivers[0];
    return Slice(driver, Pick(kPools), Int(3));
  }

  std::vector<InventoryDevice> Devices() {
    std::vector<InventoryDevice> out;
    const int gpus = Int(4);
    for (int i = 0; i < gpus; ++i) {
      std::string id = absl::StrCat("U-", i);
      if (Int(6) == 0) id = Int(2) == 0 ? "" : absl::StrCat("U-", Int(3));
      out.push_back({DeviceKind::kGpu, static_cast<uint32_t>(i), id});
    }
    if (Int(4) == 0) out.push_back({DeviceKind::kTpu, 0, "T"});
    return out;
  }

 private:
  std::mt19937 rng_;
};

std::string Gauge(prometheus::Registry* r) {
  return prometheus::TextSerializer().Serialize(r->Collect());
}

// Every observable of `got` equals `want`'s.
void ExpectSameMap(const DeviceMap& got, const DeviceMap& want) {
  for (const std::string& node : kNodes) {
    std::string why_got, why_want;
    EXPECT_EQ(got.Lendable(node, &why_got), want.Lendable(node, &why_want)) << node;
    EXPECT_EQ(why_got, why_want) << node;
    EXPECT_EQ(got.NodeDevices(node), want.NodeDevices(node)) << node;
    for (DeviceKind kind : {DeviceKind::kGpu, DeviceKind::kTpu}) {
      for (uint32_t i = 0; i < 3; ++i) {
        const dra::LedgerDevice l{node, kind, i};
        EXPECT_EQ(got.ToDra(l), want.ToDra(l)) << node << " " << i;
      }
    }
  }
  for (const std::string& driver : kAllDrivers) {
    for (const std::string& pool : kPools) {
      for (const std::string& name : kDeviceNames) {
        const dra::DraDevice d{driver, pool, name};
        const auto a = got.ToLedger(d);
        const auto b = want.ToLedger(d);
        EXPECT_EQ(a.has_value(), b.has_value()) << d.ToString();
        if (a && b) {
          EXPECT_TRUE(*a == *b) << d.ToString();
        }
      }
    }
  }
  const auto a = got.UnmappableNodes();
  const auto b = want.UnmappableNodes();
  EXPECT_EQ(a.size(), b.size());
  for (const auto& [node, u] : b) {
    auto it = a.find(node);
    ASSERT_NE(it, a.end()) << node;
    EXPECT_EQ(it->second.reason, u.reason) << node;
    EXPECT_EQ(it->second.detail, u.detail) << node;
  }
  EXPECT_EQ(got.UnmappableCounts(), want.UnmappableCounts());
}

TEST(DeviceMapIncrementalTest, ApplyEqualsAFullRebuildOverRandomSequences) {
  constexpr int kSequences = 150;
  constexpr int kSteps = 30;
  int refused = 0, changed_total = 0;
  for (int seq = 0; seq < kSequences; ++seq) {
    SCOPED_TRACE(absl::StrCat("sequence (seed) ", seq));
    Generator g(static_cast<uint32_t>(seq));
    prometheus::Registry inc_registry, full_registry;
    DeviceMap inc(kDrivers, &inc_registry);    // fed deltas
    DeviceMap full(kDrivers, &full_registry);  // rebuilt from everything, every step
    std::map<std::string, json> slices;        // what the cluster has
    LedgerInventory inventory;
    for (int step = 0; step < kSteps; ++step) {
      SCOPED_TRACE(absl::StrCat("step ", step));
      MapDelta delta;
      std::map<std::string, json> next = slices;
      LedgerInventory next_inv = inventory;
      const int ops = 1 + g.Int(3);
      for (int op = 0; op < ops; ++op) {
        switch (g.Int(10)) {
          case 0:
          case 1:
          case 2:
          case 3: {  // add or change a slice
            json s = g.RandomSlice();
            const std::string name = s["metadata"]["name"];
            if (std::find(delta.deleted.begin(), delta.deleted.end(), name) !=
                delta.deleted.end()) {
              break;  // one change per slice per delta
            }
            bool again = false;
            for (const json& u : delta.upserted) again = again || u["metadata"]["name"] == name;
            if (again) break;
            next[name] = s;
            delta.upserted.push_back(s);
            break;
          }
          case 4:
          case 5: {  // delete a slice (or one that is not there)
            std::string name = absl::StrCat("gpu-", g.Pick(kPools), "-", g.Int(3));
            if (!slices.empty() && g.Int(4) != 0) {
              auto it = slices.begin();
              std::advance(it, g.Int(static_cast<int>(slices.size())));
              name = it->first;
            }
            bool upserted = false;
            for (const json& u : delta.upserted) upserted = upserted || u["metadata"]["name"] == name;
            if (upserted) break;
            next.erase(name);
            delta.deleted.push_back(name);
            break;
          }
          case 6:
          case 7: {  // a lending node added or its devices changed
            const std::string& node = g.Pick(kNodes);
            if (std::find(delta.inventory_removed.begin(), delta.inventory_removed.end(), node) !=
                delta.inventory_removed.end()) {
              break;
            }
            auto devices = g.Devices();
            next_inv[node] = devices;
            delta.inventory_set[node] = devices;
            break;
          }
          case 8: {  // a lending node removed
            const std::string& node = g.Pick(kNodes);
            if (delta.inventory_set.count(node) != 0) break;
            next_inv.erase(node);
            delta.inventory_removed.push_back(node);
            break;
          }
          default: {  // the same slice again, its pool's generation bumped
            if (slices.empty()) break;
            auto it = slices.begin();
            std::advance(it, g.Int(static_cast<int>(slices.size())));
            json s = it->second;
            const std::string name = it->first;
            bool touched = std::find(delta.deleted.begin(), delta.deleted.end(), name) !=
                           delta.deleted.end();
            for (const json& u : delta.upserted) touched = touched || u["metadata"]["name"] == name;
            if (touched) break;
            s["spec"]["pool"]["generation"] = s["spec"]["pool"]["generation"].get<int>() + 1;
            next[name] = s;
            delta.upserted.push_back(s);
          }
        }
      }
      if (g.Int(25) == 0) {
        // A malformed slice: the whole delta is refused, nothing changes.
        MapDelta bad = delta;
        bad.upserted.push_back({{"apiVersion", "resource.k8s.io/v1"},
                                {"kind", "ResourceSlice"},
                                {"metadata", {{"name", "broken"}}},
                                {"spec", {{"driver", "gpu.nvidia.com"}}}});
        std::vector<std::string> changed;
        ASSERT_EQ(inc.Apply(bad, &changed).code(), absl::StatusCode::kInvalidArgument);
        ++refused;
        ExpectSameMap(inc, full);
      }
      std::vector<std::string> inc_changed, full_changed;
      ASSERT_TRUE(inc.Apply(delta, &inc_changed).ok());
      slices = std::move(next);
      inventory = std::move(next_inv);
      std::vector<json> all;
      for (const auto& [_, s] : slices) all.push_back(s);
      ASSERT_TRUE(full.Update(all, inventory, &full_changed).ok());
      EXPECT_EQ(inc_changed, full_changed);
      changed_total += static_cast<int>(full_changed.size());
      ExpectSameMap(inc, full);
      DeviceMap fresh(kDrivers);
      ASSERT_TRUE(fresh.Update(all, inventory).ok());
      ExpectSameMap(inc, fresh);
      EXPECT_EQ(Gauge(&inc_registry), Gauge(&full_registry));
      if (::testing::Test::HasFailure()) return;  // the first divergence is the one to read
    }
  }
  // The sequences exercise what they are meant to.
  EXPECT_GT(refused, 50);
  EXPECT_GT(changed_total, 100);
}

TEST(DeviceMapIncrementalTest, ApplyNeedsSliceNames) {
  DeviceMap m(kDrivers);
  MapDelta delta;
  delta.upserted.push_back({{"apiVersion", "resource.k8s.io/v1"},
                            {"kind", "ResourceSlice"},
                            {"spec",
                             {{"driver", "gpu.nvidia.com"},
                              {"nodeName", "n0"},
                              {"pool", {{"name", "n0"}, {"generation", 1},
                                        {"resourceSliceCount", 1}}}}}});
  delta.inventory_set["n0"] = {{DeviceKind::kGpu, 0, ""}};
  const absl::Status s = m.Apply(delta);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("metadata.name"), std::string::npos) << s;
  std::string why;
  EXPECT_FALSE(m.Lendable("n0", &why));
  EXPECT_EQ(why, "not_in_ledger");  // the inventory part was not applied either
}

}  // namespace
}  // namespace k8s_dra
}  // namespace duet
