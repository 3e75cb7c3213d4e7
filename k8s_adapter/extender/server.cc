#include "k8s_adapter/extender/server.h"

#include <map>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "k8s_adapter/http/https_server.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace extender {
namespace {

HttpReply Text(int status, std::string message) {
  HttpReply r;
  r.status = status;
  r.content_type = "text/plain; charset=utf-8";
  r.body = std::move(message);
  r.body.push_back('\n');
  return r;
}

HttpReply Json(const nlohmann::json& j) {
  HttpReply r;
  r.body = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return r;
}

// Parses a request body; a 400 reply (with the parser's message) when it is
// not JSON.
std::optional<nlohmann::json> ParseBody(const std::string& body, HttpReply* error) {
  // Before the DOM: a megabyte of '[' would cost hundreds of MiB.
  if (absl::Status depth = CheckJsonDepth(body); !depth.ok()) {
    *error = Text(400, std::string(depth.message()));
    return std::nullopt;
  }
  // nlohmann reports bad input by throwing; this is the one call site. Not
  // only parse_error: a number too large for a double ("1e999") is
  // out_of_range, so every json::exception is caught.
  try {
    return nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    *error = Text(400, absl::StrCat("the body is not valid JSON: ", e.what()));
  }
  return std::nullopt;
}

}  // namespace

// ---------------------------------------------------------------- Handler

Handler::Handler(Extender* extender, std::string url_prefix, bool enable_echo,
                 prometheus::Registry* registry)
    : extender_(extender),
      prefix_(absl::StripSuffix(url_prefix, "/")),
      enable_echo_(enable_echo) {
  if (registry != nullptr) {
    auto& binds = prometheus::BuildCounter()
                      .Name("duet_extender_binds_total")
                      .Help("Scheduler extender binds by result: bound, refused (the pod is not "
                            "duet's, unknown, replaced, or no room), invalid (a bad body)")
                      .Register(*registry);
    binds_bound_ = &binds.Add({{"result", "bound"}});
    binds_refused_ = &binds.Add({{"result", "refused"}});
    binds_invalid_ = &binds.Add({{"result", "invalid"}});
  }
}

void Handler::CountBind(const char* result) const {
  prometheus::Counter* c = std::string_view(result) == "bound"     ? binds_bound_
                           : std::string_view(result) == "refused" ? binds_refused_
                                                                   : binds_invalid_;
  if (c != nullptr) c->Increment();
}

std::string Handler::Verb(const std::string& target) const {
  absl::string_view path = target;
  path = path.substr(0, path.find('?'));
  if (path == "/healthz") return "healthz";
  if (!absl::ConsumePrefix(&path, prefix_)) return "other";
  if (path == "/filter") return "filter";
  if (path == "/prioritize") return "prioritize";
  if (path == "/bind") return "bind";
  if (enable_echo_ && path == "/_echo") return "echo";
  return "other";
}

HttpReply Handler::Handle(const std::string& method, const std::string& target,
                          const std::string& body, const std::string& peer) const {
  const std::string verb = Verb(target);
  if (verb == "other") return Text(404, absl::StrCat("no such endpoint: ", target));
  const std::string want = verb == "healthz" ? "GET" : "POST";
  if (method != want && !(verb == "healthz" && method == "HEAD")) {
    HttpReply r = Text(405, absl::StrCat(method, " is not allowed on ", target, "; use ", want));
    r.allow = want;
    return r;
  }
  if (verb == "healthz") return Text(200, "ok");
  if (verb == "echo") {
    HttpReply r;
    r.body = body;
    return r;
  }
  if (verb == "filter") return Filter(body);
  if (verb == "prioritize") return Prioritize(body);
  return Bind(body, peer);
}

// A filter or prioritize call: ExtenderArgs from the body (the fast path for
// the usual shape, see ParseExtenderArgsFast, else the general one, which
// also words every error: 400), and the reply whose body `answer` makes of
// them.
HttpReply Handler::WithArgs(const std::string& body,
                            absl::FunctionRef<std::string(const ExtenderArgs&)> answer) const {
  std::optional<ExtenderArgs> args = ParseExtenderArgsFast(body);
  if (!args.has_value()) {
    HttpReply error;
    std::optional<nlohmann::json> j = ParseBody(body, &error);
    if (!j.has_value()) return error;
    absl::StatusOr<ExtenderArgs> parsed = ParseExtenderArgs(std::move(*j));
    if (!parsed.ok()) return Text(400, std::string(parsed.status().message()));
    args = std::move(*parsed);
  }
  HttpReply r;
  r.body = answer(*args);
  return r;
}

