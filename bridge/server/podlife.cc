#include "bridge/server/podlife.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <ctime>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bridge/api/convert.h"
#include "common/metrics/metrics.h"
#include "common/reason.h"
#include "bridge/server/bridge.h"
#include "duet/v1/duet.grpc.pb.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "k8s_adapter/kube_client.h"
#include "k8s_adapter/leader_election.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

}  // namespace

absl::Status BridgePodReleaser::Release(const k8s::PodRelease& r) {
  const Holding& h = r.holding;
  absl::Status s;
  if (h.owner.kind == OwnerKind::kPlaceholder && placeholders_ != nullptr) {
    s = placeholders_->Cancel(h.node, h.owner.pod_uid);
  } else {
    s = ledger_->Release(h.node, h.owner).status();
  }
  if (!s.ok()) return s;
  if (events_ != nullptr && !r.pod_name.empty()) {
    k8s::EventSpec e;
    e.object_kind = "Pod";
    e.object_namespace = r.pod_namespace;
    e.object_name = r.pod_name;
    e.object_uid = h.owner.pod_uid;
    e.type = "Normal";
    e.reason = "DuetReleased";
    e.message = absl::StrCat("duet released ", h.devices.size(), " device(s) on node ", h.node,
                             " held by ", h.owner.ToString(), ": pod ",
                             r.reason == k8s::PodReleaseReason::kOrphaned
                                 ? "not found"
                                 : k8s::PodReleaseReasonName(r.reason));
    events_->Record(e);
  }
  return absl::OkStatus();
}

std::function<void(const PlaceholderLoss&)> PlaceholderLossEvents(k8s::EventRecorder* events) {
  return [events](const PlaceholderLoss& loss) {
    std::vector<std::string> devs;
    for (const HeldDevice& d : loss.devices) {
      devs.push_back(absl::StrCat(DeviceKindName(d.kind), " ", d.index));
    }
    const std::string what = absl::StrCat(
        "Slurm placeholder job ", loss.lost_job_id, " of pod ", loss.pod.ns, "/", loss.pod.name,
        " on node ", loss.node, " (", absl::StrJoin(devs, ", "), ") disappeared from Slurm");
    k8s::EventSpec e;
    if (loss.repaired) {
      e.type = "Normal";
      e.reason = "DuetPlaceholderRepaired";
      e.message = absl::StrCat(what, "; re-created as job(s) ",
                               absl::StrJoin(loss.new_job_ids, ","), " on the same devices");
    } else {
      e.type = "Warning";
      e.reason = "DuetPlaceholderLost";
      e.message = absl::StrCat(
          what,
          ": the devices stay held for the pod and Slurm steps on them are refused until "
          "duet re-creates the placeholder (",
          loss.detail, "); delete the pod to give the devices back to Slurm");
    }
    if (!loss.pod.name.empty()) {
      k8s::EventSpec p = e;
      p.object_kind = "Pod";
      p.object_namespace = loss.pod.ns;
      p.object_name = loss.pod.name;
      p.object_uid = loss.pod.uid;
      events->Record(p);
    }
    e.object_kind = "Node";
    e.object_name = loss.node;
    events->Record(e);
  };
}

std::function<void(const std::string&, bool, const std::string&)> NodeDrainEvents(
    k8s::EventRecorder* events) {
  return [events](const std::string& node, bool drained, const std::string& reason) {
    k8s::EventSpec e;
    e.object_kind = "Node";
    e.object_name = node;
    e.type = "Normal";
    if (drained) {
      e.reason = "DuetDrained";
      e.message = absl::StrCat("duet drained Slurm node ", node, " (", reason,
                               "): no new Slurm jobs start on it");
    } else {
      e.reason = "DuetResumed";
      e.message = absl::StrCat("duet resumed Slurm node ", node, " (was: ", reason, ")");
    }
    events->Record(e);
  };
}

