#pragma once

// The Slurm sync's settings that come from configuration, declared once:
// SlurmSyncOptions (slurm_sync.h) extends this struct, and duet-bridge's
// config embeds it (SlurmConfig, the `slurm` section, same key names), so a
// default lives in one place and config validation asks Validate() below.
// Header-only (no libslurm), and in the core's config folder: bridge/slurm
// depends inward on it, never the config on bridge/slurm.

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace duet {

struct SlurmSyncSettings {
  // Time between sync passes (nodes, job import, weights).
  absl::Duration sync_period = absl::Seconds(10);
  // Off: duet leaves Slurm's nodes alone (no create, drain, resume or GRES
  // check). On: create and delete them, or adopt slurmd's (SlurmNodeMode).
  bool manage_nodes = true;
  // Feed node weights back to Slurm so it packs like the extender.
  bool manage_weights = true;
  // Import Slurm's jobs into the ledger and release ended ones.
  bool import_jobs = true;
  // Node label whose value is the Slurm NodeAddr/NodeHostname (default: the
  // node name).
  std::string node_addr_label = "duet.dev/slurm-node-addr";
  // Feature that marks the Slurm nodes duet created; only those are deleted.
  std::string managed_feature = "duet";
  // The Slurm topology (a topology.yaml name; "default" for topology.conf)
  // whose topology/block blocks duet's created nodes join, named as their
  // GKE block (`Topology=NAME:BLOCK` at creation, Slurm 25.05+; the blocks
  // must be listed in slurmctld's topology, docs/slurm-versions.md). Empty:
  // none; the block and sub-block reach Slurm as node features on every
  // version either way.
  std::string block_topology;
  // Holdings granted less than this before the job list was read are not
  // released by a job import.
  absl::Duration release_grace = absl::Seconds(5);
  // The partition (and QOS) placeholder jobs go to; empty: the cluster's
  // default. Give placeholders a partition of their own on the shared nodes,
  // with MaxTime=UNLIMITED and PreemptMode=OFF (docs/config.md, "Placeholders
  // in Slurm"): in the users' partition they live by its time limit, its
  // per-node caps and its preemption rules. Each pass checks the partition
  // and reports what could end a placeholder (duet_slurm_placeholder_risk).
  std::string placeholder_partition;
  std::string placeholder_qos;
  // What a Slurm preemption of a placeholder means (docs/config.md,
  // "Preemption"). "protect": nothing may preempt one (the pass reports a
  // configuration that could, duet_slurm_placeholder_risk{risk="preemptable"});
  // a placeholder Slurm preempted anyway is handled as lost and its pod's
  // devices stay fenced. "evict-pods": a preempted placeholder's pod is
  // evicted through the Eviction API (PodDisruptionBudgets apply), and the
  // preemptor's steps wait for its devices up to `preemption_wait`.
  std::string preemption = "protect";
  absl::Duration preemption_wait = absl::Minutes(5);

  // OK, or INVALID_ARGUMENT naming the field under `prefix` ("slurm.").
  absl::Status Validate(const std::string& prefix = "") const {
    if (sync_period < absl::Milliseconds(100)) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "sync_period: must be at least 100ms"));
    }
    if (managed_feature.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "managed_feature: must be set"));
    }
    for (const auto& [key, value] : {std::pair<const char*, const std::string*>{
                                         "placeholder_partition", &placeholder_partition},
                                     {"placeholder_qos", &placeholder_qos},
                                     {"block_topology", &block_topology}}) {
      if (value->find_first_of(" \t\n,=") != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            prefix, key, ": must be one Slurm name (no spaces, commas or '='), not \"", *value,
            "\""));
      }
    }
    if (block_topology.find(':') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "block_topology: a topology name has no ':', not \"", block_topology, "\""));
    }
    if (preemption != "protect" && preemption != "evict-pods") {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "preemption: \"", preemption, "\" is not one of protect, evict-pods"));
    }
    if (preemption_wait < absl::Seconds(1) || preemption_wait > absl::Hours(1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "preemption_wait: must be between 1s and 1h, not ",
          absl::FormatDuration(preemption_wait)));
    }
    if (release_grace < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "release_grace: must not be negative"));
    }
    return absl::OkStatus();
  }
};

}  // namespace duet