HttpReply Handler::Filter(const std::string& body) const {
  return WithArgs(body, [this](const ExtenderArgs& a) {
    return FilterResultBody(extender_->Filter(a), &a);
  });
}

HttpReply Handler::Prioritize(const std::string& body) const {
  // The usual body: the names as views into one block, and the pod's request
  // from the extender's cache (the filter of the same pod read it) without a
  // DOM of the pod; a new pod is parsed here. Anything else, and a pod that
  // does not parse, takes the general path (which words the 400).
  if (std::optional<PrioritizeArgs> p = ParsePrioritizeArgsFast(body)) {
    std::optional<std::vector<int64_t>> scores =
        extender_->PrioritizeScoresFromText(p->pod_text, p->node_names);
    if (!scores.has_value()) {
      if (std::optional<nlohmann::json> pod = ParsePodText(p->pod_text)) {
        scores = extender_->PrioritizeScores(*pod, p->pod_text, p->node_names);
      }
    }
    if (scores.has_value()) {
      HttpReply r;
      r.body = PriorityListBodyOfViews(p->node_names, *scores);
      return r;
    }
  }
  return WithArgs(body, [this](const ExtenderArgs& a) {
    return PriorityListBody(a.node_names, extender_->PrioritizeScores(a));
  });
}

HttpReply Handler::Bind(const std::string& body, const std::string& peer) const {
  HttpReply error;
  std::optional<nlohmann::json> j = ParseBody(body, &error);
  absl::StatusOr<BindingArgs> args =
      j.has_value() ? ParseBindingArgs(*j) : absl::InvalidArgumentError(error.body);
  if (!args.ok()) {
    // Not a bind at all, but someone asked for one: the same log as binds.
    CountBind("invalid");
    spdlog::warn("extender bind: result=invalid caller=\"{}\" error=\"{}\"",
                 peer.empty() ? "unknown" : peer,
                 std::string(absl::StripTrailingAsciiWhitespace(args.status().message())));
    return j.has_value() ? Text(400, std::string(args.status().message())) : error;
  }
  // Extender::Bind logs the line for this bind (it knows the devices).
  absl::Status s = extender_->Bind(*args, peer);
  CountBind(s.ok() ? "bound" : "refused");
  // The protocol's way to refuse: 200 with Error set; kube-scheduler retries.
  return Json(BindingResultJson(s.ok() ? "" : std::string(s.message())));
}

// ---------------------------------------------------------------- server

namespace {

struct ServerMetrics {
  explicit ServerMetrics(prometheus::Registry& registry)
      : requests(prometheus::BuildCounter()
                     .Name("duet_extender_requests_total")
                     .Help("Scheduler extender HTTP requests by verb and HTTP status code")
                     .Register(registry)),
        latency(prometheus::BuildHistogram()
                    .Name("duet_extender_request_seconds")
                    .Help("Scheduler extender time from a complete request to its answer, by verb")
                    .Register(registry)),
        tls_failures(prometheus::BuildCounter()
                         .Name("duet_extender_tls_failures_total")
                         .Help("Scheduler extender connections whose TLS handshake failed, by "
                               "reason: no_certificate, bad_certificate (not signed by "
                               "tls.client_ca_file, or invalid), not_tls, other")
                         .Register(registry)) {
    for (const char* r : {"no_certificate", "bad_certificate", "not_tls", "other"}) {
      tls_failure_by_reason.emplace(r, &tls_failures.Add({{"reason", r}}));
    }
    for (const char* v : {"filter", "prioritize", "bind", "healthz", "echo", "other"}) {
      histograms.emplace(v, &latency.Add({{"verb", v}},
                                         prometheus::Histogram::BucketBoundaries{
                                             0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                             0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}));
    }
  }
  void Observe(const std::string& verb, int status, double seconds) {
    requests.Add({{"verb", verb}, {"code", std::to_string(status)}}).Increment();
    auto it = histograms.find(verb);
    if (it != histograms.end()) it->second->Observe(seconds);
  }
  void CountTlsFailure(const char* reason) {
    auto it = tls_failure_by_reason.find(reason);
    if (it != tls_failure_by_reason.end()) it->second->Increment();
  }

