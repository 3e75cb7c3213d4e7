#include "bridge/server/bridge.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/grpc/tls.h"
#include "common/metrics/metrics.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "common/status_macros.h"
#include "bridge/etcd/etcd_log.h"
#include "bridge/journal/fault_file_layer.h"
#include "bridge/placement/topology.h"
#include "bridge/server/leadership.h"
#include "bridge/server/pod_release.h"
#include "bridge/server/slurm_metrics.h"
#include "bridge/server/sync_events.h"
#include "bridge/server/unix_socket.h"
#include "bridge/server/watch_metrics.h"
#include "bridge/server/wiring.h"
#include "bridge/server/workload.h"
#include "bridge/slurm/munge_auth.h"
#include "common/reason.h"
#include "bridge/slurm/pod_evictions.h"
#include "bridge/slurm/placeholder_policy.h"
#include "bridge/slurm/slurm_key_auth.h"
#include "k8s_adapter/kube_api.h"
#include "k8s_adapter/kubeconfig/kubeconfig_file.h"
#include "k8s_adapter/reconcile/node_inventory.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace {

// Says at start, one line per listener, which mutations need no credential
// there (OpenDoors, bridge/config/config.h): error level beyond loopback and
// for Slurm owners (the SPANK plugin signs its calls; none is a risky choice
// anywhere), warning level for pods on loopback or the unix socket
// (auth.mode none: development). duet_open_access says the same to alerts.
void AnnounceOpenDoors(const Config& config, Metrics* metrics) {
  const std::vector<OpenDoor> doors = OpenDoors(config);
  for (const OpenDoor& d : doors) {
    const std::string line = absl::StrCat(d.listener, " ", d.Describe());
    if (d.reach == "beyond_loopback" || d.what == "slurm") {
      spdlog::error("{}", line);
    } else {
      spdlog::warn("{}", line);
    }
  }
  // Every listener and kind of owner, 0 included, so an alert can tell a
  // closed door from an older bridge that does not say.
  std::vector<std::string> listeners;
  if (!config.grpc.listen.empty()) listeners.push_back("grpc.listen");
  if (!config.grpc.plaintext_listen.empty()) listeners.push_back("grpc.plaintext_listen");
  if (!config.grpc.unix_socket.empty()) listeners.push_back("grpc.unix_socket");
  metrics->AddCollector([doors, listeners] {
    prometheus::MetricFamily f = NewFamily(
        "duet_open_access",
        "1 where a gRPC listener takes a mutation with no credential: what pods (auth.mode "
        "none) or slurm (slurm.credential none); the start-up log says who may reach it",
        prometheus::MetricType::Gauge);
    for (const std::string& listener : listeners) {
      for (const char* what : {"pods", "slurm"}) {
        const bool open = std::any_of(doors.begin(), doors.end(), [&](const OpenDoor& d) {
          return d.listener == listener && d.what == what;
        });
        AddValue(&f, {{"listener", listener}, {"what", what}}, open ? 1 : 0);
      }
    }
    return std::vector<prometheus::MetricFamily>{std::move(f)};
  });
}

