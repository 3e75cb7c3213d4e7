#pragma once

// The ledger: which owner holds which device on which node.
//
// Pure C++, no I/O. Every holding is all-or-nothing, and on every path the
// ledger enforces invariant I1: no device is held by two owner groups beyond
// its capacity (a whole-device holding never shares; milli-unit shares of one
// device never sum past its capacity). See types.h for owner groups.
//
// Thread-safety: all methods may be called concurrently. One mutex (`mu_`)
// guards the node table and the holdings; a write holds it for the few
// microseconds the change takes. Readers get immutable NodeViews by
// shared_ptr, so a snapshot of every node copies pointers only and never
// blocks writers for long: a writer that finds a view still shared copies that
// one node before changing it (copy on write).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "bridge/ledger/types.h"

namespace duet {

// "Any `count` devices of `kind`", chosen by the ledger.
struct CountSelector {
  DeviceKind kind = DeviceKind::kGpu;
  uint32_t count = 0;
  // Per device; 0 or kWholeDevice mean whole devices.
  uint32_t milli = 0;
  // Only devices of this model; empty for any.
  std::string model;
};

struct HoldRequest {
  std::string node;
  Owner owner;
  // Exactly one of `devices` (non-empty) and `count` is set.
  std::vector<HeldDevice> devices;
  std::optional<CountSelector> count;
  // Non-zero: refuse with ABORTED unless the node's generation equals it.
  uint64_t expected_generation = 0;
  // Replay only: keep the original grant time instead of the clock's.
  std::optional<absl::Time> granted_at;
};

struct HoldResult {
  Holding holding;
  // False when an identical holding already existed (a retry).
  bool created = false;
  // The ledger sequence number the caller must see durable before it answers
  // (for a retry: the latest change, which may still be in flight).
  uint64_t seq = 0;
};

struct ReleaseResult {
  bool released = false;
  Holding holding;  // Set when `released`.
  uint64_t seq = 0;
};

// One change, as passed to the ChangeListener. Pointers are valid only during
// the callback.
struct Change {
  enum class Type { kUpsertNode, kRemoveNode, kHold, kRelease };
  Type type;
  uint64_t seq = 0;
  const std::string* node = nullptr;
  // kUpsertNode: the new spec (with devices).
  const NodeSpec* spec = nullptr;
  // kHold / kRelease: the holding granted or released.
  const Holding* holding = nullptr;
  // The node after the change; for a node that left the ledger, its last
  // state. Never null.
  const std::shared_ptr<const NodeView>* view = nullptr;
  // True when the node left the ledger with this change (kRemoveNode of a node
  // with no holdings, or kRelease of the last holding on a GONE node).
  bool erased = false;
};

// Told of every change, in sequence order, while the ledger's lock is held:
// must be quick and must not call back into the ledger.
class ChangeListener {
 public:
  virtual ~ChangeListener() = default;
  virtual void OnChange(const Change& change) = 0;
};

// A consistent image of every node at one sequence number.
struct LedgerSnapshot {
  uint64_t seq = 0;
  std::vector<std::shared_ptr<const NodeView>> nodes;  // sorted by name
};

class Ledger {
 public:
  struct Options {
    const Clock* clock = Clock::Real();
  };
  Ledger();
  explicit Ledger(Options options);
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  // Listeners are told of changes in order. Not owned; must outlive the ledger
  // or be removed first.
  void AddListener(ChangeListener* listener) ABSL_LOCKS_EXCLUDED(mu_);
  void RemoveListener(ChangeListener* listener) ABSL_LOCKS_EXCLUDED(mu_);

  // Adds a node or replaces its spec and state. Refused with
  // FAILED_PRECONDITION if the new spec drops a held device or shrinks its
  // capacity below what is held. A spec equal to the current one changes
  // nothing (no generation bump, no change record). Returns the seq.
  absl::StatusOr<uint64_t> UpsertNode(const NodeSpec& spec) ABSL_LOCKS_EXCLUDED(mu_);

