// duet_spank_client.so: the bridge client of spank_duet.so (gRPC, protobuf,
// libmunge). spank_duet.so dlopens it in slurmstepd only, for steps that may
// need the bridge; see client_abi.h. One slurmstepd serves one step, so the
// module's state is one RemoteState.

#include <cstdio>
#include <string>

#include "slurm_plugin/bridge_client.h"
#include "slurm_plugin/client_abi.h"
#include "slurm_plugin/plugin_config.h"
#include "slurm_plugin/remote.h"

namespace {
duet::spank::RemoteState g_state;
}  // namespace

extern "C" {

__attribute__((visibility("default"))) unsigned duet_spank_client_abi(void) {
  return DUET_SPANK_CLIENT_ABI;
}

__attribute__((visibility("default"))) void duet_spank_client_init_post_opt(
    spank_t sp, const duet_spank_args* args) {
  duet::spank::RemoteInitPostOpt(sp, duet::spank::FromArgs(*args), &g_state);
}

__attribute__((visibility("default"))) int duet_spank_client_user_init(
    spank_t sp, const duet_spank_args* args, int show, char* err, size_t err_len) {
  if (show) g_state.show = true;
  absl::Status s;
  {
    // user_init runs as the job's user; the bridge is root's to talk to.
    duet::spank::ScopedEffectiveRoot root;
    s = duet::spank::RemoteUserInit(sp, duet::spank::FromArgs(*args), &g_state);
  }
  if (s.ok()) return 0;
  snprintf(err, err_len, "%s", std::string(s.message()).c_str());
  return -1;
}

__attribute__((visibility("default"))) void duet_spank_client_exit(spank_t sp,
                                                                  const duet_spank_args* args) {
  absl::Status s = duet::spank::RemoteExit(sp, duet::spank::FromArgs(*args), &g_state);
  if (!s.ok()) slurm_info("duet: %s", std::string(s.message()).c_str());
}

}  // extern "C"