// journal.etcd.tls for the etcd client; its errors name the config fields.
etcd::TlsOptions EtcdTls(const EtcdLogConfig& e) {
  etcd::TlsOptions t;
  t.ca_file = e.tls.ca_file;
  t.cert_file = e.tls.cert_file;
  t.key_file = e.tls.key_file;
  t.field = "journal.etcd.tls";
  return t;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(
    const TlsConfig& tls) {
  return TlsServerCredentials({tls.cert_file, "grpc.tls.cert_file"},
                              {tls.key_file, "grpc.tls.key_file"},
                              {tls.client_ca_file, "grpc.tls.client_ca_file"});
}

std::unique_ptr<auth::CallAuthorizer> NewCallAuthorizer(
    const AuthConfig& config, k8s::KubeClient* kube, const std::atomic<k8s::PodWatch*>* pods,
    Metrics* metrics) {
  // The pod watch's view first (no API call for a pod it knows), then the API.
  auto view = WatchedPodBinding(pods);
  auth::CallAuthorizer::Options o;
  o.config = config;
  if (metrics != nullptr) {
    o.on_refusal = AuthRefusalsToMetrics(metrics);
  }
  return std::make_unique<auth::CallAuthorizer>(kube, auth::PodBindingFrom(view, kube),
                                                std::move(o));
}

Bridge::Bridge(const Config& config) : config_(config) {}

PodLivenessFn Bridge::PodLivenessFromWatch() { return WatchedPodLiveness(&pod_view_); }

absl::StatusOr<std::unique_ptr<Bridge>> Bridge::Start(const Config& config,
                                                      const BridgeStartOptions& options) {
  std::unique_ptr<Bridge> b(new Bridge(config));
  DUET_RETURN_IF_ERROR(b->LoadSlurmKey());
  DUET_RETURN_IF_ERROR(b->OpenJournal());
  DUET_RETURN_IF_ERROR(b->ConnectKubernetes());
  DUET_RETURN_IF_ERROR(b->StartInventory());
  b->StartEvents();
  DUET_RETURN_IF_ERROR(b->StartSlurm());
  DUET_RETURN_IF_ERROR(b->StartGangs());
  DUET_RETURN_IF_ERROR(b->StartPodWatch());
  DUET_RETURN_IF_ERROR(b->ServeMetrics(options));
  DUET_RETURN_IF_ERROR(b->ServeGrpc());
  DUET_RETURN_IF_ERROR(b->ServeExtender());
  DUET_RETURN_IF_ERROR(b->StartDra());
  b->metrics_->SetServing(true);
  AnnounceOpenDoors(config, b->metrics_.get());
  spdlog::info("duet-bridge serving: grpc {} unix {} metrics {} extender {}; {} nodes, {} holdings",
               config.grpc.listen.empty() ? "-" : absl::StrCat("port ", b->grpc_port_),
               config.grpc.unix_socket.empty()
                   ? "-"
                   : absl::StrCat(config.grpc.unix_socket, " (mode ",
                                  OctalMode(config.grpc.unix_socket_mode), ")"),
               config.metrics.listen.empty() ? "-" : config.metrics.listen,
               b->extender_server_ == nullptr
                   ? "-"
                   : absl::StrCat(b->extender_server_->tls() ? "https" : "http", " port ",
                                  b->extender_port()),
               b->ledger_.node_count(), b->ledger_.holding_count());
  return b;
}

absl::Status Bridge::LoadSlurmKey() {
  // Read first: a missing or unreadable key stops the bridge here with the
  // file named, before libslurm (which needs the same key) or anything else
  // starts; never a bridge that would refuse every step later.
  // Whether or not slurm.enabled: the SPANK plugin's calls are checked either
  // way (SlurmOwnerCheck).
  if (config_.slurm.EffectiveCredential() != "slurm_key") return absl::OkStatus();
  SlurmKeyAuthOptions o;
  o.key_file = config_.slurm.key_file;
  o.slurm_conf = config_.slurm.conf_path;
  o.max_age = CredentialMaxAge(config_);
  absl::StatusOr<std::unique_ptr<SlurmKeyAuth>> made = SlurmKeyAuth::Create(std::move(o));
  if (!made.ok()) {
    return absl::Status(made.status().code(),
                        absl::StrCat("slurm.credential: slurm_key: ", made.status().message()));
  }
  key_auth_ = std::move(*made);
  return absl::OkStatus();
}

absl::Status Bridge::OpenJournal() {
  // The journal restores the ledger (I3/I4) before anything can change it.
  if (const EtcdLogConfig& e = config_.journal.etcd; !e.endpoints.empty()) {
    // Shared by the replicas and fenced: a takeover starts from every
    // acknowledged change (bridge/etcd/etcd_log.h).
    EtcdLog::Options eo;
    eo.endpoints = e.endpoints;
    eo.tls = EtcdTls(e);
    eo.prefix = e.prefix;
    eo.owner = LeaderIdentity(config_.kubernetes.leader_election);
    eo.request_timeout = e.request_timeout;
    eo.commit_timeout = e.commit_timeout;
    eo.snapshot_every = config_.journal.snapshot_every;
    DUET_ASSIGN_OR_RETURN(journal_, EtcdLog::Open(eo, &ledger_));
    spdlog::info("etcd log {}: recovered {} nodes and {} holdings", e.prefix,
                 ledger_.node_count(), ledger_.holding_count());
  } else {
    Journal::Options jopts;
    jopts.dir = config_.journal.dir;
    jopts.fsync = config_.journal.fsync;
    jopts.snapshot_every = config_.journal.snapshot_every;
    // TEST-ONLY seam (bench/soak): journal writes fail while the named control
    // file says ENOSPC or EIO (bridge/journal/fault_file_layer.h).
    if (const char* control = std::getenv("DUET_TEST_JOURNAL_FAULT_FILE");
        control != nullptr && *control != '\0') {
      journal_fault_files_ = NewControlFileFaultLayer(FileLayer::Posix(), control);
      jopts.files = journal_fault_files_.get();
      spdlog::warn("journal: test-only fault layer on, controlled by {}", control);
    }
    DUET_ASSIGN_OR_RETURN(journal_, Journal::Open(jopts, &ledger_));
    spdlog::info("journal {}: recovered {} nodes and {} holdings", config_.journal.dir,
                 ledger_.node_count(), ledger_.holding_count());
  }
  durability_ = NewWaitingDurability(WaitDurableOn(journal_.get()));

  metrics_ = std::make_unique<Metrics>(&ledger_);
  Metrics* m = metrics_.get();
  journal_->SetFsyncObserver(FsyncToMetrics(m));
  ledger_.AddListener(&hub_);
  // The learned workload: fed by the extender, the pod watch and the Slurm
  // sync, read by every scoring path.
  workload_model_ = std::make_unique<placement::WorkloadModel>(config_.placement.workload);
  placement::WorkloadModel* model = workload_model_.get();
  m->AddCollector([model] { return WorkloadFamilies(model->stats(absl::Now())); });
  return absl::OkStatus();
}

absl::Status Bridge::ConnectKubernetes() {
  // For the Node watch, the extender's bindings, the callers'
  // TokenReviews (auth.mode token) and the DRA lending mode.
  if (config_.inventory.source != "kubernetes" && config_.extender.listen.empty() &&
      config_.auth.mode != "token" && !config_.dra.enabled &&
      !(config_.slurm.enabled && config_.slurm.preemption == "evict-pods")) {
    return absl::OkStatus();
  }
  DUET_ASSIGN_OR_RETURN(k8s::KubeConfig kc, k8s::ResolveKubeConfig(config_.kubernetes.kubeconfig,
                                                                   config_.kubernetes.context));
  k8s::KubeClientOptions ko;
  ko.request_timeout = config_.kubernetes.request_timeout;
  DUET_ASSIGN_OR_RETURN(kube_client_, k8s::NewCurlKubeClient(kc, ko));
  return absl::OkStatus();
}

absl::Status Bridge::StartInventory() {
  absl::StatusOr<placement::Policy> policy = placement::ParsePolicy(config_.placement.policy);
  if (!policy.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("placement.policy: ", policy.status().message()));
  }
  policy_ = *policy;
  if (config_.inventory.source == "embedded") {
    inventory_ = NewStaticInventory(EmbeddedInventoryYaml());
  } else if (config_.inventory.source == "kubernetes") {
    // The shared pools' Nodes, listed then watched. Start() returns after the
    // first complete list.
    k8s::NodeInventoryOptions no;
    no.label_selector = config_.kubernetes.shared_node_selector;
    // The lending pools' devices come from their DRA drivers' ResourceSlices
    // (no device-plugin capacity there).
    if (config_.dra.enabled) {
      no.dra_pools = config_.dra.pools;
      no.dra_drivers = config_.dra.drivers;
    }
    inventory_ = std::make_unique<k8s::KubeNodeInventory>(kube_client_.get(), no);
  } else {
    inventory_ = NewFileInventory(config_.inventory.file, config_.inventory.reload_period);
  }
  sink_ = std::make_unique<LedgerInventorySink>(&ledger_);
  absl::Status inv = inventory_->Start(sink_.get());
  if (!inv.ok()) {
    return absl::Status(inv.code(), absl::StrCat("inventory (", config_.inventory.source,
                                                 "): ", inv.message()));
  }
  return absl::OkStatus();
}

