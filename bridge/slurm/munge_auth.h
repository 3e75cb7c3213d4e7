#pragma once

// Who may Hold/Release for a Slurm owner over gRPC (DESIGN.md §9): a caller
// with a munge credential that munged at `socket` decodes, encoded by root
// (slurmstepd; spank_duet's client regains root for the encode) or by
// `slurm_uid`, whose payload is exactly slurm_munge::Payload of the call's
// Binding (method, node, owner job and step, request digest), encoded at
// most `max_age` ago (munge's encode time; either way, for clock skew), and
// never accepted before by this process. munged refuses its own replays and
// expired credentials (default TTL 5 min) too; `max_age` is the tighter
// bound that makes replay across a leader takeover impossible
// (common/credential/replay_memory.h says why).
//
// Refusals carry reason CREDENTIAL_REFUSED with metadata why and node
// (common/reason.h): UNAUTHENTICATED (missing, bad_signature: munged rejects
// it; expired; replayed; wrong_version: a duet/v1 payload), PERMISSION_DENIED
// (wrong_uid, wrong_method, wrong_request), RESOURCE_EXHAUSTED (full: more
// than `max_remembered` credentials within one max age). UNAVAILABLE (munged
// cannot be reached) carries no reason. Every message says which. Nothing is
// remembered from a refused credential.
//
// Thread-safety: thread-safe (each Check uses its own munge context; the
// replay memory locks itself).

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/credential/munge_payload.h"
#include "common/credential/replay_memory.h"

namespace duet {

struct MungeAuthOptions {
  // munged socket; "" = libmunge's default (/run/munge/munge.socket.2).
  std::string socket;
  // Accepted besides root (Slurm's SlurmUser).
  uint32_t slurm_uid = 0;
  // slurm.credential_max_age.
  absl::Duration max_age = absl::Seconds(10);
  size_t max_remembered = size_t{1} << 20;
  const Clock* clock = Clock::Real();
};

class MungeAuth {
 public:
  explicit MungeAuth(MungeAuthOptions options)
      : options_(std::move(options)), seen_(options_.max_remembered) {}

  // OK when `credential` (the metadata value; "" when absent) is a fresh,
  // first-seen munge credential for exactly `want`. `who` (optional) gets
  // the caller's identity for the audit log ("slurm job=12 step=0 uid=0
  // credential=munge").
  absl::Status Check(const std::string& credential, const slurm_munge::Binding& want,
                     std::string* who = nullptr);

 private:
  const MungeAuthOptions options_;
  credential::ReplayMemory seen_;
};

// "Hold for slurm job 12 step 0 on node gke-a": how refusals name a call.
std::string DescribeCall(const slurm_munge::Binding& b);
// "slurm job=12 step=0": the Slurm identity a credential proves.
std::string SlurmIdentity(const slurm_munge::Binding& b);

}  // namespace duet
