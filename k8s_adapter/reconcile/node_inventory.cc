#include "k8s_adapter/reconcile/node_inventory.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

absl::StatusOr<NodeSpec> NodeSpecFromNodeOrThrow(const nlohmann::json& node) {
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
  const int64_t gpu_count = *gpus / 1000;
  const int64_t tpu_count = *tpus / 1000;
  if (gpu_count <= 0 && tpu_count <= 0) {
    return absl::NotFoundError(absl::StrCat("node ", out.name, " has no ", kGpuResource, " or ",
                                            kTpuResource, " capacity"));
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

  for (int64_t i = 0; i < gpu_count; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kGpu;
    d.index = static_cast<uint32_t>(i);
    d.id = absl::StrCat(out.name, "/gpu", i);
    d.model = Label(out.labels, kGpuModelLabel);
    d.topology = topo;
    d.topology.nvlink_domain = Label(out.labels, kGpuCliqueLabel);
    out.devices.push_back(std::move(d));
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
    for (int64_t i = 0; i < tpu_count; ++i) {
      DeviceSpec d;
      d.kind = DeviceKind::kTpu;
      d.index = static_cast<uint32_t>(i);
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

}  // namespace

absl::StatusOr<NodeSpec> NodeSpecFromNode(const nlohmann::json& node) {
  try {
    return NodeSpecFromNodeOrThrow(node);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("malformed Node: ", e.what()));
  }
}

KubeNodeInventory::KubeNodeInventory(KubeClient* client, NodeInventoryOptions options)
    : client_(client), options_(std::move(options)) {}

KubeNodeInventory::~KubeNodeInventory() { Stop(); }

absl::Status KubeNodeInventory::Start(InventorySink* sink) {
  {
    absl::MutexLock l(&mu_);
    sink_ = sink;
    nodes_.clear();
    synced_ = false;
  }
  InformerOptions io = options_.informer;
  io.path = "/api/v1/nodes";
  io.label_selector = options_.label_selector;
  InformerHandler* handler = this;
  informer_ = std::make_unique<Informer>(client_, std::move(io), handler);
  absl::Status s = informer_->Start();
  if (!s.ok()) {
    informer_.reset();
    return absl::Status(s.code(), absl::StrCat("kubernetes node inventory: ", s.message()));
  }
  absl::MutexLock l(&mu_);
  spdlog::info("kubernetes node inventory: {} shared nodes (selector \"{}\")", nodes_.size(),
               options_.label_selector);
  return absl::OkStatus();
}

void KubeNodeInventory::Stop() {
  if (informer_) informer_->Stop();
}

InformerStats KubeNodeInventory::stats() const {
  return informer_ ? informer_->stats() : InformerStats{};
}

void KubeNodeInventory::OnUpsert(const nlohmann::json& object) {
  absl::StatusOr<NodeSpec> spec = NodeSpecFromNode(object);
  absl::MutexLock l(&mu_);
  if (!spec.ok()) {
    std::string name;
    try {
      name = object.at("metadata").at("name").get<std::string>();
    } catch (const nlohmann::json::exception&) {
      spdlog::error("kubernetes node inventory: {}", std::string(spec.status().message()));
      return;
    }
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

void KubeNodeInventory::OnDelete(const std::string& key, const nlohmann::json* last) {
  absl::MutexLock l(&mu_);
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

}  // namespace k8s
}  // namespace duet
