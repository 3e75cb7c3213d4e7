#include "bridge/placement/topology.h"

#include <algorithm>
#include <array>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace duet::placement {
namespace {

constexpr char kBlockLabel[] = "cloud.google.com/gce-topology-block";
constexpr char kSubblockLabel[] = "cloud.google.com/gce-topology-subblock";
constexpr char kHostLabel[] = "cloud.google.com/gce-topology-host";
constexpr char kCliqueLabel[] = "nvidia.com/gpu.clique";

std::string Label(const NodeSpec& spec, const char* key) {
  auto it = spec.labels.find(key);
  return it == spec.labels.end() ? "" : it->second;
}

NodeTopology FromLabels(const NodeSpec& spec) {
  NodeTopology t;
  t.block = Label(spec, kBlockLabel);
  t.subblock = Label(spec, kSubblockLabel);
  t.host = Label(spec, kHostLabel);
  t.clique = Label(spec, kCliqueLabel);
  return t;
}

void FillFrom(const Topology& d, NodeTopology* t) {
  if (t->block.empty()) t->block = d.block;
  if (t->subblock.empty()) t->subblock = d.subblock;
  if (t->host.empty()) t->host = d.host;
  if (t->clique.empty()) t->clique = d.nvlink_domain;
}

// Domain keys: a sub-block is named within its block, everything within its
// pool, so equal names in different places never merge. '\n' cannot occur in
// a label value.
std::string CliqueKey(const NodeTopology& t) { return t.clique.empty() ? "" : "c\n" + t.clique; }
std::string SubblockKey(const NodeTopology& t) {
  return t.subblock.empty() ? "" : absl::StrCat("s\n", t.block, "\n", t.subblock);
}
std::string BlockKey(const NodeTopology& t) { return t.block.empty() ? "" : "b\n" + t.block; }

// A domain of one pool at one level: (pool, block, sub-block or clique).
// Views into the candidates, so grouping allocates no strings.
using DomainKey = std::tuple<absl::string_view, absl::string_view, absl::string_view>;

// The best way to place the gang found so far at one level.
struct Option {
  uint32_t per_node = 0;
  std::vector<uint32_t> picked;  // candidate indices
  uint64_t stranded = 0;         // free milli left on the picked nodes
  uint64_t domain_free = 0;      // free milli of the whole domain
};

// Fewest nodes, least stranded, the fullest domain (leaving roomier ones
// whole), then the smaller sorted name list.
bool Better(const Option& a, const Option& b, const std::vector<GangCandidate>& c) {
  if (a.picked.size() != b.picked.size()) return a.picked.size() < b.picked.size();
  if (a.stranded != b.stranded) return a.stranded < b.stranded;
  if (a.domain_free != b.domain_free) return a.domain_free < b.domain_free;
  auto names = [&](const Option& o) {
    std::vector<absl::string_view> n;
    for (uint32_t i : o.picked) n.push_back(c[i].node);
    std::sort(n.begin(), n.end());
    return n;
  };
  return names(a) < names(b);
}

uint64_t Leftover(const GangCandidate& c, uint32_t per_node) {
  const uint64_t used = c.member_milli * per_node;
  return c.free_milli > used ? c.free_milli - used : 0;
}

// The domain's best option: for each per-node count (largest first, so the
// fewest nodes first), the fullest nodes that take it. `members_of` is in
// the global order (fullest first, then by name).
std::optional<Option> BestIn(const std::vector<uint32_t>& members_of,
                             const std::vector<GangCandidate>& c,
                             const std::vector<uint32_t>& per_node_counts, uint32_t members) {
  for (uint32_t m : per_node_counts) {
    const uint32_t k = members / m;
    if (k < 2 || members_of.size() < k) continue;  // one node: the node level
    Option o;
    o.per_node = m;
    for (uint32_t i : members_of) {
      if (c[i].fits < m) continue;
      o.picked.push_back(i);
      o.stranded += Leftover(c[i], m);
      if (o.picked.size() == k) break;
    }
    if (o.picked.size() < k) continue;
    for (uint32_t i : members_of) o.domain_free += c[i].free_milli;
    return o;
  }
  return std::nullopt;
}

std::string NoRoomReason(const std::vector<GangCandidate>& c, const std::vector<uint32_t>& order,
                         uint32_t members) {
  if (order.empty()) return absl::StrCat("gang of ", members, ": no node has room for a member");
  struct PoolRoom {
    uint64_t slots = 0;
    uint32_t nodes = 0;
    uint32_t most = 0;
  };
  std::map<absl::string_view, PoolRoom> pools;
  for (uint32_t i : order) {
    PoolRoom& p = pools[c[i].pool];
    p.slots += c[i].fits;
    ++p.nodes;
    p.most = std::max(p.most, c[i].fits);
  }
  std::vector<std::string> parts;
  for (const auto& [pool, room] : pools) {
    if (parts.size() == 4) {
      parts.push_back(absl::StrCat("and ", pools.size() - 4, " more pools"));
      break;
    }
    parts.push_back(absl::StrCat("pool \"", pool, "\" has room for ", room.slots, " on ", room.nodes,
                                 room.nodes == 1 ? " node" : " nodes", " (at most ", room.most,
                                 " per node)"));
  }
  return absl::StrCat("gang of ", members,
                      ": no pool holds every member with the same number on each node; ",
                      absl::StrJoin(parts, "; "));
}

}  // namespace

