#pragma once

// duet-bridge's configuration: one struct of defaults (each field documented),
// loaded from one YAML file, overridden by flags, validated separately with the
// field path named in every error (`grpc.listen: ...`).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bridge/config/extender_settings.h"
#include "bridge/config/slurm_sync_settings.h"
#include "common/leader_election_options.h"
#include "bridge/placement/workload_model.h"

namespace duet {

struct TlsConfig {
  // PEM server certificate chain and key. Both set: gRPC serves TLS.
  std::string cert_file;
  std::string key_file;
  // PEM CA bundle. Set: clients must present a certificate signed by it.
  std::string client_ca_file;
};

struct GrpcConfig {
  // TCP address, "host:port". Empty: no TCP listener.
  std::string listen = "127.0.0.1:50151";
  // A second TCP address served in plaintext even when `tls` is set: for
  // kubelet's gRPC readiness probe (which speaks no TLS) and the SPANK
  // plugin (whose Slurm-owned calls carry their own credential). Tokens are
  // not accepted on it (auth.allow_plaintext_tokens). Empty: none.
  std::string plaintext_listen;
  // Unix socket path (node-local clients: the SPANK plugin, duet-node).
  // Empty: no unix listener. Its directory must not be writable by every
  // user without the sticky bit (anyone could swap the socket for their own).
  std::string unix_socket;
  // File mode of unix_socket, set right after bind (YAML: octal, "0660").
  // Connecting needs write permission on the socket: with 0660 only the
  // bridge's user and group may call over it.
  uint32_t unix_socket_mode = 0660;
  // Accept a mutation that needs no credential on a TCP listener beyond
  // loopback (auth.mode none, or slurm.credential none, on a listener other
  // hosts can reach without a client certificate). Off: such a
  // configuration is refused at start; on: it starts, and says so at error
  // level for every such listener.
  bool allow_insecure = false;
  // Largest request the server accepts, in bytes.
  int max_message_bytes = 4 << 20;
  // HTTP/2 streams per connection.
  int max_concurrent_streams = 256;
  // WatchNodes streams served at once; more are refused (RESOURCE_EXHAUSTED).
  int max_watch_streams = 256;
  // WatchNodes streams one caller (peer IP; the unix socket's callers
  // together) may hold at once, so no peer takes every slot. 0: no
  // per-caller limit (duet-nodes behind one NAT address need more).
  int max_watch_streams_per_caller = 16;
  // On SIGTERM, how long in-flight calls get before they are cancelled.
  absl::Duration shutdown_grace = absl::Seconds(10);
  TlsConfig tls;
};

struct MetricsConfig {
  // Prometheus /metrics on "host:port". Empty: no metrics endpoint.
  std::string listen = "127.0.0.1:9464";
};

// The ledger's log in etcd (bridge/etcd/etcd_log.h), shared by the replicas
// under leader election; off while `endpoints` is empty.
struct EtcdLogConfig {
  // etcd v3 client URLs (its JSON gateway), tried in turn: all
  // https://host:port (with `tls`) or all http://host:port. Empty: the log
  // is the local journal in journal.dir.
  std::vector<std::string> endpoints;
  // For https:// endpoints (and only for them). The files are checked at
  // start (readable, PEM, the key matches the certificate) and read again
  // for every new connection to etcd.
  struct Tls {
    // CA certificates that sign etcd's server certificate; required with
    // https:// (the system's store is not used).
    std::string ca_file;
    // The client certificate and its key, set together (etcd
    // --client-cert-auth); empty: no client certificate.
    std::string cert_file;
    std::string key_file;
  } tls;
  // Accept http:// endpoints beyond loopback (the ledger's log unencrypted
  // and unauthenticated on the network). Off: such a configuration is
  // refused; on: it starts and says so at error level. Loopback http:// (a
  // local proxy, tests) needs no flag; https:// endpoints refuse it.
  bool allow_insecure = false;
  // Every key the log writes starts with this (one ledger per prefix).
  std::string prefix = "/duet/ledger";
  // One HTTP request to etcd.
  absl::Duration request_timeout = absl::Seconds(2);
  // A batch that etcd has not committed within this is failed: its callers
  // get UNAVAILABLE, the log stays failed and the leader exits.
  absl::Duration commit_timeout = absl::Seconds(10);
};

struct JournalConfig {
  // Directory of the write-ahead log and snapshots. Created if missing.
  // Unused when `etcd.endpoints` is set.
  std::string dir = "/var/lib/duet/journal";
  // fdatasync before answering. Off only for throwaway development runs.
  bool fsync = true;
  // Records between automatic snapshots (0: never).
  uint64_t snapshot_every = 100000;
  // The log in etcd instead of journal.dir.
  EtcdLogConfig etcd;
};

struct InventoryConfig {
  // Where nodes come from: "kubernetes" (the Node watch, see `kubernetes`),
  // "file" (a YAML node list, for development) or "embedded" (a small
  // built-in demo inventory).
  std::string source = "kubernetes";
  // For source "file": the YAML node list.
  std::string file;
  // How often the file is checked for changes.
  absl::Duration reload_period = absl::Seconds(5);
};

// Active/standby replicas of duet-bridge on a coordination.k8s.io/v1 Lease.
// The elector's settings are k8s::LeaderElectionOptions
// (common/leader_election_options.h), embedded with their defaults and
// checked by its Validate(). Here lease_namespace (YAML `namespace`) empty
// means the in-cluster namespace file, else "default"; identity empty means
// $POD_NAME, else the hostname; a leader that cannot renew exits;
// release_on_stop is not read from the file.
struct LeaderElectionConfig : k8s::LeaderElectionOptions {
  // Off: the bridge serves at once (one replica).
  bool enabled = false;
};

struct KubernetesConfig {
  // kubeconfig file for development; empty: in-cluster (service-account
  // token and CA, KUBERNETES_SERVICE_HOST/PORT).
  std::string kubeconfig;
  // kubeconfig context; empty: the current one.
  std::string context;
  // Label selector of the shared node pools. Nodes it selects that have
  // nvidia.com/gpu or google.com/tpu capacity become the inventory.
  std::string shared_node_selector = "duet.dev/shared=true";
  // Deadline of every non-watch request.
  absl::Duration request_timeout = absl::Seconds(60);

