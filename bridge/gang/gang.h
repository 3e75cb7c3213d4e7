#pragma once

// Gangs (docs/gangs.md): the vocabulary and the interfaces the parts are
// built against.
//
//  GangKey / GangSpec  which gang a pod belongs to and what each member asks
//                      (k8s_adapter/gang recognises them from a pod).
//  GangMaker           the Slurm side: one placeholder job over every node of
//                      the gang (bridge/slurm's Placeholders implements it).
//  GangPlanner         picks the gang's nodes (bridge/placement/topology
//                      scores the candidate sets).
//  GangRegistry        (bridge/gang/registry.h) reserves, gathers, binds and
//                      releases gangs over these.
//
// Thread-safety: the interfaces here must be safe to call concurrently.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bridge/ledger/types.h"
#include "bridge/placement/request.h"

namespace duet {
namespace gang {

// Where a pod's gang membership came from.
enum class GangSource : uint8_t {
  kPodGroup = 1,  // scheduler-plugins' label scheduling.x-k8s.io/pod-group
  kJobSet = 2,    // a JobSet's replicated job
  kLws = 3,       // a LeaderWorkerSet group
  kWorkload = 4,  // Kubernetes' Workload API (spec.workloadRef)
};
// "podgroup", "jobset", "lws", "workload".
const char* GangSourceName(GangSource source);

// A gang's identity. `name` is unique within (namespace, source): the
// PodGroup's name; "JOBSET/REPLICATEDJOB" for a JobSet; "LWS/GROUP-INDEX" for
// a LeaderWorkerSet group; "WORKLOAD/PODGROUP[/REPLICA-KEY]" for a Workload.
struct GangKey {
  std::string ns;
  GangSource source = GangSource::kPodGroup;
  std::string name;

  // "podgroup/NS/NAME": the form in Slurm job names (duet-gang:KEY), the
  // ledger's slot owners (gang:KEY#SLOT), logs and Events.
  std::string ToString() const;
  // The inverse of ToString; INVALID_ARGUMENT on anything else.
  static absl::StatusOr<GangKey> Parse(const std::string& text);

  bool operator==(const GangKey& o) const {
    return ns == o.ns && source == o.source && name == o.name;
  }
  bool operator!=(const GangKey& o) const { return !(*this == o); }
  bool operator<(const GangKey& o) const {
    if (ns != o.ns) return ns < o.ns;
    if (source != o.source) return source < o.source;
    return name < o.name;
  }
  template <typename H>
  friend H AbslHashValue(H h, const GangKey& k) {
    return H::combine(std::move(h), k.ns, k.source, k.name);
  }
};

// What a recognised member says about its gang.
struct GangSpec {
  GangKey key;
  // Members the gang needs before any is bound (PodGroup minMember, JobSet
  // replicas x parallelism, LWS size, Workload gang minCount). >= 1.
  uint32_t min_member = 0;
  // What every member asks (the first member's request; docs/gangs.md 1).
  placement::PodRequest member;
  // A multi-host TPU slice wanted by the members' node selector
  // (cloud.google.com/gke-tpu-topology, e.g. "4x4"); empty: none.
  std::string tpu_topology;
  std::string tpu_accelerator;
};

// The ledger owner of one reserved slot: Owner::GangSlot(job, key, slot) is
// {kind kGangSlot, job_id J, pod_uid "gang:KEY#SLOT"}.
inline constexpr char kGangSlotPrefix[] = "gang:";
// The Slurm job name of a gang's placeholder: "duet-gang:KEY".
inline constexpr char kGangJobPrefix[] = "duet-gang:";

// One node of a gang's placement: `members` slots on `node`.
struct GangNode {
  std::string node;
  uint32_t members = 0;
};

// What GangMaker::Create made.
struct GangAllocation {
  uint32_t job_id = 0;
  // One holding per slot, slot order: slot s is holdings[s] (owner
  // GangSlot{job_id, key, s}); slots fill nodes in the order given.
  std::vector<Holding> slots;
  // The ledger sequence to wait for before answering.
  uint64_t seq = 0;
};

// The Slurm side of a gang. Thread-safe.
class GangMaker {
 public:
  virtual ~GangMaker() = default;
  // One Slurm job named duet-gang:KEY over `nodes` (each node
  // members x member devices, CPUs and memory), immediate; records each
  // slot's devices as its GangSlot owner. Every node gets the same number of
  // members (one job asks the same GRES on every node): INVALID_ARGUMENT
  // otherwise. On any error nothing stays held and no job stays.
  // Errors: INVALID_ARGUMENT, NOT_FOUND (node unknown), FAILED_PRECONDITION
  // (node not usable), RESOURCE_EXHAUSTED (no room in Slurm, or Slurm chose
  // devices the ledger refuses), UNAVAILABLE (Slurm unreachable).
  virtual absl::StatusOr<GangAllocation> Create(const GangKey& key, const GangSpec& spec,
                                                const std::vector<GangNode>& nodes) = 0;
  // Cancels job `job_id` and releases every slot and member placeholder of
  // it in the ledger. OK when it is gone already. UNAVAILABLE keeps the
  // ledger as it is.
  virtual absl::Status Cancel(const GangKey& key, uint32_t job_id) = 0;
};

}  // namespace gang
}  // namespace duet