void Bridge::StartEvents() {
  // Kubernetes Events (rate-limited, asynchronous), when the bridge talks to
  // Kubernetes: pod releases, duet's node drains, refusals.
  if (kube_client_ == nullptr || config_.kubernetes.events_per_minute <= 0) return;
  k8s::EventRecorderOptions eo;
  eo.events_per_minute = config_.kubernetes.events_per_minute;
  eo.instance = LeaderIdentity(config_.kubernetes.leader_election);
  events_ = std::make_unique<k8s::EventRecorder>(kube_client_.get(), eo);
  k8s::EventRecorder* ev = events_.get();
  metrics_->AddCollector([ev] { return EventFamilies(ev->stats()); });
}

absl::Status Bridge::StartSlurm() {
  // Dynamic nodes, job import, weights, placeholders.
  if (!config_.slurm.enabled) return absl::OkStatus();
  LibSlurmClientOptions co;
  co.conf_path = config_.slurm.conf_path;
  co.call_timeout = config_.slurm.call_timeout;
  slurm_ = std::make_unique<LibSlurmClient>(co);
  SlurmSyncOptions so;
  static_cast<SlurmSyncSettings&>(so) = config_.slurm;  // the configured settings, as they are
  DUET_ASSIGN_OR_RETURN(so.node_mode,
                        ParseSlurmNodeMode(config_.slurm.nodes));  // ValidateConfig checked it
  if (events_ != nullptr) {
    so.on_drain = NodeDrainEvents(events_.get());
    so.on_placeholder_lost = PlaceholderLossEvents(events_.get());
  }
  so.pod_liveness = PodLivenessFromWatch();
  so.pod_name = WatchedPodName(&pod_view_);
  so.policy = policy_;
  so.workload = LearnedWorkload();
  so.on_live_job = SlurmJobsToWorkload(workload_model_.get(), &ledger_);
  slurm_loads_ = std::make_unique<SlurmNodeLoads>();
  so.loads = slurm_loads_.get();
  if (config_.slurm.preemption == "evict-pods") {
    // ConnectKubernetes made the client for it.
    PodEvictionsOptions eo;
    eo.wait = config_.slurm.preemption_wait;
    eo.evict = EvictThroughKubernetes(kube_client_.get());
    eo.get_job = SlurmJobLookup(slurm_.get());
    pod_evictions_ = std::make_unique<PodEvictions>(std::move(eo), Clock::Real());
    so.evictions = pod_evictions_.get();
    PodEvictions* ev = pod_evictions_.get();
    metrics_->AddCollector([ev] { return PodEvictionFamilies(ev->stats()); });
  }
  slurm_sync_ = std::make_unique<SlurmSync>(so, &ledger_, slurm_.get(), Clock::Real());
  placeholders_ = std::make_unique<Placeholders>(
      &ledger_, slurm_.get(),
      PlaceholderJobOptions{config_.slurm.placeholder_partition, config_.slurm.placeholder_qos});
  stale_holders_ = std::make_unique<StaleHolders>(&ledger_, slurm_.get(), PodLivenessFromWatch());
  SlurmSync* sync = slurm_sync_.get();
  metrics_->AddCollector([sync] { return SlurmMetricFamilies(sync->degraded(), sync->stats()); });
  // Said before the first pass: a bridge with no credential source (no
  // sackd beside it under auth/slurm) would otherwise only log Slurm's
  // authentication errors.
  slurm_auth_ = std::make_unique<SlurmAuthMonitor>(LibslurmConfPath(config_.slurm.conf_path),
                                                   SlurmAuthEnv::FromProcess());
  slurm_auth_->Check();
  SlurmAuthMonitor* auth = slurm_auth_.get();
  metrics_->AddCollector([auth] { return SlurmAuthFamilies(auth->Check()); });
  // A first pass before serving, so Slurm and the ledger agree early. A
  // Slurm that is down is not fatal: the bridge serves degraded.
  absl::Status first = sync->RunOnce();
  if (!first.ok()) spdlog::warn("slurm: first sync pass: {}", first.ToString());
  sync->Start();
  return absl::OkStatus();
}

