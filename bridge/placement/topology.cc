#include "bridge/placement/topology.h"

#include <algorithm>
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

// The label keys as strings made once: NodeSpec::labels' find() takes a
// std::string, and these are too long for the small-string buffer.
const std::string& Key(int i) {
  static const std::string* const kKeys =
      new std::string[4]{kBlockLabel, kSubblockLabel, kHostLabel, kCliqueLabel};
  return kKeys[i];
}

void Label(const NodeSpec& spec, int key, std::string* out) {
  auto it = spec.labels.find(Key(key));
  if (it != spec.labels.end()) *out = it->second;
}

NodeTopology FromLabels(const NodeSpec& spec) {
  NodeTopology t;
  if (spec.labels.empty()) return t;
  Label(spec, 0, &t.block);
  Label(spec, 1, &t.subblock);
  Label(spec, 2, &t.host);
  Label(spec, 3, &t.clique);
  return t;
}

// FNV-1a: a stable hash of a node name, so candidates that are equally full
// are ordered the same in every process without comparing their names.
uint64_t NameHash(absl::string_view name) {
  uint64_t h = 14695981039346656037ULL;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  return h;
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
// the global order (fullest first, then by name hash).
std::optional<Option> BestIn(absl::Span<const uint32_t> members_of,
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
  // One order for everything: fullest first (least free), then by a stable
  // hash of the name, then the name, so every choice below is the same
  // whatever the input order (and in every process).
  struct Ranked {
    uint64_t free_milli;
    uint64_t name_hash;
    uint32_t index;
  };
  std::vector<Ranked> ranked;
  ranked.reserve(c.size());
  for (uint32_t i = 0; i < c.size(); ++i) {
    if (c[i].fits >= 1) ranked.push_back({c[i].free_milli, NameHash(c[i].node), i});
  }
  std::sort(ranked.begin(), ranked.end(), [&](const Ranked& a, const Ranked& b) {
    if (a.free_milli != b.free_milli) return a.free_milli < b.free_milli;
    if (a.name_hash != b.name_hash) return a.name_hash < b.name_hash;
    return std::tie(c[a.index].node, c[a.index].pool, c[a.index].fits) <
           std::tie(c[b.index].node, c[b.index].pool, c[b.index].fits);
  });
  std::vector<uint32_t> order;
  order.reserve(ranked.size());
  for (const Ranked& r : ranked) order.push_back(r.index);

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

  // Level by level, tightest first: group the candidates by domain (each
  // group keeps `order`) and take the best domain's option. Most gangs are
  // settled at the first level that holds them, so later levels are only
  // grouped when needed.
  constexpr DomainLevel kLevels[] = {DomainLevel::kClique, DomainLevel::kSubblock,
                                     DomainLevel::kBlock, DomainLevel::kPool};
  const uint32_t fewest = members / per_node_counts[per_node_counts.size() > 1 ? 1 : 0];
  // Grouping without a vector per domain: each candidate gets its domain's
  // id, then one counting sort lays the domains out side by side in one
  // array, each in `order`.
  absl::flat_hash_map<DomainKey, uint32_t> ids;
  ids.reserve(order.size());
  std::vector<uint32_t> domain_of(order.size());
  std::vector<uint32_t> starts;
  std::vector<uint32_t> flat(order.size());
  constexpr uint32_t kNone = ~uint32_t{0};
  for (DomainLevel level : kLevels) {
    ids.clear();
    for (size_t j = 0; j < order.size(); ++j) {
      const GangCandidate& n = c[order[j]];
      const NodeTopology& t = n.topology;
      DomainKey key;
      bool has = true;
      switch (level) {
        case DomainLevel::kClique:
          has = !t.clique.empty();
          key = DomainKey{n.pool, t.clique, {}};
          break;
        case DomainLevel::kSubblock:
          has = !t.subblock.empty();
          key = DomainKey{n.pool, t.block, t.subblock};
          break;
        case DomainLevel::kBlock:
          has = !t.block.empty();
          key = DomainKey{n.pool, t.block, {}};
          break;
        case DomainLevel::kNode:
        case DomainLevel::kPool:
          key = DomainKey{n.pool, {}, {}};
          break;
      }
      domain_of[j] = has ? ids.try_emplace(key, static_cast<uint32_t>(ids.size())).first->second
                         : kNone;
    }
    starts.assign(ids.size() + 1, 0);
    for (uint32_t d : domain_of) {
      if (d != kNone) ++starts[d + 1];
    }
    for (size_t d = 1; d < starts.size(); ++d) starts[d] += starts[d - 1];
    std::vector<uint32_t> fill(starts.begin(), starts.end() - 1);
    for (size_t j = 0; j < order.size(); ++j) {
      if (domain_of[j] != kNone) flat[fill[domain_of[j]]++] = order[j];
    }
    std::optional<Option> best;
    for (size_t d = 0; d + 1 < starts.size(); ++d) {
      const absl::Span<const uint32_t> nodes(flat.data() + starts[d], starts[d + 1] - starts[d]);
      if (nodes.size() < fewest) continue;  // too few nodes at any count
      std::optional<Option> o = BestIn(nodes, c, per_node_counts, members);
      if (o.has_value() && (!best.has_value() || Better(*o, *best, c))) best = std::move(o);
    }
    if (best.has_value()) return done(best->picked, best->per_node, level);
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
  std::vector<std::pair<const std::string*, double>> packed;
  size_t bytes = 0;
  for (const Entry& e : entries) {
    const double p = DomainPacking(e.totals, find(CliqueKey(e.topology)),
                                   find(SubblockKey(e.topology)), find(BlockKey(e.topology)));
    if (p <= 0) continue;
    packed.emplace_back(e.name, p);
    bytes += e.name->size();
  }
  out.names_ = std::make_unique<char[]>(std::max<size_t>(bytes, 1));
  out.by_node_.reserve(packed.size());
  char* at = out.names_.get();
  for (const auto& [name, p] : packed) {
    std::copy(name->begin(), name->end(), at);
    out.by_node_[absl::string_view(at, name->size())] = p;
    at += name->size();
  }
  return out;
}

double DomainUsage::NodePacking(const std::string& node) const {
  auto it = by_node_.find(node);
  return it == by_node_.end() ? 0 : it->second;
}

std::shared_ptr<const DomainUsage> DomainUsageCache::Current() const {
  absl::MutexLock l(&mu_);
  return usage_;
}

std::shared_ptr<const DomainUsage> DomainUsageCache::Refresh(
    absl::Time now, const std::function<std::vector<std::shared_ptr<const NodeView>>()>& nodes) {
  absl::MutexLock b(&build_mu_);
  auto out = std::make_shared<const DomainUsage>(DomainUsage::Of(nodes()));
  absl::MutexLock l(&mu_);
  usage_ = out;
  built_ = now;
  return out;
}

std::shared_ptr<const DomainUsage> DomainUsageCache::Get(
    absl::Time now, const std::function<std::vector<std::shared_ptr<const NodeView>>()>& nodes) {
  {
    absl::MutexLock l(&mu_);
    if (usage_ != nullptr && now - built_ < max_age_) return usage_;
  }
  if (!build_mu_.TryLock()) {
    // Another caller is rebuilding: the previous answer will do, and the
    // very first caller's is waited for.
    {
      absl::MutexLock l(&mu_);
      if (usage_ != nullptr) return usage_;
    }
    build_mu_.Lock();
  }
  std::shared_ptr<const DomainUsage> out;
  {
    absl::MutexLock l(&mu_);
    if (usage_ != nullptr && now - built_ < max_age_) out = usage_;
  }
  if (out == nullptr) {
    out = std::make_shared<const DomainUsage>(DomainUsage::Of(nodes()));
    absl::MutexLock l(&mu_);
    usage_ = out;
    built_ = now;
  }
  build_mu_.Unlock();
  return out;
}

}  // namespace duet::placement
