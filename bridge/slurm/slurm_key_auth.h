#pragma once

// Who may Hold/Release for a Slurm owner over gRPC on an auth/slurm cluster
// (DESIGN.md §9): a caller whose slurm.key credential (slurm_key_cred.h)
// signs exactly slurm_munge::Payload of the call's Binding (method, node,
// owner job and step, request digest), made within `max_age` of now (either
// way: clocks differ), and never seen before. Only holders of the cluster's
// slurm.key can make one: slurmstepd (root) on a Slurm node, and Slurm's own
// daemons.
//
// Replays: every accepted nonce is remembered until its credential expires
// (common/credential/replay_memory.h); a second use is refused. The memory is
// this process's: a standby that takes over starts empty, which is safe
// because `max_age` (slurm.credential_max_age) is shorter than a takeover
// (config validation), so every credential the old leader could have seen is
// expired before the new one serves.
//
// Refusals carry reason CREDENTIAL_REFUSED with metadata why and node
// (common/reason.h); nothing in the ledger changes and nothing is remembered:
// UNAUTHENTICATED (missing, malformed, bad_signature: another key or a
// changed field, wrong_version: a duet-key1 credential, expired or from the
// future, replayed), PERMISSION_DENIED (wrong_method, wrong_request: a valid
// credential for another call), RESOURCE_EXHAUSTED (full: more than
// `max_remembered` credentials within one max age). Every message says why.
//
// Thread-safety: thread-safe.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/credential/munge_payload.h"
#include "common/credential/replay_memory.h"

namespace duet {

struct SlurmKeyAuthOptions {
  // slurm.key; "" = slurm_key::DefaultKeyPath(slurm_conf).
  std::string key_file;
  std::string slurm_conf;
  // slurm.credential_max_age.
  absl::Duration max_age = absl::Seconds(10);
  size_t max_remembered = size_t{1} << 20;
  const Clock* clock = Clock::Real();
};

class SlurmKeyAuth {
 public:
  // Loads the key; the errors of slurm_key::LoadDerivedKey (they name the
  // file) and INVALID_ARGUMENT for a max_age below one second.
  static absl::StatusOr<std::unique_ptr<SlurmKeyAuth>> Create(SlurmKeyAuthOptions options);
  // With a derived key already in hand (tests).
  SlurmKeyAuth(std::string derived_key, SlurmKeyAuthOptions options);

  // OK when `credential` (the metadata value; "" when absent) is a fresh,
  // first-seen slurm.key credential for exactly `want`. `who` (optional)
  // gets the caller's identity for the audit log.
  absl::Status Check(const std::string& credential, const slurm_munge::Binding& want,
                     std::string* who = nullptr);

  const std::string& key_file() const { return options_.key_file; }

 private:
  const std::string key_;
  const SlurmKeyAuthOptions options_;
  credential::ReplayMemory seen_;
};

}  // namespace duet
