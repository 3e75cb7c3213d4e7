#pragma once

// LibSlurmClient: SlurmClient over libslurm (slurm/slurm.h of Slurm 22.05,
// 24.11, 25.11 or 26.05; the differences are in slurm_compat.h).
//
// A libslurm client can talk to a slurmctld of its own release or of the two
// after it (Slurm's protocol rule). Ping checks that, from the controller's
// version in its configuration, on the first answer and again after every
// failed ping (the controller may come back upgraded): a slurmctld outside
// the range gets FAILED_PRECONDITION naming both versions, and no other call
// is made to it by SlurmSync (degraded until it is fixed).
//
// Every call runs on a short-lived worker thread and is awaited for at most
// `call_timeout`; past it the caller gets UNAVAILABLE and the worker is left
// to finish on its own (its result is dropped). libslurm's own retries can
// take up to MessageTimeout per attempt, so this is what bounds a call while
// slurmctld is down or restarting. A timed-out AllocatePlaceholder may still
// have created the job in Slurm: the placeholder carries the pod in its name
// and comment, and SlurmSync's reconcile cancels it if nothing recorded it.
// At most `max_stuck_calls` calls may be outstanding past their deadline;
// beyond that, calls fail fast with UNAVAILABLE without touching libslurm.
//
// Thread-safety: thread-safe. libslurm keeps its errno per thread, so each
// call and its error code are read on the same worker thread.

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bridge/slurm/slurm_client.h"

namespace duet {

// The libslurm release duet was built against (SLURM_VERSION_NUMBER).
SlurmRelease BuiltSlurmRelease();
// Whether a libslurm of release `client` can talk to a slurmctld of `ctld`:
// the same release or one of the next two (22.05: 22.05-23.11; 24.11:
// 24.11-25.11; 26.05: 26.05-26.11-27.05). Unknown releases: false.
bool ControllerSupported(SlurmRelease client, SlurmRelease ctld);
// The refusal for a controller outside that range, naming both versions.
std::string UnsupportedControllerMessage(SlurmRelease client, absl::string_view ctld_version);

struct LibSlurmClientOptions {
  // slurm.conf to use; empty: $SLURM_CONF, else Slurm's default path.
  std::string conf_path;
  // Deadline of every call.
  absl::Duration call_timeout = absl::Seconds(5);
  // Calls allowed to hang past their deadline before new calls fail fast.
  int max_stuck_calls = 8;
  // User the placeholder jobs run as (root when the bridge runs as root).
  // -1: the bridge's own uid/gid.
  int64_t job_uid = -1;
  int64_t job_gid = -1;
};

class LibSlurmClient final : public SlurmClient {
 public:
  explicit LibSlurmClient(LibSlurmClientOptions options = {});
  ~LibSlurmClient() override;

  absl::Status Ping() override;
  absl::StatusOr<std::vector<SlurmNodeInfo>> ListNodes() override;
  absl::StatusOr<std::optional<SlurmNodeInfo>> GetNode(const std::string& name) override;
  absl::Status CreateNode(const SlurmNodeConfig& config) override;
  absl::Status UpdateNode(const SlurmNodeUpdate& update) override;
  absl::Status DeleteNode(const std::string& name) override;
  absl::StatusOr<SlurmAllocation> AllocatePlaceholder(const SlurmAllocRequest& request) override;
  absl::StatusOr<SlurmGangAllocation> AllocateGang(const SlurmGangRequest& request) override;
  absl::Status KillJob(uint32_t job_id) override;
  absl::StatusOr<std::vector<SlurmJobInfo>> ListJobs() override;
  absl::StatusOr<std::optional<SlurmJobInfo>> GetJob(uint32_t job_id) override;
  absl::StatusOr<SlurmControllerInfo> Controller() override;
  absl::Status Reconfigure() override;
  absl::StatusOr<SlurmClusterConfig> ClusterConfig() override;
  absl::StatusOr<std::vector<SlurmPartitionInfo>> ListPartitions() override;
  absl::StatusOr<std::vector<SlurmReservationInfo>> ListReservations() override;

  // slurmctld's version string ("24.11.5"), from its configuration.
  absl::StatusOr<std::string> ControllerVersion();

  // Calls that passed their deadline and are still running.
  int stuck_calls() const { return stuck_->load(); }

 private:
  // Runs `fn` on a worker thread, waits up to call_timeout.
  template <typename T>
  absl::StatusOr<T> Run(const char* what, std::function<absl::StatusOr<T>()> fn);
  absl::Status RunStatus(const char* what, std::function<absl::Status()> fn);

  const LibSlurmClientOptions options_;
  // Shared with detached workers, which may outlive the client.
  std::shared_ptr<std::atomic<int>> stuck_;
  // Ping found the controller's version supported; reset by a failed ping.
  std::atomic<bool> controller_checked_{false};
};

// The "NodeName=... State=FUTURE" line slurm_create_node gets (also what
// `scontrol create` would be given). Exposed for tests and the benchmark.
std::string SlurmNodeLine(const SlurmNodeConfig& config);

}  // namespace duet
