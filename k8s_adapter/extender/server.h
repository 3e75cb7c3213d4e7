#pragma once

// The extender's HTTP(S) endpoint (Boost.Beast over Asio): a thin layer that
// turns requests into Extender calls and their results into JSON.
//
//   POST <prefix>/filter      ExtenderArgs -> ExtenderFilterResult
//   POST <prefix>/prioritize  ExtenderArgs -> HostPriorityList
//   POST <prefix>/bind        ExtenderBindingArgs -> ExtenderBindingResult
//   GET  /healthz             "ok"
//   POST <prefix>/_echo       the body back (only with enable_echo; benchmarks)
//
// Bodies over max_request_bytes get 413 (the connection is then closed);
// bodies nested deeper than kMaxJsonDepth (types.h) get 400 before any DOM
// is built; bodies that are not JSON, or JSON of the wrong shape, get 400
// with a message naming the problem; other paths 404; a known path with the
// wrong method 405. None of these changes anything. HTTP/1.1 keep-alive;
// HTTPS only when a certificate and key are given.
//
// Who may call: with tls.client_ca_file, only clients whose certificate
// that CA signed (the TLS handshake fails for the rest, before any
// request is read). Without it, Start refuses a listen address beyond
// loopback unless allow_unauthenticated, and logs at error level when it
// is taken. Every bind, bound or refused, is one log line naming the
// caller (certificate subject and peer address), the pod, the node, the
// devices and the result.
//
// Sockets, TLS, keep-alive and limits are the shared HTTP(S) server's
// (k8s_adapter/http/https_server.h).
//
// Threads: `threads` threads run the io_context (parsing, filter,
// prioritize); binds, which wait on Slurm, the journal and the API server,
// run on a pool of `bind_threads` (0: as many as `threads`) so they never
// hold up filter calls.
//
// Metrics (in `registry`): duet_extender_requests_total{verb,code},
// duet_extender_request_seconds{verb} and
// duet_extender_binds_total{result=bound|refused|invalid}.
//
// Thread-safety: Start/Stop from one thread; everything else is internal.

#include <cstddef>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "bridge/config/extender_settings.h"
#include "k8s_adapter/extender/extender.h"
#include "k8s_adapter/http/https_server.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace duet {
namespace extender {

// The configured settings (ExtenderSettings: listen, url_prefix, tls,
// max_request_bytes, threads; bridge/config/extender_settings.h, which
// documents them) and what only a program sets. Start checks them with
// ExtenderSettings::Validate.
struct ServerOptions : ExtenderSettings {
  // listen defaults to "127.0.0.1:0" here (the config's "" means no
  // extender); see port().
  ServerOptions() { listen = "127.0.0.1:0"; }

  // Idle keep-alive connections are closed after this long.
  int idle_timeout_seconds = 120;
  // Serves POST <prefix>/_echo (benchmarks and tests only).
  bool enable_echo = false;
  // Where the metrics go; null: a private registry.
  std::shared_ptr<prometheus::Registry> registry;
};

// One answer, before it goes on the wire (also what tests check).
using HttpReply = http::HttpReply;

// The routing and JSON layer, without sockets. Thread-safe.
class Handler {
 public:
  // `registry` (may be null: no metrics) gets duet_extender_binds_total.
  Handler(Extender* extender, std::string url_prefix, bool enable_echo,
          prometheus::Registry* registry = nullptr);
  // `method` is the HTTP method ("POST"), `target` the request target (a
  // query string is ignored). `peer` names the caller for the bind log
  // (certificate subject and address; "" when unknown).
  HttpReply Handle(const std::string& method, const std::string& target, const std::string& body,
                   const std::string& peer = "") const;
  // The metrics label of a target: filter, prioritize, bind, healthz, echo
  // or other.
  std::string Verb(const std::string& target) const;

 private:
  // The reply whose body `answer` makes of the args parsed from `body`, or
  // the 400 reply when they do not parse.
  HttpReply WithArgs(const std::string& body,
                     absl::FunctionRef<std::string(const ExtenderArgs&)> answer) const;
  HttpReply Filter(const std::string& body) const;
  HttpReply Prioritize(const std::string& body) const;
  HttpReply Bind(const std::string& body, const std::string& peer) const;
  void CountBind(const char* result) const;

  Extender* const extender_;
  const std::string prefix_;
  const bool enable_echo_;
  // duet_extender_binds_total by result; null without a registry.
  prometheus::Counter* binds_bound_ = nullptr;
  prometheus::Counter* binds_refused_ = nullptr;
  prometheus::Counter* binds_invalid_ = nullptr;
};

class ExtenderServer {
 public:
  // Checks the options (ExtenderSettings::Validate), binds and starts
  // serving. Errors name the field (extender.listen, extender.tls.cert_file,
  // extender.tls.client_ca_file, extender.allow_unauthenticated) and the
  // reason.
  static absl::StatusOr<std::unique_ptr<ExtenderServer>> Start(Extender* extender,
                                                                ServerOptions options);
  ~ExtenderServer();
  ExtenderServer(const ExtenderServer&) = delete;
  ExtenderServer& operator=(const ExtenderServer&) = delete;

  // The bound port.
  int port() const;
  bool tls() const;
  // Stops accepting, closes connections, joins the threads. Idempotent.
  void Stop();

 private:
  class Impl;
  explicit ExtenderServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace extender
}  // namespace duet
