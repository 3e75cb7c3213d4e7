#include "k8s_adapter/dra/webhook.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "k8s_adapter/dra/admission_review.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace k8s_dra {

namespace {

http::HttpReply Text(int status, std::string message) {
  http::HttpReply r;
  r.status = status;
  r.content_type = "text/plain; charset=utf-8";
  r.body = std::move(message);
  r.body.push_back('\n');
  return r;
}

std::string Path(const std::string& target) { return target.substr(0, target.find('?')); }

}  // namespace

WebhookHandler::WebhookHandler(dra::AdmissionGate* gate, prometheus::Registry* registry)
    : gate_(gate) {
  if (registry == nullptr) return;
  auto& requests = prometheus::BuildCounter()
                       .Name("duet_dra_webhook_requests_total")
                       .Help("DRA admission webhook reviews by result: allowed, denied (the "
                             "Lender refused), invalid (not a resourceclaims/status review)")
                       .Register(*registry);
  allowed_ = &requests.Add({{"result", "allowed"}});
  denied_ = &requests.Add({{"result", "denied"}});
  invalid_ = &requests.Add({{"result", "invalid"}});
  seconds_ = &prometheus::BuildHistogram()
                  .Name("duet_dra_webhook_seconds")
                  .Help("DRA admission webhook time from a complete review to its answer")
                  .Register(*registry)
                  .Add({}, prometheus::Histogram::BucketBoundaries{
                               0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                               0.1, 0.25, 0.5, 1, 2.5, 5, 10});
}

http::HttpReply WebhookHandler::Handle(const std::string& method, const std::string& target,
                                       const std::string& body) const {
  const std::string path = Path(target);
  if (path == "/healthz") {
    if (method != "GET" && method != "HEAD") {
      http::HttpReply r = Text(405, absl::StrCat(method, " is not allowed on /healthz; use GET"));
      r.allow = "GET";
      return r;
    }
    return Text(200, "ok");
  }
  if (path != kAdmissionPath) return Text(404, absl::StrCat("no such endpoint: ", target));
  if (method != "POST") {
    http::HttpReply r = Text(405, absl::StrCat(method, " is not allowed on ", path, "; use POST"));
    r.allow = "POST";
    return r;
  }
  const auto start = std::chrono::steady_clock::now();
  http::HttpReply r = Admit(body);
  if (seconds_ != nullptr) {
    seconds_->Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return r;
}

http::HttpReply WebhookHandler::Admit(const std::string& body) const {
  absl::StatusOr<ParsedReview> review = ParseAdmissionReviewBody(body);
  if (!review.ok()) {
    if (invalid_ != nullptr) invalid_->Increment();
    spdlog::warn("dra webhook: invalid review: {}", std::string(review.status().message()));
    return Text(400, std::string(review.status().message()));
  }
  const dra::AdmissionVerdict verdict = gate_->Review(review->ask);
  prometheus::Counter* c = verdict.allowed ? allowed_ : denied_;
  if (c != nullptr) c->Increment();
  if (!verdict.allowed) {
    spdlog::info("dra webhook: refused claim {}/{} ({}): {} {}", review->ask.claim.ns,
                 review->ask.claim.name, review->ask.claim.uid, verdict.reason, verdict.message);
  }
  http::HttpReply r;
  r.body = AdmissionResponse(review->api_version, review->uid, verdict)
               .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

WebhookServer::WebhookServer(std::unique_ptr<WebhookHandler> handler,
                             std::unique_ptr<http::HttpsServer> server)
    : handler_(std::move(handler)), server_(std::move(server)) {}

absl::StatusOr<std::unique_ptr<WebhookServer>> WebhookServer::Start(dra::AdmissionGate* gate,
                                                                    WebhookOptions options) {
  if (gate == nullptr) return absl::InvalidArgumentError("dra webhook: no admission gate");
  if (options.listen.empty()) {
    return absl::InvalidArgumentError("dra.webhook.listen: required (host:port)");
  }
  if (options.cert_file.empty() || options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "dra.webhook.tls.cert_file and dra.webhook.tls.key_file: required (kube-apiserver calls "
        "admission webhooks over HTTPS only)");
  }
  auto handler = std::make_unique<WebhookHandler>(gate, options.registry);
  http::HttpsServerOptions o;
  o.listen = options.listen;
  o.cert_file = options.cert_file;
  o.key_file = options.key_file;
  o.client_ca_file = options.client_ca_file;
  o.max_request_bytes = options.max_request_bytes;
  o.threads = options.threads;
  o.blocking_threads = options.admission_threads;
  o.config_prefix = "dra.webhook.";
  o.log_name = "dra webhook";
  const WebhookHandler* h = handler.get();
  o.handler = [h](const std::string& method, const std::string& target, const std::string& body,
                  const std::string&) { return h->Handle(method, target, body); };
  // The gate waits for the ledger step to be durable.
  o.blocking = [](const std::string& target) { return Path(target) == kAdmissionPath; };
  absl::StatusOr<std::unique_ptr<http::HttpsServer>> server = http::HttpsServer::Start(std::move(o));
  if (!server.ok()) return server.status();
  return std::unique_ptr<WebhookServer>(new WebhookServer(std::move(handler), std::move(*server)));
}

WebhookServer::~WebhookServer() { Stop(); }

void WebhookServer::Stop() { server_->Stop(); }

}  // namespace k8s_dra
}  // namespace duet
