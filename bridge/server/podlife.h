#pragma once

// duet-bridge's pod-lifecycle glue: the release action used by the pod watch
// (Slurm placeholder first, then the ledger; an Event on the pod), the
// metric families of the pod watch, the watches and the event recorder, and
// the leader-election run loop.

#include <signal.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "bridge/config/config.h"
#include "bridge/ledger/ledger.h"
#include "bridge/slurm/placeholders.h"
#include "bridge/slurm/slurm_sync.h"
#include "k8s_adapter/event_recorder.h"
#include "k8s_adapter/informer.h"
#include "k8s_adapter/kube_config.h"
#include "k8s_adapter/reconcile/pod_watch.h"
#include "prometheus/metric_family.h"

namespace duet {

// Releases one pod holding. A placeholder goes through Placeholders::Cancel
// when `placeholders` is set (Slurm enabled: the job is cancelled first;
// UNAVAILABLE keeps the holding); everything else is released in the ledger.
// On success a Normal "DuetReleased" Event is recorded on the pod when
// `events` is set. None is owned; `placeholders` and `events` may be null.
class BridgePodReleaser final : public k8s::PodReleaser {
 public:
  BridgePodReleaser(Ledger* ledger, Placeholders* placeholders, k8s::EventRecorder* events)
      : ledger_(ledger), placeholders_(placeholders), events_(events) {}
  absl::Status Release(const k8s::PodRelease& release) override;

 private:
  Ledger* const ledger_;
  Placeholders* const placeholders_;
  k8s::EventRecorder* const events_;
};

// For SlurmSyncOptions::on_drain: a Normal Event on the Node ("DuetDrained"
// / "DuetResumed") each time duet drains a node in Slurm or undoes its own
// drain. `events` must outlive the returned function.
// For SlurmSyncOptions::on_placeholder_lost: Events on the pod and its node.
// Repaired: Normal "DuetPlaceholderRepaired". Fenced: Warning
// "DuetPlaceholderLost", which says the devices stay held for the pod (Slurm
// steps on them are refused) and that deleting the pod gives them back.
std::function<void(const PlaceholderLoss&)> PlaceholderLossEvents(k8s::EventRecorder* events);

std::function<void(const std::string&, bool, const std::string&)> NodeDrainEvents(
    k8s::EventRecorder* events);

// duet_pod_releases_total{reason}, duet_pod_release_failures_total,
// duet_pod_sweeps_total, duet_pod_watch_pods.
std::vector<prometheus::MetricFamily> PodWatchFamilies(const k8s::PodWatchStats& stats);
// duet_k8s_watch_events_total{resource}, duet_k8s_watch_relists_total{resource}
// (lists after the first), duet_k8s_watch_failures_total{resource}.
std::vector<prometheus::MetricFamily> InformerFamilies(
    const std::vector<std::pair<std::string, k8s::InformerStats>>& by_resource);
// duet_k8s_events_total{result}, duet_k8s_events_queued.
std::vector<prometheus::MetricFamily> EventFamilies(const k8s::EventRecorderStats& stats);

// `identity`, else $POD_NAME, else the hostname.
std::string LeaderIdentity(const LeaderElectionConfig& config);
// `namespace_`, else the client config's namespace (in-cluster: the service
// account's namespace file; a kubeconfig context's), else "default".
std::string LeaderNamespace(const LeaderElectionConfig& config, const k8s::KubeConfig& kube);

// Exit status of a leader that lost its lease (the Deployment restarts it).
inline constexpr int kExitLostLease = 3;

// Run() under kubernetes.leader_election: a standby (health NOT_SERVING,
// duet_leader 0) until this replica holds the Lease, then the full Bridge;
// exits kExitLostLease when the lease is lost, 0 on SIGTERM/SIGINT (from
// `signals`, already blocked in every thread), 1 when it cannot start.
int RunWithLeaderElection(const Config& config, const sigset_t& signals);

}  // namespace duet
