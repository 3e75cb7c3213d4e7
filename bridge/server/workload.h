#pragma once

// duet-bridge's learned workload (placement::WorkloadModel, configured by
// placement.workload): what feeds it and what it exports.
//
// Fed with arrivals, each counted once per key:
//  - every pod the scheduler extender filters ("pod/<uid>": a pod that asks
//    duet to place it);
//  - every pod the pod watch reads that is bound to a shared node (a ledger
//    node), whoever scheduled it ("pod/<uid>" too);
//  - every live Slurm job the sync reads that holds devices on a shared node
//    and is not a pod's placeholder ("slurm/<job id>"; its shape is what it
//    holds on its first such node, its CPUs spread evenly over its nodes).
// After a restart the pod watch's first list and the Slurm sync's first pass
// report the live pods and jobs again: that is the rebuild.

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "bridge/ledger/ledger.h"
#include "bridge/placement/workload_model.h"
#include "bridge/slurm/slurm_client.h"
#include "nlohmann/json.hpp"
#include "prometheus/metric_family.h"

namespace duet {

// Counts `pod` (a v1.Pod) when it is bound to a node `ledger` knows and its
// resources can be read. False when it was not counted (not on a shared
// node, unreadable, or already counted).
bool ObserveBoundPod(placement::WorkloadModel* model, const Ledger& ledger,
                     const nlohmann::json& pod, absl::Time now);

// Counts a live Slurm job that holds devices on a node `ledger` knows.
bool ObserveSlurmJob(placement::WorkloadModel* model, const Ledger& ledger,
                     const SlurmJobInfo& job, absl::Time now);

// duet_workload_shapes{set="tracked|exported"}, duet_workload_coverage,
// duet_workload_arrivals_total, duet_workload_duplicates_total,
// duet_workload_evictions_total.
std::vector<prometheus::MetricFamily> WorkloadFamilies(const placement::WorkloadModel::Stats& s);

}  // namespace duet
