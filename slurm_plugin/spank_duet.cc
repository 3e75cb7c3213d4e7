// spank_duet.so: the SPANK entry points. A thin facade: it switches on the
// context and turns the Status of the C++ underneath into 0 / -1 (and a
// message the user sees). Options, for srun/sbatch/salloc:
//
//   --duet-show   print, when each step starts, the devices it got on each
//                 node and who else (pods, other jobs) holds devices there.
//                 Same as SLURM_DUET_SHOW=1 in the environment.
//
// Plugstack arguments: see plugin_config.h.

extern "C" {
#include <slurm/spank.h>
}

#include <string>

#include "slurm_plugin/plugin_config.h"
#include "slurm_plugin/remote.h"

// SPANK_PLUGIN() gives these internal linkage under C++; spell them out.
extern "C" {
__attribute__((visibility("default"))) extern const char plugin_name[] = "duet";
__attribute__((visibility("default"))) extern const char plugin_type[] = "spank";
__attribute__((visibility("default"))) extern const unsigned int plugin_version =
    SLURM_VERSION_NUMBER;
__attribute__((visibility("default"))) extern const unsigned int spank_plugin_version = 1;
}

namespace {

duet::spank::PluginConfig g_config;
duet::spank::RemoteState g_remote;
// Set in user_init when the step is refused. Slurm 22.05 reports a failed
// user_init as "could not execve" with exit code 0 (srun rc 0, batch job
// COMPLETED), so the refusal is delivered in task_init_privileged instead:
// every task then fails before exec with exit code 1, which srun and sacct
// report. No gRPC happens after fork; this only prints and returns.
std::string g_refusal;

// May run twice in slurmstepd (once per option pass): idempotent.
int OnShowOption(int /*val*/, const char* /*optarg*/, int /*remote*/) {
  g_remote.show = true;
  return 0;
}

struct spank_option g_show_option = {
    const_cast<char*>("duet-show"), nullptr,
    const_cast<char*>("duet: print, at step start, the GPUs/TPUs the step got on each node and "
                      "which pods and jobs share the node (or SLURM_DUET_SHOW=1)"),
    0, 0, OnShowOption};

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int slurm_spank_init(spank_t sp, int ac, char** av) {
  // No network here: a failing required init in slurmd drains the node.
  auto config = duet::spank::ParsePluginArgs(ac, av);
  if (!config.ok()) {
    slurm_error("duet: %s", std::string(config.status().message()).c_str());
    return -1;
  }
  g_config = *config;
  const spank_context_t ctx = spank_context();
  if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR || ctx == S_CTX_REMOTE) {
    if (spank_option_register(sp, &g_show_option) != ESPANK_SUCCESS) {
      slurm_error("duet: cannot register --duet-show");
      return -1;
    }
  }
  return 0;
}

__attribute__((visibility("default"))) int slurm_spank_user_init(spank_t sp, int, char**) {
  if (!spank_remote(sp)) return 0;
  absl::Status s = duet::spank::RemoteUserInit(sp, g_config, &g_remote);
  if (!s.ok()) {
    g_refusal = std::string(s.message());
    slurm_error("duet: %s", g_refusal.c_str());
  }
  return 0;
}

__attribute__((visibility("default"))) int slurm_spank_task_init_privileged(spank_t sp, int,
                                                                            char**) {
  if (!spank_remote(sp) || g_refusal.empty()) return 0;
  return -1;
}

__attribute__((visibility("default"))) int slurm_spank_exit(spank_t sp, int, char**) {
  if (!spank_remote(sp)) return 0;
  absl::Status s = duet::spank::RemoteExit(sp, g_config, &g_remote);
  if (!s.ok()) slurm_info("duet: %s", std::string(s.message()).c_str());
  return 0;
}

}  // extern "C"
