#include "k8s_adapter/dra/device_map.h"

#include <set>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace duet {
namespace k8s_dra {

namespace {

constexpr char kNvidia[] = "gpu.nvidia.com";
constexpr char kTpu[] = "tpu.google.com";

using json = nlohmann::json;

// A string field of `j`, "" when absent or not a string.
std::string Str(const json& j, const char* key) {
  if (!j.is_object()) return "";
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// A string attribute ({"string": V}) of a device, "" when absent.
std::string StringAttribute(const json& device, const char* name) {
  auto attrs = device.find("attributes");
  if (attrs == device.end() || !attrs->is_object()) return "";
  auto a = attrs->find(name);
  return a == attrs->end() ? "" : Str(*a, "string");
}

// "<prefix><digits>" -> the number; nullopt otherwise.
std::optional<uint32_t> IndexAfter(absl::string_view name, absl::string_view prefix) {
  if (!absl::ConsumePrefix(&name, prefix) || name.empty()) return std::nullopt;
  for (char c : name) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  if (name.size() > 1 && name[0] == '0') return std::nullopt;  // "gpu-01" is not gpu-1
  uint32_t n = 0;
  if (!absl::SimpleAtoi(name, &n)) return std::nullopt;
  return n;
}

// The int64 at `key` of `j`, nullopt when absent or not an integer.
std::optional<int64_t> Int(const json& j, const char* key) {
  if (!j.is_object()) return std::nullopt;
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

// One published device, with where it came from.
struct Published {
  std::string driver;
  std::string pool;
  const json* device;
};

// Reason order: the earliest found on a node is the one reported.
int Rank(const std::string& reason) {
  const auto& all = DeviceMap::Reasons();
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i] == reason) return static_cast<int>(i);
  }
  return static_cast<int>(all.size());
}

}  // namespace

struct DeviceMap::Snapshot {
  absl::flat_hash_map<dra::DraDevice, dra::LedgerDevice> to_ledger;
  std::map<dra::LedgerDevice, dra::DraDevice> to_dra;
  std::map<std::string, std::vector<dra::DraDevice>> node_devices;  // lendable nodes
  std::map<std::string, Unmappable> unmappable;
};

const std::vector<std::string>& DeviceMap::Reasons() {
  static const auto* reasons = new std::vector<std::string>{
      "incomplete_pool", "mig_devices",        "vfio_devices", "uuid_mismatch",
      "duplicate_device", "unknown_device",    "unpublished_device", "no_slices",
      "not_in_ledger"};
  return *reasons;
}

DeviceMap::DeviceMap(std::vector<std::string> lending_drivers, prometheus::Registry* registry)
    : drivers_(std::move(lending_drivers)), snapshot_(std::make_shared<Snapshot>()) {
  if (registry != nullptr) {
    auto& family = prometheus::BuildGauge()
                       .Name("duet_dra_unmappable_nodes")
                       .Help("Lending nodes duet does not lend on because their ResourceSlices do "
                             "not map cleanly onto the ledger's devices, by reason")
                       .Register(*registry);
    for (const std::string& r : Reasons()) gauges_[r] = &family.Add({{"reason", r}});
  }
}

