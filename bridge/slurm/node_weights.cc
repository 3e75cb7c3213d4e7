// SlurmSync's weight pass (slurm_sync.h, step 4): each node's Weight from
// the placement policy (SlurmWeightFor), sent only on change.

#include "bridge/slurm/slurm_sync.h"

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"

namespace duet {


absl::Status SlurmSync::SyncWeights(const LedgerSnapshot& snap,
                                    const std::vector<SlurmNodeInfo>& nodes) {
  absl::flat_hash_map<std::string, uint32_t> have;
  for (const SlurmNodeInfo& n : nodes) have[n.name] = n.weight;
  absl::Status first;
  for (const auto& view : snap.nodes) {
    auto it = have.find(view->spec.name);
    if (it == have.end()) continue;
    const uint32_t want = SlurmWeightFor(*view, options_);
    if (it->second == want) continue;
    SlurmNodeUpdate u;
    u.name = view->spec.name;
    u.weight = want;
    absl::Status s = slurm_->UpdateNode(u);
    if (s.ok()) {
      Count(&SlurmSyncStats::weight_updates);
    } else if (first.ok()) {
      first = s;
    }
  }
  return first;
}

}  // namespace duet
