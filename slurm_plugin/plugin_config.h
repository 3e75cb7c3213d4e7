#pragma once

// spank_duet's configuration in C++ (duet_spank_client.so and the tests): the
// plugstack arguments parsed by plugin_args.c (keys documented there), e.g.
//   required /usr/lib/duet/spank_duet.so bridge=unix:///run/duet/bridge.sock timeout_ms=2000 on_unreachable=fail

#include <string>

#include "absl/status/statusor.h"
#include "slurm_plugin/plugin_args.h"

namespace duet::spank {

enum class OnUnreachable { kFail, kAllow };
enum class TpuProbe { kAuto, kYes, kNo };
// The credential on each Hold/Release (plugstack auth=).
enum class StepAuth { kMunge, kSlurmKey, kNone };

struct PluginConfig {
  std::string bridge = "unix:///run/duet/bridge.sock";
  int timeout_ms = 2000;
  OnUnreachable on_unreachable = OnUnreachable::kFail;
  TpuProbe tpu = TpuProbe::kAuto;
  std::string client;  // "" = duet_spank_client.so next to spank_duet.so
  StepAuth auth = StepAuth::kMunge;
  std::string munge_socket;  // "" = libmunge's default
  std::string slurm_key;     // "" = $SLURM_SACK_KEY, else /etc/slurm/slurm.key
  bool disabled = false;
};

// Parses plugstack arguments. INVALID_ARGUMENT names the bad argument.
absl::StatusOr<PluginConfig> ParsePluginArgs(int argc, const char* const* argv);

// The C struct spank_duet.so hands to the client module.
PluginConfig FromArgs(const duet_spank_args& args);

}  // namespace duet::spank