absl::Status Bridge::StartGangs() {
  // Gangs are placed by the extender, with one Slurm job each (the
  // placeholders' GangMaker), and recognised from the pods by `gang_of`.
  if (config_.extender.listen.empty() || !config_.gang.enabled) return absl::OkStatus();
  auto* maker = dynamic_cast<gang::GangMaker*>(placeholders_.get());
  if (!gang_of_ && kube_client_ != nullptr) {
    // PodGroup, JobSet, LeaderWorkerSet and Workload membership, read from
    // the pod and the object it names (cached, docs/gangs.md 1).
    gang_source_ = std::make_unique<k8s::GangSource>(kube_client_.get());
    gang_of_ = GangOfPodFrom(gang_source_.get());
  }
  if (maker == nullptr || !gang_of_) {
    spdlog::warn("gang.enabled: gangs need Slurm's gang placeholders and gang recognition{}; "
                 "gang members are placed as single pods",
                 maker == nullptr ? " (slurm.enabled)" : "");
    return absl::OkStatus();
  }
  BridgeGangsDeps d = GangDeps();
  if (config_.dra.enabled) {
    // The lending pools' gangs are DraMode's.
    d.node_filter = [ledger = &ledger_, pools = config_.dra.pools](const std::string& node) {
      std::shared_ptr<const NodeView> v = ledger->GetNode(node);
      return v == nullptr || std::find(pools.begin(), pools.end(), v->spec.pool) == pools.end();
    };
  }
  DUET_ASSIGN_OR_RETURN(gangs_, BridgeGangs::Start(std::move(d)));
  gang::GangRegistry* registry = gangs_->registry();
  metrics_->AddCollector([registry] { return GangFamilies(registry->stats()); });
  return absl::OkStatus();
}

BridgeGangsDeps Bridge::GangDeps() {
  BridgeGangsDeps d;
  d.config = &config_.gang;
  d.ledger = &ledger_;
  d.maker = dynamic_cast<gang::GangMaker*>(placeholders_.get());
  d.planner = GangPlanner();
  d.topology = GangTopology();
  const pods::PodHoldsOptions holds = MakePodHoldsOptions(policy_);
  d.load = holds.load;
  if (slurm_ != nullptr) {
    // At recovery, a job whose every slot a member holds is known as a gang
    // by its Slurm name (duet-gang:KEY).
    d.job_gang = GangOfSlurmJob(slurm_.get());
  }
  if (slurm_loads_ != nullptr) {
    d.unusable = SlurmUnusable(slurm_loads_.get());
  }
  d.wait_durable = WaitDurableOn(journal_.get());
  d.kube = kube_client_.get();
  d.events = events_.get();
  d.tick_period = config_.gang.tick_period;
  return d;
}