const char* DomainLevelName(DomainLevel level) {
  switch (level) {
    case DomainLevel::kNode: return "node";
    case DomainLevel::kClique: return "clique";
    case DomainLevel::kSubblock: return "subblock";
    case DomainLevel::kBlock: return "block";
    case DomainLevel::kPool: return "pool";
  }
  return "pool";
}

NodeTopology TopologyOf(const NodeSpec& spec) {
  NodeTopology t = FromLabels(spec);
  for (const DeviceSpec& d : spec.devices) FillFrom(d.topology, &t);
  return t;
}

NodeTopology TopologyOf(const NodeView& view) {
  NodeTopology t = TopologyOf(view.spec);
  for (const DeviceState& d : view.devices) FillFrom(d.spec.topology, &t);
  return t;
}

std::optional<GangPick> PickGangNodes(const std::vector<GangCandidate>& candidates,
                                      uint32_t members, std::string* reason) {
  if (members == 0) {
    if (reason != nullptr) *reason = "a gang of 0 members";
    return std::nullopt;
  }
  const std::vector<GangCandidate>& c = candidates;
  // One order for everything: fullest first (least free), then by name, so
  // every choice below is the same whatever the input order.
  std::vector<uint32_t> order;
  order.reserve(c.size());
  for (uint32_t i = 0; i < c.size(); ++i) {
    if (c[i].fits >= 1) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return std::tie(c[a].free_milli, c[a].node, c[a].pool, c[a].fits) <
           std::tie(c[b].free_milli, c[b].node, c[b].pool, c[b].fits);
  });

  auto done = [&](const std::vector<uint32_t>& picked, uint32_t per_node, DomainLevel level) {
    GangPick p;
    p.per_node = per_node;
    p.level = level;
    for (uint32_t i : picked) p.nodes.push_back(c[i].node);
    std::sort(p.nodes.begin(), p.nodes.end());
    return p;
  };

  // One node that takes them all: the fullest such node.
  for (uint32_t i : order) {
    if (c[i].fits >= members) return done({i}, members, DomainLevel::kNode);
  }

  // Per-node counts that divide the gang evenly, largest first.
  std::vector<uint32_t> per_node_counts;
  for (uint32_t m = members; m >= 1; --m) {
    if (members % m == 0) per_node_counts.push_back(m);
  }

  // Group by domain at every level in one pass; each group keeps `order`.
  constexpr int kLevels = 4;  // clique, sub-block, block, pool
  std::array<absl::flat_hash_map<DomainKey, std::vector<uint32_t>>, kLevels> groups;
  for (uint32_t i : order) {
    const GangCandidate& n = c[i];
    const NodeTopology& t = n.topology;
    if (!t.clique.empty()) groups[0][DomainKey{n.pool, t.clique, {}}].push_back(i);
    if (!t.subblock.empty()) groups[1][DomainKey{n.pool, t.block, t.subblock}].push_back(i);
    if (!t.block.empty()) groups[2][DomainKey{n.pool, t.block, {}}].push_back(i);
    groups[3][DomainKey{n.pool, {}, {}}].push_back(i);
  }
  constexpr DomainLevel kLevelOf[kLevels] = {DomainLevel::kClique, DomainLevel::kSubblock,
                                             DomainLevel::kBlock, DomainLevel::kPool};
  for (int level = 0; level < kLevels; ++level) {
    std::optional<Option> best;
    for (const auto& [key, nodes] : groups[level]) {
      std::optional<Option> o = BestIn(nodes, c, per_node_counts, members);
      if (o.has_value() && (!best.has_value() || Better(*o, *best, c))) best = std::move(o);
    }
    if (best.has_value()) return done(best->picked, best->per_node, kLevelOf[level]);
  }
  if (reason != nullptr) *reason = NoRoomReason(c, order, members);
  return std::nullopt;
}