  prometheus::Family<prometheus::Counter>& requests;
  prometheus::Family<prometheus::Histogram>& latency;
  prometheus::Family<prometheus::Counter>& tls_failures;
  std::map<std::string, prometheus::Histogram*> histograms;
  std::map<std::string, prometheus::Counter*> tls_failure_by_reason;
};

}  // namespace

// The extender's routing, metrics and exposure rule over the shared HTTP(S)
// server (k8s_adapter/http/https_server.h).
class ExtenderServer::Impl {
 public:
  Impl(Extender* extender, ServerOptions options)
      : options_(std::move(options)),
        registry_(options_.registry ? options_.registry : std::make_shared<prometheus::Registry>()),
        handler_(extender, options_.url_prefix, options_.enable_echo, registry_.get()),
        metrics_(*registry_) {}

  absl::Status Listen() {
    http::HttpsServerOptions o;
    o.listen = options_.listen;
    o.cert_file = options_.tls.cert_file;
    o.key_file = options_.tls.key_file;
    o.client_ca_file = options_.tls.client_ca_file;
    o.max_request_bytes = static_cast<size_t>(options_.max_request_bytes);
    o.threads = options_.threads;
    o.blocking_threads = options_.bind_threads;
    o.idle_timeout_seconds = options_.idle_timeout_seconds;
    o.config_prefix = "extender.";
    o.log_name = "extender";
    o.handler = [this](const std::string& method, const std::string& target,
                       const std::string& body, const std::string& peer) {
      return handler_.Handle(method, target, body, peer);
    };
    // Binds wait on Slurm, the journal and the API server: off the io threads.
    o.blocking = [this](const std::string& target) { return handler_.Verb(target) == "bind"; };
    o.observe = [this](const std::string& target, int status, double seconds) {
      metrics_.Observe(handler_.Verb(target), status, seconds);
    };
    o.tls_failure = [this](const char* reason) { metrics_.CountTlsFailure(reason); };
    // /bind lends duet-bridge's pods/binding permission to the caller: an
    // address others can reach needs client certificates, or the explicit
    // acceptance (the config's validation says the same).
    const std::string listen = options_.listen;
    const bool allow = options_.allow_unauthenticated;
    o.check_exposure = [listen, allow, https = !options_.tls.cert_file.empty()](
                           bool loopback, bool client_certs) -> absl::Status {
      if (client_certs || loopback) return absl::OkStatus();
      if (!allow) {
        return absl::InvalidArgumentError(absl::StrCat(
            "extender.listen: ", listen,
            " is beyond loopback without client certificates: any peer that reaches it may "
            "bind pods to nodes with duet-bridge's permission; set extender.tls.client_ca_file "
            "(kube-scheduler's client CA), listen on loopback only, or set "
            "extender.allow_unauthenticated: true to accept it"));
      }
      spdlog::error(
          "extender.listen {} is {} beyond loopback without client certificates "
          "(extender.allow_unauthenticated: true): any peer that reaches it may bind pods to "
          "nodes with duet-bridge's permission",
          listen, https ? "HTTPS" : "plain HTTP");
      return absl::OkStatus();
    };
    absl::StatusOr<std::unique_ptr<http::HttpsServer>> server = http::HttpsServer::Start(std::move(o));
    if (!server.ok()) return server.status();
    server_ = std::move(*server);
    return absl::OkStatus();
  }

  void Stop() {
    if (server_ != nullptr) server_->Stop();
  }

  int port() const { return server_->port(); }
  bool tls() const { return server_->tls(); }

 private:
  const ServerOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  Handler handler_;
  ServerMetrics metrics_;
  // Last: stopped and destroyed first, while what its threads use is alive.
  std::unique_ptr<http::HttpsServer> server_;
};

ExtenderServer::ExtenderServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<ExtenderServer>> ExtenderServer::Start(Extender* extender,
                                                                      ServerOptions options) {
  if (absl::Status s = options.Validate("extender."); !s.ok()) return s;
  auto impl = std::make_unique<Impl>(extender, std::move(options));
  absl::Status s = impl->Listen();
  if (!s.ok()) return s;
  return std::unique_ptr<ExtenderServer>(new ExtenderServer(std::move(impl)));
}

ExtenderServer::~ExtenderServer() { Stop(); }

int ExtenderServer::port() const { return impl_->port(); }
bool ExtenderServer::tls() const { return impl_->tls(); }
void ExtenderServer::Stop() { impl_->Stop(); }

}  // namespace extender
}  // namespace duet
