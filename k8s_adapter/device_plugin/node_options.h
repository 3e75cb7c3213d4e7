#pragma once

// duet-node's options (one struct, filled from flags by main.cc) and their
// validation. Plain data: no locking; every part reads its copy.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace duet {
namespace node {

struct NodePluginOptions {
  // duet-bridge: "host:port" or "unix:/path".
  std::string bridge;
  // TLS to the bridge (PEM files). Any set: TLS. `bridge_ca_file` empty:
  // the system roots. Client certificate and key: both or neither (the
  // bridge's grpc.tls.client_ca_file asks for them).
  std::string bridge_ca_file;
  std::string bridge_cert_file;
  std::string bridge_key_file;
  // A ServiceAccount token file (a projected token with the bridge's
  // audience) sent on every call to the bridge as `authorization: Bearer`;
  // re-read on every call, so kubelet's rotations are picked up. Empty: no
  // token (the bridge's auth.mode none, or its unix socket).
  std::string bridge_token_file;
  // This node's name in the ledger (and Kubernetes).
  std::string node_name;
  // kubelet's device-plugin directory: kubelet.sock is there, ours go there.
  std::string plugin_dir = "/var/lib/kubelet/device-plugins";
  // kubelet's PodResources socket; empty: not used.
  std::string pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  // Where device nodes (nvidiaN, accelN) live on the host.
  std::string device_dir = "/dev";
  // Read-only mounts for GPU containers, "HOST_PATH:CONTAINER_PATH" (e.g.
  // GKE's driver: /home/kubernetes/bin/nvidia:/usr/local/nvidia).
  std::vector<std::string> gpu_mounts;
  // The step agent's unix socket (step_agent.h), for spank_duet's plugstack
  // agent=unix://PATH; empty: no agent.
  std::string step_agent_socket;
  // Prometheus /metrics on "host:port"; empty: none.
  std::string metrics_listen;
  // Timeouts of calls to the bridge (Allocate's PlacePod waits for Slurm).
  absl::Duration bridge_timeout = absl::Seconds(15);
  // How often PodResources is re-read (it is also read on every Allocate).
  absl::Duration pod_resources_period = absl::Seconds(5);
};

// Checks the options; the error names the flag.
absl::Status ValidateOptions(const NodePluginOptions& options);

}  // namespace node
}  // namespace duet
