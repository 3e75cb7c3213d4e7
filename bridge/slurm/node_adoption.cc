// SlurmSync's node pass in adopt mode (slurm.nodes: adopt; slurm_sync.h,
// step 2): slurmd registers its own dynamic node; duet adds its features,
// drains and resumes, drains on a GRES mismatch, and reports ledger nodes
// with no registered (or a differently named) Slurm node.

#include "bridge/slurm/slurm_sync.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bridge/slurm/libslurm_client.h"
#include "bridge/slurm/slurm_sync_internal.h"
#include "spdlog/spdlog.h"

namespace duet {

using slurm_sync_internal::DrainReasonFor;

namespace {

// GPU and TPU counts per GRES name ("gpu:8,tpu:0"), types ignored: a
// slurmd's GRES type is the operator's choice (Slinky: extraConf Gres=),
// what must agree with Kubernetes is how many devices Slurm hands out.
std::string DeviceCounts(const std::vector<SlurmGres>& gres) {
  uint64_t gpus = 0, tpus = 0;
  for (const SlurmGres& g : gres) {
    if (g.name == "gpu") gpus += g.count;
    if (g.name == "tpu") tpus += g.count;
  }
  return absl::StrCat("gpu:", gpus, ",tpu:", tpus);
}

}  // namespace

absl::Status SlurmSync::AdoptNodes(const LedgerSnapshot& snap,
                                   const std::vector<SlurmNodeInfo>& nodes) {
  absl::Status first;
  auto note = [&first](absl::Status s) {
    if (first.ok() && !s.ok()) first = std::move(s);
  };
  absl::flat_hash_map<std::string, const SlurmNodeInfo*> by_name;
  for (const SlurmNodeInfo& n : nodes) by_name[n.name] = &n;
  std::set<std::string> unregistered, unmapped, mismatched;

  for (const auto& view : snap.nodes) {
    const NodeSpec& spec = view->spec;
    const std::string slurm_name = SlurmNameFor(spec);
    if (slurm_name != spec.name) {
      // Placeholders, job import and the SPANK plugin's Hold/Release all
      // name a node by one name: a Slurm node of another name is not
      // served (nothing granted on a guess).
      const std::string why = absl::StrCat("slurmd registers it as ", slurm_name,
                                           ", not its Kubernetes name: not adopted");
      unmapped.insert(spec.name);
      if (!unmapped_.count(spec.name)) {
        spdlog::error(
            "slurm sync: {}: {} (duet needs the Slurm node named like the Kubernetes node: "
            "Kubernetes node names without a dot and no {} annotation)",
            spec.name, why, kSlinkyHostnameOverride);
      }
      if (options_.loads != nullptr) options_.loads->MarkUnusable(spec.name, "UNMAPPED", why);
      continue;
    }
    auto it = by_name.find(spec.name);
    if (it == by_name.end() || it->second->future) {
      if (spec.state == NodeState::kGone) continue;
      unregistered.insert(spec.name);
      if (!unregistered_.count(spec.name)) {
        spdlog::warn(
            "slurm sync: {}: no slurmd has registered Slurm node {} yet (slurm.nodes: adopt): "
            "nothing is made for it, no placeholders until it registers",
            spec.name, slurm_name);
      }
      if (options_.loads != nullptr) {
        options_.loads->MarkUnusable(spec.name, "UNREGISTERED", "no slurmd registered in Slurm");
      }
      continue;
    }
    const SlurmNodeInfo& have = *it->second;
    if (unregistered_.count(spec.name)) {
      spdlog::info("slurm sync: {}: slurmd registered, adopted ({})", spec.name, have.state);
    }
    const SlurmNodeConfig want = SlurmNodeFor(*view, options_);
    // Features: duet's are added to slurmd's own (a NodeSet's feature puts
    // the node in its partition); none is ever removed.
    std::set<std::string> features(have.features.begin(), have.features.end());
    const size_t had = features.size();
    features.insert(want.features.begin(), want.features.end());
    if (features.size() != had) {
      SlurmNodeUpdate u;
      u.name = have.name;
      u.features = std::vector<std::string>(features.begin(), features.end());
      note(slurm_->UpdateNode(u));
    }
    // GRES: never recreated (slurmd owns the node); a mismatch drains it.
    std::string reason = DrainReasonFor(spec.state);
    const std::string want_counts = DeviceCounts(want.gres);
    const std::string have_counts = DeviceCounts(have.gres);
    if (want_counts != have_counts) {
      mismatched.insert(spec.name);
      reason = absl::StrCat("duet: GRES mismatch: slurmd registered ", have_counts,
                            ", Kubernetes node has ", want_counts);
      if (!mismatched_.count(spec.name)) {
        spdlog::error(
            "slurm sync: {}: slurmd registered GRES {} ({}), the Kubernetes node has {}: "
            "draining it (fix the NodeSet's Gres= or gres.conf; duet never recreates a node "
            "slurmd owns)",
            spec.name, FormatGres(have.gres), have_counts, want_counts);
      }
      if (!have.drain) Count(&SlurmSyncStats::gres_mismatch_drains);
    } else if (mismatched_.count(spec.name)) {
      spdlog::info("slurm sync: {}: GRES agree again ({})", spec.name, have_counts);
    }
    note(DrainOrResume(have, reason));
  }
  unregistered_.swap(unregistered);
  unmapped_.swap(unmapped);
  mismatched_.swap(mismatched);
  {
    absl::MutexLock lock(&stats_mu_);
    stats_.nodes_unregistered = unregistered_.size();
    stats_.nodes_unmapped = unmapped_.size();
    stats_.nodes_gres_mismatch = mismatched_.size();
  }
  // Slurm nodes that are not (or no longer) in the ledger are slurmd's:
  // left as they are.
  return first;
}

}  // namespace duet