  // Pod lifecycle (invariant I2), events, leader election.
  // Watch pods and release the holdings (placeholders) of pods that are
  // deleted, finished (Succeeded/Failed) or unknown to Kubernetes. Used when
  // the bridge talks to Kubernetes (inventory.source kubernetes).
  bool watch_pods = true;
  // A holding whose pod is not in the pod watch's view is released only
  // once it is older than this (covers watch lag).
  absl::Duration pod_release_grace = absl::Seconds(30);
  // Time between sweeps of the ledger against the pod view (and retries of
  // releases that failed, e.g. while Slurm was unreachable).
  absl::Duration pod_sweep_period = absl::Seconds(30);
  // Kubernetes Events posted per minute at most (token bucket; 0: none).
  int events_per_minute = 60;
  LeaderElectionConfig leader_election;
};

// The `slurm` section. The sync's own settings (sync_period, manage_nodes,
// manage_weights, import_jobs, node_addr_label, managed_feature,
// release_grace) are SlurmSyncSettings (bridge/config/slurm_sync_settings.h),
// embedded with their defaults and checked by its Validate().
struct SlurmConfig : SlurmSyncSettings {
  // Off: duet-bridge does not talk to Slurm (the ledger still serves).
  bool enabled = false;
  // slurm.conf for libslurm; empty: $SLURM_CONF, else Slurm's default path.
  std::string conf_path;
  // Deadline of every call to slurmctld.
  absl::Duration call_timeout = absl::Seconds(5);
  // With manage_nodes (false: `nodes` is unused and must stay "create"), how ledger nodes meet Slurm nodes:
  //  "create": duet creates/updates/drains/deletes a dynamic Slurm node per
  //            ledger node (slurmd started against it, e.g. `slurmd -Z -N`).
  //  "adopt":  a slurmd registers its own dynamic node (Slinky NodeSet
  //            pods: `slurmd -Z --conf-server`); duet maps each ledger node
  //            to it by name, never creates, deletes or recreates one, and
  //            still drains/resumes, weighs, adds features and checks GRES.
  std::string nodes = "create";
  // What a Hold/Release over gRPC for a Slurm owner (slurm_job, slurm_step)
  // must carry to show that slurmstepd of that job on that node is calling;
  // else UNAUTHENTICATED / PERMISSION_DENIED (UNAVAILABLE: munged cannot be
  // asked) and the ledger is not touched. Checked whether or not `enabled`:
  // the SPANK plugin calls the bridge even when the bridge does not sync with
  // slurmctld. spank_duet's plugstack auth= must match.
  //   munge      a munge credential from root (slurmstepd) or `munge_uid`
  //              (clusters on auth/munge)
  //   slurm_key  an HMAC under the cluster's slurm.key (clusters on
  //              auth/slurm: Slinky, the GKE add-on)
  //              Either binds the call (method), node, job, step and the
  //              request's content (duet/v3 payload), is fresh
  //              (credential_max_age) and is accepted once.
  //   none       such calls are trusted as is: only as an explicit choice,
  //              refused with auth.mode token and, beyond loopback, without
  //              grpc.allow_insecure; said at start at error level
  // "" (unset): munge, or none when require_munge is false.
  std::string credential;
  // slurm.key for `slurm_key`; "" = slurm.key beside conf_path.
  std::string key_file;
  // A credential (either kind) is accepted this long after (and before, for
  // clock skew) it was made; 1s to 5m, and shorter than
  // kubernetes.leader_election.lease_duration when leader election is on, so
  // that no credential outlives a takeover (docs/config.md). Zero (unset):
  // CredentialMaxAge() picks one.
  absl::Duration credential_max_age = absl::ZeroDuration();
  // Older switch: false = credential none. Contradicting `credential` is an
  // error.
  bool require_munge = true;
  // munged socket the bridge decodes with; "" = /run/munge/munge.socket.2.
  std::string munge_socket;
  // Accepted credential uid besides root (Slurm's SlurmUser).
  uint32_t munge_uid = 0;

