#pragma once

// duet-bridge's gangs (docs/gangs.md): the GangRegistry and what it needs
// of the rest of the bridge, in one place.
//
//  - the registry itself, rebuilt from the ledger at start (Recover);
//  - a thread that runs GangRegistry::Tick every `tick_period` (timeouts,
//    and whether the members of gathering gangs still exist: a GET of each
//    pod, since the pod watch sees bound pods only) and annotates the
//    members of a complete gang (duet.io/gang-node: NODE, a merge PATCH),
//    off the extender's filter thread;
//  - the gang's Events on every member pod, through the event recorder;
//  - a PodReleaser for the pod watch: a member's placeholder of a gang job
//    goes back to its slot (GangRegistry::OnMemberGone) instead of being
//    cancelled, which would cancel the whole gang's Slurm job;
//  - the metrics: duet_gang_reservations_total, duet_gang_unplaceable_total,
//    duet_gang_releases_total{reason}, duet_gangs{state}.
//
// Thread-safety: Start/Stop from one thread; the rest thread-safe.

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "bridge/config/config.h"
#include "bridge/gang/registry.h"
#include "bridge/ledger/ledger.h"
#include "k8s_adapter/event_recorder.h"
#include "k8s_adapter/kube_client.h"
#include "k8s_adapter/reconcile/pod_watch.h"
#include "prometheus/metric_family.h"

namespace duet {

// The annotation a complete gang's members get (docs/gangs.md 2.2).
inline constexpr char kGangNodeAnnotation[] = "duet.io/gang-node";

struct BridgeGangsDeps {
  const GangConfig* config = nullptr;  // required
  Ledger* ledger = nullptr;            // required
  // The Slurm side (bridge/slurm's Placeholders); required.
  gang::GangMaker* maker = nullptr;
  // Required: placement::PickGangNodes.
  gang::GangPlannerFn planner;
  // placement::TopologyOf of a node; null: none.
  std::function<placement::NodeTopology(const NodeView&)> topology;
  // The gang of a Slurm job (SlurmSync's duet-gang:KEY jobs); null: none.
  std::function<std::optional<gang::GangKey>(uint32_t job_id)> job_gang;
  // As the extender's.
  std::function<placement::NodeLoad(const NodeView&)> load;
  std::function<std::string(const std::string& node)> unusable;
  std::function<absl::Status(uint64_t seq)> wait_durable;
  // GangRegistryOptions' (null: every node; the extender's rules). The
  // extender's registry takes the nodes of no DRA lending pool; the lending
  // mode's (DraMode's) those of its pools, and claims as members.
  std::function<bool(const std::string& node)> node_filter;
  std::function<bool(uint32_t job_id, const std::vector<std::string>& nodes)> in_use;
  // The API server (member checks, annotations); null: neither.
  k8s::KubeClient* kube = nullptr;
  // Null: no Events.
  k8s::EventRecorder* events = nullptr;
  absl::Duration tick_period = absl::Seconds(5);
  const Clock* clock = Clock::Real();
};

class BridgeGangs {
 public:
  // Recovers the gangs from the ledger and starts the thread.
  static absl::StatusOr<std::unique_ptr<BridgeGangs>> Start(BridgeGangsDeps deps);
  ~BridgeGangs();
  BridgeGangs(const BridgeGangs&) = delete;
  BridgeGangs& operator=(const BridgeGangs&) = delete;

  gang::GangRegistry* registry() { return registry_.get(); }

  // The pod watch's releaser: gang members' placeholders go back to their
  // slots; everything else to `inner` (not owned; must outlive the result).
  std::unique_ptr<k8s::PodReleaser> Releaser(k8s::PodReleaser* inner);

  // Idempotent: stops the thread (annotations not made yet are dropped).
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit BridgeGangs(BridgeGangsDeps deps);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !annotate_.empty(); }
  absl::StatusOr<bool> MemberExists(const gang::MemberRef& m) const;
  void Annotate(const gang::MemberRef& m, const std::string& node) const;
  void PostEvent(const gang::GangEvent& e) const;

  const BridgeGangsDeps deps_;
  std::unique_ptr<gang::GangRegistry> registry_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Members to annotate, with their node.
  std::deque<std::pair<gang::MemberRef, std::string>> annotate_ ABSL_GUARDED_BY(mu_);
};

std::vector<prometheus::MetricFamily> GangFamilies(const gang::GangStats& stats);

}  // namespace duet
