#include "k8s_adapter/dra/device_map.h"

#include <array>
#include <set>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
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

using PoolKey = std::pair<std::string, std::string>;  // (driver, pool name)

// One device of a slice, as much of it as the judging reads.
struct ParsedDevice {
  std::string name;
  std::string node;  // its own nodeName (perDeviceNodeSelection), "" if none
  std::string type;  // attribute `type`
  std::string uuid;  // attribute `uuid`
};

// One ResourceSlice of a lending driver, as much of it as the judging reads.
struct ParsedSlice {
  PoolKey pool;
  int64_t generation = 0;
  int64_t count = 0;
  std::string node;  // spec.nodeName
  std::vector<ParsedDevice> devices;
};

// Checks one ResourceSlice (`label` names it in errors); fills `out` and
// sets `*lending` when its driver is one of `lending_drivers`.
absl::Status Parse(const json& s, const std::string& label, const std::set<std::string>& lending,
                   ParsedSlice* out, bool* lending_driver) {
  if (!s.is_object() || Str(s, "kind") != "ResourceSlice" ||
      !absl::StartsWith(Str(s, "apiVersion"), "resource.k8s.io/")) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": not a resource.k8s.io ResourceSlice"));
  }
  static const json kNull;
  const json& spec = s.contains("spec") ? s["spec"] : kNull;
  const json& pool = spec.is_object() && spec.contains("pool") ? spec["pool"] : kNull;
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
  *lending_driver = lending.count(driver) != 0;
  if (!*lending_driver) return absl::OkStatus();
  out->pool = {driver, pool_name};
  out->generation = *gen;
  out->count = *count;
  out->node = Str(spec, "nodeName");
  out->devices.clear();
  if (spec.contains("devices")) {
    for (const json& d : spec["devices"]) {
      ParsedDevice pd;
      pd.name = Str(d, "name");
      pd.node = Str(d, "nodeName");
      if (d.is_object()) {
        pd.type = StringAttribute(d, "type");
        pd.uuid = StringAttribute(d, "uuid");
      }
      out->devices.push_back(std::move(pd));
    }
  }
  return absl::OkStatus();
}

// metadata.name, "" when absent.
std::string Name(const json& s) {
  return s.is_object() && s.contains("metadata") ? Str(s["metadata"], "name") : std::string();
}

// "ResourceSlice <name>", or "slices[i]" for an unnamed one.
std::string Label(const json& s, size_t i) {
  const std::string name = Name(s);
  return name.empty() ? absl::StrCat("slices[", i, "]") : absl::StrCat("ResourceSlice ", name);
}

// One published device, with where it came from.
struct Published {
  const PoolKey* pool;
  const ParsedDevice* device;
};

// Reason order: the earliest found on a node is the one reported.
int Rank(const std::string& reason) {
  const auto& all = DeviceMap::Reasons();
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i] == reason) return static_cast<int>(i);
  }
  return static_cast<int>(all.size());
}

// Snapshot shards: a node's entry lives in the shard of its name's hash, a
// DRA device's ledger twin in the shard of its pool's.
constexpr size_t kShards = 256;
template <typename T>
size_t ShardOf(const T& key) {
  return absl::Hash<T>{}(key) % kShards;
}

}  // namespace

// The judgment of one lending node. Immutable once in a snapshot.
struct DeviceMap::NodeEntry {
  bool lendable = false;
  Unmappable why;  // when not lendable
  // When lendable: every mapped device, sorted by ledger device.
  std::vector<std::pair<dra::LedgerDevice, dra::DraDevice>> mapped;
  std::vector<dra::DraDevice> devices;  // the DRA side of `mapped`, same order
};

struct DeviceMap::Snapshot {
  using NodeShard = absl::flat_hash_map<std::string, std::shared_ptr<const NodeEntry>>;
  // A pool's devices: device name -> ledger device.
  using PoolDevices = absl::flat_hash_map<std::string, dra::LedgerDevice>;
  // PoolId() -> its devices (a pool's devices change together, mostly).
  using DraShard = absl::flat_hash_map<std::string, std::shared_ptr<const PoolDevices>>;
  // Every lending node (the inventory's), by shard.
  std::array<std::shared_ptr<const NodeShard>, kShards> nodes;
  // DRA device -> ledger device, over the lendable nodes, by shard of its
  // pool.
  std::array<std::shared_ptr<const DraShard>, kShards> to_ledger;
  std::map<std::string, int> counts;  // unmappable nodes by reason (all present)

