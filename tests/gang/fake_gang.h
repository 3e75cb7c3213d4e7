#pragma once

// Test doubles for gangs: a GangMaker with real behaviour on a real Ledger
// (Create holds each slot's devices under a slot owner, Cancel releases
// every holding of the job) that records its calls, and a simple planner
// standing in for placement::PickGangNodes (one pool, the most members per
// node that divides the gang, the first nodes by name).

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bridge/gang/gang.h"
#include "bridge/gang/registry.h"
#include "bridge/ledger/ledger.h"
#include "bridge/placement/topology.h"

namespace duet {
namespace gang {
namespace fakes {

// The slot owner the fake records: {job J, pod uid "gang:KEY#SLOT"}, of a
// kind the ledger accepts for pods (the registry reads slots by uid).
inline Owner SlotOwner(uint32_t job, const GangKey& key, uint32_t slot) {
  return Owner::Placeholder(job, SlotUid(key, slot));
}

class FakeGangMaker final : public GangMaker {
 public:
  explicit FakeGangMaker(Ledger* ledger) : ledger_(ledger) {}

  struct CreateCall {
    GangKey key;
    std::vector<GangNode> nodes;
  };

  absl::StatusOr<GangAllocation> Create(const GangKey& key, const GangSpec& spec,
                                        const std::vector<GangNode>& nodes) override {
    absl::MutexLock l(&mu_);
    creates_.push_back({key, nodes});
    if (!create_error_.ok()) return create_error_;
    GangAllocation a;
    a.job_id = next_job_++;
    uint32_t slot = 0;
    for (const GangNode& n : nodes) {
      for (uint32_t m = 0; m < n.members; ++m, ++slot) {
        HoldRequest h;
        h.node = n.node;
        h.owner = SlotOwner(a.job_id, key, slot);
        h.count = CountSelector{spec.member.kind, spec.member.count, 0, ""};
        absl::StatusOr<HoldResult> r = ledger_->Hold(h);
        if (!r.ok()) {
          ReleaseJob(a.job_id);
          return absl::ResourceExhaustedError(r.status().message());
        }
        a.slots.push_back(r->holding);
        a.seq = r->seq;
      }
    }
    return a;
  }

  absl::Status Cancel(const GangKey& key, uint32_t job_id) override {
    absl::MutexLock l(&mu_);
    cancels_.push_back(job_id);
    if (!cancel_error_.ok()) return cancel_error_;
    ReleaseJob(job_id);
    return absl::OkStatus();
  }

  std::vector<CreateCall> creates() const {
    absl::MutexLock l(&mu_);
    return creates_;
  }
  std::vector<uint32_t> cancels() const {
    absl::MutexLock l(&mu_);
    return cancels_;
  }
  void set_cancel_error(absl::Status s) {
    absl::MutexLock l(&mu_);
    cancel_error_ = std::move(s);
  }
  void set_create_error(absl::Status s) {
    absl::MutexLock l(&mu_);
    create_error_ = std::move(s);
  }

 private:
  void ReleaseJob(uint32_t job_id) {
    for (const Holding& h : ledger_->ListHoldings()) {
      if (h.owner.kind == OwnerKind::kPlaceholder && h.owner.job_id == job_id) {
        (void)ledger_->Release(h.node, h.owner);
      }
    }
  }

  Ledger* const ledger_;
  mutable absl::Mutex mu_;
  std::vector<CreateCall> creates_;
  std::vector<uint32_t> cancels_;
  absl::Status create_error_;
  absl::Status cancel_error_;
  uint32_t next_job_ = 500;
};

// One pool at a time (in name order); the largest per-node count that
// divides the gang; the first nodes by name that take it.
inline std::optional<placement::GangPick> SimplePlanner(
    const std::vector<placement::GangCandidate>& candidates, uint32_t members, std::string* reason) {
  std::map<std::string, std::vector<placement::GangCandidate>> pools;
  for (const placement::GangCandidate& c : candidates) pools[c.pool].push_back(c);
  for (auto& [pool, nodes] : pools) {
    std::sort(nodes.begin(), nodes.end(),
              [](const auto& a, const auto& b) { return a.node < b.node; });
    for (uint32_t per = members; per >= 1; --per) {
      if (members % per != 0) continue;
      placement::GangPick pick;
      pick.per_node = per;
      for (const placement::GangCandidate& c : nodes) {
        if (c.fits >= per && pick.nodes.size() < members / per) pick.nodes.push_back(c.node);
      }
      if (pick.nodes.size() == members / per) return pick;
    }
  }
  if (reason != nullptr) {
    *reason = absl::StrCat(candidates.size(), " nodes have room for a member; no pool holds ",
                           members, " evenly");
  }
  return std::nullopt;
}

}  // namespace fakes
}  // namespace gang
}  // namespace duet
