#pragma once

// The settings of leader election on a Lease (leader_election.h), declared
// once: LeaderElector takes them, and duet-bridge's config embeds them
// (kubernetes.leader_election, same key names but `namespace`), so a
// default lives in one place and config validation asks Validate() below.
// Header-only and in the shared leaf: the config (core) and the Kubernetes
// client (k8s_adapter) both include it, and neither may include the other.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace duet {
namespace k8s {

struct LeaderElectionOptions {
  // Namespace of the Lease.
  std::string lease_namespace;
  std::string lease_name = "duet-bridge";
  // Unique per replica (pod name + a random suffix).
  std::string identity;
  // A standby takes over a lease not renewed for this long.
  absl::Duration lease_duration = absl::Seconds(15);
  // A leader that cannot renew for this long steps down (< lease_duration).
  absl::Duration renew_deadline = absl::Seconds(10);
  // Time between attempts to acquire or renew.
  absl::Duration retry_period = absl::Seconds(2);
  // On Stop, a leader gives the lease up so a standby takes over at once.
  bool release_on_stop = true;
  // Times the retries and the lease's expiry, and stamps renewTime.
  const Clock* clock = Clock::Real();

  // OK, or INVALID_ARGUMENT naming the field under `prefix`
  // ("kubernetes.leader_election."). Namespace and identity are not checked:
  // callers fill them in (empty means a fallback to them).
  absl::Status Validate(const std::string& prefix = "") const {
    if (lease_name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "lease_name: must be set"));
    }
    if (retry_period < absl::Milliseconds(10)) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "retry_period: must be at least 10ms"));
    }
    if (renew_deadline <= retry_period) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "renew_deadline: must be longer than retry_period"));
    }
    if (lease_duration <= renew_deadline) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "lease_duration: must be longer than renew_deadline"));
    }
    return absl::OkStatus();
  }
};

}  // namespace k8s
}  // namespace duet