  // "<driver>/<pool>" (a driver name has no '/').
  static std::string PoolId(const dra::DraDevice& d) { return absl::StrCat(d.driver, "/", d.pool); }
  const dra::LedgerDevice* Owner(const std::string& pool_id, const std::string& name) const {
    const DraShard& shard = *to_ledger[ShardOf(pool_id)];
    auto p = shard.find(pool_id);
    if (p == shard.end()) return nullptr;
    auto it = p->second->find(name);
    return it == p->second->end() ? nullptr : &it->second;
  }
  const NodeEntry* Find(const std::string& node) const {
    const NodeShard& shard = *nodes[ShardOf(node)];
    auto it = shard.find(node);
    return it == shard.end() ? nullptr : it->second.get();
  }
};

// The slices and inventory the map was built from (the writers' side).
struct DeviceMap::State {
  struct Pool {
    std::map<std::string, ParsedSlice> slices;  // by slice key (name)
    int64_t generation = -1;
    int64_t want = 0;  // resourceSliceCount of the newest generation
    int64_t have = 0;  // slices of the newest generation
    std::set<std::string> slice_nodes;  // every spec.nodeName, any generation
    std::set<std::string> nodes;        // slice_nodes and every device's nodeName

    void Summarize() {
      generation = -1;
      want = have = 0;
      slice_nodes.clear();
      nodes.clear();
      for (const auto& [_, s] : slices) {
        if (!s.node.empty()) slice_nodes.insert(s.node);
        if (s.generation > generation) {
          generation = s.generation;
          want = s.count;
          have = 0;
        }
        if (s.generation == generation) ++have;
        for (const ParsedDevice& d : s.devices) {
          if (!d.node.empty()) nodes.insert(d.node);
        }
      }
      nodes.insert(slice_nodes.begin(), slice_nodes.end());
    }
  };
  std::map<std::string, PoolKey> slice_pool;  // slice key -> its pool
  std::map<PoolKey, Pool> pools;
  absl::flat_hash_map<std::string, std::set<PoolKey>> node_pools;  // node -> pools naming it
  LedgerInventory inventory;

  // Re-summarizes `key` after its slices changed; adds every node it names
  // (before or after) to `dirty`.
  void Resummarize(const PoolKey& key, std::set<std::string>* dirty) {
    auto it = pools.find(key);
    if (it == pools.end()) return;
    Pool& p = it->second;
    const std::set<std::string> before = std::move(p.nodes);
    p.Summarize();
    for (const std::string& n : before) {
      dirty->insert(n);
      if (p.nodes.count(n) == 0) {
        auto np = node_pools.find(n);
        np->second.erase(key);
        if (np->second.empty()) node_pools.erase(np);
      }
    }
    for (const std::string& n : p.nodes) {
      dirty->insert(n);
      node_pools[n].insert(key);
    }
    if (p.slices.empty()) pools.erase(it);
  }
  // Removes slice `key`; its pool is added to `touched`.
  void Erase(const std::string& key, std::set<PoolKey>* touched) {
    auto it = slice_pool.find(key);
    if (it == slice_pool.end()) return;
    touched->insert(it->second);
    pools[it->second].slices.erase(key);
    slice_pool.erase(it);
  }
  void Insert(const std::string& key, ParsedSlice slice, std::set<PoolKey>* touched) {
    Erase(key, touched);
    touched->insert(slice.pool);
    slice_pool[key] = slice.pool;
    Pool& p = pools[slice.pool];
    p.slices[key] = std::move(slice);
  }
};

const std::vector<std::string>& DeviceMap::Reasons() {
  static const auto* reasons = new std::vector<std::string>{
      "incomplete_pool", "mig_devices",        "vfio_devices", "uuid_mismatch",
      "duplicate_device", "unknown_device",    "unpublished_device", "no_slices",
      "not_in_ledger"};
  return *reasons;
}

