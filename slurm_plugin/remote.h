#pragma once

// The remote context (slurmstepd), one instance per step on each node.
//
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

#include "absl/status/status.h"
#include "slurm_plugin/plugin_config.h"

namespace duet::spank {

struct RemoteState {
  bool show = false;        // --duet-show or SLURM_DUET_SHOW=1
  bool registered = false;  // Hold succeeded; Release at exit
  std::string node;
  uint32_t job_id = 0;
  uint32_t step_id = 0;
};

// Status messages are what the user sees; the facade prints them.
absl::Status RemoteUserInit(spank_t sp, const PluginConfig& config, RemoteState* state);
absl::Status RemoteExit(spank_t sp, const PluginConfig& config, RemoteState* state);

}  // namespace duet::spank
