#pragma once

// Helpers shared by SlurmSync's passes (slurm_sync.h), which live one per file:
//   slurm_sync.cc         the pass (RunOnce), its thread, stats, the slurmctld
//                         restart workaround and the placeholder policy check
//   node_config.cc        what a ledger node becomes in Slurm (SlurmNodeFor, ...)
//   node_loads.cc         SlurmNodeLoads, UnusableReason, ReservationReason
//   node_sync.cc          nodes, create mode (SyncNodes, Retire, DrainOrResume)
//   node_adoption.cc      nodes, adopt mode (AdoptNodes)
//   job_import.cc         jobs (ImportJobs, ReleaseEndedHolders)
//   gang_jobs.cc          gang jobs (GangJobsHeld, ImportGangJob)
//   lost_placeholders.cc  lost placeholders (HandleLost, RepairFailureName)
//   node_weights.cc       weights (SyncWeights)
// Internal to duet::slurm: nothing outside bridge/slurm includes it.

#include <cstdint>
#include <string>
#include <vector>

#include "bridge/ledger/ledger.h"
#include "bridge/slurm/slurm_client.h"

namespace duet {
namespace slurm_sync_internal {

// The drain reason duet gives a node in inventory state `s` ("duet: ...");
// empty for kReady.
inline std::string DrainReasonFor(NodeState s) {
  switch (s) {
    case NodeState::kCordoned: return "duet: cordoned";
    case NodeState::kNotReady: return "duet: node not ready";
    case NodeState::kGone: return "duet: node left the inventory";
    case NodeState::kReady: return "";
  }
  return "";
}

// The devices a Slurm job holds on one node, as ledger devices (GPUs, then
// TPUs, each in index order).
inline std::vector<HeldDevice> ToHeld(const SlurmJobNodeDevices& d) {
  std::vector<HeldDevice> out;
  for (uint32_t g : d.gpus) out.push_back({DeviceKind::kGpu, g, kWholeDevice});
  for (uint32_t t : d.tpus) out.push_back({DeviceKind::kTpu, t, kWholeDevice});
  return out;
}

}  // namespace slurm_sync_internal
}  // namespace duet
