#include "k8s_adapter/reconcile/node_inventory.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bridge/ledger/ledger.h"
#include "k8s_adapter/common/quantity.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace k8s {
namespace {

constexpr char kGpuResource[] = "nvidia.com/gpu";
constexpr char kTpuResource[] = "google.com/tpu";
constexpr char kGpuModelLabel[] = "cloud.google.com/gke-accelerator";
constexpr char kGpuCliqueLabel[] = "nvidia.com/gpu.clique";
constexpr char kTpuModelLabel[] = "cloud.google.com/gke-tpu-accelerator";
constexpr char kTpuTopologyLabel[] = "cloud.google.com/gke-tpu-topology";
constexpr char kPoolLabel[] = "cloud.google.com/gke-nodepool";
constexpr char kBlockLabel[] = "cloud.google.com/gce-topology-block";
constexpr char kSubblockLabel[] = "cloud.google.com/gce-topology-subblock";
constexpr char kHostLabel[] = "cloud.google.com/gce-topology-host";
constexpr char kSlinkyHostnameOverride[] = "nodeset.slinky.slurm.net/hostname-override";
const char* const kZoneLabels[] = {"topology.kubernetes.io/zone", "topology.gke.io/zone",
                                   "failure-domain.beta.kubernetes.io/zone"};

std::string Label(const std::map<std::string, std::string>& labels, const char* key) {
  auto it = labels.find(key);
  return it == labels.end() ? "" : it->second;
}

// A resource quantity from status.<which>, in milli-units; 0 when absent.
absl::StatusOr<int64_t> Resource(const nlohmann::json& status, const char* which, const char* name) {
  auto section = status.find(which);
  if (section == status.end() || !section->is_object()) return 0;
  auto q = section->find(name);
  if (q == section->end()) return 0;
  if (!q->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("status.", which, "[", name, "]: must be a string"));
  }
  absl::StatusOr<int64_t> v = ParseQuantityMilli(q->get<std::string>());
  if (!v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("status.", which, "[", name, "]: ", v.status().message()));
  }
  return v;
}

// Chips per host → host bounds. 2D chips (v5e, v6e) tile as 1x1, 2x2, 2x4;
// 3D chips (v4, v5p) as 2x2x1.
std::string TpuHostBounds(const std::string& model, uint32_t chips) {
  const bool three_d = model.find("v4") != std::string::npos || model.find("v5p") != std::string::npos;
  if (three_d) return chips == 4 ? "2x2x1" : (chips == 8 ? "2x2x2" : absl::StrCat(chips, "x1x1"));
  switch (chips) {
    case 1:
      return "1x1";
    case 4:
      return "2x2";
    case 8:
      return "2x4";
    default:
      return absl::StrCat(chips, "x1");
  }
}

std::vector<std::string> TpuSubsliceShapes(const std::string& host_bounds) {
  if (host_bounds == "1x1") return {"1x1"};
  if (host_bounds == "2x2") return {"1x1", "2x2"};
  if (host_bounds == "2x4") return {"1x1", "2x2", "2x4"};
  return {};
}

bool SameSpec(const NodeSpec& a, const NodeSpec& b) {
  return a.name == b.name && a.cpus == b.cpus && a.memory_mib == b.memory_mib &&
         a.devices == b.devices && a.labels == b.labels && a.pool == b.pool && a.zone == b.zone &&
         a.state == b.state;
}

// "gpu-<minor>" / "accel<N>" with nothing after the digits; false otherwise.
bool ParseIndexedName(const std::string& name, absl::string_view prefix, uint32_t* index) {
  if (!absl::StartsWith(name, prefix)) return false;
  absl::string_view digits = absl::string_view(name).substr(prefix.size());
  if (digits.empty() || digits.size() > 9) return false;
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return absl::SimpleAtoi(digits, index);
}

// The string value of device attribute `name` ({"string": v}), "" if absent.
std::string StringAttribute(const nlohmann::json& device, const std::string& name) {
  auto attrs = device.find("attributes");
  if (attrs == device.end() || !attrs->is_object()) return "";
  auto a = attrs->find(name);
  if (a == attrs->end() || !a->is_object()) return "";
  auto v = a->find("string");
  return v != a->end() && v->is_string() ? v->get<std::string>() : "";
}

