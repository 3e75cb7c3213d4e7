#include "bridge/inventory/inventory.h"

#include <malloc.h>
#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bridge/config/yaml_section.h"
#include "common/yaml/unique_keys.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace {

absl::Status ParseDevices(Section& node, const std::string& key, DeviceKind kind,
                          const Topology& node_topology, NodeSpec* out) {
  YAML::Node n = node.Child(key);
  if (!n) return absl::OkStatus();
  Section s(n, node.Path(key));
  DUET_YAML(s.Check());
  uint32_t count = 0;
  std::string model;
  std::vector<std::string> ids;
  Topology topo = node_topology;
  DUET_YAML(s.Int("count", &count));
  DUET_YAML(s.String("model", &model));
  DUET_YAML(s.StringList("ids", &ids));
  if (kind == DeviceKind::kGpu) {
    DUET_YAML(s.String("nvlink_domain", &topo.nvlink_domain));
  } else {
    DUET_YAML(s.String("host_bounds", &topo.tpu_host_bounds));
    DUET_YAML(s.String("topology", &topo.tpu_topology));
    DUET_YAML(s.StringList("subslice_shapes", &topo.tpu_subslice_shapes));
  }
  DUET_YAML(s.Finish());
  if (count == 0) return absl::InvalidArgumentError(s.Path("count") + ": must be at least 1");
  if (count > kMaxDevicesPerNode) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.Path("count"), ": must be at most ", kMaxDevicesPerNode));
  }
  if (!ids.empty() && ids.size() != count) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.Path("ids"), ": has ", ids.size(), " entries for ", count, " devices"));
  }
  for (uint32_t i = 0; i < count; ++i) {
    DeviceSpec d;
    d.kind = kind;
    d.index = i;
    d.id = ids.empty() ? absl::StrCat(out->name, "/", DeviceKindName(kind), i) : ids[i];
    d.model = model;
    d.topology = topo;
    out->devices.push_back(std::move(d));
  }
  return absl::OkStatus();
}

absl::Status ParseNode(const YAML::Node& n, const std::string& path, NodeSpec* out) {
  Section s(n, path);
  if (!n.IsMap()) return absl::InvalidArgumentError(path + ": must be a mapping");
  DUET_YAML(s.String("name", &out->name));
  if (out->name.empty()) return absl::InvalidArgumentError(s.Path("name") + ": must be set");
  DUET_YAML(s.Int("cpus", &out->cpus));
  DUET_YAML(s.Int("memory_mib", &out->memory_mib));
  DUET_YAML(s.String("pool", &out->pool));
  DUET_YAML(s.String("zone", &out->zone));
  DUET_YAML(s.StringMap("labels", &out->labels));
  std::string state = "ready";
  DUET_YAML(s.String("state", &state));
  if (state == "ready") {
    out->state = NodeState::kReady;
  } else if (state == "cordoned") {
    out->state = NodeState::kCordoned;
  } else if (state == "not-ready") {
    out->state = NodeState::kNotReady;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(s.Path("state"), ": \"", state, "\" must be ready, cordoned or not-ready"));
  }
  Topology topo;
  {
    Section t(s.Child("topology"), s.Path("topology"));
    DUET_YAML(t.Check());
    DUET_YAML(t.String("block", &topo.block));
    DUET_YAML(t.String("subblock", &topo.subblock));
    DUET_YAML(t.String("host", &topo.host));
    DUET_YAML(t.Finish());
  }
  DUET_YAML(ParseDevices(s, "gpus", DeviceKind::kGpu, topo, out));
  DUET_YAML(ParseDevices(s, "tpus", DeviceKind::kTpu, topo, out));
  DUET_YAML(s.Finish());
  absl::Status valid = ValidateNodeSpec(*out);
  if (!valid.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", valid.message()));
  return absl::OkStatus();
}

absl::Status ParseInventoryInto(const YAML::Node& root, std::vector<NodeSpec>* out) {
  Section top(root, "");
  DUET_YAML(top.Check());
  YAML::Node nodes = top.Child("nodes");
  DUET_YAML(top.Finish());
  if (!nodes) return absl::OkStatus();
  if (!nodes.IsSequence()) return absl::InvalidArgumentError("nodes: must be a list");
  std::set<std::string> names;
  for (size_t i = 0; i < nodes.size(); ++i) {
    NodeSpec spec;
    DUET_YAML(ParseNode(nodes[i], absl::StrCat("nodes[", i, "]"), &spec));
    if (!names.insert(spec.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("nodes[", i, "].name: \"", spec.name, "\" is listed twice"));
    }
    out->push_back(std::move(spec));
  }
  return absl::OkStatus();
}

class StaticInventory final : public InventorySource {
 public:
  explicit StaticInventory(std::string text) : text_(std::move(text)) {}
  absl::Status Start(InventorySink* sink) override {
    absl::StatusOr<std::vector<NodeSpec>> nodes = ParseInventory(text_);
    if (!nodes.ok()) return nodes.status();
    sink->ReplaceAll(*nodes);
    return absl::OkStatus();
  }
  void Stop() override {}

 private:
  const std::string text_;
};

// Thread-safety: `mu_` guards `stop_`; the poller thread is the only reader
// of `mtime_` after Start.
class FileInventory final : public InventorySource {
 public:
  FileInventory(std::string path, absl::Duration period)
      : path_(std::move(path)), period_(period) {}
  ~FileInventory() override { Stop(); }