absl::Status Bridge::StartPodWatch() {
  // The pod watch (invariant I2), when the bridge talks to Kubernetes. It
  // releases what deleted/finished/unknown pods held; with Slurm it cancels
  // their placeholders first.
  if (kube_client_ == nullptr) return absl::OkStatus();
  const KubernetesConfig& kc = config_.kubernetes;
  if (kc.watch_pods) {
    pod_releaser_ =
        std::make_unique<BridgePodReleaser>(&ledger_, placeholders_.get(), events_.get());
    k8s::PodWatchOptions po;
    po.grace = kc.pod_release_grace;
    po.sweep_period = kc.pod_sweep_period;
    po.on_pod = BoundPodsToWorkload(workload_model_.get(), &ledger_);
    k8s::PodReleaser* releaser = pod_releaser_.get();
    if (gangs_ != nullptr) {
      // A gang member's placeholder goes back to its slot, not to scancel.
      gang_releaser_ = gangs_->Releaser(releaser);
      releaser = gang_releaser_.get();
    }
    pod_watch_ = std::make_unique<k8s::PodWatch>(kube_client_.get(), &ledger_, releaser, po);
    DUET_RETURN_IF_ERROR(pod_watch_->Start());
    pod_view_.store(pod_watch_.get());
    k8s::PodWatch* watch = pod_watch_.get();
    metrics_->AddCollector([watch] { return PodWatchFamilies(watch->stats()); });
  }
  auto* nodes = dynamic_cast<k8s::KubeNodeInventory*>(inventory_.get());
  k8s::PodWatch* watch = pod_watch_.get();
  metrics_->AddCollector([nodes, watch] {
    std::vector<std::pair<std::string, k8s::InformerStats>> by;
    if (nodes != nullptr) by.emplace_back("nodes", nodes->stats());
    if (watch != nullptr) by.emplace_back("pods", watch->stats().informer);
    return InformerFamilies(by);
  });
  return absl::OkStatus();
}

absl::Status Bridge::ServeMetrics(const BridgeStartOptions& options) {
  if (options.exposer != nullptr) {
    metrics_->RegisterOn(options.exposer);
  } else if (!config_.metrics.listen.empty()) {
    DUET_ASSIGN_OR_RETURN(exposer_, metrics_->Serve(config_.metrics.listen));
  }
  return absl::OkStatus();
}

LedgerService::Options Bridge::ServiceOptions() {
  LedgerService::Options sopts;
  sopts.max_watch_streams = config_.grpc.max_watch_streams;
  sopts.max_watch_streams_per_caller = config_.grpc.max_watch_streams_per_caller;
  sopts.authorize_slurm_owner = SlurmOwnerCheck();
  // auth.mode token: pod-owned Hold/Release and PlacePod need a caller the
  // API server vouches for (bridge/auth/authz.h).
  if (config_.auth.mode == "token") {
    authorizer_ = NewCallAuthorizer(config_.auth, kube_client_.get(), &pod_view_, metrics_.get());
    sopts.authorize_call = AuthorizeCallWith(authorizer_.get());
  }  // mode none: Start names every listener that leaves open (AnnounceOpenDoors)
  // Every successful mutation leaves one audit line (bridge/server/audit.h).
  AuditLog::Options audit;
  audit.metrics = metrics_.get();
  audit_ = std::make_unique<AuditLog>(std::move(audit));
  sopts.audit = audit_.get();
  // PlacePod (device plugin) holds like the extender's bind
  // (pods::PodHolds): the same policy, and the same Slurm CPU/memory loads,
  // told of every placeholder it makes; Slurm placeholders when Slurm is on.
  sopts.placeholders = placeholders_.get();
  sopts.pod_holds = MakePodHoldsOptions(policy_);
  sopts.workload = workload_model_.get();
  // A Slurm step refused because another Slurm job, or a placeholder whose
  // pod has ended, holds its devices in the ledger: if Slurm says that job
  // has ended (the ledger lags Slurm), release it and try once more.
  if (stale_holders_ != nullptr) {
    sopts.resolve_slurm_conflict = ResolveSlurmConflictWith(stale_holders_.get());
  }
  if (slurm_loads_ != nullptr) {
    sopts.slurm_state = SlurmStateOf(slurm_loads_.get());
  }
  if (pod_evictions_ != nullptr) {
    sopts.pod_eviction_wait = PodEvictionWaitFor(pod_evictions_.get(), &ledger_);
  }
  return sopts;
}