absl::Status DeviceMap::Update(const std::vector<json>& slices, const LedgerInventory& ledger,
                              std::vector<std::string>* changed) {
  const std::set<std::string> lending(drivers_.begin(), drivers_.end());
  // Pass 1: check every slice and find each pool's newest generation.
  struct Pool {
    int64_t generation = -1;
    int64_t want = 0;  // resourceSliceCount of the newest generation
    int64_t have = 0;  // slices of the newest generation seen
    std::set<std::string> nodes;  // every node any generation names
  };
  std::map<std::pair<std::string, std::string>, Pool> pools;
  for (size_t i = 0; i < slices.size(); ++i) {
    const json& s = slices[i];
    const std::string name = s.is_object() && s.contains("metadata")
                                 ? Str(s["metadata"], "name") : std::string();
    const std::string label = name.empty() ? absl::StrCat("slices[", i, "]")
                                           : absl::StrCat("ResourceSlice ", name);
    if (!s.is_object() || Str(s, "kind") != "ResourceSlice" ||
        !absl::StartsWith(Str(s, "apiVersion"), "resource.k8s.io/")) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": not a resource.k8s.io ResourceSlice"));
    }
    const json& spec = s.contains("spec") ? s["spec"] : json();
    const json& pool = spec.is_object() && spec.contains("pool") ? spec["pool"] : json();
    const std::string driver = Str(spec, "driver");
    const std::string pool_name = Str(pool, "name");
    const std::optional<int64_t> gen = Int(pool, "generation");
    const std::optional<int64_t> count = Int(pool, "resourceSliceCount");
    if (driver.empty() || pool_name.empty() || !gen.has_value() || !count.has_value() ||
        *count < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": spec.driver, spec.pool.name, spec.pool.generation and "
                 "spec.pool.resourceSliceCount (at least 1) are required"));
    }
    if (spec.contains("devices") && !spec["devices"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(label, ": spec.devices must be a list"));
    }
    if (lending.count(driver) == 0) continue;
    Pool& p = pools[{driver, pool_name}];
    const std::string node = Str(spec, "nodeName");
    if (!node.empty()) p.nodes.insert(node);
    if (*gen > p.generation) {
      p.generation = *gen;
      p.want = *count;
      p.have = 0;
    }
    if (*gen == p.generation) ++p.have;
  }

  auto snap = std::make_shared<Snapshot>();
  auto refuse = [&](const std::string& node, const std::string& reason, std::string detail) {
    auto it = snap->unmappable.find(node);
    if (it == snap->unmappable.end() || Rank(reason) < Rank(it->second.reason)) {
      snap->unmappable[node] = Unmappable{reason, std::move(detail)};
    }
  };

  // Pass 2: the devices of complete pools, by node.
  std::map<std::string, std::vector<Published>> by_node;
  for (const auto& [key, p] : pools) {
    if (p.have < p.want) {
      for (const std::string& node : p.nodes) {
        refuse(node, "incomplete_pool",
               absl::StrCat("pool ", key.first, "/", key.second, " generation ", p.generation,
                            " has ", p.have, " of its ", p.want, " ResourceSlices"));
      }
    }
  }
  for (const json& s : slices) {
    const json& spec = s["spec"];
    const std::string driver = Str(spec, "driver");
    if (lending.count(driver) == 0) continue;
    const std::string pool_name = Str(spec["pool"], "name");
    const Pool& p = pools[{driver, pool_name}];
    if (*Int(spec["pool"], "generation") != p.generation || p.have < p.want) continue;
    const std::string slice_node = Str(spec, "nodeName");
    if (!spec.contains("devices")) continue;
    for (const json& d : spec["devices"]) {
      // perDeviceNodeSelection: a device may name its own node.
      std::string node = Str(d, "nodeName");
      if (node.empty()) node = slice_node;
      if (node.empty()) continue;  // not bound to one node: not duet's to lend
      by_node[node].push_back(Published{driver, pool_name, &d});
    }
  }

  // Pass 3: per node, every published device against the inventory.
  std::set<std::string> nodes;
  for (const auto& [node, _] : ledger) nodes.insert(node);
  for (const auto& [node, _] : by_node) nodes.insert(node);
  for (const std::string& node : nodes) {
    auto inv = ledger.find(node);
    auto pub = by_node.find(node);
    if (inv == ledger.end()) continue;  // not a lending node: not duet's
    if (pub == by_node.end()) {
      refuse(node, "no_slices",
             absl::StrCat("no complete ResourceSlice of a lending driver (",
                          absl::StrJoin(drivers_, ", "), ") publishes devices of node ", node));
      continue;
    }
    std::map<std::pair<DeviceKind, uint32_t>, const InventoryDevice*> twins;
    for (const InventoryDevice& d : inv->second) twins[{d.kind, d.index}] = &d;
    std::map<dra::LedgerDevice, dra::DraDevice> mapped;
    for (const Published& p : pub->second) {
      const std::string dev_name = Str(*p.device, "name");
      const dra::DraDevice dra{p.driver, p.pool, dev_name};
      const std::string type = StringAttribute(*p.device, "type");
      std::optional<uint32_t> index;
      DeviceKind kind = DeviceKind::kGpu;
      if (p.driver == kNvidia) {
        if (absl::StrContains(dev_name, "-mig-") || type == "mig") {
          refuse(node, "mig_devices", absl::StrCat(dra.ToString(), " is a MIG device: a taint on "
                                                   "its GPU does not cover it"));
          continue;
        }
        if (absl::StartsWith(dev_name, "gpu-vfio-") || type == "vfio") {
          refuse(node, "vfio_devices", absl::StrCat(dra.ToString(), " is a VFIO device: a taint "
                                                    "on its GPU does not cover it"));
          continue;
        }
        if (!type.empty() && type != "gpu") {
          refuse(node, "mig_devices", absl::StrCat(dra.ToString(), " is a ", type,
                                                   " device (a partition of a GPU)"));
          continue;
        }
        index = IndexAfter(dev_name, "gpu-");
      } else if (p.driver == kTpu) {
        // Google's TPU driver names chips accel<N> after /dev/accel<N> (or by
        // VFIO group, which says nothing of the chip number: unknown here).
        kind = DeviceKind::kTpu;
        index = IndexAfter(dev_name, "accel");
      }
      auto twin = index.has_value() ? twins.find({kind, *index}) : twins.end();
      if (twin == twins.end()) {
        refuse(node, "unknown_device",
               absl::StrCat(dra.ToString(), " has no twin in duet's inventory of node ", node));
        continue;
      }
      if (kind == DeviceKind::kGpu) {
        const std::string uuid = StringAttribute(*p.device, "uuid");
        if (!uuid.empty() && !twin->second->id.empty() && uuid != twin->second->id) {
          refuse(node, "uuid_mismatch",
                 absl::StrCat(dra.ToString(), " has uuid ", uuid, " but /dev/nvidia", *index,
                              " of node ", node, " is ", twin->second->id));
          continue;
        }
      }
      // TPU: no uuid check. Google's driver (kubernetes-sigs/
      // dra-driver-google-tpu, cmd/tpu-dra-kubeletplugin, as issue 26 and
      // tests/fakes/fake_dra_driver.py read it; not re-read here) names chips
      // accel<N> and gives every chip of a host the same uuid (newer releases
      // derive one per chip from the node and chip names); neither says which
      // /dev/accel<N> a chip is, so the name is the only link and a uuid
      // comparison with the inventory's per-chip id would refuse good hosts.
      const dra::LedgerDevice ledger_dev{node, kind, *index};
      if (!mapped.emplace(ledger_dev, dra).second) {
        refuse(node, "duplicate_device",
               absl::StrCat(dra.ToString(), " and ", mapped[ledger_dev].ToString(),
                            " both name ", DeviceKindName(kind), " ", *index, " of node ", node));
      }
    }
    // Every ledger device of a lent kind needs its twin (a Slurm placeholder
    // may take any of them; a TPU host is lent whole).
    std::set<DeviceKind> lent_kinds;
    for (const std::string& d : drivers_) {
      if (d == kNvidia) lent_kinds.insert(DeviceKind::kGpu);
      if (d == kTpu) lent_kinds.insert(DeviceKind::kTpu);
    }
    for (const InventoryDevice& d : inv->second) {
      if (lent_kinds.count(d.kind) == 0) continue;
      if (mapped.count(dra::LedgerDevice{node, d.kind, d.index}) == 0) {
        refuse(node, "unpublished_device",
               absl::StrCat(DeviceKindName(d.kind), " ", d.index, " of node ", node,
                            " has no device in the lending drivers' ResourceSlices"));
      }
    }
    if (snap->unmappable.count(node) != 0) continue;
    std::vector<dra::DraDevice>& list = snap->node_devices[node];
    for (const auto& [l, d] : mapped) {
      snap->to_ledger.emplace(d, l);
      snap->to_dra.emplace(l, d);
      list.push_back(d);
    }
  }

  // Only lending nodes (the inventory's) are judged; others are not duet's.
  for (auto it = snap->unmappable.begin(); it != snap->unmappable.end();) {
    it = ledger.count(it->first) == 0 ? snap->unmappable.erase(it) : std::next(it);
  }
  std::map<std::string, int> counts;
  for (const std::string& r : Reasons()) counts[r] = 0;
  for (const auto& [_, u] : snap->unmappable) ++counts[u.reason];
  for (const auto& [reason, gauge] : gauges_) gauge->Set(counts[reason]);
  std::shared_ptr<const Snapshot> old;
  std::shared_ptr<const Snapshot> now = snap;
  {
    absl::MutexLock lock(&mu_);
    old = std::move(snapshot_);
    snapshot_ = std::move(snap);
  }
  if (changed != nullptr) {
    // A merge of the two sorted node maps.
    changed->clear();
    static const std::map<std::string, std::vector<dra::DraDevice>> kNone;
    const auto& a = old ? old->node_devices : kNone;
    const auto& b = now->node_devices;
    auto i = a.begin();
    auto j = b.begin();
    while (i != a.end() || j != b.end()) {
      if (j == b.end() || (i != a.end() && i->first < j->first)) {
        changed->push_back((i++)->first);
      } else if (i == a.end() || j->first < i->first) {
        changed->push_back((j++)->first);
      } else {
        if (i->second != j->second) changed->push_back(i->first);
        ++i;
        ++j;
      }
    }
  }
  return absl::OkStatus();  // `old` goes here, outside the lock
}