double DomainPacking(const DomainTotals& node, const DomainTotals* clique,
                     const DomainTotals* subblock, const DomainTotals* block) {
  double sum = 0;
  int levels = 0;
  for (const DomainTotals* d : {clique, subblock, block}) {
    if (d == nullptr) continue;
    ++levels;
    // The domain's other nodes: what this node holds itself is the node
    // preference's business, not the domain's.
    const uint64_t capacity = d->capacity_milli - std::min(d->capacity_milli, node.capacity_milli);
    const uint64_t used = d->used_milli - std::min(d->used_milli, node.used_milli);
    if (capacity > 0) sum += static_cast<double>(std::min(used, capacity)) / capacity;
  }
  return levels == 0 ? 0 : sum / levels;
}

DomainUsage DomainUsage::Of(absl::Span<const std::shared_ptr<const NodeView>> nodes) {
  struct Entry {
    NodeTopology topology;
    DomainTotals totals;
    const std::string* name;
  };
  std::vector<Entry> entries;
  entries.reserve(nodes.size());
  absl::flat_hash_map<std::string, DomainTotals> domains;
  for (const std::shared_ptr<const NodeView>& v : nodes) {
    if (v == nullptr) continue;
    Entry e{TopologyOf(*v), {}, &v->spec.name};
    if (e.topology.clique.empty() && e.topology.subblock.empty() && e.topology.block.empty()) {
      continue;
    }
    for (const DeviceState& d : v->devices) {
      e.totals.capacity_milli += d.spec.capacity_milli;
      e.totals.used_milli += d.used_milli;
    }
    for (const std::string& key :
         {CliqueKey(e.topology), SubblockKey(e.topology), BlockKey(e.topology)}) {
      if (key.empty()) continue;
      DomainTotals& t = domains[key];
      t.capacity_milli += e.totals.capacity_milli;
      t.used_milli += e.totals.used_milli;
    }
    entries.push_back(std::move(e));
  }
  DomainUsage out;
  auto find = [&](const std::string& key) -> const DomainTotals* {
    if (key.empty()) return nullptr;
    auto it = domains.find(key);
    return it == domains.end() ? nullptr : &it->second;
  };
  for (const Entry& e : entries) {
    const double p = DomainPacking(e.totals, find(CliqueKey(e.topology)),
                                   find(SubblockKey(e.topology)), find(BlockKey(e.topology)));
    if (p > 0) out.by_node_[*e.name] = p;
  }
  return out;
}

double DomainUsage::NodePacking(const std::string& node) const {
  auto it = by_node_.find(node);
  return it == by_node_.end() ? 0 : it->second;
}

}  // namespace duet::placement