std::vector<MetricFamily> PodWatchFamilies(const k8s::PodWatchStats& s) {
  std::vector<MetricFamily> out;
  MetricFamily rel = NewFamily("duet_pod_releases_total",
                               "Pod holdings (placeholders) released by the pod watch, by reason",
                               MetricType::Counter);
  AddValue(&rel, {{"reason", "deleted"}}, static_cast<double>(s.released_deleted));
  AddValue(&rel, {{"reason", "terminal"}}, static_cast<double>(s.released_terminal));
  AddValue(&rel, {{"reason", "orphaned"}}, static_cast<double>(s.released_orphaned));
  out.push_back(std::move(rel));
  MetricFamily fail = NewFamily("duet_pod_release_failures_total",
                                "Pod holding releases that failed and were kept for a retry",
                                MetricType::Counter);
  AddValue(&fail, {}, static_cast<double>(s.release_failures));
  out.push_back(std::move(fail));
  MetricFamily sweeps = NewFamily("duet_pod_sweeps_total",
                                  "Sweeps of the ledger against the pod view, by result",
                                  MetricType::Counter);
  AddValue(&sweeps, {{"result", "done"}}, static_cast<double>(s.sweeps));
  AddValue(&sweeps, {{"result", "skipped"}}, static_cast<double>(s.sweeps_skipped));
  out.push_back(std::move(sweeps));
  MetricFamily pods = NewFamily("duet_pod_watch_pods", "Pods in the pod watch's view",
                                MetricType::Gauge);
  AddValue(&pods, {}, static_cast<double>(s.pods));
  out.push_back(std::move(pods));
  return out;
}

std::vector<MetricFamily> InformerFamilies(
    const std::vector<std::pair<std::string, k8s::InformerStats>>& by_resource) {
  MetricFamily events = NewFamily("duet_k8s_watch_events_total",
                                  "Kubernetes watch events applied, by resource",
                                  MetricType::Counter);
  MetricFamily relists = NewFamily("duet_k8s_watch_relists_total",
                                   "Kubernetes relists after the first list (410 Gone, bad frames)",
                                   MetricType::Counter);
  MetricFamily failures = NewFamily("duet_k8s_watch_failures_total",
                                    "Failed Kubernetes list or watch attempts, by resource",
                                    MetricType::Counter);
  for (const auto& [resource, s] : by_resource) {
    AddValue(&events, {{"resource", resource}}, static_cast<double>(s.events));
    AddValue(&relists, {{"resource", resource}},
             static_cast<double>(s.lists > 0 ? s.lists - 1 : 0));
    AddValue(&failures, {{"resource", resource}}, static_cast<double>(s.failures));
  }
  return {std::move(events), std::move(relists), std::move(failures)};
}

std::vector<MetricFamily> EventFamilies(const k8s::EventRecorderStats& s) {
  MetricFamily total = NewFamily("duet_k8s_events_total", "Kubernetes Events recorded, by result",
                                 MetricType::Counter);
  AddValue(&total, {{"result", "posted"}}, static_cast<double>(s.posted));
  AddValue(&total, {{"result", "failed"}}, static_cast<double>(s.failed));
  AddValue(&total, {{"result", "deduplicated"}}, static_cast<double>(s.deduplicated));
  AddValue(&total, {{"result", "dropped"}}, static_cast<double>(s.dropped));
  MetricFamily queued = NewFamily("duet_k8s_events_queued", "Kubernetes Events waiting to be posted",
                                  MetricType::Gauge);
  AddValue(&queued, {}, static_cast<double>(s.queued));
  return {std::move(total), std::move(queued)};
}

std::string LeaderIdentity(const LeaderElectionConfig& c) {
  if (!c.identity.empty()) return c.identity;
  if (const char* pod = std::getenv("POD_NAME"); pod != nullptr && *pod != '\0') return pod;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0 && host[0] != '\0') return host;
  return "duet-bridge";
}

std::string LeaderNamespace(const LeaderElectionConfig& c, const k8s::KubeConfig& kube) {
  if (!c.namespace_.empty()) return c.namespace_;
  if (!kube.namespace_.empty()) return kube.namespace_;
  return "default";
}

