#pragma once

// duet-bridge's configuration: one struct of defaults (each field documented),
// loaded from one YAML file, overridden by flags, validated separately with the
// field path named in every error (`grpc.listen: ...`).

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
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
  // Unix socket path (node-local clients: the SPANK plugin, duet-node).
  // Empty: no unix listener.
  std::string unix_socket;
  // Largest request the server accepts, in bytes.
  int max_message_bytes = 4 << 20;
  // HTTP/2 streams per connection.
  int max_concurrent_streams = 256;
  // WatchNodes streams served at once; more are refused (RESOURCE_EXHAUSTED).
  int max_watch_streams = 256;
  // On SIGTERM, how long in-flight calls get before they are cancelled.
  absl::Duration shutdown_grace = absl::Seconds(10);
  TlsConfig tls;
};

struct MetricsConfig {
  // Prometheus /metrics on "host:port". Empty: no metrics endpoint.
  std::string listen = "127.0.0.1:9464";
};

struct JournalConfig {
  // Directory of the write-ahead log and snapshots. Created if missing.
  std::string dir = "/var/lib/duet/journal";
  // fdatasync before answering. Off only for throwaway development runs.
  bool fsync = true;
  // Records between automatic snapshots (0: never).
  uint64_t snapshot_every = 100000;
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
struct LeaderElectionConfig {
  // Off: the bridge serves at once (one replica).
  bool enabled = false;
  // Namespace of the Lease; empty: the in-cluster namespace file, else
  // "default".
  std::string namespace_;
  std::string lease_name = "duet-bridge";
  // This replica's identity; empty: $POD_NAME, else the hostname.
  std::string identity;
  // A standby takes over a lease not renewed for this long.
  absl::Duration lease_duration = absl::Seconds(15);
  // A leader that cannot renew for this long steps down (and exits).
  absl::Duration renew_deadline = absl::Seconds(10);
  // Time between attempts to acquire or renew.
  absl::Duration retry_period = absl::Seconds(2);
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

  // ---- pod lifecycle (invariant I2), events, leader election ----
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

struct SlurmConfig {
  // Off: duet-bridge does not talk to Slurm (the ledger still serves).
  bool enabled = false;
  // slurm.conf for libslurm; empty: $SLURM_CONF, else Slurm's default path.
  std::string conf_path;
  // Deadline of every call to slurmctld.
  absl::Duration call_timeout = absl::Seconds(5);
  // Time between sync passes (nodes, job import, weights).
  absl::Duration sync_period = absl::Seconds(10);
  // Off: duet leaves Slurm's nodes alone (no create, drain, resume or GRES
  // check); `nodes` is then unused and must stay "create".
  bool manage_nodes = true;
  // With manage_nodes, how ledger nodes meet Slurm nodes:
  //  "create": duet creates/updates/drains/deletes a dynamic Slurm node per
  //            ledger node (slurmd started against it, e.g. `slurmd -Z -N`).
  //  "adopt":  a slurmd registers its own dynamic node (Slinky NodeSet
  //            pods: `slurmd -Z --conf-server`); duet maps each ledger node
  //            to it by name, never creates, deletes or recreates one, and
  //            still drains/resumes, weighs, adds features and checks GRES.
  std::string nodes = "create";
  // Feed node weights back to Slurm so it packs like the extender.
  bool manage_weights = true;
  // Import Slurm's jobs into the ledger and release ended ones.
  bool import_jobs = true;
  // Node label whose value is the Slurm NodeAddr (default: the node name).
  std::string node_addr_label = "duet.dev/slurm-node-addr";
  // Feature that marks the Slurm nodes duet created; only those are deleted.
  std::string managed_feature = "duet";
  // Holdings younger than this are not released by a job import.
  absl::Duration release_grace = absl::Seconds(5);
  // --- Slurm owner credentials (DESIGN.md §9) ---
  // While `enabled`: what a Hold/Release over gRPC for a Slurm owner
  // (slurm_job, slurm_step) must carry to show that slurmstepd of that job on
  // that node is calling; else UNAUTHENTICATED / PERMISSION_DENIED and the
  // ledger is not touched. spank_duet's plugstack auth= must match.
  //   munge      a munge credential from root (slurmstepd) or `munge_uid`
  //              binding node, job and step (clusters on auth/munge)
  //   slurm_key  an HMAC under the cluster's slurm.key binding node, job,
  //              step and call, fresh (credential_ttl) and used once
  //              (clusters on auth/slurm: Slinky, the GKE add-on)
  //   none       such calls are trusted as is
  // "" (unset): munge, or none when require_munge is false.
  std::string credential;
  // slurm.key for `slurm_key`; "" = slurm.key beside conf_path.
  std::string key_file;
  // A slurm_key credential is accepted this long after (and before, for
  // clock skew) it was made.
  absl::Duration credential_ttl = absl::Minutes(5);
  // Older switch: false = credential none. Contradicting `credential` is an
  // error.
  bool require_munge = true;
  // munged socket the bridge decodes with; "" = /run/munge/munge.socket.2.
  std::string munge_socket;
  // Accepted credential uid besides root (Slurm's SlurmUser).
  uint32_t munge_uid = 0;
  // --- end Slurm owner credentials ---

  // `credential`, or what it defaults to: munge, none when !require_munge.
  std::string EffectiveCredential() const {
    if (!credential.empty()) return credential;
    return require_munge ? "munge" : "none";
  }
};

struct PlacementConfig {
  // How the extender scores nodes and how Slurm node weights are derived:
  // duet | spread | most-allocated | best-fit | fgd (placement::ParsePolicy).
  std::string policy = "duet";
  // The workload the fragmentation-aware policies score against, learned
  // from the pods and Slurm jobs the bridge sees (placement.workload.*;
  // docs/config.md says how to tune it).
  placement::WorkloadModelOptions workload;
};

struct ExtenderConfig {
  // The kube-scheduler extender's HTTP(S) address, "host:port". Empty: no
  // extender. When set, duet-bridge also needs the Kubernetes API (for
  // bindings), configured in `kubernetes`, whatever the inventory source.
  std::string listen;
  // Verbs are served at <url_prefix>/filter, /prioritize and /bind.
  std::string url_prefix = "/duet";
  // PEM certificate chain and key; both set: HTTPS only.
  struct {
    std::string cert_file;
    std::string key_file;
  } tls;
  // Larger request bodies are refused with 413.
  int64_t max_request_bytes = 8388608;
  // Threads that serve requests (and as many for binds).
  int threads = 2;
};

struct Config {
  GrpcConfig grpc;
  MetricsConfig metrics;
  JournalConfig journal;
  InventoryConfig inventory;
  KubernetesConfig kubernetes;
  SlurmConfig slurm;
  PlacementConfig placement;
  ExtenderConfig extender;
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

// The embedded default used by `duet-bridge --dev`: local listeners, a
// journal under the given directory, the embedded demo inventory.
Config DevConfig(const std::string& state_dir);

}  // namespace duet
