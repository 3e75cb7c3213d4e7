#pragma once

// duet-bridge's memory of the Slurm credentials it accepted, so that each is
// accepted once (bridge/slurm/munge_auth.h, slurm_key_auth.h). A credential
// is remembered until it would be refused as too old anyway
// (slurm.credential_max_age after it was made), so the memory holds at most
// the credentials of one max age; past `max_entries` a new one is refused
// (kFull) until older ones expire, rather than forgetting one that could then
// be replayed.
//
// The memory is this process's. A standby that takes over starts empty; that
// is safe because config validation keeps credential_max_age shorter than a
// takeover (kubernetes.leader_election.lease_duration): every credential the
// old leader saw is expired before the new one serves (docs/config.md).
//
// Thread-safety: thread-safe; `mu_` guards both maps.

#include <cstddef>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace duet::credential {

class ReplayMemory {
 public:
  explicit ReplayMemory(size_t max_entries) : max_entries_(max_entries) {}

  enum class Result { kFirst, kReplayed, kFull };

  // Records `key` (a nonce, or a digest of the credential) as used until
  // `expires`, forgetting what expired at `now`. kReplayed: seen before and
  // not yet expired; kFull: `max_entries` unexpired keys already.
  Result Remember(const std::string& key, absl::Time expires, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    while (!by_expiry_.empty() && by_expiry_.begin()->first <= now) {
      auto it = seen_.find(by_expiry_.begin()->second);
      if (it != seen_.end() && it->second == by_expiry_.begin()->first) seen_.erase(it);
      by_expiry_.erase(by_expiry_.begin());
    }
    if (seen_.contains(key)) return Result::kReplayed;
    if (seen_.size() >= max_entries_) return Result::kFull;
    seen_.emplace(key, expires);
    by_expiry_.emplace(expires, key);
    return Result::kFirst;
  }

  size_t size() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return seen_.size();
  }
  size_t max_entries() const { return max_entries_; }

 private:
  const size_t max_entries_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, absl::Time> seen_ ABSL_GUARDED_BY(mu_);
  // The same keys ordered by when they expire, to forget them cheaply.
  std::multimap<absl::Time, std::string> by_expiry_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet::credential
