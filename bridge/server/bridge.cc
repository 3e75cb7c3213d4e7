#include "bridge/server/bridge.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "bridge/slurm/munge_auth.h"  // slurm helper: munge
#include "bridge/slurm/slurm_key_auth.h"
#include "k8s_adapter/kube_config.h"
#include "k8s_adapter/node_inventory.h"
#include "bridge/server/podlife.h"
#include "bridge/server/workload.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& field, const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(field, ": cannot read ", path));
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const TlsConfig& tls) {
  if (tls.cert_file.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions opts;
  auto cert = ReadFile("grpc.tls.cert_file", tls.cert_file);
  if (!cert.ok()) return cert.status();
  auto key = ReadFile("grpc.tls.key_file", tls.key_file);
  if (!key.ok()) return key.status();
  opts.pem_key_cert_pairs.push_back({*key, *cert});
  if (!tls.client_ca_file.empty()) {
    auto ca = ReadFile("grpc.tls.client_ca_file", tls.client_ca_file);
    if (!ca.ok()) return ca.status();
    opts.pem_root_certs = *ca;
    opts.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(opts);
}

// True when a process accepts connections on the unix socket at `path`.
bool SocketInUse(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool in_use = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return in_use;
}

prometheus::MetricFamily Family(const std::string& name, const std::string& help,
                                prometheus::MetricType type, double value) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  prometheus::ClientMetric m;
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(m);
  return f;
}

std::vector<prometheus::MetricFamily> SlurmMetricFamilies(bool degraded,
                                                          const SlurmSyncStats& s) {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  out.push_back(Family("duet_slurm_degraded", "1 while slurmctld cannot be reached",
                       MetricType::Gauge, degraded ? 1 : 0));
  out.push_back(Family("duet_slurm_sync_passes_total", "Slurm sync passes", MetricType::Counter,
                       static_cast<double>(s.passes)));
  out.push_back(Family("duet_slurm_sync_failed_passes_total", "Slurm sync passes that failed",
                       MetricType::Counter, static_cast<double>(s.failed_passes)));
  out.push_back(Family("duet_slurm_reconcile_corrections_total",
                       "Ledger corrections from Slurm's job table (imported + released)",
                       MetricType::Counter,
                       static_cast<double>(s.holdings_imported + s.holdings_released)));
  out.push_back(Family("duet_slurm_conflicts_total",
                       "Slurm jobs holding devices the ledger gives another owner",
                       MetricType::Counter, static_cast<double>(s.conflicts)));
  out.push_back(Family("duet_slurm_node_changes_total",
                       "Slurm nodes created, deleted, recreated, drained or resumed by duet",
                       MetricType::Counter,
                       static_cast<double>(s.nodes_created + s.nodes_deleted + s.nodes_recreated +
                                           s.drains + s.resumes)));
  out.push_back(Family("duet_slurm_weight_updates_total", "Slurm node weight updates",
                       MetricType::Counter, static_cast<double>(s.weight_updates)));
  out.push_back(Family("duet_slurm_reconfigures_total",
                       "scontrol reconfigure sent after a slurmctld start with GRES nodes "
                       "(Slurm 22.05 workaround)",
                       MetricType::Counter, static_cast<double>(s.reconfigures)));
  out.push_back(Family("duet_slurm_version_refusals_total",
                       "Slurm sync passes refused because slurmctld's release is one this "
                       "duet-bridge's libslurm cannot talk to",
                       MetricType::Counter, static_cast<double>(s.version_refusals)));
  out.push_back(Family("duet_slurm_nodes_unregistered",
                       "slurm.nodes: adopt: shared nodes whose slurmd has not registered its "
                       "Slurm node (nothing granted to Slurm there)",
                       MetricType::Gauge, static_cast<double>(s.nodes_unregistered)));
  out.push_back(Family("duet_slurm_nodes_unmapped",
                       "slurm.nodes: adopt: shared nodes whose Slurm name (up to the first dot, "
                       "or Slinky's hostname-override) is not their Kubernetes name: not adopted",
                       MetricType::Gauge, static_cast<double>(s.nodes_unmapped)));
  out.push_back(Family("duet_slurm_nodes_gres_mismatch",
                       "slurm.nodes: adopt: nodes whose slurmd registered other GPU/TPU counts "
                       "than Kubernetes reports (drained)",
                       MetricType::Gauge, static_cast<double>(s.nodes_gres_mismatch)));
  out.push_back(Family("duet_slurm_gres_mismatch_drains_total",
                       "Drains duet made because a slurmd's GRES disagree with the node's devices",
                       MetricType::Counter, static_cast<double>(s.gres_mismatch_drains)));
  {
    prometheus::MetricFamily f = Family(
        "duet_placeholder_losses_total",
        "Placeholders whose Slurm job vanished while their pod ran (scancel, node down), by the "
        "outcome of the first sync pass that saw each: repaired, or fenced (devices kept held "
        "in the ledger)",
        MetricType::Counter, static_cast<double>(s.placeholders_lost_repaired));
    f.metric[0].label.push_back({"outcome", "repaired"});
    prometheus::ClientMetric fenced = f.metric[0];
    fenced.label[0].value = "fenced";
    fenced.counter.value = static_cast<double>(s.placeholders_lost_fenced);
    f.metric.push_back(fenced);
    out.push_back(std::move(f));
  }
  out.push_back(Family("duet_placeholder_repairs_total",
                       "Lost placeholders re-created in Slurm for the pod's exact devices",
                       MetricType::Counter, static_cast<double>(s.placeholder_repairs)));
  out.push_back(Family("duet_placeholders_fenced",
                       "Lost placeholders not repaired yet: their pod's devices are held in the "
                       "ledger only (SPANK refuses Slurm steps on them)",
                       MetricType::Gauge, static_cast<double>(s.placeholders_fenced)));
  const double age = s.last_success == absl::InfinitePast()
                         ? -1
                         : absl::ToDoubleSeconds(absl::Now() - s.last_success);
  out.push_back(Family("duet_slurm_sync_age_seconds",
                       "Seconds since the last successful sync pass (-1: none yet)",
                       MetricType::Gauge, age));
  return out;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(
    const TlsConfig& tls) {
  return Credentials(tls);
}

Bridge::Bridge(const Config& config) : config_(config) {}

PodLivenessFn Bridge::PodLivenessFromWatch() {
  return [this](const std::string& uid) {
    k8s::PodWatch* watch = pod_view_.load();
    if (watch == nullptr) return PodLiveness::kUnknown;
    switch (watch->Lookup(uid).state) {
      case k8s::PodSeen::kRunning:
        return PodLiveness::kLive;
      case k8s::PodSeen::kEnded:
        return PodLiveness::kGone;
      case k8s::PodSeen::kNotSeen:
        return PodLiveness::kUnknown;
    }
    return PodLiveness::kUnknown;
  };
}

absl::StatusOr<std::unique_ptr<Bridge>> Bridge::Start(const Config& config,
                                                      const BridgeStartOptions& options) {
  std::unique_ptr<Bridge> b(new Bridge(config));

  // 0. The slurm.key for the plugin's credentials, read first: a missing or
  // unreadable key stops the bridge here with the file named, before libslurm
  // (which needs the same key) or anything else starts; never a bridge that
  // would refuse every step later.
  const std::string credential = config.slurm.EffectiveCredential();
  std::shared_ptr<SlurmKeyAuth> key_auth;
  if (config.slurm.enabled && credential == "slurm_key") {
    absl::StatusOr<std::unique_ptr<SlurmKeyAuth>> made = SlurmKeyAuth::Create(
        {config.slurm.key_file, config.slurm.conf_path, config.slurm.credential_ttl});
    if (!made.ok()) {
      return absl::Status(made.status().code(),
                          absl::StrCat("slurm.credential: slurm_key: ", made.status().message()));
    }
    key_auth = std::move(*made);
  }

  // 1. The journal restores the ledger (I3/I4) before anything can change it.
  Journal::Options jopts;
  jopts.dir = config.journal.dir;
  jopts.fsync = config.journal.fsync;
  jopts.snapshot_every = config.journal.snapshot_every;
  absl::StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(jopts, &b->ledger_);
  if (!journal.ok()) return journal.status();
  b->journal_ = std::move(*journal);
  spdlog::info("journal {}: recovered {} nodes and {} holdings", config.journal.dir,
               b->ledger_.node_count(), b->ledger_.holding_count());
  Journal* j = b->journal_.get();
  b->durability_ = NewWaitingDurability([j](uint64_t seq) { return j->WaitDurable(seq); });

  b->metrics_ = std::make_unique<Metrics>(&b->ledger_);
  Metrics* m = b->metrics_.get();
  b->journal_->SetFsyncObserver(
      [m](double seconds, size_t records, size_t bytes) { m->ObserveFsync(seconds, records, bytes); });
  b->ledger_.AddListener(&b->hub_);
  // The learned workload: fed by the extender, the pod watch and the Slurm
  // sync below, read by every scoring path.
  b->workload_model_ = std::make_unique<placement::WorkloadModel>(config.placement.workload);
  {
    placement::WorkloadModel* model = b->workload_model_.get();
    m->AddCollector([model] { return WorkloadFamilies(model->stats(absl::Now())); });
  }

  // The Kubernetes API: for the Node watch, and for the extender's bindings.
  if (config.inventory.source == "kubernetes" || !config.extender.listen.empty()) {
    absl::StatusOr<k8s::KubeConfig> kc =
        k8s::ResolveKubeConfig(config.kubernetes.kubeconfig, config.kubernetes.context);
    if (!kc.ok()) return kc.status();
    k8s::KubeClientOptions ko;
    ko.request_timeout = config.kubernetes.request_timeout;
    absl::StatusOr<std::unique_ptr<k8s::KubeClient>> client = k8s::NewCurlKubeClient(*kc, ko);
    if (!client.ok()) return client.status();
    b->kube_client_ = std::move(*client);
  }
  absl::StatusOr<placement::Policy> policy = placement::ParsePolicy(config.placement.policy);
  if (!policy.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("placement.policy: ", policy.status().message()));
  }

  // 2. The inventory.
  if (config.inventory.source == "embedded") {
    b->inventory_ = NewStaticInventory(EmbeddedInventoryYaml());
  } else if (config.inventory.source == "kubernetes") {
    // The shared pools' Nodes, listed then watched. Start() returns after the
    // first complete list.
    k8s::NodeInventoryOptions no;
    no.label_selector = config.kubernetes.shared_node_selector;
    b->inventory_ = std::make_unique<k8s::KubeNodeInventory>(b->kube_client_.get(), no);
  } else {
    b->inventory_ = NewFileInventory(config.inventory.file, config.inventory.reload_period);
  }
  b->sink_ = std::make_unique<LedgerInventorySink>(&b->ledger_);
  absl::Status inv = b->inventory_->Start(b->sink_.get());
  if (!inv.ok()) {
    return absl::Status(inv.code(), absl::StrCat("inventory (", config.inventory.source,
                                                 "): ", inv.message()));
  }

  // ---- pod lifecycle (pod-lifecycle helper) ----
  // 2b. Kubernetes Events (rate-limited, asynchronous), when the bridge talks
  // to Kubernetes: pod releases, duet's node drains (below), refusals.
  if (b->kube_client_ != nullptr && config.kubernetes.events_per_minute > 0) {
    k8s::EventRecorderOptions eo;
    eo.events_per_minute = config.kubernetes.events_per_minute;
    eo.instance = LeaderIdentity(config.kubernetes.leader_election);
    b->events_ = std::make_unique<k8s::EventRecorder>(b->kube_client_.get(), eo);
    k8s::EventRecorder* ev = b->events_.get();
    m->AddCollector([ev] { return EventFamilies(ev->stats()); });
  }
  // ---- end pod lifecycle ----

  // 3. Slurm: dynamic nodes, job import, weights, placeholders.
  if (config.slurm.enabled) {
    LibSlurmClientOptions co;
    co.conf_path = config.slurm.conf_path;
    co.call_timeout = config.slurm.call_timeout;
    b->slurm_ = std::make_unique<LibSlurmClient>(co);
    SlurmSyncOptions so;
    so.period = config.slurm.sync_period;
    so.manage_nodes = config.slurm.manage_nodes;
    absl::StatusOr<SlurmNodeMode> node_mode = ParseSlurmNodeMode(config.slurm.nodes);
    if (!node_mode.ok()) return node_mode.status();  // ValidateConfig checked it
    so.node_mode = *node_mode;
    so.manage_weights = config.slurm.manage_weights;
    so.import_jobs = config.slurm.import_jobs;
    so.node_addr_label = config.slurm.node_addr_label;
    so.managed_feature = config.slurm.managed_feature;
    so.release_grace = config.slurm.release_grace;
    if (b->events_ != nullptr) {
      so.on_drain = NodeDrainEvents(b->events_.get());
      so.on_placeholder_lost = PlaceholderLossEvents(b->events_.get());
    }
    so.pod_liveness = b->PodLivenessFromWatch();
    so.policy = *policy;
    so.workload = b->LearnedWorkload();
    {
      placement::WorkloadModel* model = b->workload_model_.get();
      const Ledger* ledger = &b->ledger_;
      so.on_live_job = [model, ledger](const SlurmJobInfo& job) {
        ObserveSlurmJob(model, *ledger, job, absl::Now());
      };
    }
    b->slurm_loads_ = std::make_unique<SlurmNodeLoads>();
    so.loads = b->slurm_loads_.get();
    b->slurm_sync_ = std::make_unique<SlurmSync>(so, &b->ledger_, b->slurm_.get(), Clock::Real());
    b->placeholders_ = std::make_unique<Placeholders>(&b->ledger_, b->slurm_.get());
    b->stale_holders_ =
        std::make_unique<StaleHolders>(&b->ledger_, b->slurm_.get(), b->PodLivenessFromWatch());
    SlurmSync* sync = b->slurm_sync_.get();
    m->AddCollector([sync] { return SlurmMetricFamilies(sync->degraded(), sync->stats()); });
    // A first pass before serving, so Slurm and the ledger agree early. A
    // Slurm that is down is not fatal: the bridge serves degraded.
    absl::Status first = sync->RunOnce();
    if (!first.ok()) spdlog::warn("slurm: first sync pass: {}", first.ToString());
    sync->Start();
  }

  // ---- pod lifecycle (pod-lifecycle helper) ----
  // 3b. The pod watch (invariant I2), when the bridge talks to Kubernetes. The pod watch releases what deleted/finished/unknown pods
  // held; with Slurm it cancels their placeholders first.
  if (b->kube_client_ != nullptr) {
    const KubernetesConfig& kc = config.kubernetes;
    if (kc.watch_pods) {
      b->pod_releaser_ = std::make_unique<BridgePodReleaser>(&b->ledger_, b->placeholders_.get(),
                                                             b->events_.get());
      k8s::PodWatchOptions po;
      po.grace = kc.pod_release_grace;
      po.sweep_period = kc.pod_sweep_period;
      {
        placement::WorkloadModel* model = b->workload_model_.get();
        const Ledger* ledger = &b->ledger_;
        po.on_pod = [model, ledger](const nlohmann::json& pod) {
          ObserveBoundPod(model, *ledger, pod, absl::Now());
        };
      }
      b->pod_watch_ = std::make_unique<k8s::PodWatch>(b->kube_client_.get(), &b->ledger_,
                                                      b->pod_releaser_.get(), po);
      absl::Status pw = b->pod_watch_->Start();
      if (!pw.ok()) return pw;
      b->pod_view_.store(b->pod_watch_.get());
      k8s::PodWatch* watch = b->pod_watch_.get();
      m->AddCollector([watch] { return PodWatchFamilies(watch->stats()); });
    }
    auto* nodes = dynamic_cast<k8s::KubeNodeInventory*>(b->inventory_.get());
    k8s::PodWatch* watch = b->pod_watch_.get();
    m->AddCollector([nodes, watch] {
      std::vector<std::pair<std::string, k8s::InformerStats>> by;
      if (nodes != nullptr) by.emplace_back("nodes", nodes->stats());
      if (watch != nullptr) by.emplace_back("pods", watch->stats().informer);
      return InformerFamilies(by);
    });
  }
  // ---- end pod lifecycle ----

  // 4. Metrics.
  if (options.exposer != nullptr) {
    m->RegisterOn(options.exposer);
  } else if (!config.metrics.listen.empty()) {
    auto exposer = b->metrics_->Serve(config.metrics.listen);
    if (!exposer.ok()) return exposer.status();
    b->exposer_ = std::move(*exposer);
  }

  // 5. gRPC.
  LedgerService::Options sopts;
  sopts.max_watch_streams = config.grpc.max_watch_streams;
  // --- Slurm owner authentication (slurm helper) ---
  if (config.slurm.enabled && credential == "munge") {
    auto auth = std::make_shared<MungeAuth>(
        MungeAuthOptions{config.slurm.munge_socket, config.slurm.munge_uid});
    sopts.authorize_slurm_owner = [auth, m](const SlurmCallerCredentials& c, const char* method,
                                            const std::string& node, const Owner& owner) {
      absl::Status s = auth->Check(c.munge, method, node, owner);
      if (!s.ok()) {
        m->CountCredentialRefusal(
            "munge", c.munge.empty()                 ? "missing"
                     : absl::IsPermissionDenied(s)   ? "wrong_owner"
                     : absl::IsUnauthenticated(s)    ? "rejected"
                                                     : "unavailable");
      }
      return s;
    };
  } else if (key_auth != nullptr) {
    std::shared_ptr<SlurmKeyAuth> auth = key_auth;
    spdlog::info("Slurm owners' Hold/Release need a slurm.key credential (key {})",
                 auth->key_file());
    sopts.authorize_slurm_owner = [auth, m](const SlurmCallerCredentials& c, const char* method,
                                            const std::string& node, const Owner& owner) {
      SlurmKeyAuth::Why why = SlurmKeyAuth::Why::kNone;
      absl::Status s = auth->Check(c.slurm_key, method, node, owner, &why);
      if (!s.ok()) m->CountCredentialRefusal("slurm_key", SlurmKeyAuth::WhyName(why));
      return s;
    };
  } else if (config.slurm.enabled) {
    spdlog::warn(
        "slurm.credential: none: Hold/Release for Slurm jobs are trusted without a credential; "
        "whoever reaches the gRPC port can hold or release for any Slurm job");
  }
  // --- end Slurm owner authentication ---
  // --- PlacePod (device plugin): Slurm placeholders when Slurm is on ---
  // It holds like the extender's bind (pods::PodHolds): the same policy, and
  // the same Slurm CPU/memory loads, told of every placeholder it makes.
  sopts.placeholders = b->placeholders_.get();
  sopts.pod_holds = b->MakePodHoldsOptions(*policy);
  sopts.workload = b->workload_model_.get();
  // --- end PlacePod ---
  // A Slurm step refused because another Slurm job, or a placeholder whose
  // pod has ended, holds its devices in the ledger: if Slurm says that job
  // has ended (the ledger lags Slurm), release it and try once more.
  if (b->stale_holders_ != nullptr) {
    StaleHolders* stale = b->stale_holders_.get();
    sopts.resolve_slurm_conflict = [stale](const HoldRequest& r) {
      if (r.devices.empty()) return false;
      absl::StatusOr<int> n = stale->ReleaseEnded(r.node, r.owner, r.devices);
      if (!n.ok()) {
        spdlog::warn("hold for {} on {}: cannot check the placeholders that hold its devices: {}",
                     r.owner.ToString(), r.node, n.status().ToString());
        return false;
      }
      return *n > 0;
    };
  }
  if (b->slurm_loads_ != nullptr) {
    SlurmNodeLoads* loads = b->slurm_loads_.get();
    sopts.slurm_state = [loads](const std::string& node) { return loads->State(node); };
  }
  b->service_ = std::make_unique<LedgerService>(&b->ledger_, b->durability_.get(), &b->hub_, m,
                                                sopts);
  auto creds = Credentials(config.grpc.tls);
  if (!creds.ok()) return creds.status();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(config.grpc.max_message_bytes);
  builder.SetMaxSendMessageSize(64 << 20);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, config.grpc.max_concurrent_streams);
  // gRPC binds with SO_REUSEPORT by default: a second bridge would silently
  // share the port and split the clients between two ledgers.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (!config.grpc.listen.empty()) {
    builder.AddListeningPort(config.grpc.listen, *creds, &b->grpc_port_);
  }
  if (!config.grpc.unix_socket.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(
        std::filesystem::path(config.grpc.unix_socket).parent_path(), ec);
    if (SocketInUse(config.grpc.unix_socket)) {
      return absl::UnavailableError(absl::StrCat("grpc.unix_socket ", config.grpc.unix_socket,
                                                 ": another process is serving on it"));
    }
    ::unlink(config.grpc.unix_socket.c_str());  // a stale socket from a previous run
    // Node-local clients authenticate by file permissions; no TLS on the socket.
    builder.AddListeningPort("unix:" + config.grpc.unix_socket, grpc::InsecureServerCredentials());
  }
  builder.RegisterService(b->service_.get());
  b->server_ = builder.BuildAndStart();
  if (b->server_ == nullptr || (!config.grpc.listen.empty() && b->grpc_port_ == 0)) {
    return absl::UnavailableError(absl::StrCat(
        "grpc: cannot listen on ",
        config.grpc.listen.empty() ? "" : absl::StrCat("grpc.listen ", config.grpc.listen, " "),
        config.grpc.unix_socket.empty() ? ""
                                        : absl::StrCat("grpc.unix_socket ", config.grpc.unix_socket),
        " (address in use or not permitted?)"));
  }
  b->server_->GetHealthCheckService()->SetServingStatus(true);
  b->server_->GetHealthCheckService()->SetServingStatus("duet", true);
  if (b->slurm_sync_ != nullptr) {
    // "duet.slurm" is NOT_SERVING while Slurm is unreachable; the ledger
    // (service "") keeps serving from what it knows.
    Bridge* self = b.get();
    self->health_thread_ = std::thread([self] {
      absl::MutexLock lock(&self->health_mu_);
      do {
        self->server_->GetHealthCheckService()->SetServingStatus(
            "duet.slurm", !self->slurm_sync_->degraded());
      } while (!self->health_mu_.AwaitWithTimeout(absl::Condition(&self->stopping_),
                                                  absl::Seconds(1)));
    });
  }
  // 6. The scheduler extender.
  if (!config.extender.listen.empty()) {
    b->pod_api_ = extender::NewKubePodApi(b->kube_client_.get());
    extender::ExtenderOptions eo;
    eo.wait_durable = [j](uint64_t seq) { return j->WaitDurable(seq); };
    // Holds as PlacePod does: the policy, and the CPU/memory that Slurm's
    // jobs and placeholders hold (each sync pass).
    const pods::PodHoldsOptions holds = b->MakePodHoldsOptions(*policy);
    eo.policy = holds.policy;
    eo.workload = holds.workload;
    {
      placement::WorkloadModel* model = b->workload_model_.get();
      eo.observe = [model](const std::string& key, const placement::PodRequest& req) {
        model->Observe(key, req, absl::Now());
      };
    }
    eo.load = holds.load;
    eo.on_placeholder = holds.on_placeholder;
    if (b->slurm_loads_ != nullptr) {
      SlurmNodeLoads* loads = b->slurm_loads_.get();
      eo.unusable = [loads](const std::string& node) { return loads->Unusable(node); };
    }
    // Bind refusals become Warning Events on the pod (rate-limited, async).
    if (b->events_ != nullptr) {
      k8s::EventRecorder* ev = b->events_.get();
      eo.on_refusal = [ev](const k8s::EventSpec& e) { ev->Record(e); };
    }
    b->extender_ = std::make_unique<extender::Extender>(&b->ledger_, b->placeholders_.get(),
                                                        b->pod_api_.get(), std::move(eo));
    extender::ServerOptions xo;
    xo.listen = config.extender.listen;
    xo.url_prefix = config.extender.url_prefix;
    xo.tls_cert_file = config.extender.tls.cert_file;
    xo.tls_key_file = config.extender.tls.key_file;
    xo.max_request_bytes = static_cast<size_t>(config.extender.max_request_bytes);
    xo.threads = config.extender.threads;
    xo.registry = m->registry();
    auto server = extender::ExtenderServer::Start(b->extender_.get(), std::move(xo));
    if (!server.ok()) return server.status();
    b->extender_server_ = std::move(*server);
  }

  m->SetServing(true);
  spdlog::info("duet-bridge serving: grpc {} unix {} metrics {} extender {}; {} nodes, {} holdings",
               config.grpc.listen.empty() ? "-" : absl::StrCat("port ", b->grpc_port_),
               config.grpc.unix_socket.empty() ? "-" : config.grpc.unix_socket,
               config.metrics.listen.empty() ? "-" : config.metrics.listen,
               b->extender_server_ == nullptr
                   ? "-"
                   : absl::StrCat(b->extender_server_->tls() ? "https" : "http", " port ",
                                  b->extender_port()),
               b->ledger_.node_count(), b->ledger_.holding_count());
  return b;
}

