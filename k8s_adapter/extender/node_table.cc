#include "k8s_adapter/extender/node_table.h"

#include <algorithm>
#include <utility>

#include "bridge/placement/prepared.h"

namespace duet {
namespace extender {
namespace {

// Names looked up per reader lock in Read (as Ledger::GetNodes batches).
constexpr size_t kReadBatch = 256;

}  // namespace

NodeTable::NodeTable(Ledger* ledger) : ledger_(ledger) {
  // Listen first, then read the snapshot: a change between the two reaches
  // the rows through OnChange, and Put keeps whichever of the two is newer.
  ledger_->AddListener(this);
  LedgerSnapshot snap = ledger_->Snapshot();
  absl::MutexLock l(&mu_);
  for (std::shared_ptr<const NodeView>& view : snap.nodes) {
    const std::string name = view->spec.name;
    Put(name, std::move(view), snap.seq);
  }
  seq_ = std::max(seq_, snap.seq);
  // Rows of nodes that left while filling are no longer needed.
  for (auto it = index_.begin(); it != index_.end();) {
    if (rows_[it->second].view == nullptr) {
      free_rows_.push_back(it->second);
      index_.erase(it++);
    } else {
      ++it;
    }
  }
  filled_ = true;
}

NodeTable::~NodeTable() { ledger_->RemoveListener(this); }

void NodeTable::Put(const std::string& name, std::shared_ptr<const NodeView> view, uint64_t seq) {
  auto it = index_.find(name);
  if (it != index_.end()) {
    Row& row = rows_[it->second];
    if (row.seq > seq) return;  // the snapshot is older than a change seen
    if (view == nullptr && filled_) {
      if (row.view != nullptr) --live_;
      row.view.reset();
      row.free.devices.clear();
      row.packing = 0;
      row.seq = 0;
      free_rows_.push_back(it->second);
      index_.erase(it);
      return;
    }
    if (row.view == nullptr && view != nullptr) ++live_;
    if (row.view != nullptr && view == nullptr) --live_;
    if (view != nullptr) {
      row.free = placement::PrepareNode(*view);
    } else {
      row.free.devices.clear();
    }
    row.view = std::move(view);
    row.seq = seq;
    return;
  }
  if (view == nullptr && filled_) return;
  uint32_t i;
  if (!free_rows_.empty()) {
    i = free_rows_.back();
    free_rows_.pop_back();
  } else {
    i = static_cast<uint32_t>(rows_.size());
    rows_.emplace_back();
  }
  index_.emplace(name, i);
  Row& row = rows_[i];
  if (view != nullptr) {
    row.free = placement::PrepareNode(*view);
    ++live_;
  }
  row.view = std::move(view);
  row.packing = domains_ == nullptr ? 0 : domains_->NodePacking(name);
  row.seq = seq;
}

void NodeTable::OnChange(const Change& change) {
  absl::MutexLock l(&mu_);
  Put(*change.node, change.erased ? nullptr : *change.view, change.seq);
  seq_ = std::max(seq_, change.seq);
}

void NodeTable::SetDomains(std::shared_ptr<const placement::DomainUsage> domains) {
  absl::MutexLock l(&mu_);
  domains_ = std::move(domains);
  for (const auto& [name, i] : index_) {
    rows_[i].packing = domains_ == nullptr ? 0 : domains_->NodePacking(name);
  }
}

std::shared_ptr<const placement::DomainUsage> NodeTable::domains() const {
  absl::ReaderMutexLock l(&mu_);
  return domains_;
}

void NodeTable::Read(const std::vector<std::string>& names,
                     absl::FunctionRef<void(size_t, const Row&)> fn) const {
  ReadAny(names, fn);
}

void NodeTable::Read(absl::Span<const std::string_view> names,
                     absl::FunctionRef<void(size_t, const Row&)> fn) const {
  ReadAny(names, fn);
}

template <typename Names>
void NodeTable::ReadAny(const Names& names, absl::FunctionRef<void(size_t, const Row&)> fn) const {
  for (size_t start = 0; start < names.size(); start += kReadBatch) {
    const size_t end = std::min(names.size(), start + kReadBatch);
    absl::ReaderMutexLock l(&mu_);
    for (size_t i = start; i < end; ++i) {
      const std::string_view name = names[i];
      auto it = index_.find(absl::string_view(name.data(), name.size()));
      if (it == index_.end()) continue;
      const Row& row = rows_[it->second];
      if (row.view != nullptr) fn(i, row);
    }
  }
}

uint64_t NodeTable::seq() const {
  absl::ReaderMutexLock l(&mu_);
  return seq_;
}

size_t NodeTable::size() const {
  absl::ReaderMutexLock l(&mu_);
  return live_;
}

}  // namespace extender
}  // namespace duet
