#pragma once

// The kube-scheduler extender's settings that come from configuration,
// declared once: extender::ServerOptions (k8s_adapter/extender/server.h)
// extends this struct, and duet-bridge's config embeds it (Config::extender,
// the `extender` section, same key names), so a default lives in one place
// and config validation asks Validate() below. Header-only and in the core's
// config folder: the extender depends inward on it, never the config on the
// extender.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "bridge/config/host_port.h"

namespace duet {

struct ExtenderSettings {
  // The extender's HTTP(S) address, "host:port" (port 0: any free port).
  // Empty: no extender. When set, duet-bridge also needs the Kubernetes API
  // (for bindings), configured in `kubernetes`, whatever the inventory source.
  std::string listen;
  // Verbs are served at <url_prefix>/filter, /prioritize and /bind; "" or a
  // path starting with / ("/x" and "/x/" serve the same).
  std::string url_prefix = "/duet";
  // PEM certificate chain and key; both set: HTTPS only.
  // client_ca_file (PEM CA bundle): every client must present a certificate
  // signed by it (kube-scheduler's extender tlsConfig certFile/keyFile);
  // connections without one fail in the TLS handshake. Needs HTTPS.
  struct Tls {
    std::string cert_file;
    std::string key_file;
    std::string client_ca_file;
  } tls;
  // A listen address beyond loopback without tls.client_ca_file lets any
  // peer that reaches the port bind pods with duet-bridge's pods/binding
  // permission. Refused (config validation and ExtenderServer::Start) unless
  // this is true; said at start at error level when taken.
  bool allow_unauthenticated = false;
  // /bind acts only for pods whose spec.schedulerName is one of these
  // (duet's kube-scheduler profiles); other pods are refused.
  std::vector<std::string> scheduler_names = {"duet"};
  // Larger request bodies are refused with 413 (and the connection closed).
  int64_t max_request_bytes = 8388608;
  // Threads that serve requests.
  int threads = 2;
  // Threads that run binds (each waits on Slurm's placeholder grant, the
  // journal and the API server; kube-scheduler binds pods in parallel);
  // 0: as many as `threads`. bench/slurm/RESULTS.md (pods per second): 2
  // bind threads held the placeholder stream ~15-30% below 16.
  int bind_threads = 16;

  // OK, or INVALID_ARGUMENT naming the field under `prefix` ("extender.").
  // An empty listen passes: whether the extender must run is the caller's.
  absl::Status Validate(absl::string_view prefix = "") const {
    if (absl::Status s = CheckHostPort(absl::StrCat(prefix, "listen"), listen); !s.ok()) return s;
    if (!url_prefix.empty() &&
        (url_prefix[0] != '/' || url_prefix.find_first_of("?# ") != std::string::npos)) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "url_prefix: \"", url_prefix, "\" must be empty or a path starting with /"));
    }
    if (tls.cert_file.empty() != tls.key_file.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "tls: cert_file and key_file must be set together"));
    }
    if (!tls.client_ca_file.empty() && tls.cert_file.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "tls.client_ca_file: client certificates are checked only over HTTPS; set "
                  "tls.cert_file and tls.key_file too"));
    }
    if (scheduler_names.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "scheduler_names: name at least one (the schedulerName of duet's profile)"));
    }
    for (size_t i = 0; i < scheduler_names.size(); ++i) {
      if (scheduler_names[i].empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(prefix, "scheduler_names[", i, "]: must not be empty"));
      }
    }
    if (max_request_bytes < 1024 || max_request_bytes > (int64_t{1} << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "max_request_bytes: must be 1024..1073741824"));
    }
    if (threads < 1 || threads > 64) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "threads: must be 1..64"));
    }
    if (bind_threads < 0 || bind_threads > 256) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "bind_threads: must be 0..256"));
    }
    return absl::OkStatus();
  }
};

}  // namespace duet