Bridge::SlurmOwnerCheckFn Bridge::SlurmOwnerCheck() {
  // Slurm owners' Hold/Release must carry slurm.credential (DESIGN.md §9),
  // whether or not this bridge syncs with slurmctld (slurm.enabled): the SPANK
  // plugin on the Slurm nodes calls it either way, and an unchecked call can
  // release a running step's devices or hold every free one as a made-up job.
  const std::string credential = config_.slurm.EffectiveCredential();
  const CredentialRefusalCounter count = CredentialRefusalsToMetrics(metrics_.get());
  if (credential == "munge") {
    MungeAuthOptions o;
    o.socket = config_.slurm.munge_socket;
    o.slurm_uid = config_.slurm.munge_uid;
    o.max_age = CredentialMaxAge(config_);
    auto auth = std::make_shared<MungeAuth>(std::move(o));
    spdlog::info("Slurm owners' Hold/Release need a munge credential (munged at {}, at most {} old)",
                 config_.slurm.munge_socket.empty() ? "/run/munge/munge.socket.2"
                                                    : config_.slurm.munge_socket,
                 absl::FormatDuration(CredentialMaxAge(config_)));
    return MungeOwnerCheck(std::move(auth), count);
  }
  if (credential == "slurm_key") {
    std::shared_ptr<SlurmKeyAuth> auth = key_auth_;  // LoadSlurmKey loaded it, or Start failed
    spdlog::info("Slurm owners' Hold/Release need a slurm.key credential (key {}, at most {} old)",
                 auth->key_file(), absl::FormatDuration(CredentialMaxAge(config_)));
    return SlurmKeyOwnerCheck(std::move(auth), count);
  }
  // "none", written on purpose (the default is munge): validation refused it
  // beyond loopback without grpc.allow_insecure, and Start names every
  // listener it leaves open at error level.
  return nullptr;
}

absl::Status Bridge::ServeGrpc() {
  service_ = std::make_unique<LedgerService>(&ledger_, durability_.get(), &hub_, metrics_.get(),
                                             ServiceOptions());
  DUET_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds,
                        GrpcServerCredentials(config_.grpc.tls));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(config_.grpc.max_message_bytes);
  builder.SetMaxSendMessageSize(64 << 20);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, config_.grpc.max_concurrent_streams);
  // gRPC binds with SO_REUSEPORT by default: a second bridge would silently
  // share the port and split the clients between two ledgers.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (!config_.grpc.listen.empty()) {
    builder.AddListeningPort(config_.grpc.listen, creds, &grpc_port_);
  }
  if (!config_.grpc.plaintext_listen.empty()) {
    builder.AddListeningPort(config_.grpc.plaintext_listen, grpc::InsecureServerCredentials(),
                             &grpc_plaintext_port_);
  }
  const std::string& socket = config_.grpc.unix_socket;
  // The umask drops group and others' write until the listeners are bound;
  // then the socket gets grpc.unix_socket_mode (unix_socket.h).
  UnixSocketListener unix_listener(socket, config_.grpc.unix_socket_mode);
  DUET_RETURN_IF_ERROR(unix_listener.Prepare());
  if (!socket.empty()) {
    // Node-local clients authenticate by file permissions; no TLS on the socket.
    builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  }
  service_->RegisterWith(&builder);
  server_ = builder.BuildAndStart();
  if (server_ != nullptr) service_->StartCallThreads();
  DUET_RETURN_IF_ERROR(unix_listener.Finish(server_ != nullptr));
  if (server_ == nullptr || (!config_.grpc.listen.empty() && grpc_port_ == 0) ||
      (!config_.grpc.plaintext_listen.empty() && grpc_plaintext_port_ == 0)) {
    return absl::UnavailableError(absl::StrCat(
        "grpc: cannot listen on ",
        config_.grpc.listen.empty() ? "" : absl::StrCat("grpc.listen ", config_.grpc.listen, " "),
        config_.grpc.plaintext_listen.empty()
            ? ""
            : absl::StrCat("grpc.plaintext_listen ", config_.grpc.plaintext_listen, " "),
        socket.empty() ? "" : absl::StrCat("grpc.unix_socket ", socket),
        " (address in use or not permitted?)"));
  }
  server_->GetHealthCheckService()->SetServingStatus(true);
  server_->GetHealthCheckService()->SetServingStatus("duet", true);
  // "duet.slurm" is NOT_SERVING while Slurm is unreachable; the ledger
  // (service "") keeps serving from what it knows. A failed journal is failed
  // for good (every change is refused from then on, I3): the bridge then
  // reports NOT_SERVING on "" and "duet", for good, so that probes take it out
  // of service and it gets restarted, instead of a bridge that looks healthy
  // and refuses every grant.
  health_thread_ = std::thread([this] {
    absl::MutexLock lock(&health_mu_);
    bool journal_failed = false;
    uint64_t seen_passes = 0;
    uint64_t seen_failed = 0;
    do {
      if (slurm_sync_ != nullptr) {
        server_->GetHealthCheckService()->SetServingStatus("duet.slurm",
                                                           !slurm_sync_->degraded());
        if (slurm_auth_ != nullptr) {
          // A failed pass: say whether the bridge has any credential at all.
          const SlurmSyncStats st = slurm_sync_->stats();
          if (st.failed_passes != seen_failed) {
            slurm_auth_->OnPassFailed();
          } else if (st.passes != seen_passes) {
            slurm_auth_->OnPassSucceeded();
          }
          seen_passes = st.passes;
          seen_failed = st.failed_passes;
        }
      }
      if (!journal_failed && journal_ != nullptr) {
        absl::Status health = journal_->Health();
        if (!health.ok()) {
          journal_failed = true;
          spdlog::error("journal failed, refusing every change until a restart: {}",
                        std::string(health.message()));
          server_->GetHealthCheckService()->SetServingStatus(false);
          server_->GetHealthCheckService()->SetServingStatus("duet", false);
        }
      }
    } while (!health_mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Seconds(1)));
  });
  return absl::OkStatus();
}

