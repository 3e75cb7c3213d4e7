#pragma once

// spank_duet's configuration: the arguments after the .so path in
// plugstack.conf, e.g.
//   required /usr/lib/duet/spank_duet.so bridge=unix:///run/duet/bridge.sock timeout_ms=2000 on_unreachable=fail
//
// Keys:
//   bridge=ADDR          gRPC target of duet-bridge: unix:///path or host:port
//                        (default unix:///run/duet/bridge.sock)
//   timeout_ms=N         deadline of each call to the bridge (default 2000, 1..60000)
//   on_unreachable=fail|allow
//                        what a step does when the bridge cannot be reached.
//                        Default fail: a step the ledger does not know about
//                        could be given to a pod by the bridge in the meantime
//                        (invariant I1 beats availability). allow runs the step
//                        unregistered and logs it; job import records it later.
//   tpu=auto|yes|no      read TPU indices from the job's GRES detail (one
//                        slurmctld RPC per step): auto does so only on nodes
//                        with /dev/accel0 or /dev/vfio/0 (default auto).
//   disabled             load the plugin but do nothing (for staged rollouts).
// Unknown keys and bad values are errors (the plugin then fails to load).

#include <string>

#include "absl/status/statusor.h"

namespace duet::spank {

enum class OnUnreachable { kFail, kAllow };
enum class TpuProbe { kAuto, kYes, kNo };

struct PluginConfig {
  std::string bridge = "unix:///run/duet/bridge.sock";
  int timeout_ms = 2000;
  OnUnreachable on_unreachable = OnUnreachable::kFail;
  TpuProbe tpu = TpuProbe::kAuto;
  bool disabled = false;
};

// Parses plugstack arguments. INVALID_ARGUMENT names the bad argument.
absl::StatusOr<PluginConfig> ParsePluginArgs(int argc, const char* const* argv);

}  // namespace duet::spank