DeviceMap::DeviceMap(std::vector<std::string> lending_drivers, prometheus::Registry* registry)
    : drivers_(std::move(lending_drivers)), state_(std::make_unique<State>()) {
  auto empty = std::make_shared<Snapshot>();
  auto no_nodes = std::make_shared<const Snapshot::NodeShard>();
  auto no_devices = std::make_shared<const Snapshot::DraShard>();
  empty->nodes.fill(no_nodes);
  empty->to_ledger.fill(no_devices);
  for (const std::string& r : Reasons()) empty->counts[r] = 0;
  snapshot_ = std::move(empty);
  if (registry != nullptr) {
    auto& family = prometheus::BuildGauge()
                       .Name("duet_dra_unmappable_nodes")
                       .Help("Lending nodes duet does not lend on because their ResourceSlices do "
                             "not map cleanly onto the ledger's devices, by reason")
                       .Register(*registry);
    for (const std::string& r : Reasons()) gauges_[r] = &family.Add({{"reason", r}});
  }
}

DeviceMap::~DeviceMap() = default;

absl::Status DeviceMap::Update(const std::vector<json>& slices, const LedgerInventory& ledger,
                              std::vector<std::string>* changed) {
  const std::set<std::string> lending(drivers_.begin(), drivers_.end());
  auto state = std::make_unique<State>();
  std::set<PoolKey> touched;
  for (size_t i = 0; i < slices.size(); ++i) {
    const std::string label = Label(slices[i], i);
    ParsedSlice parsed;
    bool lends = false;
    if (absl::Status s = Parse(slices[i], label, lending, &parsed, &lends); !s.ok()) return s;
    if (!lends) continue;
    // Keyed by name; an unnamed or repeated one by its position (a key no
    // Kubernetes name can be, so each occurrence counts).
    std::string key = Name(slices[i]);
    if (key.empty() || state->slice_pool.count(key) != 0) key = absl::StrCat(" slices[", i, "]");
    state->Insert(key, std::move(parsed), &touched);
  }
  std::set<std::string> dirty;
  for (const PoolKey& k : touched) state->Resummarize(k, &dirty);
  state->inventory = ledger;
  for (const auto& [node, _] : ledger) dirty.insert(node);
  absl::MutexLock lock(&update_mu_);
  // Every node the map judged before is judged again (it may have left).
  const std::shared_ptr<const Snapshot> old = Current();
  for (const auto& shard : old->nodes) {
    for (const auto& [node, _] : *shard) dirty.insert(node);
  }
  state_ = std::move(state);
  Commit(dirty, changed);
  return absl::OkStatus();
}

absl::Status DeviceMap::Apply(const MapDelta& delta, std::vector<std::string>* changed) {
  const std::set<std::string> lending(drivers_.begin(), drivers_.end());
  std::vector<std::pair<std::string, std::optional<ParsedSlice>>> upserts;
  for (size_t i = 0; i < delta.upserted.size(); ++i) {
    const json& s = delta.upserted[i];
    const std::string label = Label(s, i);
    ParsedSlice parsed;
    bool lends = false;
    if (absl::Status st = Parse(s, label, lending, &parsed, &lends); !st.ok()) return st;
    const std::string name = Name(s);
    if (name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(label, ": metadata.name is required"));
    }
    upserts.emplace_back(name, lends ? std::optional<ParsedSlice>(std::move(parsed))
                                     : std::nullopt);
  }
  absl::MutexLock lock(&update_mu_);
  State& st = *state_;
  std::set<PoolKey> touched;
  for (const std::string& name : delta.deleted) st.Erase(name, &touched);
  for (auto& [name, parsed] : upserts) {
    if (parsed.has_value()) {
      st.Insert(name, std::move(*parsed), &touched);
    } else {
      st.Erase(name, &touched);  // now of a driver duet does not lend
    }
  }
  std::set<std::string> dirty;
  for (const PoolKey& k : touched) st.Resummarize(k, &dirty);
  for (const auto& [node, devices] : delta.inventory_set) {
    st.inventory[node] = devices;
    dirty.insert(node);
  }
  for (const std::string& node : delta.inventory_removed) {
    if (st.inventory.erase(node) != 0) dirty.insert(node);
  }
  Commit(dirty, changed);
  return absl::OkStatus();
}

