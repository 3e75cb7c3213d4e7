#pragma once

// duet-bridge's Slurm-side metrics, as families its Metrics collects at each
// scrape (Metrics::AddCollector): the Slurm sync's stats, pod evictions
// (slurm.preemption: evict-pods) and libslurm's credential check.

#include <vector>

#include "bridge/slurm/pod_evictions.h"
#include "bridge/slurm/slurm_auth_check.h"
#include "bridge/slurm/slurm_sync.h"
#include "prometheus/metric_family.h"

namespace duet {

// duet_slurm_degraded, duet_slurm_sync_*, duet_slurm_*_total, the adopt-mode
// node gauges, duet_placeholder_* (losses, repairs, repair failures by
// reason, fenced), duet_slurm_placeholder_risk{risk} (once the sync could
// read Slurm's configuration), duet_dra_claims_without_lend_job.
std::vector<prometheus::MetricFamily> SlurmMetricFamilies(bool degraded,
                                                          const SlurmSyncStats& s);

// duet_pod_evictions_total{result} and duet_pod_evictions_pending
// (slurm.preemption: evict-pods).
std::vector<prometheus::MetricFamily> PodEvictionFamilies(const PodEvictionStats& s);

// duet_slurm_auth_ready{source}: one series, the current check.
std::vector<prometheus::MetricFamily> SlurmAuthFamilies(const SlurmAuthCheck& c);

}  // namespace duet