  // `credential`, or what it defaults to: munge, none when !require_munge.
  std::string EffectiveCredential() const {
    if (!credential.empty()) return credential;
    return require_munge ? "munge" : "none";
  }
};

struct PlacementConfig {
  // How the extender scores nodes and how Slurm node weights are derived:
  // duet | spread | most-allocated | best-fit | fgd: a name in placement's
  // registry (placement::RegisteredPolicies), which validation asks.
  std::string policy = "duet";
  // The workload the fragmentation-aware policies score against, learned
  // from the pods and Slurm jobs the bridge sees (placement.workload.*;
  // docs/config.md says how to tune it).
  placement::WorkloadModelOptions workload;
};

// Who may make the mutating gRPC calls (Hold, Release, PlacePod) for pods
// and placeholders (bridge/auth/authz.h). Slurm-owned Hold/Release keep
// their own credential (slurm.credential); reads are not checked.
struct AuthConfig {
  //  "none":  anyone who reaches the gRPC port (development, `--dev`).
  //  "token": a Kubernetes ServiceAccount token in the call's
  //           `authorization: Bearer` metadata, checked with a TokenReview
  //           against the API server (needs the `kubernetes` connection).
  //           duet-node's ServiceAccount may act only for pods bound to the
  //           node its token is bound to; operators for any owner. Calls
  //           over grpc.unix_socket are trusted (file permissions).
  std::string mode = "none";
  // Audiences the token must carry (TokenReview spec.audiences); duet-node's
  // projected token asks for one of them.
  std::vector<std::string> audiences = {"duet-bridge"};
  // duet-node's ServiceAccount as the API server names it:
  // "system:serviceaccount:NAMESPACE:NAME". Required in mode token.
  std::string node_service_account;
  // Users and groups (TokenReview status.user) that may make any mutating
  // call for any pod or placeholder owner (operators, duetctl).
  std::vector<std::string> operator_users;
  std::vector<std::string> operator_groups;
  // How long a TokenReview answer is reused for the same token, and how many
  // tokens are remembered at most.
  absl::Duration cache_ttl = absl::Seconds(10);
  int cache_size = 4096;
  // Accept tokens on a plaintext TCP listener (tests; a token sent in clear
  // can be replayed until it expires). Off: such a call is UNAUTHENTICATED.
  bool allow_plaintext_tokens = false;
};

// The DRA lending mode (docs/dra.md): duet lends devices of `pools` to
// Kubernetes' own scheduler, steered by DeviceTaintRules and fenced by the
// admission webhook on resourceclaims/status.
struct DraConfig {
  bool enabled = false;
  // Node pools (the nodes' cloud.google.com/gke-nodepool) that lend; shared
  // nodes of other pools stay in the device-plugin mode. Required when
  // enabled.
  std::vector<std::string> pools;
  // DRA drivers whose devices duet lends.
  std::vector<std::string> drivers = {"gpu.nvidia.com", "tpu.google.com"};
  // The DeviceTaintRules' taint key (a label key: optional DNS prefix and a
  // name).
  std::string taint_key = "duet.dev/not-lent";
  // Lent, unallocated devices kept per pool so small pods start at once.
  int warm_buffer = 0;
  // A lent, unallocated device above the buffer is reclaimed after this long.
  absl::Duration reclaim_after = absl::Seconds(60);
  struct Webhook {
    // host:port of the HTTPS admission webhook. Required when enabled.
    std::string listen;
    // The serving certificate kube-apiserver checks with the caBundle.
    // Required when enabled (kube-apiserver calls webhooks over HTTPS only).
    std::string cert_file;
    std::string key_file;
    // Reclaim waits this long after the last admission that could touch a
    // device (step 3): at least the webhook configuration's timeoutSeconds
    // plus a margin.
    absl::Duration admission_grace = absl::Seconds(15);
    // Admissions waiting on the ledger's journal at once. Concurrent
    // admissions share one fsync (group commit), so this bounds how many
    // kube-apiserver calls one fsync can answer (bench/dra/RESULTS.md 1).
    int admission_threads = 16;
  } webhook;
  // "" reads the API server's discovery; "1.36" or "1.37" forces the
  // DeviceTaintRule API (v1beta2 / v1).
  std::string kube_version;
};

// Gangs (docs/gangs.md): pods that are useless until all of them run are
// placed whole through the extender, with one Slurm allocation.
struct GangConfig {
  // Gang members go through the GangRegistry (when the extender is on).
  bool enabled = true;
  // A reserved gang whose members have not all arrived by then is released.
  absl::Duration reserve_timeout = absl::Seconds(300);
  // A complete gang with no member left for this long is released.
  absl::Duration idle_release = absl::Seconds(60);
  // How often the registry checks its timeouts and whether the members of
  // gathering gangs still exist (a GET of each such pod per period).
  absl::Duration tick_period = absl::Seconds(5);
};

struct Config {
  GrpcConfig grpc;
  AuthConfig auth;
  MetricsConfig metrics;
  JournalConfig journal;
  InventoryConfig inventory;
  KubernetesConfig kubernetes;
  SlurmConfig slurm;
  PlacementConfig placement;
  // The kube-scheduler extender: ExtenderSettings
  // (bridge/config/extender_settings.h: listen, url_prefix, tls,
  // max_request_bytes, threads), with its defaults, checked by its
  // Validate() when listen is set.
  ExtenderSettings extender;
  DraConfig dra;
  GangConfig gang;
  // spdlog level: trace, debug, info, warn, error.
  std::string log_level = "info";
};

// Parses YAML text over the defaults. Unknown keys and wrong types are
// INVALID_ARGUMENT naming the key path. Does not validate values.
absl::StatusOr<Config> ParseConfig(const std::string& yaml_text);
// Reads and parses a file; NOT_FOUND / INVALID_ARGUMENT name the file.
absl::StatusOr<Config> LoadConfigFile(const std::string& path);
// Checks values; the first problem is returned with its field path.
absl::Status ValidateConfig(const Config& config);

// slurm.credential_max_age, or when it is unset: 10s, and with leader
// election on, lease_duration - renew_deadline (the least time between the
// old leader's last call and the new leader's first, after a crash) within
// 1s..10s.
absl::Duration CredentialMaxAge(const Config& config);

// A mutating call that needs no credential on one gRPC listener: auth.mode
// none leaves pods' Hold/Release/PlacePod open, slurm.credential none Slurm
// owners' Hold/Release. A TCP listener that checks client certificates
// (grpc.tls.client_ca_file) is no open door. Validation refuses the ones
// beyond loopback unless grpc.allow_insecure; the bridge logs each at start
// and exports them as duet_open_access.
struct OpenDoor {
  std::string listener;  // grpc.listen | grpc.plaintext_listen | grpc.unix_socket
  std::string address;   // host:port, or the socket's path
  std::string what;      // pods | slurm
  std::string reach;     // beyond_loopback | loopback | unix_socket
  std::string how;       // e.g. "plaintext TCP beyond loopback", "a unix socket, mode 0660"
  // For people, after the listener's name: the address, how it is reached,
  // by which setting, who may do what ("0.0.0.0:50151 is plaintext TCP
  // beyond loopback with auth.mode none: any peer that reaches it may hold
  // and release devices for any pod").
  std::string Describe() const;
};
// Every open door of `config`, listener by listener, pods before slurm.
std::vector<OpenDoor> OpenDoors(const Config& config);
// True for a listen address only this host can reach: localhost, 127.0.0.0/8
// or [::1].
bool IsLoopbackAddress(const std::string& host_port);
// The journal.etcd endpoints spoken to in plaintext beyond loopback: refused
// by validation unless journal.etcd.allow_insecure; the bridge names each at
// start at error level.
std::vector<std::string> InsecureEtcdEndpoints(const EtcdLogConfig& etcd);

// The embedded default used by `duet-bridge --dev`: local listeners, a
// journal under the given directory, the embedded demo inventory.
Config DevConfig(const std::string& state_dir);

}  // namespace duet
