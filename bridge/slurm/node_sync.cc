// SlurmSync's node pass in create mode (slurm_sync.h, step 2): every ledger
// node becomes a Slurm node; cordoned / not-ready / gone nodes are drained,
// duet's own drains resumed; nodes that left the ledger are drained and
// deleted once empty; a node whose GRES changed is recreated once empty.
// DrainOrResume is shared with adopt mode (node_adoption.cc).

#include "bridge/slurm/slurm_sync.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "common/status_macros.h"
#include "bridge/slurm/libslurm_client.h"
#include "bridge/slurm/slurm_sync_internal.h"
#include "spdlog/spdlog.h"

namespace duet {

using slurm_sync_internal::DrainReasonFor;

namespace {

constexpr char kDuetReason[] = "duet: ";


bool IsDuetDrain(const SlurmNodeInfo& n) {
  return n.drain && absl::StartsWith(n.reason, kDuetReason);
}

std::vector<SlurmGres> Sorted(std::vector<SlurmGres> g) {
  std::sort(g.begin(), g.end(), [](const SlurmGres& a, const SlurmGres& b) {
    return std::tie(a.name, a.type, a.count) < std::tie(b.name, b.type, b.count);
  });
  g.erase(std::remove_if(g.begin(), g.end(), [](const SlurmGres& x) { return x.count == 0; }),
          g.end());
  return g;
}

}  // namespace

absl::Status SlurmSync::Retire(const SlurmNodeInfo& node, const std::string& reason) {
  if (!node.future && !node.drain) {
    SlurmNodeUpdate u;
    u.name = node.name;
    u.drain_reason = reason;
    DUET_RETURN_IF_ERROR(slurm_->UpdateNode(u));
    Count(&SlurmSyncStats::drains);
    spdlog::info("slurm sync: drained {} ({})", node.name, reason);
  }
  absl::Status s = slurm_->DeleteNode(node.name);
  if (absl::IsFailedPrecondition(s)) return absl::OkStatus();  // jobs left: next pass
  if (!s.ok() && !absl::IsNotFound(s)) return s;
  Count(&SlurmSyncStats::nodes_deleted);
  spdlog::info("slurm sync: deleted Slurm node {} ({})", node.name, reason);
  return absl::OkStatus();
}

absl::Status SlurmSync::DrainOrResume(const SlurmNodeInfo& have, const std::string& reason) {
  if (!reason.empty() && !have.drain) {
    SlurmNodeUpdate u;
    u.name = have.name;
    u.drain_reason = reason;
    absl::Status s = slurm_->UpdateNode(u);
    if (!s.ok()) return s;
    Count(&SlurmSyncStats::drains);
    spdlog::info("slurm sync: drained {} ({})", have.name, reason);
    // Unusable from now, not from the next pass's read (this pass read the
    // node before draining it): the node may be uncordoned in the ledger
    // before then, and a filter that passed it would send binds that Slurm
    // refuses ("Required node not available") until a pass resumes it.
    if (options_.loads != nullptr) {
      SlurmNodeInfo drained = have;
      drained.drain = true;
      drained.reason = reason;
      options_.loads->MarkUnusable(have.name, have.state + "+DRAIN", UnusableReason(drained));
    }
    if (options_.on_drain) options_.on_drain(have.name, true, reason);
  } else if (reason.empty() && IsDuetDrain(have)) {
    SlurmNodeUpdate u;
    u.name = have.name;
    u.drain_reason = "";
    absl::Status s = slurm_->UpdateNode(u);
    if (!s.ok()) return s;
    Count(&SlurmSyncStats::resumes);
    spdlog::info("slurm sync: resumed {} (was: {})", have.name, have.reason);
    // Usable again from the next pass's read, not at once: Slurm 22.05 can
    // report a resumed dynamic node not responding until its slurmd's next
    // registration, and refuses placeholders there until then.
    if (options_.on_drain) options_.on_drain(have.name, false, have.reason);
  } else if (!reason.empty() && IsDuetDrain(have) && have.reason != reason) {
    SlurmNodeUpdate u;
    u.name = have.name;
    u.drain_reason = reason;
    return slurm_->UpdateNode(u);
  }
  return absl::OkStatus();
}

absl::Status SlurmSync::SyncNodes(const LedgerSnapshot& snap,
                                  const std::vector<SlurmNodeInfo>& nodes) {
  if (options_.node_mode == SlurmNodeMode::kAdopt) return AdoptNodes(snap, nodes);
  absl::Status first;
  auto note = [&first](absl::Status s) {
    if (first.ok() && !s.ok()) first = std::move(s);
  };
  absl::flat_hash_map<std::string, const SlurmNodeInfo*> by_name;
  for (const SlurmNodeInfo& n : nodes) by_name[n.name] = &n;
  absl::flat_hash_set<std::string> wanted;

  for (const auto& view : snap.nodes) {
    const NodeSpec& spec = view->spec;
    wanted.insert(spec.name);
    auto it = by_name.find(spec.name);
    if (spec.state == NodeState::kGone) {
      if (it != by_name.end()) note(Retire(*it->second, DrainReasonFor(NodeState::kGone)));
      continue;
    }
    const SlurmNodeConfig want = SlurmNodeFor(*view, options_);
    if (it == by_name.end()) {
      absl::Status s = slurm_->CreateNode(want);
      if (s.ok()) {
        Count(&SlurmSyncStats::nodes_created);
        spdlog::info("slurm sync: created Slurm node {}: {}", want.name, SlurmNodeLine(want));
      } else if (!absl::IsAlreadyExists(s)) {
        note(s);
      }
      continue;
    }
    const SlurmNodeInfo& have = *it->second;
    // GRES: Slurm refuses count changes on a node with File= devices; drain,
    // then delete and recreate once empty.
    const std::string want_gres = FormatGres(Sorted(want.gres));
    const std::string have_gres = FormatGres(Sorted(have.gres));
    if (want_gres != have_gres && recreated_for_[spec.name] != want_gres) {
      if (have.busy) {
        if (!have.drain) {
          SlurmNodeUpdate u;
          u.name = have.name;
          u.drain_reason = "duet: GRES changed, recreating once empty";
          note(slurm_->UpdateNode(u));
          Count(&SlurmSyncStats::drains);
          spdlog::info("slurm sync: {} GRES {} -> {}: drained, recreated once empty", have.name,
                       have_gres, want_gres);
        }
        continue;
      }
      absl::Status s = slurm_->DeleteNode(have.name);
      if (s.ok()) s = slurm_->CreateNode(want);
      if (s.ok()) {
        // A recreated node comes back FUTURE; RESUME makes a running slurmd
        // register again.
        SlurmNodeUpdate u;
        u.name = have.name;
        u.drain_reason = "";
        (void)slurm_->UpdateNode(u);
        recreated_for_[spec.name] = want_gres;
        Count(&SlurmSyncStats::nodes_recreated);
        spdlog::info("slurm sync: recreated Slurm node {} for GRES {} -> {}", have.name, have_gres,
                     want_gres);
      }
      note(s);
      continue;
    }
    if (have.features != want.features) {
      SlurmNodeUpdate u;
      u.name = have.name;
      u.features = want.features;
      note(slurm_->UpdateNode(u));
    }
    if (have.future) continue;  // no slurmd yet: state changes wait for it
    note(DrainOrResume(have, DrainReasonFor(spec.state)));
  }
  // Nodes duet made that left the ledger: drain, delete once empty.
  for (const SlurmNodeInfo& n : nodes) {
    if (wanted.contains(n.name)) continue;
    if (options_.managed_feature.empty() ||
        std::find(n.features.begin(), n.features.end(), options_.managed_feature) ==
            n.features.end()) {
      continue;  // not ours
    }
    note(Retire(n, DrainReasonFor(NodeState::kGone)));
  }
  return first;
}

}  // namespace duet
