#pragma once

// The DRA lending mode's validating admission webhook (docs/dra.md
// "Admission"), served by duet-bridge over HTTPS on the shared server
// (k8s_adapter/http/https_server.h):
//
//   POST /validate-resourceclaim-status   an AdmissionReview (admission.k8s.io/v1)
//                                         of a resourceclaims/status write
//   GET  /healthz                         "ok"
//
// The review is parsed (admission_review.h) and put to the AdmissionGate (the
// Lender), whose verdict goes back in the AdmissionReview answer: 200 with
// allowed true, or allowed false and status {403, reason, message}. A body
// that is not such a review is 400 with a message naming the problem (and the
// gate is not asked; with failurePolicy Fail the apiserver refuses the
// write). A query (kube-apiserver adds ?timeout=10s) is ignored. Other paths
// 404, the wrong method 405, bodies over max_request_bytes 413.
//
// The ValidatingWebhookConfiguration that points here: rules [{apiGroups
// [resource.k8s.io], apiVersions ["*"], operations [UPDATE], resources
// [resourceclaims/status]}], failurePolicy Fail, sideEffects NoneOnDryRun,
// admissionReviewVersions [v1], timeoutSeconds 10, clientConfig.caBundle the
// CA of tls.cert_file.
//
// Admissions run on a pool (the gate waits on the ledger's journal), not on
// the io threads.
//
// Metrics (in `registry`, may be null): duet_dra_webhook_requests_total
// {result=allowed|denied|invalid} and duet_dra_webhook_seconds (from a
// complete request to its answer, admissions only).
//
// Thread-safety: Start/Stop from one thread; the gate is called concurrently.

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "bridge/dra/dra_device.h"
#include "k8s_adapter/http/https_server.h"
#include "prometheus/counter.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace duet {
namespace k8s_dra {

inline constexpr char kAdmissionPath[] = "/validate-resourceclaim-status";

struct WebhookOptions {
  // dra.webhook.listen, "host:port" (port 0: any free port).
  std::string listen = "127.0.0.1:0";
  // dra.webhook.tls: the serving certificate and key (PEM), both required:
  // kube-apiserver calls webhooks over HTTPS only.
  std::string cert_file;
  std::string key_file;
  // Optional: only clients with a certificate this CA signed (the
  // apiserver's --proxy-client / admission-control kubeconfig identity).
  std::string client_ca_file;
  size_t max_request_bytes = 3 << 20;  // a claim is at most ~1.5 MiB in etcd, twice
  // The io threads, and the admissions that may wait on the ledger's journal
  // at once (dra.webhook.admission_threads): they share one fsync, so with
  // too few of them concurrent calls queue for one fsync each.
  int threads = 2;
  int admission_threads = 16;
  prometheus::Registry* registry = nullptr;
};

// The routing and JSON layer, without sockets (what the server runs; tests
// call it directly). Thread-safe.
class WebhookHandler {
 public:
  // `registry` may be null (no metrics).
  WebhookHandler(dra::AdmissionGate* gate, prometheus::Registry* registry);
  http::HttpReply Handle(const std::string& method, const std::string& target,
                         const std::string& body) const;

 private:
  http::HttpReply Admit(const std::string& body) const;

  dra::AdmissionGate* const gate_;
  prometheus::Counter* allowed_ = nullptr;
  prometheus::Counter* denied_ = nullptr;
  prometheus::Counter* invalid_ = nullptr;
  prometheus::Histogram* seconds_ = nullptr;
};

class WebhookServer {
 public:
  // INVALID_ARGUMENT naming the setting (dra.webhook.tls.cert_file,
  // dra.webhook.listen, ...) when one is missing or unusable.
  static absl::StatusOr<std::unique_ptr<WebhookServer>> Start(dra::AdmissionGate* gate,
                                                              WebhookOptions options);
  ~WebhookServer();
  WebhookServer(const WebhookServer&) = delete;
  WebhookServer& operator=(const WebhookServer&) = delete;

  int port() const { return server_->port(); }
  // Stops serving (admissions running finish). Idempotent.
  void Stop();

 private:
  WebhookServer(std::unique_ptr<WebhookHandler> handler, std::unique_ptr<http::HttpsServer> server);
  std::unique_ptr<WebhookHandler> handler_;
  std::unique_ptr<http::HttpsServer> server_;
};

}  // namespace k8s_dra
}  // namespace duet