std::shared_ptr<const DeviceMap::Snapshot> DeviceMap::Current() const {
  absl::MutexLock lock(&mu_);
  return snapshot_;
}

std::optional<dra::LedgerDevice> DeviceMap::ToLedger(const dra::DraDevice& device) const {
  auto snap = Current();
  auto it = snap->to_ledger.find(device);
  if (it == snap->to_ledger.end()) return std::nullopt;
  return it->second;
}

std::optional<dra::DraDevice> DeviceMap::ToDra(const dra::LedgerDevice& device) const {
  auto snap = Current();
  auto it = snap->to_dra.find(device);
  if (it == snap->to_dra.end()) return std::nullopt;
  return it->second;
}

bool DeviceMap::Lendable(const std::string& node, std::string* why) const {
  auto snap = Current();
  if (snap->node_devices.count(node) != 0) return true;
  if (why != nullptr) {
    auto it = snap->unmappable.find(node);
    *why = it != snap->unmappable.end() ? it->second.reason : "not_in_ledger";
  }
  return false;
}

std::vector<dra::DraDevice> DeviceMap::NodeDevices(const std::string& node) const {
  auto snap = Current();
  auto it = snap->node_devices.find(node);
  return it == snap->node_devices.end() ? std::vector<dra::DraDevice>{} : it->second;
}

std::map<std::string, Unmappable> DeviceMap::UnmappableNodes() const {
  return Current()->unmappable;
}

std::map<std::string, int> DeviceMap::UnmappableCounts() const {
  std::map<std::string, int> counts;
  for (const std::string& r : Reasons()) counts[r] = 0;
  for (const auto& [_, u] : Current()->unmappable) ++counts[u.reason];
  return counts;
}

}  // namespace k8s_dra
}  // namespace duet