  absl::Status Start(InventorySink* sink) override {
    absl::StatusOr<std::vector<NodeSpec>> nodes = Load(&mtime_);
    if (!nodes.ok()) return nodes.status();
    sink->ReplaceAll(*nodes);
    spdlog::info("inventory: {} nodes from {}", nodes->size(), path_);
    poller_ = std::thread([this, sink] { Poll(sink); });
    return absl::OkStatus();
  }

  void Stop() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (poller_.joinable()) poller_.join();
  }

 private:
  absl::StatusOr<std::vector<NodeSpec>> Load(struct timespec* mtime) {
    struct stat st;
    if (stat(path_.c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat("inventory file ", path_, ": cannot be read"));
    }
    *mtime = st.st_mtim;
    std::ifstream in(path_);
    std::stringstream buf;
    buf << in.rdbuf();
    absl::StatusOr<std::vector<NodeSpec>> nodes = ParseInventory(buf.str());
    if (!nodes.ok()) {
      return absl::Status(nodes.status().code(),
                          absl::StrCat("inventory file ", path_, ": ", nodes.status().message()));
    }
    return nodes;
  }

  void Poll(InventorySink* sink) {
    absl::MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), period_)) {
      mu_.Unlock();
      struct stat st;
      if (stat(path_.c_str(), &st) == 0 && (st.st_mtim.tv_sec != mtime_.tv_sec ||
                                            st.st_mtim.tv_nsec != mtime_.tv_nsec)) {
        absl::StatusOr<std::vector<NodeSpec>> nodes = Load(&mtime_);
        if (nodes.ok()) {
          spdlog::info("inventory: reloaded {} nodes from {}", nodes->size(), path_);
          sink->ReplaceAll(*nodes);
        } else {
          spdlog::error("inventory: keeping the last good inventory: {}",
                        std::string(nodes.status().message()));
        }
      }
      mu_.Lock();
    }
  }

  const std::string path_;
  const absl::Duration period_;
  struct timespec mtime_ = {};
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread poller_;
};

}  // namespace

absl::StatusOr<std::vector<NodeSpec>> ParseInventory(const std::string& yaml_text) {
  std::vector<NodeSpec> out;
  try {
    const YAML::Node root = YAML::Load(yaml_text);
    absl::Status s = CheckUniqueKeys(root);
    if (s.ok()) s = ParseInventoryInto(root, &out);
    if (!s.ok()) return s;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("YAML error at line ", e.mark.line + 1,
                                                   ", column ", e.mark.column + 1, ": ", e.msg));
  }
  return out;
}

void LedgerInventorySink::ReplaceAll(const std::vector<NodeSpec>& nodes) {
  std::set<std::string> keep;
  for (const NodeSpec& n : nodes) {
    keep.insert(n.name);
    Upsert(n);
  }
  for (const auto& view : ledger_->Snapshot().nodes) {
    if (!keep.count(view->spec.name) && view->spec.state != NodeState::kGone) {
      Remove(view->spec.name);
    }
  }
  // A full inventory is parsed from a large document (YAML or a Node list):
  // hand the parser's freed heap back to the system, or glibc keeps it and the
  // bridge's resident memory stays at the parse's peak.
  malloc_trim(0);
}

void LedgerInventorySink::Upsert(const NodeSpec& node) {
  absl::StatusOr<uint64_t> s = ledger_->UpsertNode(node);
  if (!s.ok()) spdlog::warn("inventory: node {} not updated: {}", node.name, std::string(s.status().message()));
}

void LedgerInventorySink::Remove(const std::string& name) {
  absl::StatusOr<uint64_t> s = ledger_->RemoveNode(name);
  if (!s.ok() && !absl::IsNotFound(s.status())) {
    spdlog::warn("inventory: node {} not removed: {}", name, std::string(s.status().message()));
  } else if (s.ok()) {
    spdlog::info("inventory: node {} left the inventory", name);
  }
}

const char* EmbeddedInventoryYaml() {
  return R"(nodes:
  - name: gke-h100-a
    cpus: 208
    memory_mib: 1843200
    pool: shared-h100
    zone: us-central1-a
    labels: {cloud.google.com/gke-accelerator: nvidia-h100-80gb, cloud.google.com/gke-nodepool: shared-h100}
    topology: {block: b1, subblock: s1}
    gpus: {count: 8, model: nvidia-h100-80gb, nvlink_domain: b1-s1-a}
  - name: gke-h100-b
    cpus: 208
    memory_mib: 1843200
    pool: shared-h100
    zone: us-central1-a
    labels: {cloud.google.com/gke-accelerator: nvidia-h100-80gb, cloud.google.com/gke-nodepool: shared-h100}
    topology: {block: b1, subblock: s2}
    gpus: {count: 8, model: nvidia-h100-80gb, nvlink_domain: b1-s2-b}
  - name: gke-tpu-a
    cpus: 224
    memory_mib: 196608
    pool: shared-v5e
    zone: us-central1-b
    labels: {cloud.google.com/gke-tpu-accelerator: tpu-v5-lite-podslice, cloud.google.com/gke-tpu-topology: 2x2, cloud.google.com/gke-nodepool: shared-v5e}
    tpus: {count: 4, model: tpu-v5-lite-podslice, host_bounds: 2x2, topology: 2x2, subslice_shapes: [1x1, 2x2]}
)";
}

std::unique_ptr<InventorySource> NewFileInventory(std::string path, absl::Duration reload_period) {
  return std::make_unique<FileInventory>(std::move(path), reload_period);
}

std::unique_ptr<InventorySource> NewStaticInventory(std::string yaml_text) {
  return std::make_unique<StaticInventory>(std::move(yaml_text));
}

}  // namespace duet
