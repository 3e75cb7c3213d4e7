#pragma once

// Fakes the DRA gang and slice lending tests share: a RuleWriter that records
// the tainted set of its last Resync, and etcd's claims (none allocated
// unless Set). Thread-safe.

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "bridge/dra/lender.h"

namespace duet {
namespace dra {
namespace testing {

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

}  // namespace testing
}  // namespace dra
}  // namespace duet
