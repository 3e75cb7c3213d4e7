#pragma once

// duet-bridge's data paths between its subsystems: each function below makes
// the callback one subsystem is handed to reach another, and its comment says
// what flows from where to where. Bridge::Start (bridge.cc) hands them out;
// none of the subsystems knows the others.
//
// Nothing is owned: every pointer passed in must outlive the function made
// from it. The functions made are as thread-safe as what they call (all of
// it is), and block no longer than it does.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bridge/auth/authz.h"
#include "bridge/gang/registry.h"
#include "bridge/journal/ledger_log.h"
#include "bridge/ledger/ledger.h"
#include "bridge/placement/topology.h"
#include "bridge/placement/workload.h"
#include "bridge/placement/workload_model.h"
#include "bridge/server/metrics.h"
#include "bridge/server/service.h"
#include "bridge/slurm/munge_auth.h"
#include "bridge/slurm/pod_evictions.h"
#include "bridge/slurm/slurm_client.h"
#include "bridge/slurm/slurm_key_auth.h"
#include "bridge/slurm/slurm_sync.h"
#include "bridge/slurm/stale_holders.h"
#include "k8s_adapter/event_recorder.h"
#include "k8s_adapter/gang/gang_source.h"
#include "k8s_adapter/kube_client.h"
#include "k8s_adapter/reconcile/pod_watch.h"
#include "nlohmann/json.hpp"

namespace duet {

// ---- The ledger's log -> whoever answers only once a change is durable ----

// The ledger's log (journal or etcd) -> the service's Durability, the
// extender's binds, the gangs and the DRA lender: waits until the change
// numbered `seq` is durable (LedgerLog::WaitDurable).
std::function<absl::Status(uint64_t seq)> WaitDurableOn(LedgerLog* log);

// The log's fsyncs -> the journal fsync metrics (Metrics::ObserveFsync).
std::function<void(double seconds, size_t records, size_t bytes)> FsyncToMetrics(
    Metrics* metrics);

// ---- The pod watch -> the Slurm side and the call authorizer ----

// The pod watch -> the Slurm sync and StaleHolders (PodLivenessFn): a pod
// running is kLive, ended kGone, not seen kUnknown; kUnknown too while
// `watch` holds null (before the watch starts, or without Kubernetes).
PodLivenessFn WatchedPodLiveness(const std::atomic<k8s::PodWatch*>* watch);

// The pod watch -> the Slurm sync (SlurmSyncOptions::pod_name): the
// namespace and name of the pod with a uid, so a lost placeholder is re-made
// under the pod's name; nullopt when the watch has not seen it (or is not
// started).
std::function<std::optional<PlaceholderPod>(const std::string& pod_uid)> WatchedPodName(
    const std::atomic<k8s::PodWatch*>* watch);

// The pod watch -> the call authorizer (auth.mode token): where a running
// pod is bound, as the watch saw it; nullopt (ask the API) when the watch
// does not know it as running. `pods` may be null, or hold null.
std::function<std::optional<auth::PodBinding>(const std::string& uid)> WatchedPodBinding(
    const std::atomic<k8s::PodWatch*>* pods);

// The call authorizer's refusals -> duet's auth refusal metric
// (Metrics::CountAuthRefusal).
std::function<void(const std::string& method, const std::string& why)> AuthRefusalsToMetrics(
    Metrics* metrics);

// ---- Arrivals -> the learned workload (bridge/server/workload.h) ----

// Live Slurm jobs the sync reads -> the learned workload (ObserveSlurmJob).
std::function<void(const SlurmJobInfo& job)> SlurmJobsToWorkload(placement::WorkloadModel* model,
                                                                 const Ledger* ledger);

// Pods the pod watch reads -> the learned workload (ObserveBoundPod).
std::function<void(const nlohmann::json& pod)> BoundPodsToWorkload(
    placement::WorkloadModel* model, const Ledger* ledger);

// Pods the extender filters -> the learned workload (WorkloadModel::Observe).
std::function<void(const std::string& key, const placement::PodRequest& req)>
FilteredPodsToWorkload(placement::WorkloadModel* model);

// The learned workload -> every scoring path (the Slurm weights, pod holds,
// the extender): its current snapshot.
placement::WorkloadFn WorkloadFrom(const placement::WorkloadModel* model);

// ---- Slurm's node loads (SlurmNodeLoads, each sync pass) -> placement ----

// Slurm's CPU/memory on a node -> pod holds, the extender and gangs.
std::function<placement::NodeLoad(const NodeView&)> SlurmLoadOf(SlurmNodeLoads* loads);

// A placeholder's CPU/memory, made by a pod hold -> Slurm's node loads, until
// the next sync pass reads them from Slurm.
std::function<void(const std::string& node, const placement::NodeLoad&)> PlaceholderLoadTo(
    SlurmNodeLoads* loads);

// Why Slurm will not run a placeholder on a node -> the extender's filter and
// the gangs' node choice (SlurmNodeLoads::Unusable).
std::function<std::string(const std::string& node)> SlurmUnusable(SlurmNodeLoads* loads);

// Slurm's state and reason of a node -> the service's ListNodes/GetNode.
std::function<std::pair<std::string, std::string>(const std::string& node)> SlurmStateOf(
    SlurmNodeLoads* loads);

// ---- slurm.preemption: evict-pods ----

// PodEvictions -> Kubernetes: evicts a preempted placeholder's pod
// (k8s::EvictPod).
std::function<absl::Status(const PlaceholderPod& pod)> EvictThroughKubernetes(
    k8s::KubeClient* kube);

// PodEvictions -> Slurm: the preemptor's job as Slurm has it now.
std::function<absl::StatusOr<std::optional<SlurmJobInfo>>(uint32_t job_id)> SlurmJobLookup(
    SlurmClient* slurm);

// A Slurm owner's refused Hold (the service) -> PodEvictions: the
// POD_EVICTING refusal while the pods on its devices are being evicted
// (PodEvictionWait).
std::function<std::optional<absl::Status>(const HoldRequest& request, bool ask_slurm)>
PodEvictionWaitFor(PodEvictions* evictions, const Ledger* ledger);

// ---- The service -> the Slurm side and the authorizer ----

// A Slurm owner's Hold refused because a device is held (the service) ->
// StaleHolders: releases holders Slurm says have ended; true when it
// released any (the service then tries once more).
std::function<bool(const HoldRequest& request)> ResolveSlurmConflictWith(StaleHolders* stale);

// A mutating call (the service) -> the call authorizer (auth.mode token).
decltype(LedgerService::Options::authorize_call) AuthorizeCallWith(auth::CallAuthorizer* authz);

// ---- A Slurm owner's Hold/Release (the service) -> slurm.credential ----

// A credential check's outcome -> duet's credential refusal metric
// (Metrics::CountCredentialRefusal), labelled with the refusal's why (its
// CREDENTIAL_REFUSED metadata); one without a reason is munged being
// unreachable. Nothing for OK.
using CredentialRefusalCounter = std::function<void(const char* kind, const absl::Status& s)>;
CredentialRefusalCounter CredentialRefusalsToMetrics(Metrics* metrics);

// The service's Slurm owner check (LedgerService::Options::
// authorize_slurm_owner) -> munged (slurm.credential munge), each outcome
// counted as "munge".
decltype(LedgerService::Options::authorize_slurm_owner) MungeOwnerCheck(
    std::shared_ptr<MungeAuth> auth, CredentialRefusalCounter count);

// The same -> slurm.key (slurm.credential slurm_key), counted as "slurm_key".
decltype(LedgerService::Options::authorize_slurm_owner) SlurmKeyOwnerCheck(
    std::shared_ptr<SlurmKeyAuth> auth, CredentialRefusalCounter count);

// ---- Gangs (docs/gangs.md) ----

// Pods (the extender) -> Kubernetes gang recognition (k8s::GangSource): the
// gang a pod belongs to.
std::function<absl::StatusOr<std::optional<gang::GangSpec>>(const nlohmann::json& pod)>
GangOfPodFrom(k8s::GangSource* source);

// The gang registry -> placement: the nodes of a gang (placement::PickGangNodes).
gang::GangPlannerFn GangPlanner();

// The gang registry -> placement: a ledger node's topology, labels first,
// then its devices' (placement::TopologyOf).
std::function<placement::NodeTopology(const NodeView&)> GangTopology();

// The gang registry's recovery -> Slurm: the gang of a Slurm job, by its
// name (duet-gang:KEY); nullopt when it is none or Slurm cannot say.
std::function<std::optional<gang::GangKey>(uint32_t job_id)> GangOfSlurmJob(SlurmClient* slurm);

// ---- The extender -> Kubernetes Events ----

// Bind refusals (the extender) -> Warning Events on the pod (rate-limited,
// asynchronous).
std::function<void(const k8s::EventSpec&)> ExtenderRefusalEvents(k8s::EventRecorder* events);

}  // namespace duet
