#pragma once

// The extender's per-node table for prioritize: one row per ledger node,
// in one contiguous array, holding what scoring reads of the node (its free
// devices, CPU and memory, placement::PrepareNode) and its domain packing
// inline, found by one name lookup. Prioritize over thousands of names then
// costs one hash lookup and one row per name, instead of a ledger lookup, a
// domain-usage lookup and a pointer chase into each node's device table.
//
// Exact, not a cache that lags: the table is a ledger ChangeListener, so
// every change (upsert, removal, hold, release) patches its node's row before
// the ledger call that made it returns; a prioritize that starts after a
// hold or release sees it, as one reading the ledger would. `seq()` is the
// ledger sequence of the last change applied. Only the domain packing is
// as old as the DomainUsage last given to SetDomains (the extender rebuilds
// it in the background, see extender.h); nodes the usage does not know read
// 0, as DomainUsage::NodePacking says.
//
// Thread-safety: thread-safe. One reader/writer mutex: the ledger's
// listener call (under the ledger's lock) takes it to write, for one row;
// Read takes it to read once per 256 names, so a ledger change waits at most
// for one batch. Read's callback runs under it and must not call into the
// ledger or the table (a ledger change would wait for the callback, and the
// callback for the ledger).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "bridge/ledger/ledger.h"
#include "bridge/placement/node_free.h"
#include "bridge/placement/topology.h"

namespace duet {
namespace extender {

class NodeTable final : public ChangeListener {
 public:
  struct Row {
    // The node as of its last change; null for a node the ledger no longer
    // has. Keeps `free`'s model names alive.
    std::shared_ptr<const NodeView> view;
    // placement::PrepareNode(*view).
    placement::internal::NodeFree free;
    // domains()->NodePacking(name); 0 without domains.
    double packing = 0;
    // The ledger sequence of the change (or snapshot) that wrote the row.
    uint64_t seq = 0;
  };

  // Registers with `ledger` (not owned; must outlive the table) and fills
  // the rows from its snapshot, so the table starts current.
  explicit NodeTable(Ledger* ledger);
  NodeTable(const NodeTable&) = delete;
  NodeTable& operator=(const NodeTable&) = delete;
  ~NodeTable() override;

  // ChangeListener: patches the changed node's row.
  void OnChange(const Change& change) ABSL_LOCKS_EXCLUDED(mu_) override;

  // The domain usage whose packing the rows carry (null: none, packing 0).
  void SetDomains(std::shared_ptr<const placement::DomainUsage> domains) ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<const placement::DomainUsage> domains() const ABSL_LOCKS_EXCLUDED(mu_);

  // Calls fn(i, row) for every names[i] the ledger has, in order (names it
  // does not have are skipped), under the reader lock (see the class
  // comment).
  void Read(const std::vector<std::string>& names,
            absl::FunctionRef<void(size_t, const Row&)> fn) const ABSL_LOCKS_EXCLUDED(mu_);
  void Read(absl::Span<const std::string_view> names,
            absl::FunctionRef<void(size_t, const Row&)> fn) const ABSL_LOCKS_EXCLUDED(mu_);

  // The ledger sequence of the last change applied.
  uint64_t seq() const ABSL_LOCKS_EXCLUDED(mu_);
  // Nodes in the table (those the ledger has).
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  template <typename Names>
  void ReadAny(const Names& names, absl::FunctionRef<void(size_t, const Row&)> fn) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Writes `view` (null: the node left) into `name`'s row as of `seq`.
  void Put(const std::string& name, std::shared_ptr<const NodeView> view, uint64_t seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Ledger* const ledger_;
  mutable absl::Mutex mu_;
  std::vector<Row> rows_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_rows_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> index_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const placement::DomainUsage> domains_ ABSL_GUARDED_BY(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  size_t live_ ABSL_GUARDED_BY(mu_) = 0;
  // False while the constructor fills from the snapshot: removed nodes keep
  // their row (view null, with the removal's seq) so an older snapshot does
  // not bring them back.
  bool filled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace extender
}  // namespace duet
