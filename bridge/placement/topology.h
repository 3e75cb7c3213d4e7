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
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "bridge/ledger/types.h"

namespace duet::placement {

struct NodeTopology {
  std::string block;
  std::string subblock;
  std::string host;
  std::string clique;  // NVLink domain; empty when none
};
// Labels first (cloud.google.com/gce-topology-{block,subblock,host},
// nvidia.com/gpu.clique); a field whose label is absent or empty is taken
// from the first device whose Topology has it (a static inventory's
// `topology:`, or a node whose labels were not kept).
NodeTopology TopologyOf(const NodeSpec& spec);
// The same for a ledger view, whose devices live in view.devices.
NodeTopology TopologyOf(const NodeView& view);

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

// Device use per domain (clique, sub-block, block) over a set of nodes, for
// DomainPacking. Immutable once built; safe to read from many threads.
class DomainUsage {
 public:
  DomainUsage() = default;
  // Move-only: the map's keys point into `names_`.
  DomainUsage(DomainUsage&&) = default;
  DomainUsage& operator=(DomainUsage&&) = default;
  DomainUsage(const DomainUsage&) = delete;
  DomainUsage& operator=(const DomainUsage&) = delete;

  // Sums each node's device capacity and held milli-units into its domains.
  // Null views are skipped; a node without topology counts in no domain.
  static DomainUsage Of(absl::Span<const std::shared_ptr<const NodeView>> nodes);

  // DomainPacking for a node `Of` was built from, by name; 0 for any other
  // node (and for every node when no node had a domain).
  double NodePacking(const std::string& node) const;

  // Nodes with a packing above 0.
  size_t size() const { return by_node_.size(); }

 private:
  // Keyed by views into one block of the names, not by a std::string each:
  // a lookup per prioritized name then reads the table and that block
  // (tens to hundreds of KB, cache-resident) instead of a heap string per
  // node scattered over the heap.
  std::unique_ptr<char[]> names_;
  absl::flat_hash_map<absl::string_view, double> by_node_;
};

// A DomainUsage of the whole cluster, rebuilt at most every `max_age`: the
// extender's prioritize sees only the nodes that passed its filter (full
// nodes, the strongest sign of a used domain, do not), and rebuilding over
// every node on every call would cost a scan of the cluster per pod. Domain
// packing is a tie-break, so an answer up to `max_age` old is good enough.
// Thread-safe.
class DomainUsageCache {
 public:
  explicit DomainUsageCache(absl::Duration max_age = absl::Seconds(1)) : max_age_(max_age) {}

  // The cached usage, or, when it is older than max_age (or there is none),
  // DomainUsage::Of(nodes()) as of `now`. One caller rebuilds at a time;
  // the others meanwhile get the previous one (or wait for the first).
  std::shared_ptr<const DomainUsage> Get(
      absl::Time now, const std::function<std::vector<std::shared_ptr<const NodeView>>()>& nodes)
      ABSL_LOCKS_EXCLUDED(mu_, build_mu_);

  // The cached usage as it is (null before the first build): for a caller
  // that leaves rebuilding to Refresh.
  std::shared_ptr<const DomainUsage> Current() const ABSL_LOCKS_EXCLUDED(mu_);

  // Rebuilds from nodes() now, whatever the age (one caller at a time), and
  // returns it: for a background refresher, so no request pays the scan.
  std::shared_ptr<const DomainUsage> Refresh(
      absl::Time now, const std::function<std::vector<std::shared_ptr<const NodeView>>()>& nodes)
      ABSL_LOCKS_EXCLUDED(mu_, build_mu_);

 private:
  const absl::Duration max_age_;
  absl::Mutex build_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // one rebuild at a time
  mutable absl::Mutex mu_;
  std::shared_ptr<const DomainUsage> usage_ ABSL_GUARDED_BY(mu_);
  absl::Time built_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// A single pod's preference for `node`'s domains, in [0, 1]: for each of its
// clique, sub-block and block (those it has), the fraction of the domain's
// device capacity that is held on the domain's *other* nodes, averaged over
// those levels. 0 for a node with no domain, or whose domains hold nothing
// elsewhere. Scorer (Policy::kDuet) adds a small multiple of it, so between
// nodes that placement otherwise rates alike, the one in a partly used
// domain wins and whole domains stay free for gangs.
struct DomainTotals {
  uint64_t used_milli = 0;
  uint64_t capacity_milli = 0;
};
// `node` is the node's own totals; a null domain is one the node lacks.
double DomainPacking(const DomainTotals& node, const DomainTotals* clique,
                     const DomainTotals* subblock, const DomainTotals* block);

}  // namespace duet::placement