absl::Status Bridge::StartDra() {
  // The DRA lending mode (docs/dra.md): the lending pools' devices go to
  // kube-scheduler only while a lend job holds them in Slurm, fenced by the
  // admission webhook. Validation made sure Slurm is on.
  if (!config_.dra.enabled) return absl::OkStatus();
  if (kube_client_ == nullptr || placeholders_ == nullptr) {
    return absl::FailedPreconditionError(
        "dra.enabled needs the Kubernetes API (kubernetes.kubeconfig or in-cluster) and Slurm");
  }
  DraModeDeps d;
  d.config = &config_.dra;
  d.ledger = &ledger_;
  d.kube = kube_client_.get();
  d.lends = placeholders_.get();
  d.durable = WaitDurableOn(journal_.get());
  d.registry = metrics_->registry().get();
  d.policy = policy_;
  d.events = events_.get();
  if (config_.gang.enabled) {
    // Gangs in the lending mode (docs/dra.md "Gangs"): the extender's gang
    // wiring, over the lending pools (DraMode sets the rest).
    if (!gang_of_) {
      gang_source_ = std::make_unique<k8s::GangSource>(kube_client_.get());
      gang_of_ = GangOfPodFrom(gang_source_.get());
    }
    d.gang_of = gang_of_;
    d.gangs = GangDeps();
  }
  absl::StatusOr<std::unique_ptr<DraMode>> m = DraMode::Start(std::move(d));
  if (!m.ok()) return m.status();
  dra_ = *std::move(m);
  if (gang::GangRegistry* g = dra_->gang_registry(); g != nullptr && gangs_ == nullptr) {
    // duet_gang_* count the lending mode's gangs (the extender's when both run).
    metrics_->AddCollector([g] { return GangFamilies(g->stats()); });
  }
  return absl::OkStatus();
}

absl::Status Bridge::ServeExtender() {
  if (config_.extender.listen.empty()) return absl::OkStatus();
  pod_api_ = extender::NewKubePodApi(kube_client_.get());
  extender::ExtenderOptions eo;
  eo.wait_durable = WaitDurableOn(journal_.get());
  // Holds as PlacePod does: the policy, and the CPU/memory that Slurm's
  // jobs and placeholders hold (each sync pass).
  const pods::PodHoldsOptions holds = MakePodHoldsOptions(policy_);
  eo.policy = holds.policy;
  eo.workload = holds.workload;
  eo.observe = FilteredPodsToWorkload(workload_model_.get());
  eo.load = holds.load;
  eo.on_placeholder = holds.on_placeholder;
  if (slurm_loads_ != nullptr) {
    eo.unusable = SlurmUnusable(slurm_loads_.get());
  }
  // Bind refusals become Warning Events on the pod (rate-limited, async).
  if (events_ != nullptr) {
    eo.on_refusal = ExtenderRefusalEvents(events_.get());
  }
  // /bind acts only for pods of duet's own scheduler profiles.
  eo.scheduler_names = config_.extender.scheduler_names;
  if (gangs_ != nullptr) {
    eo.gangs = gangs_->registry();
    eo.gang_of = gang_of_;
  }
  extender_ = std::make_unique<extender::Extender>(&ledger_, placeholders_.get(), pod_api_.get(),
                                                   std::move(eo));
  extender::ServerOptions xo;
  static_cast<ExtenderSettings&>(xo) = config_.extender;  // the configured settings, as they are
  xo.registry = metrics_->registry();
  DUET_ASSIGN_OR_RETURN(extender_server_,
                        extender::ExtenderServer::Start(extender_.get(), std::move(xo)));
  return absl::OkStatus();
}

