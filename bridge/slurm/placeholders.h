#pragma once

// Placeholders: one Slurm allocation per pod that holds devices on a shared
// node, so Slurm's own allocator never hands the pod's devices to a job.
//
// Create() asks Slurm (immediate, on that one node) for the pod's GPUs/TPUs,
// CPUs and memory, reads back which device indices Slurm chose, and records
// them in the ledger as owner Placeholder{job_id, pod_uid}. The job's name
// ("duet-pod:NS/NAME") and comment ("duet-pod uid=UID ns=NS name=NAME")
// carry the pod so the link survives any restart (SlurmSync re-reads it).
//
// Lend jobs (the DRA lending mode, docs/dra.md): CreateLend() asks Slurm the
// same way for devices to lend to Kubernetes, job name "duet-lend:NODE",
// comment "duet-lend node=NODE", and records Owner::Lend{job_id, node}.
//
// Gangs (docs/gangs.md, gang::GangMaker): Create(key, spec, nodes) asks
// Slurm for one immediate job over every node of the gang (the same GRES,
// CPUs and memory on each), job name "duet-gang:KEY", comment "duet-gang
// key=KEY slots=N", and records each slot's devices as
// Owner::GangSlot{job, KEY, slot}; Cancel(key, job) ends the job and every
// slot and member placeholder of it.
//
// Thread-safety: thread-safe (Ledger and SlurmClient are; no own state).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bridge/dra/lend_maker.h"
#include "bridge/gang/gang.h"
#include "bridge/ledger/ledger.h"
#include "bridge/pods/pod_holds.h"
#include "bridge/slurm/slurm_client.h"

namespace duet {

inline constexpr char kPlaceholderJobPrefix[] = "duet-pod:";
inline constexpr char kPlaceholderCommentPrefix[] = "duet-pod ";

// The pod a placeholder job belongs to, from its comment; nullopt when the
// job is not a duet placeholder.
struct PlaceholderPod {
  std::string uid;
  std::string ns;
  std::string name;
};
std::optional<PlaceholderPod> ParsePlaceholderComment(const std::string& comment);
std::string PlaceholderComment(const Owner& pod);

inline constexpr char kLendJobPrefix[] = "duet-lend:";
inline constexpr char kLendCommentPrefix[] = "duet-lend ";
// The node a lend job lends on, from its comment ("duet-lend node=NODE");
// nullopt when the job is not a lend job.
std::optional<std::string> ParseLendComment(const std::string& comment);
std::string LendComment(const std::string& node);

inline constexpr char kGangCommentPrefix[] = "duet-gang ";
// The gang a gang job belongs to, from its job name ("duet-gang:KEY");
// nullopt when the job is not a duet gang job (or its key is malformed).
std::optional<gang::GangKey> ParseGangJobName(const std::string& job_name);
std::string GangComment(const gang::GangKey& key, uint32_t slots);

// The Slurm side of pods::PodHolds (the core holds a pod's devices through
// this interface and never depends on Slurm).
// Where placeholder jobs go in Slurm (slurm.placeholder_partition,
// slurm.placeholder_qos); empty: the cluster's defaults.
struct PlaceholderJobOptions {
  std::string partition;
  std::string qos;
};

class Placeholders final : public pods::PlaceholderMaker,
                           public dra::LendMaker,
                           public gang::GangMaker {
 public:
  // Neither is owned; both must outlive this object.
  Placeholders(Ledger* ledger, SlurmClient* slurm, PlaceholderJobOptions job_options = {});

  // Errors: INVALID_ARGUMENT (not a pod owner, nothing asked), NOT_FOUND
  // (node unknown to the ledger), FAILED_PRECONDITION (node not usable: not
  // ready in the ledger or drained/down in Slurm), RESOURCE_EXHAUSTED (no
  // room in Slurm, or the ledger refuses the devices Slurm chose: the job is
  // then cancelled), UNAVAILABLE (Slurm unreachable; nothing was recorded).
  absl::StatusOr<Holding> Create(const Owner& pod, const std::string& node, uint32_t gpus,
                                 uint32_t tpus, uint32_t cpus, uint64_t memory_mib) override;

  // Cancels the pod's placeholder on `node` in Slurm, then releases it in
  // the ledger. OK when there is none. UNAVAILABLE when Slurm cannot be
  // reached: the ledger then keeps the holding (nothing released on a guess).
  absl::Status Cancel(const std::string& node, const std::string& pod_uid) override;

  // A lend job: `count` devices of `kind` on `node` (1 CPU, the least
  // memory, the placeholder partition/QOS), recorded as Owner::Lend. Errors as
  // Create's; INVALID_ARGUMENT for count 0. The caller asks one GPU per job
  // (a reclaim then cancels one device) and a TPU host's chips in one job.
  absl::StatusOr<Holding> CreateLend(const std::string& node, DeviceKind kind,
                                     uint32_t count) override;
  // Cancels lend job `job_id` in Slurm (OK if it already ended), then
  // releases its Lend holding on `node` (OK when the ledger has none).
  // UNAVAILABLE keeps the holding; FAILED_PRECONDITION, and nothing done,
  // while a claim holds the job's devices.
  absl::Status CancelLend(const std::string& node, uint32_t job_id) override;

  // gang::GangMaker. Create: slot s falls on the node whose members it
  // counts (nodes in the order given, `members` slots each) and takes the
  // next `spec.member.count` of the devices Slurm chose there, in index
  // order. Besides GangMaker's errors: INVALID_ARGUMENT for members whose
  // sum is not spec.min_member, a node listed twice, a member asking no
  // device or a share of one. A ledger refusal releases every slot recorded
  // and cancels the job.
  absl::StatusOr<gang::GangAllocation> Create(const gang::GangKey& key, const gang::GangSpec& spec,
                                              const std::vector<gang::GangNode>& nodes) override;
  // Refuses (FAILED_PRECONDITION, nothing done) a job that Slurm still runs
  // under another name than "duet-gang:KEY".
  absl::Status Cancel(const gang::GangKey& key, uint32_t job_id) override;

  // Re-creates the Slurm side of a placeholder whose Slurm job is gone
  // (scancel, node down, slurmctld lost it) while its pod still runs, for
  // exactly the devices the pod holds in the ledger (`lost`). Slurm picks a
  // job's GRES indices itself, lowest free first, so the free devices below
  // the pod's are taken first by short-lived filler jobs, and each run of the
  // pod's devices becomes one placeholder piece (a pod whose devices are not
  // contiguous among the free ones gets several placeholder jobs; SameGroup
  // keeps them one owner group). Every allocation is checked against the
  // indices wanted; on any mismatch or refusal everything this call made is
  // cancelled and the ledger is left as it was. On success the new pieces
  // are recorded (Placeholder{new job, uid}) before the lost one is released,
  // so the devices are never free in between; fillers are cancelled.
  // `cpus`/`memory_mib` go to the first piece (the others ask 1 CPU).
  // Errors: FAILED_PRECONDITION (node not usable, or Slurm chose other
  // devices), RESOURCE_EXHAUSTED, UNAVAILABLE, NOT_FOUND (node unknown).
  absl::StatusOr<std::vector<Holding>> Repair(const Holding& lost, const PlaceholderPod& pod,
                                              uint32_t cpus, uint64_t memory_mib);

 private:
  // A request for `node` named and placed as every placeholder job is.
  SlurmAllocRequest Request(const std::string& node) const;

  Ledger* const ledger_;
  SlurmClient* const slurm_;
  const PlaceholderJobOptions job_options_;
};

}  // namespace duet
