#pragma once

// duet-bridge's configuration: one struct of defaults (each field documented),
// loaded from one YAML file, overridden by flags, validated separately with the
// field path named in every error (`grpc.listen: ...`).

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

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
  // Create/update/drain/delete Slurm dynamic nodes from the inventory.
  bool manage_nodes = true;
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
};

struct PlacementConfig {
  // How the extender scores nodes and how Slurm node weights are derived:
  // duet | spread | most-allocated | best-fit | fgd (placement::ParsePolicy).
  std::string policy = "duet";
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