namespace {

// The ledger API on a standby: every call is refused with UNAVAILABLE (what
// clients retry, and what the SPANK plugin's failure policy treats as "bridge
// unreachable"); nothing is granted or read.
grpc::Status NotTheLeader() {
  return ToGrpc(WithReason(
      absl::UnavailableError("duet-bridge standby: not the leader (the leader replica serves the "
                             "ledger; retry)"),
      v1::reason::kStandby));
}

class StandbyLedger final : public v1::Ledger::CallbackService {
 public:
  grpc::ServerUnaryReactor* ListNodes(grpc::CallbackServerContext* ctx, const v1::ListNodesRequest*,
                                      v1::ListNodesResponse*) override {
    return Refuse(ctx);
  }
  grpc::ServerUnaryReactor* GetNode(grpc::CallbackServerContext* ctx, const v1::GetNodeRequest*,
                                    v1::Node*) override {
    return Refuse(ctx);
  }
  grpc::ServerUnaryReactor* Hold(grpc::CallbackServerContext* ctx, const v1::HoldRequest*,
                                 v1::HoldResponse*) override {
    return Refuse(ctx);
  }
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx, const v1::ReleaseRequest*,
                                    v1::ReleaseResponse*) override {
    return Refuse(ctx);
  }
  grpc::ServerUnaryReactor* ListHoldings(grpc::CallbackServerContext* ctx,
                                         const v1::ListHoldingsRequest*,
                                         v1::ListHoldingsResponse*) override {
    return Refuse(ctx);
  }
  grpc::ServerUnaryReactor* PlacePod(grpc::CallbackServerContext* ctx, const v1::PlacePodRequest*,
                                     v1::Holding*) override {
    return Refuse(ctx);
  }
  grpc::ServerWriteReactor<v1::NodeEvent>* WatchNodes(grpc::CallbackServerContext*,
                                                      const v1::WatchNodesRequest*) override {
    class Refused final : public grpc::ServerWriteReactor<v1::NodeEvent> {
     public:
      Refused() { Finish(NotTheLeader()); }
      void OnDone() override { delete this; }
    };
    return new Refused();
  }

 private:
  static grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* ctx) {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(NotTheLeader());
    return r;
  }
};

// What a standby serves: the health service (NOT_SERVING) on the gRPC
// listeners. Port 0 listeners are not supported here (the leader would bind
// another port).
absl::StatusOr<std::unique_ptr<grpc::Server>> StartStandbyGrpc(const Config& config,
                                                               StandbyLedger* ledger) {
  auto creds = GrpcServerCredentials(config.grpc.tls);
  if (!creds.ok()) return creds.status();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(ledger);
  int port = 0;
  if (!config.grpc.listen.empty()) builder.AddListeningPort(config.grpc.listen, *creds, &port);
  if (!config.grpc.unix_socket.empty()) {
    ::unlink(config.grpc.unix_socket.c_str());
    builder.AddListeningPort("unix:" + config.grpc.unix_socket, grpc::InsecureServerCredentials());
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || (!config.grpc.listen.empty() && port == 0)) {
    return absl::UnavailableError(
        absl::StrCat("standby: cannot listen on grpc.listen ", config.grpc.listen));
  }
  server->GetHealthCheckService()->SetServingStatus(false);
  server->GetHealthCheckService()->SetServingStatus("duet", false);
  return server;
}

}  // namespace

