#pragma once

// Topology for gangs and single pods (docs/gangs.md 4). Pure functions over
// ledger values: no I/O, no locks.
//
//  TopologyOf       a node's place: block / sub-block / host (GKE's
//                   cloud.google.com/gce-topology-* labels, or the devices'
//                   Topology as the inventory filled it) and its NVLink
//                   clique (nvidia.com/gpu.clique, Topology::nvlink_domain).
//  PickGangNodes    the nodes a gang's members go to: every node the same
//                   number of members, one pool, the tightest domain level
//                   that holds the gang, then the fewest nodes, then the
//                   least capacity stranded.
//  DomainPacking    a single pod's preference for nodes whose domains are
//                   already partly used, so whole domains stay free for gangs.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bridge/ledger/types.h"

namespace duet::placement {

struct NodeTopology {
  std::string block;
  std::string subblock;
  std::string host;
  std::string clique;  // NVLink domain; empty when none
};
NodeTopology TopologyOf(const NodeSpec& spec);

// How tightly a set of nodes sits, best first.
enum class DomainLevel : uint8_t {
  kNode = 0,      // one node
  kClique = 1,    // one NVLink clique
  kSubblock = 2,  // one sub-block
  kBlock = 3,     // one block
  kPool = 4,      // one pool, no shared domain
};
const char* DomainLevelName(DomainLevel level);

// A node a gang could use, as the caller measured it now.
struct GangCandidate {
  std::string node;
  std::string pool;
  NodeTopology topology;
  // Members that fit on the node now (devices, CPU, memory), >= 1.
  uint32_t fits = 0;
  // The node's free device milli-units now (for the stranding tie-break).
  uint64_t free_milli = 0;
  // The member's device milli-units (count x milli), the same for all.
  uint64_t member_milli = 0;
};

struct GangPick {
  // Nodes in a deterministic order (by name); each takes `per_node` members.
  std::vector<std::string> nodes;
  uint32_t per_node = 0;
  DomainLevel level = DomainLevel::kPool;
};

// `members` >= 1. nullopt when no set of nodes of one pool holds them with
// the same number on each node (the reason, when asked, says what was
// short). Deterministic for a given input, whatever its order.
std::optional<GangPick> PickGangNodes(const std::vector<GangCandidate>& candidates,
                                      uint32_t members, std::string* reason = nullptr);

}  // namespace duet::placement
