#pragma once

// Calls to slurmctld from the client module in slurmstepd (the TPU probe in
// slurm_spank_init_post_opt): a step that starts while slurmctld restarts
// (an upgrade, a failover, its pod rescheduled) would otherwise be refused
// for a connection the restart reset. Only in duet_spank_client.so, where
// slurmstepd provides libslurm's symbols.

#include <slurm/spank.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/slurm/slurm_compat.h"

namespace duet::spank {

// How long a step waits for an unreachable slurmctld before giving up.
inline constexpr absl::Duration kSlurmctldWait = absl::Seconds(30);

// Runs `call` (a libslurm call returning SLURM_SUCCESS or an error, with the
// error in slurm_get_errno) and, while it fails for want of slurmctld (a
// communication error), again every half second for up to kSlurmctldWait,
// logging the first failure. Returns the last call's result; its errno is
// the last call's.
template <typename Call>
int RetryWhileSlurmctldUnreachable(const char* what, Call call) {
  const absl::Time give_up = absl::Now() + kSlurmctldWait;
  int rc = call();
  bool said = false;
  while (rc != SLURM_SUCCESS && slurm_compat::IsCommError(slurm_compat::LastError()) &&
         absl::Now() < give_up) {
    if (!said) {
      slurm_info("duet: %s: slurmctld unreachable (%s), asking again for up to %lld s", what,
                 slurm_strerror(slurm_compat::LastError()),
                 static_cast<long long>(absl::ToInt64Seconds(kSlurmctldWait)));
      said = true;
    }
    absl::SleepFor(absl::Milliseconds(500));
    rc = call();
  }
  return rc;
}

}  // namespace duet::spank
