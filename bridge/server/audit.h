#pragma once

// The audit trail of duet-bridge's mutating gRPC calls (issue 25): one
// structured line per successful Hold, Release (Slurm owners, pods and
// placeholders alike) and PlacePod, the calls of duet.v1.Ledger that change
// the ledger (proto/duet/v1/duet.proto has no other mutating call), written
// once the change is durable:
//
//   audit method=Hold who="slurm job=12 step=0 uid=0 credential=munge"
//     node=gke-a owner="slurm job 12 step 0" devices=gpu0,gpu1 changed=true
//
// (one line). `who` is the identity the call proved: the Slurm job/step (and
// munge uid) of its credential, the Kubernetes user of its token (auth.mode
// token), "local(unix socket)" for the bridge's own socket, or
// "unauthenticated(PEER)" where nothing was checked. `changed` is false for
// a retried call that found its holding already there (or nothing to
// release). Values with spaces, quotes or backslashes are double-quoted, a
// quote or backslash in them escaped with a backslash, so a line splits on
// spaces outside quotes into key=value pairs.
//
// Rate-limited by a token bucket (`rate_per_second`, `burst`) so that a
// flood of calls cannot flood the log: a line past the limit is dropped and
// counted (duet_audit_dropped_total{method}); the next line written says how
// many were dropped before it (dropped=N). Lines written count in
// duet_audit_records_total{method}.
//
// Thread-safety: thread-safe; `mu_` guards the bucket and the drop count
// (the line is written outside it).

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "spdlog/logger.h"

namespace duet {

class Metrics;

struct AuditRecord {
  std::string method;   // "Hold", "Release", "PlacePod"
  std::string who;      // see above
  std::string node;
  std::string owner;    // Owner::ToString()
  std::string devices;  // "gpu0,gpu1"; "" when none (a Release that found nothing)
  bool changed = true;
};

// The line for `r` (without a trailing newline); `dropped` > 0 adds
// dropped=N.
std::string FormatAuditLine(const AuditRecord& r, uint64_t dropped);

class AuditLog {
 public:
  struct Options {
    double rate_per_second = 100;
    double burst = 200;
    // Where lines go (info level); null: spdlog's default logger.
    std::shared_ptr<spdlog::logger> logger;
    const Clock* clock = Clock::Real();
    // May be null.
    Metrics* metrics = nullptr;
  };
  explicit AuditLog(Options options);

  // Writes the line for `r`, or drops and counts it past the rate limit.
  // Returns whether it was written.
  bool Record(const AuditRecord& r) ABSL_LOCKS_EXCLUDED(mu_);

  // Lines dropped since start.
  uint64_t dropped() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const Options options_;
  mutable absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time refilled_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_since_line_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t dropped_total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace duet
