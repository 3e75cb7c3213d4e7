#pragma once

// An in-memory slurmctld for tests that need a SlurmClient but not a real
// cluster (the tests/slurm and integration tests run the real daemons).
//
//   placeholders  AllocatePlaceholder gives the lowest free GPUs of the node,
//                 as select/cons_tres does on an idle node, or
//                 RESOURCE_EXHAUSTED with Slurm's message; KillJob frees
//                 them. Nodes have `gpus_per_node` GPUs; Use() marks GPUs
//                 that other Slurm jobs hold. AllocateGang does the same on
//                 every node of the gang, all or none.
//   scripts       set_allocation() makes every AllocatePlaceholder answer a
//                 fixed result instead; set_ping() makes Ping fail (as a
//                 slurmctld of another release does); set_next_job_id()
//                 reuses a job id.
//   records       what was asked (allocation and gang requests, kills) and how many
//                 calls other than Ping were made.
//
// Node and job tables are empty unless add_node() lists a node and add_job()
// a job: ListNodes, GetNode and ListJobs answer those, GetJob "none"; CreateNode, UpdateNode and
// DeleteNode succeed (and change nothing).
//
// Thread-safety: thread-safe; `mu_` guards everything.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "bridge/slurm/slurm_client.h"

namespace duet {
namespace fakes {

class FakeSlurmClient final : public SlurmClient {
 public:
  explicit FakeSlurmClient(uint32_t gpus_per_node = 8, uint32_t first_job_id = 5000);

  absl::Status Ping() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<SlurmNodeInfo>> ListNodes() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::optional<SlurmNodeInfo>> GetNode(const std::string& name) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CreateNode(const SlurmNodeConfig& config) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status UpdateNode(const SlurmNodeUpdate& update) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status DeleteNode(const std::string& name) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<SlurmAllocation> AllocatePlaceholder(const SlurmAllocRequest& request) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<SlurmGangAllocation> AllocateGang(const SlurmGangRequest& request) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status KillJob(uint32_t job_id) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::vector<SlurmJobInfo>> ListJobs() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::optional<SlurmJobInfo>> GetJob(uint32_t job_id) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // Marks GPUs [first, first + n) of `node` as held by other Slurm jobs.
  void Use(const std::string& node, uint32_t first, uint32_t n) ABSL_LOCKS_EXCLUDED(mu_);
  // Every AllocatePlaceholder answers `result` (nothing is allocated).
  void set_allocation(absl::StatusOr<SlurmAllocation> result) ABSL_LOCKS_EXCLUDED(mu_);
  // Ping answers `status`.
  void set_ping(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  // ListNodes and GetNode answer `node` from now on.
  void add_node(SlurmNodeInfo node) ABSL_LOCKS_EXCLUDED(mu_);
  // ListJobs lists `job` from now on (replacing one of the same id); jobs
  // allocated here are not listed unless added.
  void add_job(SlurmJobInfo job) ABSL_LOCKS_EXCLUDED(mu_);
  void remove_job(uint32_t job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The next allocation gets job id `id` (a slurmctld that lost jobs in a
  // crash numbers on from its saved state, reusing their ids).
  void set_next_job_id(uint32_t id) ABSL_LOCKS_EXCLUDED(mu_);

  // Placeholder jobs allocated and not killed.
  size_t live_jobs() const ABSL_LOCKS_EXCLUDED(mu_);
  // Every AllocatePlaceholder request, in order.
  std::vector<SlurmAllocRequest> asked() const ABSL_LOCKS_EXCLUDED(mu_);
  // Every AllocateGang request, in order.
  std::vector<SlurmGangRequest> asked_gangs() const ABSL_LOCKS_EXCLUDED(mu_);
  // Every KillJob's job id, in order.
  std::vector<uint32_t> killed() const ABSL_LOCKS_EXCLUDED(mu_);
  // Calls of any method but Ping.
  int calls_but_ping() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const uint32_t gpus_per_node_;
  mutable absl::Mutex mu_;
  uint32_t next_job_ ABSL_GUARDED_BY(mu_);
  absl::Status ping_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::StatusOr<SlurmAllocation>> allocation_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::set<uint32_t>> used_ ABSL_GUARDED_BY(mu_);  // by node
  std::map<uint32_t, std::vector<SlurmJobNodeDevices>> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, SlurmNodeInfo> nodes_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, SlurmJobInfo> listed_jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<SlurmAllocRequest> asked_ ABSL_GUARDED_BY(mu_);
  std::vector<SlurmGangRequest> asked_gangs_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> killed_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace fakes
}  // namespace duet
