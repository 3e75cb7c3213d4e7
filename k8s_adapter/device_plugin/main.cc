// duet-node: ParseFlags -> Validate -> Start -> wait for SIGTERM -> Shutdown.

#include <signal.h>

#include <cstdlib>
#include <iostream>

#include "CLI/CLI.hpp"
#include "common/daemon.h"
#include "k8s_adapter/device_plugin/kube_flags.h"
#include "k8s_adapter/device_plugin/node_plugin.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  duet::SkipMutexDeadlockDetection();
  CLI::App app{"duet-node: the kubelet device plugin for GPUs and TPUs shared with Slurm"};
  duet::node::NodePluginOptions o;
  const char* env_node = std::getenv("NODE_NAME");
  if (env_node != nullptr) o.node_name = env_node;
  duet::node::KubeFlags kube_flags;
  std::string log_level = "info";
  app.add_option("--bridge", o.bridge, "duet-bridge address: host:port or unix:/path")->required();
  app.add_option("--bridge-ca", o.bridge_ca_file,
                 "PEM CA of the bridge's TLS certificate (turns TLS on; default: system roots)");
  app.add_option("--bridge-cert", o.bridge_cert_file, "PEM client certificate for the bridge");
  app.add_option("--bridge-key", o.bridge_key_file, "PEM key of --bridge-cert");
  app.add_option("--bridge-token-file", o.bridge_token_file,
                 "ServiceAccount token file sent to the bridge on every call (a projected token "
                 "with the bridge's audience; re-read on every call)");
  app.add_option("--node-name", o.node_name, "This node's name (default: $NODE_NAME)");
  app.add_option("--plugin-dir", o.plugin_dir, "kubelet's device-plugin directory")
      ->capture_default_str();
  app.add_option("--pod-resources-socket", o.pod_resources_socket,
                 "kubelet's PodResources socket (\"\": not used)")
      ->capture_default_str();
  app.add_option("--kube-server", kube_flags.server,
                 "Kubernetes API server, https://host[:port], from outside a cluster (default: "
                 "in-cluster); needs --kube-token-file");
  app.add_option("--kube-token-file", kube_flags.token_file,
                 "Bearer token for --kube-server (re-read as it rotates)");
  app.add_option("--kube-ca-file", kube_flags.ca_file,
                 "PEM CA of --kube-server's certificate (default: system roots)");
  app.add_flag("--no-kubernetes", kube_flags.disabled,
               "Do not use the Kubernetes API (no cross-check, no on-the-spot placeholders)");
  app.add_option("--step-agent-socket", o.step_agent_socket,
                 "Serve Slurm steps' Hold/Release on this unix socket (spank_duet plugstack "
                 "agent=unix://PATH), forwarded to the bridge with the step's credential");
  app.add_option("--metrics-listen", o.metrics_listen, "Prometheus /metrics on host:port");
  app.add_option("--device-dir", o.device_dir, "Where nvidiaN/accelN device nodes live")
      ->capture_default_str();
  app.add_option("--gpu-mount", o.gpu_mounts,
                 "HOST:CONTAINER read-only mount for GPU containers (repeatable), e.g. "
                 "/home/kubernetes/bin/nvidia:/usr/local/nvidia on GKE");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  absl::Status valid = duet::node::ValidateOptions(o);
  if (valid.ok()) valid = duet::node::ValidateKubeFlags(kube_flags);
  if (!valid.ok()) {
    std::cerr << "duet-node: " << valid.message() << "\n";
    return 2;
  }
  spdlog::set_level(spdlog::level::from_str(log_level));

  std::unique_ptr<duet::k8s::KubeClient> kube;
  // Flags naming a server that cannot be used are bad flags; without them, no
  // in-cluster config means running without the API (warned).
  absl::StatusOr<std::optional<duet::k8s::KubeConfig>> kc =
      duet::node::KubeConfigFromFlags(kube_flags);
  if (!kc.ok() && !kube_flags.server.empty()) {
    std::cerr << "duet-node: " << kc.status().message() << "\n";
    return 2;
  }
  if (!kc.ok()) {
    spdlog::warn(
        "no Kubernetes API ({}): Allocate matches placeholders without the pod "
        "cross-check and cannot place pods that bypassed the duet scheduler",
        kc.status().ToString());
  } else if (kc->has_value()) {
    duet::k8s::KubeClientOptions ko;
    ko.request_timeout = absl::Seconds(10);
    ko.user_agent = "duet-node/0.1";
    auto client = duet::k8s::NewCurlKubeClient(**kc, ko);
    if (!client.ok()) {
      std::cerr << "duet-node: Kubernetes client: " << client.status().message() << "\n";
      return 2;
    }
    kube = std::move(*client);
  }

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  auto plugin = duet::node::NodePlugin::Start(o, kube.get());
  if (!plugin.ok()) {
    spdlog::critical("duet-node cannot start: {}", plugin.status().ToString());
    return 1;
  }
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info("received {}; stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  (*plugin)->Shutdown();
  return 0;
}
