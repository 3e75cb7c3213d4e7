#pragma once

// SlurmClient: the seam between duet-bridge and slurmctld.
//
// Everything duet asks of Slurm goes through this interface: dynamic nodes
// (create, update, drain/resume, delete), placeholder allocations for pods and
// the job table with each job's device indices. The real implementation is
// LibSlurmClient (libslurm, libslurm_client.h); tests run it against a real
// slurmctld (tests/integration/slurm_cluster.sh).
//
// Errors use the canonical codes:
//   UNAVAILABLE         slurmctld did not answer (down, restarting, or past the
//                       call deadline). Nothing may be concluded from it.
//   RESOURCE_EXHAUSTED  no room on the node for an allocation right now
//   FAILED_PRECONDITION the node is not usable (drained, down, not responding,
//                       busy for a delete), or a GRES change Slurm refuses
//   NOT_FOUND           unknown node or job
//   INVALID_ARGUMENT    a malformed request, or one Slurm rejects as malformed
//   INTERNAL            any other Slurm error (the message has Slurm's text)
//
// Thread-safety: implementations must be safe to call from several threads.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/slurm/slurm_format.h"

namespace duet {

// The priority of every placeholder job: NO_VAL - 1, the highest a job can be
// given short of Slurm's special values. A placeholder runs at once or not at
// all, so it never waits ahead of anyone; below the top priority Slurm refused
// it whenever any job pended in the partition.
inline constexpr uint32_t kPlaceholderPriority = 0xfffffffd;

// A Slurm release: 24.11 is {24, 11}.
struct SlurmRelease {
  int major = 0;
  int minor = 0;
  bool operator==(const SlurmRelease& o) const { return major == o.major && minor == o.minor; }
  bool operator<(const SlurmRelease& o) const {
    return major != o.major ? major < o.major : minor < o.minor;
  }
};
// "24.11" (two-digit minor, as Slurm writes it).
std::string FormatRelease(SlurmRelease r);
// The release of a version string such as "24.11.5" or "26.05.0-0rc1"; nullopt
// when it is not one.
std::optional<SlurmRelease> ParseSlurmRelease(absl::string_view version);

// What slurmctld says of itself (`scontrol show config`).
struct SlurmControllerInfo {
  // BOOT_TIME: when it last started, in seconds since the epoch.
  int64_t boot_time = 0;
  // SLURM_VERSION, "24.11.5".
  std::string version;
};

// What duet wants a Slurm node to be.
struct SlurmNodeConfig {
  std::string name;
  // NodeAddr and NodeHostname; empty: the node name.
  std::string addr;
  uint32_t cpus = 1;
  uint64_t real_memory_mib = 1;
  std::vector<SlurmGres> gres;
  // Sorted, unique, already valid Slurm feature names.
  std::vector<std::string> features;
  // Scheduling weight (lower is chosen first). 0: Slurm's default.
  uint32_t weight = 0;
  // The node's place in a Slurm topology, "TOPOLOGY:UNIT" (e.g. "default:b1",
  // block b1 of topology.conf's topology/block). Sent at creation where
  // libslurm is 25.05 or newer (older releases know no Topology= and get
  // only the features); when slurmctld has no such unit, the node is created
  // without it. Empty: none. Not changed after creation.
  std::string topology;
};

// A node as slurmctld reports it.
struct SlurmNodeInfo {
  std::string name;
  std::string addr;
  uint32_t cpus = 0;
  uint64_t real_memory_mib = 0;
  std::vector<SlurmGres> gres;
  std::vector<std::string> features;  // available features, sorted
  uint32_t weight = 0;
  std::string topology;               // Topology= (25.05+), may be empty
  std::string reason;                 // drain/down reason, may be empty
  uint32_t raw_state = 0;             // enum node_states with flags
  std::string state;                  // "IDLE+DRAIN", for messages
  bool future = false;                // created, no slurmd registered yet
  bool drain = false;                 // DRAIN flag set (draining or drained)
  bool down = false;
  bool not_responding = false;
  bool busy = false;                  // ALLOCATED/MIXED or COMPLETING
  // Flags under which Slurm starts no job on the node.
  bool reboot = false;                // REBOOT_REQUESTED or REBOOT_ISSUED
  bool failing = false;               // FAIL
  bool powered_down = false;          // POWERED_DOWN, POWERING_DOWN, POWER_DOWN
  bool invalid_registration = false;  // INVALID_REG
  // What jobs (placeholders included) hold on the node now.
  uint32_t alloc_cpus = 0;
  uint64_t alloc_memory_mib = 0;
};

// A change to an existing node. Unset fields are left alone.
struct SlurmNodeUpdate {
  std::string name;
  std::optional<uint32_t> weight;
  std::optional<std::vector<std::string>> features;  // available + active
  // Drain with this reason (non-empty), or resume (empty string).
  std::optional<std::string> drain_reason;
};

// A placeholder allocation: immediate, on exactly one node.
struct SlurmAllocRequest {
  std::string node;
  std::string job_name;
  std::string comment;
  uint32_t gpus = 0;
  uint32_t tpus = 0;
  uint32_t cpus = 1;
  uint64_t memory_mib = 0;  // 0: the partition default
  // Extra "NAME=value" entries for the job's SPANK environment (prolog).
  std::vector<std::string> spank_env;
  // Partition and QOS of the job; empty: the cluster's defaults
  // (slurm.placeholder_partition / placeholder_qos). A placeholder never
  // asks for a time limit: it lasts as long as its pod (UNLIMITED).
  std::string partition;
  std::string qos;
};

// A gang's placeholder (docs/gangs.md 3): one immediate job over exactly
// `nodes`, with the same GRES, CPUs and memory on every node.
struct SlurmGangRequest {
  // Distinct node names; the answer lists them in this order.
  std::vector<std::string> nodes;
  std::string job_name;
  std::string comment;
  uint32_t gpus_per_node = 0;
  uint32_t tpus_per_node = 0;
  uint32_t cpus_per_node = 1;
  uint64_t memory_mib_per_node = 0;  // 0: the partition default
  std::vector<std::string> spank_env;
  // As SlurmAllocRequest's: the placeholder partition and QOS.
  std::string partition;
  std::string qos;
};

struct SlurmGangAllocation {
  uint32_t job_id = 0;
  // One entry per requested node, in the request's order: the device
  // indices Slurm chose there.
  std::vector<SlurmJobNodeDevices> nodes;
};

// What slurmctld's configuration says about preemption and device
// confinement (`scontrol show config`).
struct SlurmClusterConfig {
  std::string preempt_type;    // "preempt/none", "preempt/partition_prio", "preempt/qos"
  std::string preempt_mode;    // "OFF", "REQUEUE", "SUSPEND,GANG", ...
  std::string preempt_params;  // PreemptParameters, e.g. "min_exempt_priority=..."
  std::string task_plugin;     // "task/cgroup,task/affinity", ...
  // cgroup.conf's ConstrainDevices as slurmctld reports it; nullopt when it
  // reports no cgroup configuration.
  std::optional<bool> constrain_devices;
};

// A partition as slurmctld reports it.
struct SlurmPartitionInfo {
  std::string name;
  std::string nodes;  // hostlist expression
  bool is_default = false;
  bool hidden = false;
  bool root_only = false;
  bool up = true;
  // Minutes; nullopt: UNLIMITED.
  std::optional<uint32_t> max_time_min;
  // The partition's own PreemptMode ("OFF", "REQUEUE", ...); empty when it
  // follows the cluster's.
  std::string preempt_mode;
  uint16_t priority_tier = 0;
  // nullopt: no limit.
  std::optional<uint32_t> max_cpus_per_node;
};

// An advance reservation as slurmctld reports it.
struct SlurmReservationInfo {
  std::string name;
  std::vector<std::string> nodes;  // expanded
  absl::Time start;
  absl::Time end;
  bool maint = false;        // MAINT
  bool ignore_jobs = false;  // IGNORE_JOBS
  std::string users;         // who may use it ("" when by account or group)
  std::string accounts;
};

struct SlurmJobInfo {
  uint32_t job_id = 0;
  std::string name;
  std::string comment;
  SlurmJobState state = SlurmJobState::kOther;
  std::string state_reason;  // pending reason, e.g. "Resources"
  std::string nodes;         // hostlist expression
  std::vector<SlurmJobNodeDevices> devices;
  absl::Time start_time = absl::InfinitePast();
  // CPUs allocated (or asked, while pending); memory per node in MiB when
  // the job asked it per node (0: per CPU, or not known).
  uint32_t cpus = 0;
  uint64_t memory_mib = 0;
  // Ended (or ending) by preemption: PREEMPTED, the state Slurm gives a job
  // it cancelled (PreemptMode CANCEL) or could not requeue (REQUEUE).
  bool preempted = false;

