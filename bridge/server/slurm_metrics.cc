#include "bridge/server/slurm_metrics.h"

#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bridge/slurm/placeholder_policy.h"
#include "common/metrics/metrics.h"

namespace duet {
namespace {

prometheus::MetricFamily Family(const std::string& name, const std::string& help,
                                prometheus::MetricType type, double value) {
  prometheus::MetricFamily f = NewFamily(name, help, type);
  AddValue(&f, {}, value);
  return f;
}

}  // namespace

std::vector<prometheus::MetricFamily> SlurmMetricFamilies(bool degraded,
                                                          const SlurmSyncStats& s) {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  auto counter = [&out](const char* name, const char* help, double value) {
    out.push_back(Family(name, help, MetricType::Counter, value));
  };
  auto gauge = [&out](const char* name, const char* help, double value) {
    out.push_back(Family(name, help, MetricType::Gauge, value));
  };
  gauge("duet_slurm_degraded", "1 while slurmctld cannot be reached", degraded ? 1 : 0);
  counter("duet_slurm_sync_passes_total", "Slurm sync passes", s.passes);
  counter("duet_slurm_sync_failed_passes_total", "Slurm sync passes that failed", s.failed_passes);
  counter("duet_slurm_reconcile_corrections_total",
          "Ledger corrections from Slurm's job table (imported + released)",
          s.holdings_imported + s.holdings_released);
  counter("duet_slurm_conflicts_total", "Slurm jobs holding devices the ledger gives another owner",
          s.conflicts);
  counter("duet_slurm_node_changes_total",
          "Slurm nodes created, deleted, recreated, drained or resumed by duet",
          s.nodes_created + s.nodes_deleted + s.nodes_recreated + s.drains + s.resumes);
  counter("duet_slurm_weight_updates_total", "Slurm node weight updates", s.weight_updates);
  counter("duet_slurm_reconfigures_total",
          "scontrol reconfigure sent after a slurmctld start with GRES nodes "
          "(Slurm 22.05 workaround)",
          s.reconfigures);
  counter("duet_slurm_version_refusals_total",
          "Slurm sync passes refused because slurmctld's release is one this "
          "duet-bridge's libslurm cannot talk to",
          s.version_refusals);
  gauge("duet_slurm_nodes_unregistered",
        "slurm.nodes: adopt: shared nodes whose slurmd has not registered its "
        "Slurm node (nothing granted to Slurm there)",
        s.nodes_unregistered);
  gauge("duet_slurm_nodes_unmapped",
        "slurm.nodes: adopt: shared nodes whose Slurm name (up to the first dot, "
        "or Slinky's hostname-override) is not their Kubernetes name: not adopted",
        s.nodes_unmapped);
  gauge("duet_slurm_nodes_gres_mismatch",
        "slurm.nodes: adopt: nodes whose slurmd registered other GPU/TPU counts "
        "than Kubernetes reports (drained)",
        s.nodes_gres_mismatch);
  counter("duet_slurm_gres_mismatch_drains_total",
          "Drains duet made because a slurmd's GRES disagree with the node's devices",
          s.gres_mismatch_drains);
  {
    prometheus::MetricFamily f = Family(
        "duet_placeholder_losses_total",
        "Placeholders whose Slurm job vanished while their pod ran (scancel, node down), by the "
        "outcome of the first sync pass that saw each: repaired, or fenced (devices kept held "
        "in the ledger)",
        MetricType::Counter, static_cast<double>(s.placeholders_lost_repaired));
    f.metric[0].label.push_back({"outcome", "repaired"});
    prometheus::ClientMetric fenced = f.metric[0];
    fenced.label[0].value = "fenced";
    fenced.counter.value = static_cast<double>(s.placeholders_lost_fenced);
    f.metric.push_back(fenced);
    out.push_back(std::move(f));
  }
  counter("duet_placeholder_repairs_total",
          "Lost placeholders re-created in Slurm for the pod's exact devices",
          s.placeholder_repairs);
  {
    // Every reason, 0 included, so a rate() over it starts at the first scrape.
    prometheus::MetricFamily f = NewFamily(
        "duet_placeholder_repair_failures_total",
        "Failed attempts to re-make a lost placeholder, by reason: slurm_devices_busy (Slurm "
        "counts the pod's devices in use with no job the ledger knows), ledger_conflict, "
        "slurm_unavailable, other; retried at the next pass, then backing off to 5 min",
        MetricType::Counter);
    for (RepairFailure r : {RepairFailure::kSlurmDevicesBusy, RepairFailure::kLedgerConflict,
                            RepairFailure::kSlurmUnavailable, RepairFailure::kOther}) {
      const std::string name = RepairFailureName(r);
      auto it = s.repair_failures.find(name);
      AddValue(&f, {{"reason", name}}, it == s.repair_failures.end() ? 0.0 : it->second);
    }
    out.push_back(std::move(f));
  }
  if (s.placeholder_risks_known) {
    // bridge/slurm/placeholder_policy.h: 1 while present, every kind listed.
    prometheus::MetricFamily f = NewFamily(
        "duet_slurm_placeholder_risk",
        "1 while slurmctld's configuration could end, preempt or block a pod's placeholder, or "
        "leaves steps able to open every GPU: partition_missing, shared_partition, time_limit, "
        "preemptable, devices_unconstrained (the bridge's log says what to change)",
        MetricType::Gauge);
    for (PlaceholderRiskKind k : kAllPlaceholderRisks) {
      const std::string name = PlaceholderRiskName(k);
      AddValue(&f, {{"risk", name}}, s.placeholder_risks.count(name) ? 1.0 : 0.0);
    }
    out.push_back(std::move(f));
  }
  gauge("duet_placeholders_fenced",
        "Lost placeholders not repaired yet: their pod's devices are held in the "
        "ledger only (SPANK refuses Slurm steps on them)",
        s.placeholders_fenced);
  gauge("duet_dra_claims_without_lend_job",
        "DRA claims whose lend job is gone from Slurm (last pass): the claim keeps its devices in "
        "the ledger (SPANK refuses Slurm steps on them) until it is deallocated",
        s.claims_without_lend_job);
  gauge("duet_slurm_sync_age_seconds", "Seconds since the last successful sync pass (-1: none yet)",
        s.last_success == absl::InfinitePast()
            ? -1
            : absl::ToDoubleSeconds(absl::Now() - s.last_success));
  return out;
}

// slurm.preemption: evict-pods.
std::vector<prometheus::MetricFamily> PodEvictionFamilies(const PodEvictionStats& s) {
  prometheus::MetricFamily total = NewFamily(
      "duet_pod_evictions_total",
      "Evictions of pods whose placeholder Slurm preempted (slurm.preemption: evict-pods), by "
      "result: evicted (the API accepted it, or the pod was gone), blocked (a "
      "PodDisruptionBudget refused it; tried again), failed (another refusal; tried again), "
      "expired (the pod still held its devices when the preemptor's wait ran out)",
      prometheus::MetricType::Counter);
  AddValue(&total, {{"result", "evicted"}}, static_cast<double>(s.evicted));
  AddValue(&total, {{"result", "blocked"}}, static_cast<double>(s.blocked));
  AddValue(&total, {{"result", "failed"}}, static_cast<double>(s.failed));
  AddValue(&total, {{"result", "expired"}}, static_cast<double>(s.expired));
  prometheus::MetricFamily pending = NewFamily(
      "duet_pod_evictions_pending",
      "Pods being evicted for a Slurm preemption that still hold their devices",
      prometheus::MetricType::Gauge);
  AddValue(&pending, {}, s.pending);
  std::vector<prometheus::MetricFamily> out;
  out.push_back(std::move(total));
  out.push_back(std::move(pending));
  return out;
}

// duet_slurm_auth_ready{source}: one series, the current check.
std::vector<prometheus::MetricFamily> SlurmAuthFamilies(const SlurmAuthCheck& c) {
  prometheus::MetricFamily f = NewFamily(
      "duet_slurm_auth_ready",
      "1 while libslurm has a way to authenticate to slurmctld (source: sack_socket, "
      "munge_socket, or unchecked for other AuthTypes); 0 with source none: no sack socket or "
      "munged answers (run sackd or munged beside duet-bridge)",
      prometheus::MetricType::Gauge);
  AddValue(&f, {{"source", SlurmAuthSourceName(c.source)}}, c.ready() ? 1 : 0);
  return {std::move(f)};
}

}  // namespace duet
