#include "slurm_plugin/plugin_config.h"

namespace duet::spank {

PluginConfig FromArgs(const duet_spank_args& a) {
  PluginConfig c;
  c.bridge = a.bridge;
  c.timeout_ms = a.timeout_ms;
  c.on_unreachable =
      a.on_unreachable == DUET_UNREACHABLE_ALLOW ? OnUnreachable::kAllow : OnUnreachable::kFail;
  c.tpu = a.tpu == DUET_TPU_YES ? TpuProbe::kYes
          : a.tpu == DUET_TPU_NO ? TpuProbe::kNo
                                 : TpuProbe::kAuto;
  c.client = a.client;
  c.auth = a.auth == DUET_AUTH_SLURM_KEY ? StepAuth::kSlurmKey
           : a.auth == DUET_AUTH_NONE    ? StepAuth::kNone
                                         : StepAuth::kMunge;
  c.munge_socket = a.munge_socket;
  c.slurm_key = a.slurm_key;
  c.disabled = a.disabled != 0;
  return c;
}

absl::StatusOr<PluginConfig> ParsePluginArgs(int argc, const char* const* argv) {
  duet_spank_args a;
  char err[2 * DUET_ARG_MAX];
  if (duet_spank_parse_args(argc, argv, &a, err, sizeof(err)) != 0) {
    return absl::InvalidArgumentError(err);
  }
  return FromArgs(a);
}

}  // namespace duet::spank
