#pragma once

// The remote context (slurmstepd), one instance per step on each node.
//
// init_post_opt (slurmstepd, as root, before Slurm drops privileges): when
// TPUs are probed, load the job's TPU indices from slurmctld. Not later:
// from 24.11 slurmstepd runs user_init with the auth plugin's lock held, and
// a libslurm RPC there kills the step ("auth_g_create: pthread_rwlock_rdlock():
// Resource deadlock avoided").
// user_init (slurmstepd, before any task forks): read the step's devices,
// register them with duet-bridge as owner slurm_step{job, step}, refuse the
// step on a conflict, export the device variables, optionally print what the
// step got and who else holds devices on the node.
// exit (slurmstepd, after the tasks): release the registration.
//
// No gRPC channel outlives a callback (see bridge_client.h).

extern "C" {
#include <slurm/spank.h>
}

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "slurm_plugin/plugin_config.h"
#include "slurm_plugin/tpu_slice_env.h"

namespace duet::spank {

// A job's TPU indices per node (a node whose GRES detail could not be read
// holds the parse error).
using JobTpus = std::map<std::string, absl::StatusOr<std::vector<uint32_t>>>;

struct RemoteState {
  bool show = false;        // --duet-show or SLURM_DUET_SHOW=1
  bool registered = false;  // Hold succeeded; Release at exit
  std::string node;
  uint32_t job_id = 0;
  uint32_t step_id = 0;
  // The job's TPU indices per node, read in init_post_opt when TPUs are
  // probed; unset when no probe ran.
  std::optional<absl::StatusOr<JobTpus>> job_tpus;
  // This node's TPU slice and the job's nodes (tpu_slice_env.h), read with
  // job_tpus; unset when no probe ran.
  std::optional<absl::StatusOr<TpuSliceFacts>> tpu_slice;
};

// Never fails by itself: a failed probe is kept in `state` and refuses the
// step in RemoteUserInit, where the facade reports refusals.
void RemoteInitPostOpt(spank_t sp, const PluginConfig& config, RemoteState* state);
// Status messages are what the user sees; the facade prints them.
absl::Status RemoteUserInit(spank_t sp, const PluginConfig& config, RemoteState* state);
absl::Status RemoteExit(spank_t sp, const PluginConfig& config, RemoteState* state);

}  // namespace duet::spank
