// What a ledger node becomes in Slurm (slurm_sync.h): ParseSlurmNodeMode,
// SlurmNameFor, SlurmNodeFor (name, address, CPUs, memory, GRES, features),
// SlurmTopologyFor and SlurmWeightFor.

#include "bridge/slurm/slurm_sync.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "bridge/placement/placement.h"
#include "bridge/placement/topology.h"
#include "bridge/placement/tpu_slice.h"
#include "bridge/slurm/libslurm_client.h"

namespace duet {


namespace {

std::string Label(const NodeSpec& spec, const char* key) {
  auto it = spec.labels.find(key);
  return it == spec.labels.end() ? "" : it->second;
}

}  // namespace

absl::StatusOr<SlurmNodeMode> ParseSlurmNodeMode(const std::string& s) {
  if (s == "create") return SlurmNodeMode::kCreate;
  if (s == "adopt") return SlurmNodeMode::kAdopt;
  return absl::InvalidArgumentError(
      absl::StrCat("slurm node mode \"", s, "\": must be create or adopt"));
}

std::string SlurmNameFor(const NodeSpec& spec) {
  const std::string over = Label(spec, kSlinkyHostnameOverride);
  if (!over.empty()) return over;
  return spec.name.substr(0, spec.name.find('.'));
}

SlurmNodeConfig SlurmNodeFor(const NodeView& view, const SlurmSyncOptions& options) {
  const NodeSpec& spec = view.spec;
  SlurmNodeConfig c;
  c.name = spec.name;
  c.addr = Label(spec, options.node_addr_label.c_str());
  c.cpus = std::max<uint32_t>(1, spec.cpus);
  c.real_memory_mib = std::max<uint64_t>(1, spec.memory_mib);
  std::map<std::pair<std::string, std::string>, uint32_t> gres;
  std::set<std::string> features;
  // The marker means "duet made it, duet may delete it": never on a node
  // that a slurmd registered.
  if (!options.managed_feature.empty() && options.node_mode == SlurmNodeMode::kCreate) {
    features.insert(options.managed_feature);
  }
  for (const DeviceState& d : view.devices) {
    const std::string name = d.spec.kind == DeviceKind::kGpu ? "gpu" : "tpu";
    ++gres[{name, SanitizeFeature(d.spec.model)}];
    if (!d.spec.model.empty()) features.insert(SanitizeFeature(d.spec.model));
    if (!d.spec.topology.tpu_topology.empty()) {
      features.insert(SanitizeFeature("tpu-topology-" + d.spec.topology.tpu_topology));
    }
  }
  for (const auto& [key, count] : gres) c.gres.push_back({key.first, key.second, count});
  for (const std::string& v :
       {spec.pool, spec.zone, Label(spec, "cloud.google.com/gke-accelerator"),
        Label(spec, "cloud.google.com/gke-tpu-accelerator")}) {
    if (!v.empty()) features.insert(SanitizeFeature(v));
  }
  // The block and sub-block as features, on every Slurm version (from 25.05
  // the block can also be the node's Topology=, SlurmTopologyFor): labels
  // first, then the devices' topology (placement::TopologyOf).
  // A host of a multi-host TPU slice names its slice (the node pool), so a
  // Slurm job can ask for one slice whole (docs/gangs.md 5).
  if (auto slice = placement::TpuSliceOf(view)) {
    features.insert(SanitizeFeature("tpu-slice-" + slice->pool));
  }
  const placement::NodeTopology topo = placement::TopologyOf(view);
  if (!topo.block.empty()) features.insert(SanitizeFeature("block-" + topo.block));
  if (!topo.subblock.empty()) features.insert(SanitizeFeature("subblock-" + topo.subblock));
  c.features.assign(features.begin(), features.end());
  c.weight = SlurmWeightFor(view, options);
  c.topology = SlurmTopologyFor(view, options);
  return c;
}

std::string SlurmTopologyFor(const NodeView& view, const SlurmSyncOptions& options) {
  // Only a node duet creates: a node slurmd registers (adopt) takes its
  // Topology= from its own --conf, as the operator set it.
  if (options.block_topology.empty() || options.node_mode != SlurmNodeMode::kCreate) return "";
  const std::string block = placement::TopologyOf(view).block;
  if (block.empty()) return "";
  // The unit as the features spell it (lower case, [a-z0-9._-]): the name
  // the operator lists in topology.conf (BlockName=) or topology.yaml.
  return absl::StrCat(options.block_topology, ":", SanitizeFeature(block));
}

uint32_t SlurmWeightFor(const NodeView& view, const SlurmSyncOptions& options) {
  // One implementation: the placement library's policy decides Slurm's node
  // order too (fuller nodes weigh less, so Slurm's first fit packs).
  const std::shared_ptr<const placement::Workload> workload =
      options.workload ? options.workload() : nullptr;
  return placement::Scorer(options.policy, workload.get()).SlurmWeight(view, placement::NodeLoad{});
}

}  // namespace duet
