#include "k8s_adapter/device_plugin/node_options.h"

#include "absl/strings/str_cat.h"

namespace duet {
namespace node {

absl::Status ValidateOptions(const NodePluginOptions& o) {
  if (o.bridge.empty()) return absl::InvalidArgumentError("--bridge: must be set");
  if (o.node_name.empty()) {
    return absl::InvalidArgumentError("--node-name: must be set (or $NODE_NAME)");
  }
  if (o.plugin_dir.empty()) return absl::InvalidArgumentError("--plugin-dir: must be set");
  for (const std::string& m : o.gpu_mounts) {
    const size_t colon = m.find(':');
    if (colon == std::string::npos || m.size() < 2 || m[0] != '/' || colon + 1 >= m.size() ||
        m[colon + 1] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpu-mount \"", m, "\": want HOST_PATH:CONTAINER_PATH, both absolute"));
    }
  }
  if (o.bridge_cert_file.empty() != o.bridge_key_file.empty()) {
    return absl::InvalidArgumentError("--bridge-cert, --bridge-key: give both or neither");
  }
  if ((!o.bridge_ca_file.empty() || !o.bridge_cert_file.empty()) &&
      o.bridge.rfind("unix:", 0) == 0) {
    return absl::InvalidArgumentError("--bridge-ca: the bridge's unix socket has no TLS");
  }
  if (!o.bridge_token_file.empty() && o.bridge_ca_file.empty() && o.bridge_cert_file.empty() &&
      o.bridge.rfind("unix:", 0) != 0) {
    return absl::InvalidArgumentError(
        "--bridge-token-file: the token would travel in clear: give --bridge-ca (TLS) too");
  }
  if (!o.step_agent_socket.empty() &&
      (o.step_agent_socket[0] != '/' || o.step_agent_socket.size() > 107)) {
    return absl::InvalidArgumentError(
        "--step-agent-socket: an absolute path of at most 107 bytes (a unix socket's limit)");
  }
  if (o.device_dir.empty()) return absl::InvalidArgumentError("--device-dir: must be set");
  if (o.bridge_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("bridge_timeout: must be positive");
  }
  if (o.pod_resources_period <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("pod_resources_period: must be positive");
  }
  return absl::OkStatus();
}

}  // namespace node
}  // namespace duet