  // Running, suspended or completing: its devices are (still) in use.
  bool live() const {
    return state == SlurmJobState::kRunning || state == SlurmJobState::kSuspended ||
           state == SlurmJobState::kCompleting;
  }
};

struct SlurmAllocation {
  uint32_t job_id = 0;
  SlurmJobNodeDevices devices;
};

class SlurmClient {
 public:
  virtual ~SlurmClient() = default;

  // OK when slurmctld answers.
  virtual absl::Status Ping() = 0;

  // Every node, FUTURE ones included.
  virtual absl::StatusOr<std::vector<SlurmNodeInfo>> ListNodes() = 0;
  // nullopt when the node does not exist.
  virtual absl::StatusOr<std::optional<SlurmNodeInfo>> GetNode(const std::string& name) = 0;

  // Creates a dynamic node in state FUTURE (it turns IDLE when its slurmd
  // registers). ALREADY_EXISTS if a node of that name exists (Slurm itself
  // answers success for a duplicate; the implementation checks first).
  virtual absl::Status CreateNode(const SlurmNodeConfig& config) = 0;
  virtual absl::Status UpdateNode(const SlurmNodeUpdate& update) = 0;
  // FAILED_PRECONDITION while any job is on it; NOT_FOUND when absent.
  virtual absl::Status DeleteNode(const std::string& name) = 0;

