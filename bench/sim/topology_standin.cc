// THE SIMULATOR'S STAND-IN for placement::PickGangNodes and
// placement::DomainLevelName (declared in bridge/placement/topology.h, whose
// definitions are not in duet::placement yet). bench/sim/CMakeLists.txt links
// this file into duet-sim only while duet_placement's sources have no
// topology.cc; once the real one lands, duet-sim calls it instead, unchanged,
// and this file can be deleted. Nothing outside bench/sim links it.
//
// What it does, from docs/gangs.md 2 and 4: for each pool, each domain level
// from the tightest (one node, one clique, one sub-block, one block, the pool),
// each domain at that level and each per-node count m dividing `members`, the
// members / m candidates of that domain with the least free capacity that take
// m members; the best set is the tightest level, then the fewest nodes, then
// the least free device capacity left over on its nodes, then the names. An
// empty block, sub-block or clique is no domain (those candidates compete at
// the pool level only).

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bridge/placement/topology.h"

namespace duet::placement {

const char* DomainLevelName(DomainLevel level) {
  switch (level) {
    case DomainLevel::kNode:
      return "node";
    case DomainLevel::kClique:
      return "clique";
    case DomainLevel::kSubblock:
      return "subblock";
    case DomainLevel::kBlock:
      return "block";
    case DomainLevel::kPool:
      return "pool";
  }
  return "unknown";
}

std::optional<GangPick> PickGangNodes(const std::vector<GangCandidate>& candidates,
                                      uint32_t members, std::string* reason) {
  if (members == 0) {
    if (reason != nullptr) *reason = "a gang of 0 members";
    return std::nullopt;
  }
  // Deterministic whatever the input order: by pool, then by name.
  std::map<std::string, std::vector<const GangCandidate*>> pools;
  for (const GangCandidate& c : candidates) {
    if (c.fits >= 1) pools[c.pool].push_back(&c);
  }
  for (auto& [pool, list] : pools) {
    std::sort(list.begin(), list.end(),
              [](const GangCandidate* a, const GangCandidate* b) { return a->node < b->node; });
  }
  auto domain = [](const GangCandidate& c, DomainLevel level) -> const std::string* {
    static const std::string kWhole = "*";
    switch (level) {
      case DomainLevel::kNode:
        return &c.node;
      case DomainLevel::kClique:
        return &c.topology.clique;
      case DomainLevel::kSubblock:
        return &c.topology.subblock;
      case DomainLevel::kBlock:
        return &c.topology.block;
      case DomainLevel::kPool:
        return &kWhole;
    }
    return nullptr;
  };
  auto stranded = [](const GangCandidate& c, uint32_t m) {
    const uint64_t used = uint64_t{m} * c.member_milli;
    return c.free_milli > used ? c.free_milli - used : 0;
  };

  // (nodes, stranded, names) of the best set found at the current level.
  using Rank = std::tuple<size_t, uint64_t, std::vector<std::string>>;
  std::optional<Rank> best;
  uint32_t best_per_node = 0;
  for (uint8_t l = 0; l <= static_cast<uint8_t>(DomainLevel::kPool) && !best; ++l) {
    const auto level = static_cast<DomainLevel>(l);
    for (const auto& [pool, list] : pools) {
      std::map<std::string, std::vector<const GangCandidate*>> domains;
      for (const GangCandidate* c : list) {
        const std::string* d = domain(*c, level);
        if (d != nullptr && !d->empty()) domains[*d].push_back(c);
      }
      for (const auto& [name, group] : domains) {
        for (uint32_t m = members; m >= 1; --m) {
          if (members % m != 0) continue;
          const size_t need = members / m;
          if (level == DomainLevel::kNode && need != 1) continue;
          std::vector<const GangCandidate*> take;
          for (const GangCandidate* c : group) {
            if (c->fits >= m) take.push_back(c);
          }
          if (take.size() < need) continue;
          // The nodes with the least capacity left over: packing.
          std::stable_sort(take.begin(), take.end(),
                           [&](const GangCandidate* a, const GangCandidate* b) {
                             return stranded(*a, m) < stranded(*b, m);
                           });
          take.resize(need);
          Rank rank{need, 0, {}};
          for (const GangCandidate* c : take) {
            std::get<1>(rank) += stranded(*c, m);
            std::get<2>(rank).push_back(c->node);
          }
          std::sort(std::get<2>(rank).begin(), std::get<2>(rank).end());
          if (!best || rank < *best) {
            best = std::move(rank);
            best_per_node = m;
          }
        }
      }
    }
    if (best) {
      GangPick pick;
      pick.nodes = std::get<2>(*best);
      pick.per_node = best_per_node;
      pick.level = level;
      return pick;
    }
  }
  if (reason != nullptr) {
    uint32_t most = 0;
    for (const auto& [pool, list] : pools) {
      uint32_t sum = 0;
      for (const GangCandidate* c : list) sum += c->fits;
      most = std::max(most, sum);
    }
    *reason = absl::StrCat("no nodes of one pool take ", members,
                           " members with the same number on each; the most one pool takes "
                           "(any split) is ",
                           most);
  }
  return std::nullopt;
}

}  // namespace duet::placement
