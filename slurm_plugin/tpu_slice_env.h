#pragma once

// The environment a multi-host JAX/libtpu program needs on each host of a
// TPU slice (docs/gangs.md 5), for a Slurm step that runs on one:
//
//   TPU_WORKER_ID         this host's index in the slice, 0..hosts-1
//   TPU_WORKER_HOSTNAMES  every host of the slice, comma-separated, in
//                         worker-id order (entry i is worker i)
//
// duet-bridge gives each Slurm node on a multi-host slice the feature
// "tpu-slice-POOL" (bridge/slurm's SlurmNodeFor; GKE makes one node pool
// per slice). A step gets the variables when its node carries that feature
// and the step spans every node of its job (a job that asked for one slice:
// `--constraint=tpu-slice-POOL`); the worker id is the step's relative node
// id (SLURM_NODEID) and the hosts are the job's nodes in Slurm's order, so
// worker i runs on the step's node i. Hostnames are Slurm node names: they
// must resolve to the hosts (as they do for slurmd on GKE).
//
// TpuSliceEnv and SliceOfFeatures are pure (no Slurm, no network) and
// unit-tested; LoadTpuSliceFacts and ExportTpuSliceEnv talk to Slurm and
// live in tpu_slice_slurm.cc (only in the client module, where slurmstepd
// provides libslurm's symbols).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

extern "C" {
#include <slurm/spank.h>
}

namespace duet::spank {

// The feature duet-bridge puts on the hosts of a multi-host slice:
// "tpu-slice-" + the slice's node pool (lower case, as features are).
inline constexpr char kTpuSliceFeaturePrefix[] = "tpu-slice-";

// The slice a node's feature list ("a,tpu-slice-v5e-a,b": Slurm's
// comma-separated list) names; empty when none does.
std::string SliceOfFeatures(const std::string& features);

// What Slurm says about the step's job and this node, read in
// init_post_opt (libslurm RPCs are not allowed later, see remote.h).
struct TpuSliceFacts {
  std::string slice;                   // this node's slice; empty: none
  std::vector<std::string> job_nodes;  // the job's nodes, Slurm's order
};

// One step on one node.
struct TpuSliceStep {
  std::string node;      // this node (SLURMD_NODENAME)
  uint32_t node_id = 0;  // the step's relative node id (SLURM_NODEID)
  uint32_t step_nodes = 0;  // nodes in the step
  TpuSliceFacts facts;
};

// The variables (name, value) for `step`: none when the node is on no
// slice, or the step runs on one node, or the step does not span its job's
// every node (the hosts' order is not known then). INVALID_ARGUMENT, and
// nothing to set, when the facts contradict each other (the job lists no
// node `node_id` or another node there).
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> TpuSliceEnv(
    const TpuSliceStep& step);

// slurmctld's answer for `job_id` on `node`: the node's features and the
// job's node list. UNAVAILABLE when slurmctld cannot be asked.
absl::StatusOr<TpuSliceFacts> LoadTpuSliceFacts(uint32_t job_id, const std::string& node);

// Sets TpuSliceEnv's variables in the step's environment (node id and node
// count from spank items). An error sets nothing; the caller logs it (the
// step runs: these variables are a convenience, not a fence).
absl::Status ExportTpuSliceEnv(spank_t sp, const std::string& node, const TpuSliceFacts& facts);

}  // namespace duet::spank