  // Allocates now or fails (RESOURCE_EXHAUSTED: no room; FAILED_PRECONDITION:
  // node not usable). On success the devices Slurm chose are read back.
  virtual absl::StatusOr<SlurmAllocation> AllocatePlaceholder(const SlurmAllocRequest& request) = 0;
  // One job over every node of `request` at once, or nothing (no job stays
  // on any error). Errors as AllocatePlaceholder's; INVALID_ARGUMENT for no
  // node, a node listed twice, or no device asked.
  virtual absl::StatusOr<SlurmGangAllocation> AllocateGang(const SlurmGangRequest& request) = 0;
  // Cancels a job (SIGKILL through slurmctld). OK if it already ended.
  virtual absl::Status KillJob(uint32_t job_id) = 0;

  // Jobs slurmctld knows (pending, live and recently finished), with devices.
  virtual absl::StatusOr<std::vector<SlurmJobInfo>> ListJobs() = 0;
  // nullopt when Slurm no longer knows the job.
  virtual absl::StatusOr<std::optional<SlurmJobInfo>> GetJob(uint32_t job_id) = 0;

  // When slurmctld last started and its version. The default is
  // UNIMPLEMENTED (fakes).
  virtual absl::StatusOr<SlurmControllerInfo> Controller() {
    return absl::UnimplementedError("Controller");
  }
  // `scontrol reconfigure`. The default is UNIMPLEMENTED (fakes).
  virtual absl::Status Reconfigure() { return absl::UnimplementedError("Reconfigure"); }

  // Preemption and device-confinement settings of slurmctld. The default is
  // UNIMPLEMENTED (fakes).
  virtual absl::StatusOr<SlurmClusterConfig> ClusterConfig() {
    return absl::UnimplementedError("ClusterConfig");
  }
  // Every partition. The default is UNIMPLEMENTED (fakes).
  virtual absl::StatusOr<std::vector<SlurmPartitionInfo>> ListPartitions() {
    return absl::UnimplementedError("ListPartitions");
  }
  // Every reservation, active or future. The default is UNIMPLEMENTED (fakes).
  virtual absl::StatusOr<std::vector<SlurmReservationInfo>> ListReservations() {
    return absl::UnimplementedError("ListReservations");
  }
};

}  // namespace duet
