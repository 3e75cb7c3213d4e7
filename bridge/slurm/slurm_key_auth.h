#pragma once

// Who may Hold/Release for a Slurm owner over gRPC on an auth/slurm cluster
// (DESIGN.md §9): a caller whose slurm.key credential (slurm_key_cred.h) is
// for exactly this node, owner job, owner step and method, made within `ttl`
// of now (either way: clocks differ), and never seen before. Only holders of
// the cluster's slurm.key can make one: slurmstepd (root) on a Slurm node, and
// Slurm's own daemons.
//
// Replays: every accepted nonce is remembered until its credential expires;
// a second use is refused. The memory is this process's: a standby that takes
// over starts empty, which is safe because credentials expire after `ttl`
// and a standby serves only after its lease is won (longer than a step's
// Hold round trip; a replay would also need a credential captured off the
// wire, and the plugin talks to the bridge over a unix socket or cluster TCP).
//
// Refusals (nothing in the ledger changes): UNAUTHENTICATED (no credential,
// malformed, wrong MAC, expired or from the future, replayed),
// PERMISSION_DENIED never (a MAC that does not match cannot tell a wrong key
// from another request), RESOURCE_EXHAUSTED (the replay memory is full: more
// than `max_remembered` credentials within one `ttl`). Every message says why.
//
// Thread-safety: thread-safe.

#include <cstdint>
#include <deque>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "bridge/ledger/types.h"

namespace duet {

struct SlurmKeyAuthOptions {
  // slurm.key; "" = slurm_key::DefaultKeyPath(slurm_conf).
  std::string key_file;
  std::string slurm_conf;
  absl::Duration ttl = absl::Minutes(5);
  size_t max_remembered = size_t{1} << 20;
  const Clock* clock = Clock::Real();
};

class SlurmKeyAuth {
 public:
  // Loads the key; the errors of slurm_key::LoadDerivedKey (they name the
  // file) and INVALID_ARGUMENT for a ttl below one second.
  static absl::StatusOr<std::unique_ptr<SlurmKeyAuth>> Create(SlurmKeyAuthOptions options);
  // With a derived key already in hand (tests).
  SlurmKeyAuth(std::string derived_key, SlurmKeyAuthOptions options);

  // Why a credential was refused, for metrics (duet_slurm_credential_refusals_total{why}).
  enum class Why { kNone, kMissing, kMalformed, kBadMac, kExpired, kReplayed, kFull };
  static const char* WhyName(Why w);

  // OK for owners that are not Slurm's. `credential` is the metadata value
  // ("" when absent); `method` is "Hold" or "Release". `why` (optional) gets
  // the refusal's class.
  absl::Status Check(const std::string& credential, const char* method, const std::string& node,
                     const Owner& owner, Why* why = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& key_file() const { return options_.key_file; }

 private:
  std::string key_;
  SlurmKeyAuthOptions options_;
  absl::Mutex mu_;
  // nonce -> when its credential expires; `order_` holds the same in
  // insertion order to forget expired ones cheaply.
  absl::flat_hash_map<std::string, absl::Time> seen_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<absl::Time, std::string>> order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet
