#pragma once

// duet-bridge, assembled: ledger + journal + inventory + gRPC + metrics.

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "bridge/auth/authz.h"
#include "bridge/config/config.h"
#include "bridge/inventory/inventory.h"
#include "bridge/journal/journal.h"
#include "bridge/journal/ledger_log.h"
#include "bridge/ledger/ledger.h"
#include "bridge/placement/workload_model.h"
#include "bridge/server/dra_mode.h"
#include "bridge/server/durability.h"
#include "bridge/server/gangs.h"
#include "k8s_adapter/gang/gang_source.h"
#include "bridge/server/metrics.h"
#include "bridge/server/service.h"
#include "bridge/slurm/libslurm_client.h"
#include "bridge/slurm/placeholders.h"
#include "bridge/slurm/slurm_auth_check.h"
#include "bridge/slurm/slurm_key_auth.h"
#include "bridge/slurm/slurm_sync.h"
#include "bridge/slurm/stale_holders.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "k8s_adapter/event_recorder.h"
#include "k8s_adapter/extender/extender.h"
#include "k8s_adapter/extender/server.h"
#include "k8s_adapter/kube_client.h"
#include "k8s_adapter/reconcile/pod_watch.h"
#include "prometheus/exposer.h"

namespace duet {

struct BridgeStartOptions {
  // Non-null: register /metrics on this exposer (the standby's, under leader
  // election) instead of serving metrics.listen.
  prometheus::Exposer* exposer = nullptr;
};

// Thread-safety: Start and Shutdown are called from one thread; the parts
// they own are thread-safe themselves.
class Bridge {
 public:
  // Recovers the journal, loads the inventory, binds the listeners: the steps
  // below, in that order. Errors name what failed (file, offset, address).
  // `config` must be valid.
  static absl::StatusOr<std::unique_ptr<Bridge>> Start(const Config& config,
                                                       const BridgeStartOptions& options = {});
  ~Bridge();

  // Graceful: refuse new work, close watch streams, let in-flight calls finish
  // (up to grpc.shutdown_grace), flush the journal. Idempotent.
  void Shutdown();

  // OK, or why the ledger's log failed for good (it acknowledges nothing
  // more: etcd unreachable past journal.etcd.commit_timeout, deposed by
  // another replica, a local write or fsync error).
  absl::Status LogHealth() const;

  // The bound TCP port (useful with "host:0"), or 0 without a TCP listener.
  int grpc_port() const { return grpc_port_; }
  // The bound grpc.plaintext_listen port, or 0 without one.
  int grpc_plaintext_port() const { return grpc_plaintext_port_; }
  // The bound metrics port, or 0 without a metrics endpoint.
  int metrics_port() const;
  // The scheduler extender's bound port, or 0 when extender.listen is empty.
  int extender_port() const;
  // Null unless extender.listen is set.
  extender::Extender* extender() { return extender_.get(); }
  Ledger* ledger() { return &ledger_; }
  // Null unless slurm.enabled.
  SlurmSync* slurm_sync() { return slurm_sync_.get(); }
  Placeholders* placeholders() { return placeholders_.get(); }
  Metrics* metrics() { return metrics_.get(); }
  // Null unless the bridge talks to Kubernetes (and kubernetes.watch_pods /
  // events_per_minute > 0).
  k8s::PodWatch* pod_watch() { return pod_watch_.get(); }
  k8s::EventRecorder* events() { return events_.get(); }

 private:
  using SlurmOwnerCheckFn = decltype(LedgerService::Options::authorize_slurm_owner);

  explicit Bridge(const Config& config);

  // Start's steps, in order. Each sets up one part from config_ and returns
  // the error that stops the start-up.
  // slurm.credential slurm_key: reads the key (before libslurm needs it).
  absl::Status LoadSlurmKey();
  // The journal recovers the ledger (I3/I4); then durability, metrics and the
  // watch hub, before anything can change the ledger.
  absl::Status OpenJournal();
  // The Kubernetes client, when the inventory or the extender needs it.
  absl::Status ConnectKubernetes();
  // placement.policy, then the node inventory (its first list loaded).
  absl::Status StartInventory();
  // Kubernetes Events, when the bridge talks to Kubernetes.
  void StartEvents();
  // slurm.enabled: libslurm, the sync (one pass now), placeholders.
  absl::Status StartSlurm();
  // The pod watch (I2) and the watch metrics, with Kubernetes.
  // Gangs (docs/gangs.md), when the extender is on and gang.enabled: the
  // GangRegistry, recovered from the ledger, with its thread.
  absl::Status StartGangs();
  // The gang wiring both gang registries share (the extender's, the DRA
  // lending mode's): Slurm's GangMaker, PickGangNodes, topology, recovery.
  BridgeGangsDeps GangDeps();
  absl::Status StartPodWatch();
  // /metrics on metrics.listen, or on the exposer passed in.
  absl::Status ServeMetrics(const BridgeStartOptions& options);
  // The duet.v1.Ledger service and health on grpc.listen / unix_socket.
  absl::Status ServeGrpc();
  LedgerService::Options ServiceOptions();
  // How Slurm owners' Hold/Release are authenticated (slurm.credential);
  // null for none.
  SlurmOwnerCheckFn SlurmOwnerCheck();
  // The scheduler extender, with extender.listen.
  absl::Status ServeExtender();
  // The DRA lending mode, with dra.enabled.
  absl::Status StartDra();