int RunWithLeaderElection(const Config& config, const sigset_t& signals) {
  const LeaderElectionConfig& le = config.kubernetes.leader_election;
  absl::StatusOr<k8s::KubeConfig> kc =
      k8s::ResolveKubeConfig(config.kubernetes.kubeconfig, config.kubernetes.context);
  if (!kc.ok()) {
    spdlog::critical("duet-bridge cannot start: leader election: {}", kc.status().ToString());
    return 1;
  }
  // A renewal must give up well before renew_deadline, or a leader that
  // cannot reach the API server would not step down in time.
  k8s::KubeClientOptions ko;
  ko.request_timeout =
      std::min(config.kubernetes.request_timeout,
               std::max(absl::Milliseconds(500), le.renew_deadline / 2));
  ko.connect_timeout = std::min(ko.connect_timeout, ko.request_timeout);
  absl::StatusOr<std::unique_ptr<k8s::KubeClient>> client = k8s::NewCurlKubeClient(*kc, ko);
  if (!client.ok()) {
    spdlog::critical("duet-bridge cannot start: leader election: {}", client.status().ToString());
    return 1;
  }

  // The standby's endpoints. /metrics stays up across the takeover (the
  // bridge registers its families on the same exposer); gRPC is rebound by
  // the bridge.
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::Gauge& leader_gauge =
      prometheus::BuildGauge()
          .Name("duet_leader")
          .Help("1 while this duet-bridge replica holds the leader Lease and serves")
          .Register(*registry)
          .Add({});
  std::unique_ptr<prometheus::Exposer> exposer;
  if (!config.metrics.listen.empty()) {
    auto served = ServeMetrics("metrics.listen", config.metrics.listen);
    if (!served.ok()) {
      spdlog::critical("duet-bridge cannot start: {}", std::string(served.status().message()));
      return 1;
    }
    exposer = *std::move(served);
    exposer->RegisterCollectable(registry);
  }
  StandbyLedger standby_ledger;
  absl::StatusOr<std::unique_ptr<grpc::Server>> standby = StartStandbyGrpc(config, &standby_ledger);
  if (!standby.ok()) {
    spdlog::critical("duet-bridge cannot start: {}", standby.status().ToString());
    return 1;
  }

  k8s::LeaderElectionOptions lo;
  lo.lease_namespace = LeaderNamespace(le, *kc);
  lo.lease_name = le.lease_name;
  lo.identity = LeaderIdentity(le);
  lo.lease_duration = le.lease_duration;
  lo.renew_deadline = le.renew_deadline;
  lo.retry_period = le.retry_period;
  lo.release_on_stop = true;
  spdlog::info("duet-bridge standby: campaigning for lease {}/{} as {}", lo.lease_namespace,
               lo.lease_name, lo.identity);
  std::atomic<bool> elected{false}, lost{false};
  k8s::LeaderElector elector(client->get(), lo);
  elector.Start([&elected] { elected = true; }, [&lost] { lost = true; });

  std::unique_ptr<Bridge> bridge;
  int code = 0;
  while (true) {
    timespec tick{0, 100 * 1000 * 1000};
    const int sig = sigtimedwait(&signals, nullptr, &tick);
    if (sig > 0) {
      spdlog::info("received {}", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      break;
    }
    if (lost) {
      spdlog::error("duet-bridge lost the leader lease {}/{}: shutting down to restart as a standby",
                    lo.lease_namespace, lo.lease_name);
      code = kExitLostLease;
      break;
    }
    if (elected && bridge == nullptr) {
      spdlog::info("duet-bridge is the leader ({}): starting", lo.identity);
      (*standby)->Shutdown();
      (*standby)->Wait();
      standby->reset();
      BridgeStartOptions bo;
      bo.exposer = exposer.get();
      absl::StatusOr<std::unique_ptr<Bridge>> started = Bridge::Start(config, bo);
      if (!started.ok()) {
        spdlog::critical("duet-bridge cannot start: {}", started.status().ToString());
        code = 1;
        break;
      }
      bridge = std::move(*started);
      leader_gauge.Set(1);
    }
  }
  leader_gauge.Set(0);
  // The bridge first (the journal is flushed), then the lease is given up
  // so a standby takes over at once.
  if (bridge != nullptr) bridge->Shutdown();
  elector.Stop();
  if (*standby != nullptr) {
    (*standby)->Shutdown();
    (*standby)->Wait();
  }
  return code;
}

}  // namespace duet
