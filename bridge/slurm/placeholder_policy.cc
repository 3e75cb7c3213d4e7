#include "bridge/slurm/placeholder_policy.h"

#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace duet {
namespace {

// PreemptParameters=...,min_exempt_priority=N,...
std::optional<uint64_t> MinExemptPriority(const std::string& params) {
  for (absl::string_view p : absl::StrSplit(params, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(p, absl::MaxSplits('=', 1));
    uint64_t v = 0;
    if (kv.first == "min_exempt_priority" && absl::SimpleAtoi(kv.second, &v)) return v;
  }
  return std::nullopt;
}

std::string Quoted(const std::string& partition) {
  return absl::StrCat("partition ", partition);
}

}  // namespace

const char* PlaceholderRiskName(PlaceholderRiskKind kind) {
  switch (kind) {
    case PlaceholderRiskKind::kPartitionMissing: return "partition_missing";
    case PlaceholderRiskKind::kSharedPartition: return "shared_partition";
    case PlaceholderRiskKind::kTimeLimit: return "time_limit";
    case PlaceholderRiskKind::kPreemptable: return "preemptable";
    case PlaceholderRiskKind::kDevicesUnconstrained: return "devices_unconstrained";
  }
  return "unknown";
}

std::vector<PlaceholderRisk> PlaceholderRisks(const SlurmClusterConfig& config,
                                              const std::vector<SlurmPartitionInfo>& partitions,
                                              const std::string& placeholder_partition,
                                              bool evict_pods) {
  std::vector<PlaceholderRisk> out;
  const SlurmPartitionInfo* part = nullptr;
  for (const SlurmPartitionInfo& p : partitions) {
    if (placeholder_partition.empty() ? p.is_default : p.name == placeholder_partition) part = &p;
  }
  if (part == nullptr) {
    out.push_back({PlaceholderRiskKind::kPartitionMissing,
                   placeholder_partition.empty()
                       ? std::string("slurm.placeholder_partition is unset and the cluster has no "
                                     "default partition: Slurm refuses every placeholder")
                       : absl::StrCat("slurm.placeholder_partition ", placeholder_partition,
                                      " is not a partition of this cluster: Slurm refuses every "
                                      "placeholder (add it to slurm.conf: docs/config.md, "
                                      "\"Placeholders in Slurm\")")});
  } else {
    if (placeholder_partition.empty() || part->is_default) {
      out.push_back({PlaceholderRiskKind::kSharedPartition,
                     absl::StrCat("placeholders go to ", Quoted(part->name),
                                  ", where users' jobs run by default: they count against its "
                                  "per-node limits",
                                  part->max_cpus_per_node
                                      ? absl::StrCat(" (MaxCPUsPerNode=", *part->max_cpus_per_node,
                                                     ")")
                                      : "",
                                  " and follow its time limit and preemption; set "
                                  "slurm.placeholder_partition to a partition of duet's own")});
    }
    if (part->max_time_min) {
      out.push_back({PlaceholderRiskKind::kTimeLimit,
                     absl::StrCat(Quoted(part->name), " has MaxTime=", *part->max_time_min,
                                  " minutes: a placeholder lasts as long as its pod and asks "
                                  "for no time limit, which Slurm refuses there; set "
                                  "MaxTime=UNLIMITED on it")});
    }
    const bool preempt_on = !config.preempt_type.empty() &&
                            !absl::EndsWith(config.preempt_type, "/none");
    const std::optional<uint64_t> exempt = MinExemptPriority(config.preempt_params);
    const std::string mode = part->preempt_mode.empty() ? config.preempt_mode : part->preempt_mode;
    if (preempt_on && !(exempt && *exempt < kPlaceholderPriority) && evict_pods) {
      // Intended: a preemptor cancels (or, as a placeholder is never
      // requeued, REQUEUE cancels) a placeholder and its pod is evicted. A
      // suspended one keeps its job and its pod, which evict-pods does not cover.
      if (absl::StrContains(mode, "SUSPEND") || absl::StrContains(mode, "GANG")) {
        out.push_back({PlaceholderRiskKind::kPreemptable,
                       absl::StrCat("PreemptMode=", mode, " for placeholders in ",
                                    Quoted(part->name),
                                    ": Slurm would suspend a placeholder, which slurm.preemption: "
                                    "evict-pods does not cover (it covers CANCEL and REQUEUE); "
                                    "set PreemptMode=CANCEL on it")});
      }
    } else if (preempt_on && !(exempt && *exempt < kPlaceholderPriority)) {
      std::string why;
      if (absl::EndsWith(config.preempt_type, "/partition_prio")) {
        if (part->preempt_mode != "OFF") {
          std::vector<std::string> above;
          for (const SlurmPartitionInfo& p : partitions) {
            if (p.priority_tier > part->priority_tier) {
              above.push_back(absl::StrCat(p.name, " (PriorityTier=", p.priority_tier, ")"));
            }
          }
          if (!above.empty()) {
            why = absl::StrCat("PreemptType=", config.preempt_type, ": jobs of ",
                               absl::StrJoin(above, ", "), " may preempt placeholders in ",
                               Quoted(part->name), " (PriorityTier=", part->priority_tier,
                               ", PreemptMode=", mode, "); set PreemptMode=OFF on it");
          }
        }
      } else {
        why = absl::StrCat("PreemptType=", config.preempt_type,
                           ": placeholders can be preempted by the QOS rules, which duet cannot "
                           "check");
      }
      if (!why.empty()) {
        absl::StrAppend(&why, ", or set PreemptParameters=min_exempt_priority=",
                        kPlaceholderPriority - 1,
                        " (placeholders run at priority ", kPlaceholderPriority, ")");
        out.push_back({PlaceholderRiskKind::kPreemptable, std::move(why)});
      }
    }
  }
  const bool cgroup = absl::StrContains(config.task_plugin, "cgroup");
  if (!cgroup || config.constrain_devices != true) {
    out.push_back({PlaceholderRiskKind::kDevicesUnconstrained,
                   absl::StrCat(!cgroup ? absl::StrCat("TaskPlugin=", config.task_plugin.empty()
                                                                          ? "(none)"
                                                                          : config.task_plugin)
                                        : std::string("cgroup.conf has no ConstrainDevices=yes"),
                                ": no device cgroup confines a step, so it sees only its GPUs "
                                "through CUDA_VISIBLE_DEVICES (spank_duet sets it) but can open "
                                "every GPU of the node, the pods' too; set "
                                "TaskPlugin=task/cgroup and ConstrainDevices=yes")});
  }
  return out;
}

}  // namespace duet
