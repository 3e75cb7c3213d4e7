#pragma once

// duet-bridge under kubernetes.leader_election: a standby until this replica
// holds the Lease, then the full Bridge.

#include <signal.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "bridge/config/config.h"
#include "bridge/server/standby_ledger.h"
#include "grpcpp/server.h"
#include "k8s_adapter/kube_config.h"

namespace duet {

// `identity`, else $POD_NAME, else the hostname.
std::string LeaderIdentity(const LeaderElectionConfig& config);
// `lease_namespace`, else the client config's namespace (in-cluster: the service
// account's namespace file; a kubeconfig context's), else "default".
std::string LeaderNamespace(const LeaderElectionConfig& config, const k8s::KubeConfig& kube);

// Exit status of a bridge that must be restarted to serve again: a leader that
// lost its lease, or any bridge whose ledger log failed (the Deployment
// restarts it; the journal is reopened and recovered).
inline constexpr int kExitForRestart = 3;

// What a standby serves until it leads: `ledger` (every duet.v1 call
// UNAVAILABLE) and the health service NOT_SERVING, on grpc.listen,
// grpc.plaintext_listen and grpc.unix_socket. The socket is made as the
// leader makes it (unix_socket.h): mode grpc.unix_socket_mode whatever the
// umask, a directory anyone may write refused, a socket another process
// serves left alone (UNAVAILABLE). Port 0 listeners are not supported (the
// leader would bind another port). `ledger` must outlive the server.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartStandbyGrpc(const Config& config,
                                                               StandbyLedger* ledger);

// Waits up to 100 ms for one of `signals` (blocked in every thread); true,
// having logged it, if SIGTERM or SIGINT came. Run's loops poll with it.
bool StopSignalReceived(const sigset_t& signals);

// Run() under kubernetes.leader_election: a standby (health NOT_SERVING,
// duet_leader 0) until this replica holds the Lease, then the full Bridge;
// exits kExitForRestart when the lease is lost or, with journal.etcd, when the
// log in etcd fails (deposed, or etcd unreachable), 0 on SIGTERM/SIGINT (from
// `signals`, already blocked in every thread), 1 when it cannot start.
int RunWithLeaderElection(const Config& config, const sigset_t& signals);

}  // namespace duet