  const Config config_;
  Ledger ledger_;
  WatchHub hub_;
  // Test-only journal fault layer (DUET_TEST_JOURNAL_FAULT_FILE); declared
  // before journal_ so that it outlives it.
  std::unique_ptr<FileLayer> journal_fault_files_;
  std::unique_ptr<LedgerLog> journal_;  // the local Journal or the EtcdLog
  std::unique_ptr<Durability> durability_;
  std::unique_ptr<Metrics> metrics_;
  // The audit log of successful mutations (ServiceOptions makes it); before
  // service_, which writes to it, so that it outlives the service.
  std::unique_ptr<AuditLog> audit_;
  // The learned workload (placement.workload; bridge/server/workload.h).
  // Before its users, so it is destroyed after them.
  std::unique_ptr<placement::WorkloadModel> workload_model_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<LedgerService> service_;
  std::unique_ptr<grpc::Server> server_;
  // Outlives inventory_ (the Node watch uses it).
  std::unique_ptr<k8s::KubeClient> kube_client_;
  std::unique_ptr<InventorySource> inventory_;
  std::unique_ptr<LedgerInventorySink> sink_;
  std::unique_ptr<SlurmClient> slurm_;
  std::unique_ptr<SlurmNodeLoads> slurm_loads_;  // before its users (destroyed after them)
  // slurm.preemption: evict-pods (null otherwise); used by the sync and
  // the service, so destroyed after both.
  std::unique_ptr<PodEvictions> pod_evictions_;
  std::unique_ptr<SlurmSync> slurm_sync_;
  // Whether libslurm has a credential source (a sack socket, munged); said
  // at start, on failed passes (health thread) and on each scrape.
  std::unique_ptr<SlurmAuthMonitor> slurm_auth_;
  std::unique_ptr<Placeholders> placeholders_;
  std::unique_ptr<StaleHolders> stale_holders_;
  // Set by LoadSlurmKey under slurm.credential slurm_key.
  std::shared_ptr<SlurmKeyAuth> key_auth_;
  // placement.policy, parsed by StartInventory.
  placement::Policy policy_ = placement::Policy::kDuet;
  // The pod watch once started (null before, and without Kubernetes), for
  // the Slurm side's PodLivenessFn (set after the Slurm sync starts).
  std::atomic<k8s::PodWatch*> pod_view_{nullptr};
  PodLivenessFn PodLivenessFromWatch();
  // How pod holds are made (the extender's bind and PlacePod alike): the
  // placement policy and, with Slurm, slurm_loads_ as the load and as the
  // sink of placeholders' CPU/memory. Valid while slurm_loads_ lives.
  pods::PodHoldsOptions MakePodHoldsOptions(placement::Policy policy) const;
  // The learned workload's current snapshot, as the scoring components read it.
  placement::WorkloadFn LearnedWorkload() const;
  std::unique_ptr<k8s::EventRecorder> events_;
  // Which gang a pod belongs to (k8s_adapter/gang's recognition); null
  // leaves gangs off (StartGangs says so).
  std::function<absl::StatusOr<std::optional<gang::GangSpec>>(const nlohmann::json& pod)> gang_of_;
  std::unique_ptr<k8s::GangSource> gang_source_;  // behind gang_of_, when Kubernetes is on
  std::unique_ptr<BridgeGangs> gangs_;  // after Slurm's and the events', before their users
  std::unique_ptr<k8s::PodReleaser> pod_releaser_;
  std::unique_ptr<k8s::PodReleaser> gang_releaser_;  // wraps pod_releaser_ when gangs are on
  std::unique_ptr<k8s::PodWatch> pod_watch_;
  // auth.mode token: who may make mutating calls. Null otherwise.
  std::unique_ptr<auth::CallAuthorizer> authorizer_;
  // Mirrors slurm_sync_->degraded() into the "duet.slurm" health status.
  std::thread health_thread_;
  absl::Mutex health_mu_;
  bool stopping_ ABSL_GUARDED_BY(health_mu_) = false;
  int grpc_port_ = 0;
  int grpc_plaintext_port_ = 0;
  bool shut_down_ = false;
  // The scheduler extender (extender.listen). Last, so they go first: they
  // use the ledger, the placeholders and the Kubernetes client.
  std::unique_ptr<extender::PodApi> pod_api_;
  std::unique_ptr<extender::Extender> extender_;
  std::unique_ptr<extender::ExtenderServer> extender_server_;
  // The DRA lending mode (dra.enabled): after everything it uses.
  std::unique_ptr<DraMode> dra_;
};

// Starts the bridge, waits for SIGTERM or SIGINT, shuts down gracefully.
// Returns the process exit code (0 clean, 1 start-up failure). Under
// kubernetes.leader_election: RunWithLeaderElection (leadership.h; 3 when the
// lease is lost).
int Run(const Config& config);

// The gRPC server credentials for grpc.tls (insecure when no cert_file).
// Errors name the file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(
    const TlsConfig& tls);

// The CallAuthorizer of auth.mode token: TokenReviews and pod lookups through
// `kube`, the pod watch in `pods` (may hold null) as the first word on where
// a pod runs, refusals counted on `metrics` (may be null).
std::unique_ptr<auth::CallAuthorizer> NewCallAuthorizer(
    const AuthConfig& config, k8s::KubeClient* kube, const std::atomic<k8s::PodWatch*>* pods,
    Metrics* metrics);

}  // namespace duet