pods::PodHoldsOptions Bridge::MakePodHoldsOptions(placement::Policy policy) const {
  pods::PodHoldsOptions o;
  o.policy = policy;
  o.workload = LearnedWorkload();
  if (slurm_loads_ != nullptr) {
    SlurmNodeLoads* loads = slurm_loads_.get();
    o.load = [loads](const NodeView& v) { return loads->Get(v.spec.name); };
    o.on_placeholder = [loads](const std::string& node, const placement::NodeLoad& l) { loads->Add(node, l); };
  }
  return o;
}

placement::WorkloadFn Bridge::LearnedWorkload() const {
  const placement::WorkloadModel* model = workload_model_.get();
  return [model] { return model->Current(absl::Now()); };
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
  // ---- pod lifecycle: no releases once shutting down ----
  if (pod_watch_ != nullptr) pod_watch_->Stop();
  if (events_ != nullptr) events_->Stop();
  // ---- end pod lifecycle ----
  if (inventory_ != nullptr) inventory_->Stop();
  if (slurm_sync_ != nullptr) slurm_sync_->Stop();
  durability_.reset();  // answers whatever is still waiting
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

int Run(const Config& config) {
  // Block the signals before any thread starts so every thread inherits the
  // mask and only sigwait below sees them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  if (config.kubernetes.leader_election.enabled) return RunWithLeaderElection(config, set);

  absl::StatusOr<std::unique_ptr<Bridge>> bridge = Bridge::Start(config);
  if (!bridge.ok()) {
    spdlog::critical("duet-bridge cannot start: {}", bridge.status().ToString());
    return 1;
  }
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info("received {}", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  (*bridge)->Shutdown();
  return 0;
}

}  // namespace duet