// The indices of a DRA kind must be 0..n-1: Slurm's GRES index is a position
// in gres.conf's File= list, and the ledger's device index is that index.
absl::Status CheckContiguous(const std::string& node, const char* driver, const char* what,
                             const std::vector<uint32_t>& indices) {
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] != i) {
      return absl::InvalidArgumentError(absl::StrCat(
          "node ", node, ": ", driver, " publishes ", what, " [", absl::StrJoin(indices, ","),
          "], not 0..", indices.size() - 1,
          "; duet needs contiguous device numbers (Slurm's GRES indices are positions in "
          "gres.conf's File= list): not inventory"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<NodeSpec> NodeSpecFromNodeOrThrow(const nlohmann::json& node, const DraNodeDevices& dra,
                                                 std::vector<std::string>* warnings) {
  NodeSpec out;
  const nlohmann::json& md = node.at("metadata");
  out.name = md.at("name").get<std::string>();
  if (auto labels = md.find("labels"); labels != md.end() && labels->is_object()) {
    for (const auto& [k, v] : labels->items()) {
      if (v.is_string()) out.labels[k] = v.get<std::string>();
    }
  }
  // The one annotation duet reads, kept beside the labels: the Slurm node
  // name a Slinky NodeSet's slurmd registers (slurm.nodes: adopt).
  if (auto ann = md.find("annotations"); ann != md.end() && ann->is_object()) {
    auto o = ann->find(kSlinkyHostnameOverride);
    if (o != ann->end() && o->is_string()) out.labels[kSlinkyHostnameOverride] = o->get<std::string>();
  }
  static const nlohmann::json kEmpty = nlohmann::json::object();
  auto status_it = node.find("status");
  const nlohmann::json& status = status_it != node.end() && status_it->is_object() ? *status_it : kEmpty;
  auto spec_it = node.find("spec");
  const nlohmann::json& spec = spec_it != node.end() && spec_it->is_object() ? *spec_it : kEmpty;

  absl::StatusOr<int64_t> gpus = Resource(status, "capacity", kGpuResource);
  if (!gpus.ok()) return gpus.status();
  absl::StatusOr<int64_t> tpus = Resource(status, "capacity", kTpuResource);
  if (!tpus.ok()) return tpus.status();
  int64_t gpu_count = *gpus / 1000;
  int64_t tpu_count = *tpus / 1000;
  // A DRA driver owns the kind: its slices say what there is. KEP-5004 forbids
  // device-plugin capacity beside it; the slices win.
  if (dra.gpus_from_dra) {
    if (gpu_count > 0 && warnings != nullptr) {
      warnings->push_back(absl::StrCat("node ", out.name, " has ", kGpuResource, " capacity ",
                                       gpu_count, " beside ", kNvidiaDraDriver,
                                       " ResourceSlices (a device plugin and a DRA driver on one "
                                       "node); taking the DRA devices"));
    }
    gpu_count = static_cast<int64_t>(dra.gpus.size());
  }
  if (dra.tpus_from_dra) {
    if (tpu_count > 0 && warnings != nullptr) {
      warnings->push_back(absl::StrCat("node ", out.name, " has ", kTpuResource, " capacity ",
                                       tpu_count, " beside ", kTpuDraDriver,
                                       " ResourceSlices (a device plugin and a DRA driver on one "
                                       "node); taking the DRA devices"));
    }
    tpu_count = static_cast<int64_t>(dra.tpus.size());
  }
  if (gpu_count <= 0 && tpu_count <= 0) {
    return absl::NotFoundError(absl::StrCat("node ", out.name, " has no ", kGpuResource, " or ",
                                            kTpuResource, " capacity",
                                            dra.gpus_from_dra || dra.tpus_from_dra
                                                ? " and no complete DRA ResourceSlices"
                                                : ""));
  }
  if (gpu_count > static_cast<int64_t>(kMaxDevicesPerNode) ||
      tpu_count > static_cast<int64_t>(kMaxDevicesPerNode)) {
    return absl::InvalidArgumentError(absl::StrCat("node ", out.name, ": more than ", kMaxDevicesPerNode,
                                                   " devices of one kind"));
  }

  for (const char* which : {"allocatable", "capacity"}) {
    absl::StatusOr<int64_t> cpu = Resource(status, which, "cpu");
    absl::StatusOr<int64_t> mem = Resource(status, which, "memory");
    if (!cpu.ok()) return cpu.status();
    if (!mem.ok()) return mem.status();
    if (*cpu > 0 || *mem > 0) {
      out.cpus = static_cast<uint32_t>(*cpu / 1000);
      out.memory_mib = static_cast<uint64_t>(*mem / 1000 / (1 << 20));
      break;
    }
  }

  out.pool = Label(out.labels, kPoolLabel);
  for (const char* z : kZoneLabels) {
    out.zone = Label(out.labels, z);
    if (!out.zone.empty()) break;
  }
  Topology topo;
  topo.block = Label(out.labels, kBlockLabel);
  topo.subblock = Label(out.labels, kSubblockLabel);
  topo.host = Label(out.labels, kHostLabel);

  // (index, id) of each GPU.
  std::vector<std::pair<uint32_t, std::string>> gpu_list;
  if (dra.gpus_from_dra) {
    std::vector<uint32_t> minors;
    for (const auto& [minor, uuid] : dra.gpus) minors.push_back(minor);
    absl::Status c = CheckContiguous(out.name, kNvidiaDraDriver, "GPU minors", minors);
    if (!c.ok()) return c;
    for (const auto& [minor, uuid] : dra.gpus) {
      gpu_list.emplace_back(minor, uuid.empty() ? absl::StrCat(out.name, "/gpu", minor) : uuid);
    }
  } else {
    for (int64_t i = 0; i < gpu_count; ++i) {
      gpu_list.emplace_back(static_cast<uint32_t>(i), absl::StrCat(out.name, "/gpu", i));
    }
  }
  for (auto& [index, id] : gpu_list) {
    DeviceSpec d;
    d.kind = DeviceKind::kGpu;
    d.index = index;
    d.id = std::move(id);
    d.model = Label(out.labels, kGpuModelLabel);
    d.topology = topo;
    d.topology.nvlink_domain = Label(out.labels, kGpuCliqueLabel);
    out.devices.push_back(std::move(d));
  }
  std::vector<uint32_t> tpu_list;
  if (dra.tpus_from_dra) {
    tpu_list.assign(dra.tpus.begin(), dra.tpus.end());
    absl::Status c = CheckContiguous(out.name, kTpuDraDriver, "TPU chips", tpu_list);
    if (!c.ok()) return c;
  } else {
    for (int64_t i = 0; i < tpu_count; ++i) tpu_list.push_back(static_cast<uint32_t>(i));
  }
  if (tpu_count > 0) {
    Topology t = topo;
    const std::string model = Label(out.labels, kTpuModelLabel);
    t.tpu_host_bounds = TpuHostBounds(model, static_cast<uint32_t>(tpu_count));
    t.tpu_topology = Label(out.labels, kTpuTopologyLabel);
    // Sub-slices only on a single-host slice: a multi-host slice is one gang.
    if (t.tpu_topology.empty() || t.tpu_topology == t.tpu_host_bounds) {
      t.tpu_subslice_shapes = TpuSubsliceShapes(t.tpu_host_bounds);
    }
    for (uint32_t i : tpu_list) {
      DeviceSpec d;
      d.kind = DeviceKind::kTpu;
      d.index = i;
      d.id = absl::StrCat(out.name, "/tpu", i);
      d.model = model;
      d.topology = t;
      out.devices.push_back(std::move(d));
    }
  }

  bool ready = false;
  if (auto conds = status.find("conditions"); conds != status.end() && conds->is_array()) {
    for (const nlohmann::json& c : *conds) {
      if (c.value("type", "") == "Ready") ready = c.value("status", "") == "True";
    }
  }
  const bool cordoned = spec.value("unschedulable", false) || md.contains("deletionTimestamp");
  out.state = !ready ? NodeState::kNotReady : (cordoned ? NodeState::kCordoned : NodeState::kReady);

  absl::Status valid = ValidateNodeSpec(out);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("node ", out.name, ": ", valid.message()));
  }
  return out;
}

// A Node without what the inventory never reads (the image list is most of a
// GKE Node's bytes), kept for re-evaluation when its slices change.
nlohmann::json Trimmed(const nlohmann::json& node) {
  nlohmann::json out = node;
  if (auto st = out.find("status"); st != out.end() && st->is_object()) st->erase("images");
  return out;
}

absl::StatusOr<DraSlice> DraSliceFromObjectOrThrow(const nlohmann::json& slice) {
  DraSlice out;
  const nlohmann::json& spec = slice.at("spec");
  out.driver = spec.at("driver").get<std::string>();
  if (auto n = spec.find("nodeName"); n != spec.end() && !n->is_null()) out.node = n->get<std::string>();
  const nlohmann::json& pool = spec.at("pool");
  out.pool = pool.at("name").get<std::string>();
  out.generation = pool.value("generation", int64_t{0});
  out.slice_count = pool.value("resourceSliceCount", int64_t{1});
  if (out.slice_count < 1) {
    return absl::InvalidArgumentError(absl::StrCat("spec.pool.resourceSliceCount: ", out.slice_count,
                                                   "; must be at least 1"));
  }
  auto devices = spec.find("devices");
  if (devices == spec.end() || devices->is_null()) return out;
  if (!devices->is_array()) return absl::InvalidArgumentError("spec.devices: must be a list");
  for (size_t i = 0; i < devices->size(); ++i) {
    const nlohmann::json& d = (*devices)[i];
    const std::string name = d.at("name").get<std::string>();
    uint32_t index = 0;
    if (out.driver == kNvidiaDraDriver && ParseIndexedName(name, "gpu-", &index)) {
      std::string uuid = StringAttribute(d, "uuid");
      if (uuid.empty()) uuid = StringAttribute(d, absl::StrCat(kNvidiaDraDriver, "/uuid"));
      out.gpus[index] = std::move(uuid);
    } else if (out.driver == kTpuDraDriver && ParseIndexedName(name, "accel", &index)) {
      out.tpus.insert(index);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<DraSlice> DraSliceFromObject(const nlohmann::json& slice) {
  try {
    return DraSliceFromObjectOrThrow(slice);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("malformed ResourceSlice: ", e.what()));
  }
}

void MergeDraSlices(const std::vector<const DraSlice*>& slices, DraNodeDevices* out) {
  // (driver, pool) → the highest generation, its slices.
  std::map<std::pair<std::string, std::string>, std::pair<int64_t, std::vector<const DraSlice*>>> pools;
  for (const DraSlice* s : slices) {
    auto [it, added] = pools.try_emplace({s->driver, s->pool}, s->generation, std::vector<const DraSlice*>{});
    if (s->generation > it->second.first) {
      it->second.first = s->generation;
      it->second.second.clear();
    }
    if (s->generation == it->second.first) it->second.second.push_back(s);
  }
  for (const auto& [key, gen] : pools) {
    const std::vector<const DraSlice*>& of = gen.second;
    int64_t want = 1;
    for (const DraSlice* s : of) want = std::max(want, s->slice_count);
    if (static_cast<int64_t>(of.size()) < want) continue;  // not all published yet
    for (const DraSlice* s : of) {
      out->gpus.insert(s->gpus.begin(), s->gpus.end());
      out->tpus.insert(s->tpus.begin(), s->tpus.end());
    }
  }
}

absl::StatusOr<NodeSpec> NodeSpecFromNode(const nlohmann::json& node) {
  return NodeSpecFromNode(node, DraNodeDevices{}, nullptr);
}

absl::StatusOr<NodeSpec> NodeSpecFromNode(const nlohmann::json& node, const DraNodeDevices& dra,
                                          std::vector<std::string>* warnings) {
  try {
    return NodeSpecFromNodeOrThrow(node, dra, warnings);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("malformed Node: ", e.what()));
  }
}

KubeNodeInventory::KubeNodeInventory(KubeClient* client, NodeInventoryOptions options)
    : client_(client),
      options_(std::move(options)),
      dra_pools_(options_.dra_pools.begin(), options_.dra_pools.end()) {
  for (const std::string& d : options_.dra_drivers) {
    if (d == kNvidiaDraDriver) gpus_from_dra_ = true;
    if (d == kTpuDraDriver) tpus_from_dra_ = true;
  }
}

KubeNodeInventory::~KubeNodeInventory() { Stop(); }

absl::Status KubeNodeInventory::Start(InventorySink* sink) {
  {
    absl::MutexLock l(&mu_);
    sink_ = sink;
    nodes_.clear();
    synced_ = false;
    dra_nodes_.clear();
    slices_.clear();
    slices_of_node_.clear();
    mixed_logged_.clear();
  }
  if (!dra_pools_.empty()) {
    // Slices first: the Nodes' first list then finds them, and the first
    // ReplaceAll has the DRA pools' devices.
    InformerOptions so = options_.informer;
    so.path = "/apis/resource.k8s.io/v1/resourceslices";
    so.label_selector.clear();
    so.field_selector.clear();
    InformerHandler* handler = &slice_handler_;
    slice_informer_ = std::make_unique<Informer>(client_, std::move(so), handler);
    absl::Status s = slice_informer_->Start();
    if (!s.ok()) {
      slice_informer_.reset();
      return absl::Status(s.code(), absl::StrCat("kubernetes node inventory: resourceslices (dra pools): ",
                                                 s.message()));
    }
  }
  InformerOptions io = options_.informer;
  io.path = "/api/v1/nodes";
  io.label_selector = options_.label_selector;
  InformerHandler* handler = this;
  informer_ = std::make_unique<Informer>(client_, std::move(io), handler);
  absl::Status s = informer_->Start();
  if (!s.ok()) {
    informer_.reset();
    if (slice_informer_) {
      slice_informer_->Stop();
      slice_informer_.reset();
    }
    return absl::Status(s.code(), absl::StrCat("kubernetes node inventory: ", s.message()));
  }
  absl::MutexLock l(&mu_);
  spdlog::info("kubernetes node inventory: {} shared nodes (selector \"{}\"){}", nodes_.size(),
               options_.label_selector,
               dra_pools_.empty() ? ""
                                  : absl::StrCat("; DRA pools ", absl::StrJoin(dra_pools_, ","), ": ",
                                                 dra_nodes_.size(), " nodes, ", slices_.size(),
                                                 " ResourceSlices"));
  return absl::OkStatus();
}

void KubeNodeInventory::Stop() {
  if (informer_) informer_->Stop();
  if (slice_informer_) slice_informer_->Stop();
}

InformerStats KubeNodeInventory::stats() const {
  return informer_ ? informer_->stats() : InformerStats{};
}

bool KubeNodeInventory::InDraPool(const nlohmann::json& node) const {
  if (dra_pools_.empty()) return false;
  auto md = node.find("metadata");
  if (md == node.end() || !md->is_object()) return false;
  auto labels = md->find("labels");
  if (labels == md->end() || !labels->is_object()) return false;
  auto pool = labels->find(kPoolLabel);
  return pool != labels->end() && pool->is_string() && dra_pools_.count(pool->get<std::string>()) > 0;
}

absl::StatusOr<NodeSpec> KubeNodeInventory::Evaluate(const std::string& name, const nlohmann::json& node,
                                                     bool dra) {
  if (!dra) return NodeSpecFromNode(node);
  DraNodeDevices devices;
  devices.gpus_from_dra = gpus_from_dra_;
  devices.tpus_from_dra = tpus_from_dra_;
  std::vector<const DraSlice*> mine;
  if (auto it = slices_of_node_.find(name); it != slices_of_node_.end()) {
    for (const std::string& key : it->second) mine.push_back(&slices_.at(key));
  }
  MergeDraSlices(mine, &devices);
  std::vector<std::string> warnings;
  absl::StatusOr<NodeSpec> spec = NodeSpecFromNode(node, devices, &warnings);
  if (warnings.empty()) {
    mixed_logged_.erase(name);
  } else if (mixed_logged_.insert(name).second) {
    for (const std::string& w : warnings) spdlog::error("kubernetes node inventory: {}", w);
  }
  return spec;
}

void KubeNodeInventory::Apply(const std::string& name, absl::StatusOr<NodeSpec> spec) {
  if (!spec.ok()) {
    if (spec.status().code() != absl::StatusCode::kNotFound) {
      spdlog::error("kubernetes node inventory: {}", std::string(spec.status().message()));
    }
    // Not (or no longer) shared inventory.
    if (nodes_.erase(name) > 0 && synced_) sink_->Remove(name);
    return;
  }
  auto it = nodes_.find(spec->name);
  if (it != nodes_.end() && SameSpec(it->second, *spec)) return;  // a heartbeat
  if (synced_) sink_->Upsert(*spec);
  nodes_[spec->name] = *std::move(spec);
}

void KubeNodeInventory::OnUpsert(const nlohmann::json& object) {
  std::string name;
  try {
    name = object.at("metadata").at("name").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    spdlog::error("kubernetes node inventory: malformed Node: {}", e.what());
    return;
  }
  const bool dra = InDraPool(object);
  absl::MutexLock l(&mu_);
  if (dra) {
    dra_nodes_[name] = Trimmed(object);
  } else if (dra_nodes_.erase(name) > 0) {
    mixed_logged_.erase(name);
  }
  Apply(name, Evaluate(name, object, dra));
}

void KubeNodeInventory::OnDelete(const std::string& key, const nlohmann::json* last) {
  absl::MutexLock l(&mu_);
  dra_nodes_.erase(key);
  mixed_logged_.erase(key);
  if (nodes_.erase(key) > 0 && synced_) sink_->Remove(key);
}

void KubeNodeInventory::OnSynced() {
  absl::MutexLock l(&mu_);
  std::vector<NodeSpec> all;
  all.reserve(nodes_.size());
  for (const auto& [name, spec] : nodes_) all.push_back(spec);
  sink_->ReplaceAll(all);
  synced_ = true;
}

void KubeNodeInventory::Reevaluate(const std::string& node) {
  auto it = dra_nodes_.find(node);
  if (it == dra_nodes_.end()) return;
  Apply(node, Evaluate(node, it->second, true));
}

void KubeNodeInventory::PutSlice(const std::string& key, absl::StatusOr<DraSlice> slice) {
  absl::MutexLock l(&mu_);
  std::string old_node;
  if (auto it = slices_.find(key); it != slices_.end()) {
    old_node = it->second.node;
    slices_of_node_[old_node].erase(key);
    if (slices_of_node_[old_node].empty()) slices_of_node_.erase(old_node);
    slices_.erase(it);
  }
  std::string new_node;
  if (slice.ok() && !slice->node.empty() &&
      std::find(options_.dra_drivers.begin(), options_.dra_drivers.end(), slice->driver) !=
          options_.dra_drivers.end()) {
    new_node = slice->node;
    slices_of_node_[new_node].insert(key);
    slices_.emplace(key, *std::move(slice));
  }
  if (!old_node.empty()) Reevaluate(old_node);
  if (!new_node.empty() && new_node != old_node) Reevaluate(new_node);
}

void KubeNodeInventory::SliceHandler::OnUpsert(const nlohmann::json& object) {
  std::string key;
  try {
    key = object.at("metadata").at("name").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    spdlog::error("kubernetes node inventory: malformed ResourceSlice: {}", e.what());
    return;
  }
  absl::StatusOr<DraSlice> slice = DraSliceFromObject(object);
  if (!slice.ok()) {
    // Its devices are not known: as if it were gone.
    spdlog::error("kubernetes node inventory: ResourceSlice {}: {}", key,
                  std::string(slice.status().message()));
  }
  inventory_->PutSlice(key, std::move(slice));
}

void KubeNodeInventory::SliceHandler::OnDelete(const std::string& key, const nlohmann::json* last) {
  inventory_->PutSlice(key, absl::NotFoundError("deleted"));
}

}  // namespace k8s
}  // namespace duet
