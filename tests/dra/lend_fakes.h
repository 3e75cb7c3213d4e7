#pragma once

// Fakes the DRA gang and slice lending tests share: a device map by name,
// a RuleWriter that records
// the tainted set of its last Resync, etcd's claims (none allocated unless
// Set), and Slurm's gang job as a GangMaker over the ledger. Thread-safe.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bridge/dra/lender.h"
#include "bridge/gang/registry.h"
#include "bridge/ledger/ledger.h"

namespace duet {
namespace dra {
namespace testing {

// A DeviceMapView over the ledger where a lending node's device `index` is
// the DRA device `Naming::kPrefix<index>` of Naming::kDriver, pool = the node
// name. `Naming` says which nodes lend (static bool Lends(node)) and the
// ledger kind (kKind).
template <class Naming>
class NamedMap : public DeviceMapView {
 public:
  explicit NamedMap(const Ledger* ledger) : ledger_(ledger) {}
  std::optional<LedgerDevice> ToLedger(const DraDevice& d) const override {
    const std::string prefix = Naming::kPrefix;
    uint32_t index = 0;
    if (!Lends(d.pool) || d.driver != Naming::kDriver || !absl::StartsWith(d.device, prefix) ||
        !absl::SimpleAtoi(d.device.substr(prefix.size()), &index)) {
      return std::nullopt;
    }
    return LedgerDevice{d.pool, Naming::kKind, index};
  }
  std::optional<DraDevice> ToDra(const LedgerDevice& d) const override {
    if (!Lends(d.node)) return std::nullopt;
    return Dra(d.node, d.index);
  }
  bool Lendable(const std::string& node, std::string*) const override { return Lends(node); }
  std::vector<DraDevice> NodeDevices(const std::string& node) const override {
    std::vector<DraDevice> out;
    std::shared_ptr<const NodeView> v = ledger_->GetNode(node);
    if (!Lends(node) || !v) return out;
    for (const DeviceState& d : v->devices) out.push_back(Dra(node, d.spec.index));
    return out;
  }
  static bool Lends(const std::string& node) { return Naming::Lends(node); }
  static DraDevice Dra(const std::string& node, uint32_t index) {
    return {Naming::kDriver, node, absl::StrCat(Naming::kPrefix, index)};
  }

 private:
  const Ledger* const ledger_;
};

class Rules : public RuleWriter {
 public:
  absl::Status Taint(const std::vector<DraDevice>&) override { return absl::OkStatus(); }
  absl::Status Untaint(const std::vector<DraDevice>&) override { return absl::OkStatus(); }
  absl::Status Resync(const std::vector<DraDevice>& tainted) override {
    absl::MutexLock lock(&mu_);
    tainted_ = std::set<DraDevice>(tainted.begin(), tainted.end());
    return absl::OkStatus();
  }
  absl::Status ResyncPool(const std::string&, const std::vector<DraDevice>&) override {
    return absl::OkStatus();
  }
  void SetDriftListener(RuleDriftListener*) override {}
  std::set<DraDevice> tainted() {
    absl::MutexLock lock(&mu_);
    return tainted_;
  }

 private:
  absl::Mutex mu_;
  std::set<DraDevice> tainted_ ABSL_GUARDED_BY(mu_);
};

// etcd's claims: none allocated unless Set.
class Claims : public ClaimLister {
 public:
  absl::StatusOr<std::vector<AllocatedClaim>> ListAllocated() override {
    absl::MutexLock lock(&mu_);
    std::vector<AllocatedClaim> out;
    for (const auto& [uid, c] : claims_) out.push_back(c);
    return out;
  }
  absl::StatusOr<std::optional<AllocatedClaim>> GetClaim(const ClaimRef& claim) override {
    absl::MutexLock lock(&mu_);
    auto it = claims_.find(claim.uid);
    if (it == claims_.end()) return std::nullopt;
    return it->second;
  }
  void Set(const ClaimRef& claim, std::vector<DraDevice> devices) {
    absl::MutexLock lock(&mu_);
    claims_[claim.uid] = {claim, std::move(devices)};
  }
  void Remove(const std::string& uid) {
    absl::MutexLock lock(&mu_);
    claims_.erase(uid);
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, AllocatedClaim> claims_ ABSL_GUARDED_BY(mu_);
};

// Slurm's gang job as bridge/slurm's Placeholders records it: one job, each
// slot's devices under Owner::GangSlot{J, "gang:KEY#S"}.
class SlotMaker final : public gang::GangMaker {
 public:
  explicit SlotMaker(Ledger* ledger) : ledger_(ledger) {}
  absl::StatusOr<gang::GangAllocation> Create(const gang::GangKey& key, const gang::GangSpec& spec,
                                              const std::vector<gang::GangNode>& nodes) override {
    absl::MutexLock lock(&mu_);
    creates_.push_back(nodes);
    gang::GangAllocation a;
    a.job_id = next_job_++;
    uint32_t slot = 0;
    for (const gang::GangNode& n : nodes) {
      for (uint32_t m = 0; m < n.members; ++m, ++slot) {
        HoldRequest h;
        h.node = n.node;
        h.owner = Owner::GangSlot(a.job_id, key.ToString(), slot);
        h.count = CountSelector{spec.member.kind, spec.member.count, 0, ""};
        absl::StatusOr<HoldResult> r = ledger_->Hold(h);
        if (!r.ok()) {
          ReleaseLocked(a.job_id);
          return absl::ResourceExhaustedError(r.status().message());
        }
        a.slots.push_back(r->holding);
        a.seq = r->seq;
      }
    }
    return a;
  }
  absl::Status Cancel(const gang::GangKey&, uint32_t job_id) override {
    absl::MutexLock lock(&mu_);
    cancels_.push_back(job_id);
    ReleaseLocked(job_id);
    return absl::OkStatus();
  }
  std::vector<std::vector<gang::GangNode>> creates() {
    absl::MutexLock lock(&mu_);
    return creates_;
  }
  std::vector<uint32_t> cancels() {
    absl::MutexLock lock(&mu_);
    return cancels_;
  }

 private:
  void ReleaseLocked(uint32_t job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const Holding& h : ledger_->ListHoldings()) {
      if (h.owner.kind == OwnerKind::kGangSlot && h.owner.job_id == job_id) {
        (void)ledger_->Release(h.node, h.owner);
      }
    }
  }
  Ledger* const ledger_;
  absl::Mutex mu_;
  std::vector<std::vector<gang::GangNode>> creates_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> cancels_ ABSL_GUARDED_BY(mu_);
  uint32_t next_job_ ABSL_GUARDED_BY(mu_) = 700;
};

}  // namespace testing
}  // namespace dra
}  // namespace duet