  // Removes a node. With live holdings the node turns GONE instead (no new
  // holdings) and disappears when its last holding is released. NOT_FOUND for
  // an unknown node.
  absl::StatusOr<uint64_t> RemoveNode(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

  // Grants all requested devices or none. Idempotent: the same owner asking
  // again for the same devices (or the same count) gets its existing holding
  // back with created=false. Errors: INVALID_ARGUMENT (malformed), NOT_FOUND
  // (node, device), ALREADY_EXISTS (owner holds other devices there),
  // RESOURCE_EXHAUSTED (held by another group: the message names it; or too
  // few free), FAILED_PRECONDITION (node cordoned/not ready/gone), ABORTED
  // (stale expected_generation).
  absl::StatusOr<HoldResult> Hold(const HoldRequest& request) ABSL_LOCKS_EXCLUDED(mu_);

  // Releases the owner's holding on `node`. Idempotent: releasing nothing is
  // OK with released=false.
  absl::StatusOr<ReleaseResult> Release(const std::string& node, const Owner& owner)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Moves `from`'s whole holding on `node` to `to` in one step (the DRA
  // lending mode: a lend job's device becomes a claim's and back). Under the
  // one lock it releases `from` and holds the same devices for `to`, and tells
  // listeners a kRelease(from) then a kHold(to) (two seqs, two generations),
  // so a log records two records and replay reproduces it; no Hold can take
  // the devices in between. Returns `to`'s holding and the kHold's seq.
  // Errors: INVALID_ARGUMENT (bad owner, `from` == `to`, holder classes
  // differ), NOT_FOUND (unknown node, or `from` holds nothing there),
  // FAILED_PRECONDITION (`to` already holds on the node; or the node is
  // leaving the inventory), RESOURCE_EXHAUSTED (another group's share leaves
  // `to` no room: only when groups already overlap). Changes nothing on error.
  absl::StatusOr<HoldResult> Rebind(const std::string& node, const Owner& from, const Owner& to)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Reads. Null / empty when unknown.
  std::shared_ptr<const NodeView> GetNode(const std::string& name) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // GetNode for every name, in order (null where unknown). Takes the lock
  // once per batch of names rather than once per name, and never for long.
  std::vector<std::shared_ptr<const NodeView>> GetNodes(const std::vector<std::string>& names) const
      ABSL_LOCKS_EXCLUDED(mu_);
  LedgerSnapshot Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);
  // Every node's view at one instant, in no particular order (the table's),
  // for a reader that looks at every node and needs no order: Snapshot
  // without its sort by name (a third of the gang reservation's scan at
  // 5,000 nodes). The lock is held only to copy the pointers.
  std::vector<std::shared_ptr<const NodeView>> UnorderedViews() const ABSL_LOCKS_EXCLUDED(mu_);
  // Holdings on `node` (every node when empty), sorted by node then owner.
  std::vector<Holding> ListHoldings(const std::string& node = "") const ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<Holding> FindHolding(const std::string& node, const Owner& owner) const
      ABSL_LOCKS_EXCLUDED(mu_);

  size_t node_count() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t holding_count() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t seq() const ABSL_LOCKS_EXCLUDED(mu_);

  // Recovery only: continue numbering after `seq` (must not go backwards).
  void RestoreSeq(uint64_t seq) ABSL_LOCKS_EXCLUDED(mu_);
  // Recovery only: raise the node's generation to at least `generation`, so a
  // generation a client saw before a restart is never reused. No change
  // record. NOT_FOUND for an unknown node.
  absl::Status RestoreGeneration(const std::string& node, uint64_t generation)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Checks every internal invariant (I1, holdings vs device uses, used_milli).
  // Returns the first violation. For tests and the online checker.
  absl::Status CheckInvariants() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Holdings are keyed by (owner, node). The key shares the owner with the
  // device uses; lookups use HoldingKeyRef so they never copy an Owner.
  struct HoldingKey {
    std::shared_ptr<const Owner> owner;
    uint32_t node_id;
  };
  struct HoldingKeyRef {
    const Owner* owner;
    uint32_t node_id;
  };
  struct HoldingKeyHash {
    using is_transparent = void;
    size_t operator()(const HoldingKey& k) const { return Hash(*k.owner, k.node_id); }
    size_t operator()(const HoldingKeyRef& k) const { return Hash(*k.owner, k.node_id); }
    static size_t Hash(const Owner& o, uint32_t node_id) {
      return absl::Hash<std::tuple<const Owner&, uint32_t>>()(std::tie(o, node_id));
    }
  };
  struct HoldingKeyEq {
    using is_transparent = void;
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return a.node_id == b.node_id && *a.owner == *b.owner;
    }
  };
  struct HoldingEntry {
    Holding holding;
  };
  struct Slot {
    std::shared_ptr<NodeView> view;  // null when the slot is free
    uint32_t holdings = 0;
  };

  // Returns the node's view, copied first if a reader still shares it.
  NodeView* MutableView(Slot& slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status PickDevices(const NodeView& view, const HoldRequest& request,
                           std::vector<HeldDevice>* out) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Notify(const Change& change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t EraseNode(uint32_t node_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_slots_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> node_ids_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<HoldingKey, HoldingEntry, HoldingKeyHash, HoldingKeyEq> holdings_
      ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<ChangeListener*> listeners_ ABSL_GUARDED_BY(mu_);
};

// Validation of owners and requests, shared with the gRPC layer.
absl::Status ValidateOwner(const Owner& owner);
absl::Status ValidateNodeSpec(const NodeSpec& spec);

// Bounds on input sizes (the gRPC layer also enforces message size limits).
inline constexpr size_t kMaxNameLength = 253;   // a DNS subdomain, like a Node name
inline constexpr size_t kMaxUidLength = 128;
// A lend owner's group is "lend:" + a node name.
inline constexpr size_t kMaxLendUidLength = 5 + kMaxNameLength;
// A gang slot owner's group is "gang:" + a gang key ("workload/NS/WORKLOAD/
// PODGROUP/REPLICA-KEY" at most: a source, a namespace and three names) +
// "#" + a slot number.
inline constexpr size_t kMaxGangSlotUidLength = 5 + 9 + 64 + 3 * (kMaxNameLength + 1) + 11;
inline constexpr size_t kMaxDevicesPerNode = 1024;

}  // namespace duet
