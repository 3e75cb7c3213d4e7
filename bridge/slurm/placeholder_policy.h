#pragma once

// What in slurmctld's configuration could end, preempt or block a pod's
// placeholder while the pod runs, or leave steps able to open the pods'
// devices. SlurmSync checks it at every pass (the partitions and the
// preemption settings can change at any time with scontrol) and reports each
// risk as duet_slurm_placeholder_risk{risk} = 1 and an error log line when it
// appears. duet keeps serving: a placeholder Slurm ends is repaired or
// fenced as before, and the metric tells the operator why it happened.
//
//   partition_missing      slurm.placeholder_partition names no partition:
//                          every placeholder is refused.
//   shared_partition       placeholders go to the partition users' jobs run
//                          in (no placeholder_partition, or the default one):
//                          they count against its per-node caps
//                          (MaxCPUsPerNode) and follow its rules.
//   time_limit             the placeholder partition has a finite MaxTime:
//                          Slurm refuses placeholders, which ask for no time
//                          limit, or would end them at MaxTime.
//   preemptable            Slurm may preempt a placeholder (and give the
//                          pod's devices to the preemptor, whose steps duet
//                          then refuses): PreemptType is not preempt/none,
//                          placeholders are not exempt
//                          (PreemptParameters=min_exempt_priority below
//                          their priority), and under preempt/partition_prio
//                          their partition's PreemptMode is not OFF while a
//                          partition of a higher PriorityTier exists. Under
//                          preempt/qos only min_exempt_priority is checked
//                          (QOS rules live in slurmdbd, which duet does not
//                          read).
//   devices_unconstrained  no device cgroup (TaskPlugin without task/cgroup,
//                          or cgroup.conf without ConstrainDevices=yes): a
//                          step sees only its GPUs through
//                          CUDA_VISIBLE_DEVICES (spank_duet sets it), but
//                          nothing stops it opening the others, the pods'
//                          included.
//
// Pure functions; no I/O.

#include <string>
#include <vector>

#include "bridge/slurm/slurm_client.h"

namespace duet {

enum class PlaceholderRiskKind {
  kPartitionMissing,
  kSharedPartition,
  kTimeLimit,
  kPreemptable,
  kDevicesUnconstrained,
};
inline constexpr PlaceholderRiskKind kAllPlaceholderRisks[] = {
    PlaceholderRiskKind::kPartitionMissing, PlaceholderRiskKind::kSharedPartition,
    PlaceholderRiskKind::kTimeLimit, PlaceholderRiskKind::kPreemptable,
    PlaceholderRiskKind::kDevicesUnconstrained};

// The metric label: "partition_missing", "shared_partition", ...
const char* PlaceholderRiskName(PlaceholderRiskKind kind);

struct PlaceholderRisk {
  PlaceholderRiskKind kind;
  // What Slurm's configuration says and what to change, for the log.
  std::string detail;
};

// The risks of `config` and `partitions` for placeholders sent to
// `placeholder_partition` ("" = the default partition), in
// kAllPlaceholderRisks order. Under `evict_pods` (slurm.preemption:
// evict-pods) preemption by CANCEL or REQUEUE is the intended path, not a
// risk; SUSPEND and GANG still are.
std::vector<PlaceholderRisk> PlaceholderRisks(const SlurmClusterConfig& config,
                                              const std::vector<SlurmPartitionInfo>& partitions,
                                              const std::string& placeholder_partition,
                                              bool evict_pods = false);

}  // namespace duet