pods::PodHoldsOptions Bridge::MakePodHoldsOptions(placement::Policy policy) const {
  pods::PodHoldsOptions o;
  o.policy = policy;
  o.workload = LearnedWorkload();
  if (slurm_loads_ != nullptr) {
    o.load = SlurmLoadOf(slurm_loads_.get());
    o.on_placeholder = PlaceholderLoadTo(slurm_loads_.get());
  }
  return o;
}

placement::WorkloadFn Bridge::LearnedWorkload() const {
  return WorkloadFrom(workload_model_.get());
}

int Bridge::extender_port() const {
  return extender_server_ == nullptr ? 0 : extender_server_->port();
}

int Bridge::metrics_port() const {
  if (exposer_ == nullptr) return 0;
  auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

void Bridge::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  spdlog::info("duet-bridge shutting down");
  if (service_ != nullptr) service_->SetServing(false);
  if (metrics_ != nullptr) metrics_->SetServing(false);
  // The extender first: its binds in flight finish while the journal, the
  // ledger and Slurm are all still there.
  if (extender_server_ != nullptr) extender_server_->Stop();
  // The webhook likewise (kube-apiserver then fails closed: nothing more is
  // allocated on the lending pools until a bridge answers again).
  if (dra_ != nullptr) dra_->Stop();
  {
    absl::MutexLock lock(&health_mu_);
    stopping_ = true;
  }
  if (health_thread_.joinable()) health_thread_.join();
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(false);
    hub_.CloseAll("duet-bridge is shutting down");
    server_->Shutdown(absl::ToChronoTime(absl::Now() + config_.grpc.shutdown_grace));
    server_->Wait();
  }
  // No pod releases once shutting down.
  if (pod_watch_ != nullptr) pod_watch_->Stop();
  if (gangs_ != nullptr) gangs_->Stop();
  if (events_ != nullptr) events_->Stop();
  if (inventory_ != nullptr) inventory_->Stop();
  if (slurm_sync_ != nullptr) slurm_sync_->Stop();
  durability_.reset();  // answers whatever is still waiting
  // After the last answer: the calls send theirs on their queues.
  if (service_ != nullptr) service_->StopCallThreads();
  ledger_.RemoveListener(&hub_);
  if (journal_ != nullptr) {
    absl::Status s = journal_->Flush();
    if (!s.ok()) spdlog::error("journal flush at shutdown: {}", std::string(s.message()));
    journal_.reset();
  }
  exposer_.reset();
  spdlog::info("duet-bridge stopped");
}

Bridge::~Bridge() { Shutdown(); }

absl::Status Bridge::LogHealth() const {
  return journal_ == nullptr ? absl::OkStatus() : journal_->Health();
}

int Run(const Config& config) {
  // Block the signals before any thread starts so every thread inherits the
  // mask and only sigwait below sees them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // The etcd TLS files now, not first at a takeover: a standby opens the log
  // only once it leads.
  if (const EtcdLogConfig& e = config.journal.etcd; !e.endpoints.empty()) {
    if (absl::Status s = etcd::CheckTls(e.endpoints, EtcdTls(e)); !s.ok()) {
      spdlog::critical("duet-bridge cannot start: {}", s.ToString());
      return 1;
    }
    for (const std::string& u : InsecureEtcdEndpoints(e)) {
      spdlog::error(
          "journal.etcd.endpoints: {} is plaintext beyond loopback "
          "(journal.etcd.allow_insecure): anyone on the path may read or rewrite "
          "the ledger's log",
          u);
    }
  }
  if (config.kubernetes.leader_election.enabled) return RunWithLeaderElection(config, set);

  absl::StatusOr<std::unique_ptr<Bridge>> bridge = Bridge::Start(config);
  if (!bridge.ok()) {
    spdlog::critical("duet-bridge cannot start: {}", bridge.status().ToString());
    return 1;
  }
  // A ledger log that failed (a journal write or fsync error, e.g. a full
  // disk; etcd deposed or out of reach) acknowledges nothing more: exit for
  // a restart, which reopens and recovers it, as a leader does, rather than
  // stay up refusing every change. A transient error heals by itself then; a
  // lasting one shows as a restarting pod with the reason in its log.
  int code = 0;
  while (!StopSignalReceived(set)) {
    if (absl::Status s = (*bridge)->LogHealth(); !s.ok()) {
      spdlog::error("duet-bridge exits for a restart: the ledger's log failed: {}",
                    std::string(s.message()));
      code = kExitForRestart;
      break;
    }
  }
  (*bridge)->Shutdown();
  return code;
}

}  // namespace duet
