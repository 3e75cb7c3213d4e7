#include "bridge/placement/tpu_slice.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace duet::placement {
namespace {

constexpr uint32_t kMaxTopologyChips = 1u << 20;

// The slice of a node with `pool` and these devices (spec.devices or the
// view's device specs).
template <typename DeviceRange, typename SpecOf>
std::optional<TpuSliceHost> SliceOf(const std::string& pool, const DeviceRange& devices,
                                    SpecOf spec_of) {
  TpuSliceHost s;
  for (const auto& d : devices) {
    const DeviceSpec& spec = spec_of(d);
    if (spec.kind != DeviceKind::kTpu) continue;
    ++s.chips;
    if (s.topology.empty()) {
      s.topology = spec.topology.tpu_topology;
      s.accelerator = spec.model;
    }
  }
  if (s.chips == 0 || s.topology.empty() || pool.empty()) return std::nullopt;
  absl::StatusOr<uint32_t> total = TpuTopologyChips(s.topology);
  if (!total.ok() || *total <= s.chips || *total % s.chips != 0) return std::nullopt;
  s.pool = pool;
  s.hosts = *total / s.chips;
  return s;
}

std::string Shape(const std::string& topology, const std::string& accelerator) {
  return accelerator.empty() ? absl::StrCat(topology, " slice")
                             : absl::StrCat(topology, " slice of ", accelerator);
}

}  // namespace

absl::StatusOr<uint32_t> TpuTopologyChips(absl::string_view topology) {
  uint64_t chips = 1;
  const std::vector<absl::string_view> dims = absl::StrSplit(topology, 'x');
  for (absl::string_view d : dims) {
    uint32_t n = 0;
    if (d.empty() || !absl::SimpleAtoi(d, &n) || n == 0 || d[0] == '+' || d[0] == '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          "TPU topology \"", topology, "\": must be dimensions joined by 'x' (\"4x4\", \"2x2x4\")"));
    }
    chips *= n;
    if (chips > kMaxTopologyChips) {
      return absl::InvalidArgumentError(
          absl::StrCat("TPU topology \"", topology, "\": more than ", kMaxTopologyChips, " chips"));
    }
  }
  return static_cast<uint32_t>(chips);
}

std::optional<TpuSliceHost> TpuSliceOf(const NodeSpec& spec) {
  return SliceOf(spec.pool, spec.devices, [](const DeviceSpec& d) -> const DeviceSpec& { return d; });
}

std::optional<TpuSliceHost> TpuSliceOf(const NodeView& view) {
  return SliceOf(view.spec.pool, view.devices,
                 [](const DeviceState& d) -> const DeviceSpec& { return d.spec; });
}

std::optional<GangPick> PickTpuSlice(const std::vector<SliceCandidate>& hosts,
                                     const std::string& topology, const std::string& accelerator,
                                     uint32_t members, uint32_t member_chips, std::string* reason) {
  // The slices of the asked shape, by pool name.
  std::map<std::string, std::vector<const SliceCandidate*>> pools;
  for (const SliceCandidate& c : hosts) {
    if (c.slice.topology != topology) continue;
    if (!accelerator.empty() && c.slice.accelerator != accelerator) continue;
    pools[c.slice.pool].push_back(&c);
  }
  const std::string shape = Shape(topology, accelerator);
  auto say = [&](std::string why) {
    if (reason != nullptr) *reason = std::move(why);
    return std::nullopt;
  };
  if (pools.empty()) return say(absl::StrCat("no multi-host TPU ", shape, " is known"));
  std::vector<std::string> obstacles;
  for (auto& [pool, nodes] : pools) {
    const TpuSliceHost& slice = nodes.front()->slice;
    // One member per host, every chip of it: the gang's shape must be the
    // slice's (the same for every slice of this topology and model).
    if (members != slice.hosts) {
      return say(absl::StrCat("a ", shape, " has ", slice.hosts, " hosts, one member each; this gang has ",
                              members, " members"));
    }
    if (member_chips != slice.chips) {
      return say(absl::StrCat("a member of a ", shape, " takes every chip of its host (",
                              slice.chips, "); these members ask ", member_chips));
    }
    std::sort(nodes.begin(), nodes.end(),
              [](const SliceCandidate* a, const SliceCandidate* b) { return a->node < b->node; });
    std::string obstacle;
    if (nodes.size() != slice.hosts) {
      obstacle = absl::StrCat(nodes.size(), " of its ", slice.hosts, " hosts are known");
    }
    for (const SliceCandidate* c : nodes) {
      if (!obstacle.empty()) break;
      if (!c->busy.empty()) obstacle = absl::StrCat("host ", c->node, ": ", c->busy);
    }
    if (obstacle.empty()) {
      GangPick pick;
      for (const SliceCandidate* c : nodes) pick.nodes.push_back(c->node);
      pick.per_node = 1;
      pick.level = DomainLevel::kPool;
      return pick;
    }
    obstacles.push_back(absl::StrCat("pool ", pool, ": ", obstacle));
  }
  constexpr size_t kShown = 4;
  std::string text = absl::StrJoin(obstacles.begin(),
                                   obstacles.begin() + std::min(obstacles.size(), kShown), "; ");
  if (obstacles.size() > kShown) absl::StrAppend(&text, "; and ", obstacles.size() - kShown, " more");
  return say(absl::StrCat("no ", shape, " is free whole (", text, ")"));
}

std::string SliceRefusal(const std::string& node, const TpuSliceHost& slice) {
  return absl::StrCat("TPU_SLICE_WHOLE: node ", node, " is one of the ", slice.hosts,
                      " hosts of multi-host TPU slice ", slice.pool, " (", slice.topology,
                      "): a slice is taken whole, by a gang of ", slice.hosts,
                      " pods of ", slice.chips, " chips (one per host) or by Slurm, never by a single pod");
}

}  // namespace duet::placement
