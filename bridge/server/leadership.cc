#include "bridge/server/leadership.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <ctime>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bridge/api/convert.h"
#include "common/metrics/metrics.h"
#include "common/reason.h"
#include "bridge/server/bridge.h"
#include "bridge/server/standby_ledger.h"
#include "bridge/server/unix_socket.h"
#include "duet/v1/duet.grpc.pb.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "k8s_adapter/kube_client.h"
#include "k8s_adapter/kubeconfig/kubeconfig_file.h"
#include "k8s_adapter/leader_election.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"

namespace duet {

std::string LeaderIdentity(const LeaderElectionConfig& c) {
  if (!c.identity.empty()) return c.identity;
  if (const char* pod = std::getenv("POD_NAME"); pod != nullptr && *pod != '\0') return pod;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0 && host[0] != '\0') return host;
  return "duet-bridge";
}

std::string LeaderNamespace(const LeaderElectionConfig& c, const k8s::KubeConfig& kube) {
  if (!c.lease_namespace.empty()) return c.lease_namespace;
  if (!kube.namespace_.empty()) return kube.namespace_;
  return "default";
}

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
  int plaintext_port = 0;
  if (!config.grpc.plaintext_listen.empty()) {
    builder.AddListeningPort(config.grpc.plaintext_listen, grpc::InsecureServerCredentials(),
                             &plaintext_port);
  }
  // The socket as the leader makes it (Bridge::ServeGrpc): the standby's
  // callers are the same node-local clients, and the leader binds the same
  // path after it. Before, the standby took the umask's mode (0777 under a
  // umask of 0: any local user could connect) and removed whatever was at
  // the path, a socket another bridge served on included.
  UnixSocketListener unix_listener(config.grpc.unix_socket, config.grpc.unix_socket_mode);
  if (absl::Status s = unix_listener.Prepare(); !s.ok()) return s;
  if (!config.grpc.unix_socket.empty()) {
    builder.AddListeningPort("unix:" + config.grpc.unix_socket, grpc::InsecureServerCredentials());
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (absl::Status s = unix_listener.Finish(server != nullptr); !s.ok()) {
    if (server != nullptr) server->Shutdown();
    return s;
  }
  if (server == nullptr || (!config.grpc.listen.empty() && port == 0) ||
      (!config.grpc.plaintext_listen.empty() && plaintext_port == 0)) {
    return absl::UnavailableError(absl::StrCat(
        "standby: cannot listen on ",
        config.grpc.listen.empty() ? "" : absl::StrCat("grpc.listen ", config.grpc.listen, " "),
        config.grpc.plaintext_listen.empty()
            ? ""
            : absl::StrCat("grpc.plaintext_listen ", config.grpc.plaintext_listen, " "),
        config.grpc.unix_socket.empty() ? ""
                                        : absl::StrCat("grpc.unix_socket ", config.grpc.unix_socket),
        " (address in use or not permitted?)"));
  }
  server->GetHealthCheckService()->SetServingStatus(false);
  server->GetHealthCheckService()->SetServingStatus("duet", false);
  return server;
}

bool StopSignalReceived(const sigset_t& signals) {
  timespec tick{0, 100 * 1000 * 1000};
  const int sig = sigtimedwait(&signals, nullptr, &tick);
  if (sig <= 0) return false;
  spdlog::info("received {}", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  return true;
}

namespace {

// A leader that stops on purpose (SIGTERM: a rolling update, a drain) keeps
// renewing its lease, refusing every change, for one slurm.credential_max_age
// (and a second for clocks that differ by less than one) before it gives the
// lease up. A Slurm credential it accepted is then expired before the next
// leader serves, which starts with an empty replay memory; a leader that
// dies instead is covered by credential_max_age < lease_duration.
void HoldLeaseUntilCredentialsExpire(const Config& config) {
  if (config.slurm.EffectiveCredential() == "none") return;
  const absl::Duration wait = CredentialMaxAge(config) + absl::Seconds(1);
  spdlog::info(
      "duet-bridge: holding the leader lease {} more (slurm.credential_max_age and 1s) so no "
      "Slurm credential this leader accepted can be replayed to the next",
      absl::FormatDuration(wait));
  absl::SleepFor(wait);
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
      RegisterFamily(prometheus::BuildGauge(), *registry, "duet_leader",
                     "1 while this duet-bridge replica holds the leader Lease and serves")
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

  k8s::LeaderElectionOptions lo = le;  // the configured settings, as they are
  lo.lease_namespace = LeaderNamespace(le, *kc);
  lo.identity = LeaderIdentity(le);
  lo.release_on_stop = true;
  spdlog::info("duet-bridge standby: campaigning for lease {}/{} as {}", lo.lease_namespace,
               lo.lease_name, lo.identity);
  std::atomic<bool> elected{false}, lost{false};
  k8s::LeaderElector elector(client->get(), lo);
  elector.Start([&elected] { elected = true; }, [&lost] { lost = true; });

  std::unique_ptr<Bridge> bridge;
  int code = 0;
  while (true) {
    if (StopSignalReceived(signals)) break;
    if (lost) {
      spdlog::error("duet-bridge lost the leader lease {}/{}: shutting down to restart as a standby",
                    lo.lease_namespace, lo.lease_name);
      code = kExitForRestart;
      break;
    }
    if (bridge != nullptr) {
      // The ledger's log acknowledges nothing more (etcd: deposed by another
      // replica, or out of reach; the local journal: a write or fsync
      // failed, e.g. a full disk): serving on would only refuse every
      // change, and a replica that can write should lead instead. The exit
      // gives the lease up to the standby, and kubelet restarts this one
      // (which reopens its journal, or stands by).
      if (absl::Status s = bridge->LogHealth(); !s.ok()) {
        spdlog::error("duet-bridge stops leading: the ledger's log failed: {}",
                      std::string(s.message()));
        code = kExitForRestart;
        break;
      }
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
  if (bridge != nullptr && !lost) HoldLeaseUntilCredentialsExpire(config);
  elector.Stop();
  if (*standby != nullptr) {
    (*standby)->Shutdown();
    (*standby)->Wait();
  }
  return code;
}

}  // namespace duet
