#pragma once

// An HTTP/1.1 server over Boost.Beast and Asio, the socket part that duet's
// HTTP endpoints share (the scheduler extender, k8s_adapter/extender; the DRA
// admission webhook, k8s_adapter/dra/webhook.h): listening, TLS (a serving
// certificate, optionally client certificates), keep-alive, idle timeouts,
// body and header limits, the io threads and a pool for handlers that block.
// What a request means is the caller's `handler`.
//
// Limits: a body over max_request_bytes gets 413 and the connection is
// closed; headers over 64 KiB get 431; a request that is not HTTP gets 400.
// None of these reaches the handler.
//
// TLS: with cert_file and key_file, HTTPS only. With client_ca_file, only
// clients whose certificate that CA signed get past the handshake; their
// subject is part of `peer`.
//
// Thread-safety: Start/Stop from one thread. The handler and the callbacks
// run on the io threads (or the blocking pool) concurrently.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace duet {
namespace http {

// One answer, before it goes on the wire.
struct HttpReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::string allow;  // the Allow header (for 405)
};

// `method` ("POST"), `target` (path and query, as sent), `body`, and `peer`:
// "SUBJECT at ADDR:PORT" with a verified client certificate, else
// "ADDR:PORT".
using HttpHandler = std::function<HttpReply(const std::string& method, const std::string& target,
                                            const std::string& body, const std::string& peer)>;

struct HttpsServerOptions {
  // "host:port" (port 0: any free port; see HttpsServer::port()). An empty
  // host listens on every address.
  std::string listen = "127.0.0.1:0";
  // PEM files; cert_file and key_file together: HTTPS.
  std::string cert_file;
  std::string key_file;
  // PEM CA bundle: clients must present a certificate it signed.
  std::string client_ca_file;
  size_t max_request_bytes = 8 << 20;
  // io threads, and as many in the pool for blocking requests unless
  // blocking_threads > 0 says how many.
  int threads = 2;
  int blocking_threads = 0;
  int idle_timeout_seconds = 120;
  // How errors name the settings: "<config_prefix>listen",
  // "<config_prefix>tls.cert_file" ("extender.", "dra.webhook.").
  std::string config_prefix;
  // The name in log lines ("extender").
  std::string log_name = "http";

  HttpHandler handler;
  // Requests for which this is true run on the blocking pool, not on an io
  // thread (null: none). Their answers are still written.
  std::function<bool(const std::string& target)> blocking;
  // Called once per answered request (null: not called). `target` is "" for
  // a request whose start line was not read (431, 400 malformed).
  std::function<void(const std::string& target, int status, double seconds)> observe;
  // A failed TLS handshake: no_certificate, bad_certificate, not_tls, other
  // (a peer that just went away is not reported).
  std::function<void(const char* reason)> tls_failure;
  // Asked once the listen address is resolved, before binding: whether it is
  // a loopback address and whether clients must present certificates. A
  // non-OK status stops Start with it (null: anything is accepted).
  std::function<absl::Status(bool loopback, bool client_certs)> check_exposure;
};

class HttpsServer {
 public:
  // Loads the TLS files, binds and starts serving. INVALID_ARGUMENT names the
  // setting (<config_prefix>tls.cert_file ...) for unusable files or
  // addresses; UNAVAILABLE when the address cannot be bound; no handler is
  // INVALID_ARGUMENT.
  static absl::StatusOr<std::unique_ptr<HttpsServer>> Start(HttpsServerOptions options);
  ~HttpsServer();
  HttpsServer(const HttpsServer&) = delete;
  HttpsServer& operator=(const HttpsServer&) = delete;

  int port() const;
  bool tls() const;
  // Stops accepting, closes connections, joins the threads; requests already
  // running on the blocking pool finish (their answers are not sent).
  // Idempotent.
  void Stop();

 private:
  class Impl;
  explicit HttpsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace http
}  // namespace duet