std::shared_ptr<const DeviceMap::NodeEntry> DeviceMap::Judge(const std::string& node) const {
  const State& st = *state_;
  auto inv = st.inventory.find(node);
  if (inv == st.inventory.end()) return nullptr;  // not a lending node: not duet's
  auto entry = std::make_shared<NodeEntry>();
  std::optional<Unmappable> refused;
  auto refuse = [&](const std::string& reason, std::string detail) {
    if (!refused.has_value() || Rank(reason) < Rank(refused->reason)) {
      refused = Unmappable{reason, std::move(detail)};
    }
  };

  // The devices of complete pools published for this node.
  std::vector<Published> published;
  auto np = st.node_pools.find(node);
  if (np != st.node_pools.end()) {
    for (const PoolKey& key : np->second) {
      const State::Pool& p = st.pools.at(key);
      if (p.have < p.want) {
        if (p.slice_nodes.count(node) != 0) {
          refuse("incomplete_pool",
                 absl::StrCat("pool ", key.first, "/", key.second, " generation ", p.generation,
                              " has ", p.have, " of its ", p.want, " ResourceSlices"));
        }
        continue;
      }
      for (const auto& [_, s] : p.slices) {
        if (s.generation != p.generation) continue;
        for (const ParsedDevice& d : s.devices) {
          // perDeviceNodeSelection: a device may name its own node.
          const std::string& n = d.node.empty() ? s.node : d.node;
          if (n == node) published.push_back(Published{&key, &d});
        }
      }
    }
  }
  if (published.empty()) {
    refuse("no_slices",
           absl::StrCat("no complete ResourceSlice of a lending driver (",
                        absl::StrJoin(drivers_, ", "), ") publishes devices of node ", node));
    entry->why = std::move(*refused);  // (incomplete_pool, when that is why)
    return entry;
  }

  // Every published device against the inventory.
  std::map<std::pair<DeviceKind, uint32_t>, const InventoryDevice*> twins;
  for (const InventoryDevice& d : inv->second) twins[{d.kind, d.index}] = &d;
  std::map<dra::LedgerDevice, dra::DraDevice> mapped;
  for (const Published& p : published) {
    const std::string& driver = p.pool->first;
    const std::string& dev_name = p.device->name;
    const dra::DraDevice dra{driver, p.pool->second, dev_name};
    const std::string& type = p.device->type;
    std::optional<uint32_t> index;
    DeviceKind kind = DeviceKind::kGpu;
    if (driver == kNvidia) {
      if (absl::StrContains(dev_name, "-mig-") || type == "mig") {
        refuse("mig_devices", absl::StrCat(dra.ToString(), " is a MIG device: a taint on "
                                           "its GPU does not cover it"));
        continue;
      }
      if (absl::StartsWith(dev_name, "gpu-vfio-") || type == "vfio") {
        refuse("vfio_devices", absl::StrCat(dra.ToString(), " is a VFIO device: a taint "
                                            "on its GPU does not cover it"));
        continue;
      }
      if (!type.empty() && type != "gpu") {
        refuse("mig_devices",
               absl::StrCat(dra.ToString(), " is a ", type, " device (a partition of a GPU)"));
        continue;
      }
      index = IndexAfter(dev_name, "gpu-");
    } else if (driver == kTpu) {
      // Google's TPU driver names chips accel<N> after /dev/accel<N> (or by
      // VFIO group, which says nothing of the chip number: unknown here).
      kind = DeviceKind::kTpu;
      index = IndexAfter(dev_name, "accel");
    }
    auto twin = index.has_value() ? twins.find({kind, *index}) : twins.end();
    if (twin == twins.end()) {
      refuse("unknown_device",
             absl::StrCat(dra.ToString(), " has no twin in duet's inventory of node ", node));
      continue;
    }
    if (kind == DeviceKind::kGpu) {
      const std::string& uuid = p.device->uuid;
      if (!uuid.empty() && !twin->second->id.empty() && uuid != twin->second->id) {
        refuse("uuid_mismatch",
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
      refuse("duplicate_device",
             absl::StrCat(dra.ToString(), " and ", mapped[ledger_dev].ToString(), " both name ",
                          DeviceKindName(kind), " ", *index, " of node ", node));
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
      refuse("unpublished_device",
             absl::StrCat(DeviceKindName(d.kind), " ", d.index, " of node ", node,
                          " has no device in the lending drivers' ResourceSlices"));
    }
  }
  if (refused.has_value()) {
    entry->why = std::move(*refused);
    return entry;
  }
  entry->lendable = true;
  for (auto& [l, d] : mapped) {
    entry->devices.push_back(d);
    entry->mapped.emplace_back(l, std::move(d));
  }
  return entry;
}

void DeviceMap::Commit(const std::set<std::string>& dirty, std::vector<std::string>* changed) {
  const std::shared_ptr<const Snapshot> old = Current();
  auto snap = std::make_shared<Snapshot>(*old);  // shares every shard
  // Copy-on-first-write of the shards this commit changes.
  std::array<Snapshot::NodeShard*, kShards> node_copy{};
  std::array<Snapshot::DraShard*, kShards> dra_copy{};
  auto node_shard = [&](size_t i) {
    if (node_copy[i] == nullptr) {
      auto copy = std::make_shared<Snapshot::NodeShard>(*snap->nodes[i]);
      node_copy[i] = copy.get();
      snap->nodes[i] = std::move(copy);
    }
    return node_copy[i];
  };
  auto dra_shard = [&](size_t i) {
    if (dra_copy[i] == nullptr) {
      auto copy = std::make_shared<Snapshot::DraShard>(*snap->to_ledger[i]);
      dra_copy[i] = copy.get();
      snap->to_ledger[i] = std::move(copy);
    }
    return dra_copy[i];
  };
  if (changed != nullptr) changed->clear();
  // The DRA devices some dirty node claimed or claims, with the first dirty
  // node (by name) that claims it now.
  std::map<dra::DraDevice, std::optional<dra::LedgerDevice>> claims;
  for (const std::string& node : dirty) {
    const size_t si = ShardOf(node);
    const Snapshot::NodeShard& before = *snap->nodes[si];
    auto was_it = before.find(node);
    std::shared_ptr<const NodeEntry> was =
        was_it == before.end() ? nullptr : was_it->second;
    std::shared_ptr<const NodeEntry> now = Judge(node);
    if (was == nullptr && now == nullptr) continue;
    if (was != nullptr) {
      if (!was->lendable) --snap->counts[was->why.reason];
      for (const auto& [_, d] : was->mapped) claims[d];
    }
    if (now != nullptr) {
      if (!now->lendable) ++snap->counts[now->why.reason];
      for (const auto& [l, d] : now->mapped) {
        std::optional<dra::LedgerDevice>& first = claims[d];
        if (!first.has_value() || l.node < first->node) first = l;
      }
    }
    static const std::vector<dra::DraDevice> kNone;
    const auto& a = was != nullptr && was->lendable ? was->devices : kNone;
    const auto& b = now != nullptr && now->lendable ? now->devices : kNone;
    const bool in_a = was != nullptr && was->lendable;
    const bool in_b = now != nullptr && now->lendable;
    if (changed != nullptr && (in_a != in_b || a != b)) changed->push_back(node);
    if (now == nullptr) {
      node_shard(si)->erase(node);
    } else {
      (*node_shard(si))[node] = std::move(now);
    }
  }
  // Copy-on-first-write of the pools whose devices this commit changes.
  std::map<std::string, Snapshot::PoolDevices*> pool_copy;
  auto pool_devices = [&](const std::string& pool_id) {
    auto done = pool_copy.find(pool_id);
    if (done != pool_copy.end()) return done->second;
    Snapshot::DraShard* shard = dra_shard(ShardOf(pool_id));
    auto p = shard->find(pool_id);
    auto copy = p == shard->end() ? std::make_shared<Snapshot::PoolDevices>()
                                  : std::make_shared<Snapshot::PoolDevices>(*p->second);
    Snapshot::PoolDevices* raw = copy.get();
    (*shard)[pool_id] = std::move(copy);
    pool_copy[pool_id] = raw;
    return raw;
  };
  // A DRA device maps to the ledger device of the first node (by name) that
  // claims it (a pool may name several nodes). The nodes not re-judged claim
  // what they did: the owner before is still one unless it was re-judged;
  // only then are the pool's other nodes looked at.
  for (auto& [d, owner] : claims) {
    const std::string pool_id = Snapshot::PoolId(d);
    const dra::LedgerDevice* cur = snap->Owner(pool_id, d.device);
    if (cur != nullptr && dirty.count(cur->node) == 0) {
      if (!owner.has_value() || cur->node < owner->node) owner = *cur;
    } else if (cur != nullptr) {
      auto pool = state_->pools.find(PoolKey{d.driver, d.pool});
      const std::set<std::string> none;
      for (const std::string& node : pool != state_->pools.end() ? pool->second.nodes : none) {
        if (owner.has_value() && node >= owner->node) break;
        if (dirty.count(node) != 0) continue;
        const NodeEntry* e = snap->Find(node);
        if (e == nullptr || !e->lendable) continue;
        for (const auto& [l, m] : e->mapped) {
          if (m == d) owner = l;
        }
      }
    }
    if (!owner.has_value()) {
      if (cur != nullptr) pool_devices(pool_id)->erase(d.device);
    } else if (cur == nullptr || !(*cur == *owner)) {
      (*pool_devices(pool_id))[d.device] = *owner;
    }
  }
  for (const auto& [pool_id, devices] : pool_copy) {
    if (devices->empty()) dra_shard(ShardOf(pool_id))->erase(pool_id);
  }
  for (const auto& [reason, gauge] : gauges_) gauge->Set(snap->counts[reason]);
  std::shared_ptr<const Snapshot> prev;
  {
    absl::MutexLock lock(&mu_);
    prev = std::move(snapshot_);
    snapshot_ = std::move(snap);
  }
  // `prev` goes here, outside the lock (dirty is sorted, so is `changed`).
}

std::shared_ptr<const DeviceMap::Snapshot> DeviceMap::Current() const {
  absl::MutexLock lock(&mu_);
  return snapshot_;
}

std::optional<dra::LedgerDevice> DeviceMap::ToLedger(const dra::DraDevice& device) const {
  auto snap = Current();
  const dra::LedgerDevice* l = snap->Owner(Snapshot::PoolId(device), device.device);
  if (l == nullptr) return std::nullopt;
  return *l;
}

std::optional<dra::DraDevice> DeviceMap::ToDra(const dra::LedgerDevice& device) const {
  auto snap = Current();
  const NodeEntry* e = snap->Find(device.node);
  if (e == nullptr) return std::nullopt;
  for (const auto& [l, d] : e->mapped) {
    if (l == device) return d;
  }
  return std::nullopt;
}

bool DeviceMap::Lendable(const std::string& node, std::string* why) const {
  auto snap = Current();
  const NodeEntry* e = snap->Find(node);
  if (e != nullptr && e->lendable) return true;
  if (why != nullptr) *why = e != nullptr ? e->why.reason : "not_in_ledger";
  return false;
}

std::vector<dra::DraDevice> DeviceMap::NodeDevices(const std::string& node) const {
  auto snap = Current();
  const NodeEntry* e = snap->Find(node);
  return e != nullptr && e->lendable ? e->devices : std::vector<dra::DraDevice>{};
}

std::map<std::string, Unmappable> DeviceMap::UnmappableNodes() const {
  auto snap = Current();
  std::map<std::string, Unmappable> out;
  for (const auto& shard : snap->nodes) {
    for (const auto& [node, e] : *shard) {
      if (!e->lendable) out.emplace(node, e->why);
    }
  }
  return out;
}

std::map<std::string, int> DeviceMap::UnmappableCounts() const { return Current()->counts; }

}  // namespace k8s_dra
}  // namespace duet
