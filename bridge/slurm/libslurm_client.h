#pragma once

// LibSlurmClient: SlurmClient over libslurm (Slurm 22.05, slurm/slurm.h).
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
#include <string>

#include "absl/time/time.h"
#include "bridge/slurm/slurm_client.h"

namespace duet {

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
  absl::Status KillJob(uint32_t job_id) override;
  absl::StatusOr<std::vector<SlurmJobInfo>> ListJobs() override;
  absl::StatusOr<std::optional<SlurmJobInfo>> GetJob(uint32_t job_id) override;
  absl::StatusOr<int64_t> ControllerBootTime() override;
  absl::Status Reconfigure() override;

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
};

// The "NodeName=... State=FUTURE" line slurm_create_node gets (also what
// `scontrol create` would be given). Exposed for tests and the benchmark.
std::string SlurmNodeLine(const SlurmNodeConfig& config);

}  // namespace duet
