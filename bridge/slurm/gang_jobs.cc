// SlurmSync's gang jobs (job name "duet-gang:KEY", docs/gangs.md;
// slurm_sync.h, step 3): which live gang jobs the ledger holds something of,
// and the import of one it holds nothing of as GangSlot owners.

#include "bridge/slurm/slurm_sync.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "bridge/slurm/placeholders.h"
#include "bridge/slurm/slurm_sync_internal.h"
#include "spdlog/spdlog.h"

namespace duet {

using slurm_sync_internal::ToHeld;

absl::flat_hash_set<uint32_t> SlurmSync::GangJobsHeld(const std::vector<SlurmJobInfo>& jobs) const {
  absl::flat_hash_set<uint32_t> out;
  const bool any = std::any_of(jobs.begin(), jobs.end(), [](const SlurmJobInfo& j) {
    return j.live() && ParseGangJobName(j.name).has_value();
  });
  if (!any) return out;
  for (const Holding& h : ledger_->ListHoldings()) {
    // A claim on a gang job's device (the DRA lending mode) holds it too.
    if (h.owner.kind == OwnerKind::kGangSlot || h.owner.kind == OwnerKind::kPlaceholder ||
        h.owner.kind == OwnerKind::kClaim) {
      out.insert(h.owner.job_id);
    }
  }
  return out;
}

void SlurmSync::ImportGangJob(const SlurmJobInfo& job, const gang::GangKey& key,
                              const absl::flat_hash_set<std::string>& ledger_nodes,
                              absl::Time listed_at) {
  // Placeholders::Create records the slots right after Slurm grants the
  // job: a job this new may be on its way into the ledger.
  if (job.start_time > listed_at - options_.release_grace) return;
  // The slots per node the job was made for ("slots=N" in its comment, the
  // same number on every node); one slot per node when it cannot be read.
  uint32_t slots = 0;
  for (absl::string_view kv : absl::StrSplit(job.comment, ' ', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&kv, "slots=") && !absl::SimpleAtoi(kv, &slots)) slots = 0;
  }
  const size_t nodes = job.devices.size();
  uint32_t per_node = nodes > 0 && slots > 0 && slots % nodes == 0
                          ? static_cast<uint32_t>(slots / nodes)
                          : 1;
  for (const SlurmJobNodeDevices& d : job.devices) {
    if (per_node > 1 && ToHeld(d).size() % per_node != 0) per_node = 1;
  }
  const std::string gang = key.ToString();
  uint32_t slot = 0;
  for (const SlurmJobNodeDevices& d : job.devices) {
    const std::vector<HeldDevice> devices = ToHeld(d);  // sorted by (kind, index)
    const size_t each = devices.size() / per_node;
    for (uint32_t m = 0; m < per_node; ++m, ++slot) {
      if (!ledger_nodes.contains(d.node) || each == 0) continue;
      HoldRequest req;
      req.node = d.node;
      req.owner = Owner::GangSlot(job.job_id, gang, slot);
      req.devices.assign(devices.begin() + m * each, devices.begin() + (m + 1) * each);
      absl::StatusOr<HoldResult> held = ledger_->Hold(req);
      if (held.ok()) {
        Count(&SlurmSyncStats::holdings_imported);
        spdlog::info("slurm sync: imported {} on {} (the ledger had nothing of gang job {})",
                     req.owner.ToString(), d.node, job.job_id);
      } else {
        Count(&SlurmSyncStats::conflicts);
        spdlog::error("slurm sync: cannot record {} on {} (Slurm runs it): {}",
                      req.owner.ToString(), d.node, held.status().ToString());
      }
    }
  }
}

}  // namespace duet
