#include "k8s_adapter/extender/server.h"

#include <array>
#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/ssl.hpp"
#include "boost/asio/strand.hpp"
#include "boost/asio/thread_pool.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "boost/beast/ssl.hpp"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "openssl/err.h"
#include "openssl/ssl.h"
#include "openssl/x509.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace extender {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

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
  return WithArgs(body, [this](const ExtenderArgs& a) {
    return PriorityListBody(extender_->Prioritize(a));
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

  // A failed handshake's reason; "" for a peer that closed before or during
  // it (a TCP probe, a client that went away), which is not counted.
  static const char* TlsFailureReason(const beast::error_code& ec) {
    if (ec == net::error::eof || ec == net::ssl::error::stream_truncated ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted) {
      return "";
    }
    if (ec.category() == net::error::get_ssl_category()) {
      switch (ERR_GET_REASON(static_cast<unsigned long>(ec.value()))) {
        case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
          return "no_certificate";
        case SSL_R_CERTIFICATE_VERIFY_FAILED:
          return "bad_certificate";
        case SSL_R_HTTP_REQUEST:
        case SSL_R_WRONG_VERSION_NUMBER:
          return "not_tls";
        default:
          break;
      }
    }
    return "other";
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

// What every session shares (owned by the server, outlives the sessions'
// work because the server joins its threads before it goes).
struct Shared {
  const Handler* handler = nullptr;
  size_t max_body = 0;
  std::chrono::seconds idle{120};
  ServerMetrics* metrics = nullptr;
  net::thread_pool* bind_pool = nullptr;
};

// The client certificate's subject (RFC 2253), "" without one.
std::string PeerSubject(SSL* ssl) {
  X509* cert = SSL_get1_peer_certificate(ssl);
  if (cert == nullptr) return "";
  std::string out;
  BIO* bio = BIO_new(BIO_s_mem());
  if (bio != nullptr &&
      X509_NAME_print_ex(bio, X509_get_subject_name(cert), 0, XN_FLAG_RFC2253) >= 0) {
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio, &data);
    if (n > 0) out.assign(data, static_cast<size_t>(n));
  }
  BIO_free(bio);
  X509_free(cert);
  return out;
}

template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

 public:
  template <class... Args>
  Session(Shared* shared, Args&&... args) : shared_(shared), stream_(std::forward<Args>(args)...) {
    // Large first reads: without this Beast reads a 100 KB body in small
    // pieces (several times slower).
    buffer_.reserve(256 * 1024);
  }

  void Run() {
    beast::error_code ec;
    const tcp::endpoint remote = beast::get_lowest_layer(stream_).socket().remote_endpoint(ec);
    peer_ = ec ? std::string("unknown peer")
               : absl::StrCat(remote.address().to_string(), ":", remote.port());
    if constexpr (kTls) {
      beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(30));
      stream_.async_handshake(ssl::stream_base::server,
                              beast::bind_front_handler(&Session::OnHandshake, this->shared_from_this()));
    } else {
      DoRead();
    }
  }

 private:
  void OnHandshake(beast::error_code ec) {
    // Not a TLS client, one without an acceptable client certificate (with
    // tls.client_ca_file), or it went away: nothing was read.
    if (ec) {
      const char* reason = ServerMetrics::TlsFailureReason(ec);
      if (*reason != '\0' && shared_->metrics != nullptr) shared_->metrics->CountTlsFailure(reason);
      spdlog::debug("extender: TLS handshake with {} failed: {}", peer_, ec.message());
      return;
    }
    const std::string subject = PeerSubject(stream_.native_handle());
    if (!subject.empty()) peer_ = absl::StrCat(subject, " at ", peer_);
    DoRead();
  }

  void DoRead() {
    parser_.emplace();
    parser_->body_limit(shared_->max_body);
    parser_->header_limit(64 * 1024);
    beast::get_lowest_layer(stream_).expires_after(shared_->idle);
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Session::OnRead, this->shared_from_this()));
  }

  void OnRead(beast::error_code ec, size_t) {
    if (ec == http::error::end_of_stream) return DoClose();
    const auto start = std::chrono::steady_clock::now();
    if (ec == http::error::body_limit) {
      // The start line is parsed by now (the limit is checked against the
      // Content-Length header or the body read so far).
      const std::string target(parser_->get().target());
      return Write(Text(413, absl::StrCat("request body larger than ", shared_->max_body,
                                          " bytes (extender.max_request_bytes)")),
                   /*keep_alive=*/false, shared_->handler->Verb(target), start);
    }
    if (ec == http::error::header_limit) {
      return Write(Text(431, "request header too large"), false, "other", start);
    }
    if (ec) {
      if (ec.category() == beast::http::make_error_code(http::error::bad_method).category()) {
        return Write(Text(400, absl::StrCat("malformed HTTP request: ", ec.message())), false,
                     "other", start);
      }
      return;  // timeout, reset, TLS error: drop the connection
    }
    http::request<http::string_body> req = parser_->release();
    const std::string method(req.method_string());
    const std::string target(req.target());
    const bool keep_alive = req.keep_alive();
    const std::string verb = shared_->handler->Verb(target);
    if (verb == "bind") {
      // Binds wait on Slurm, the journal and the API server: off the io threads.
      auto self = this->shared_from_this();
      net::post(*shared_->bind_pool, [self, method, target, keep_alive, verb, start,
                                      body = std::move(req.body())]() mutable {
        HttpReply reply = self->shared_->handler->Handle(method, target, body, self->peer_);
        net::post(self->stream_.get_executor(), [self, reply = std::move(reply), keep_alive, verb,
                                                 start]() mutable {
          self->Write(std::move(reply), keep_alive, verb, start);
        });
      });
      return;
    }
    Write(shared_->handler->Handle(method, target, req.body(), peer_), keep_alive, verb, start);
  }

  void Write(HttpReply reply, bool keep_alive, const std::string& verb,
             std::chrono::steady_clock::time_point start) {
    auto res = std::make_shared<http::response<http::string_body>>();
    res->version(11);
    res->result(static_cast<http::status>(reply.status));
    res->set(http::field::server, "duet-bridge");
    res->set(http::field::content_type, reply.content_type);
    if (!reply.allow.empty()) res->set(http::field::allow, reply.allow);
    res->keep_alive(keep_alive);
    res->body() = std::move(reply.body);
    res->prepare_payload();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    shared_->metrics->Observe(verb, reply.status, seconds);
    res_ = res;
    beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(30));
    http::async_write(stream_, *res_,
                      beast::bind_front_handler(&Session::OnWrite, this->shared_from_this(),
                                                !keep_alive));
  }

  void OnWrite(bool close, beast::error_code ec, size_t) {
    res_.reset();
    if (ec) return;
    if (close) return DoClose();
    DoRead();
  }

  void DoClose() {
    if constexpr (kTls) {
      beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(5));
      stream_.async_shutdown([self = this->shared_from_this()](beast::error_code) {});
    } else {
      // Half-close, then read what the client still sends (e.g. the rest of
      // an oversized body) so the close does not reset the connection before
      // the client has read our answer.
      beast::error_code ec;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
      if (ec) return;
      beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(5));
      Drain();
    }
  }

  void Drain() {
    if constexpr (!kTls) {
      stream_.async_read_some(net::buffer(scratch_),
                              [self = this->shared_from_this()](beast::error_code ec, size_t) {
                                if (!ec) self->Drain();
                              });
    }
  }

  Shared* const shared_;
  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<http::response<http::string_body>> res_;
  std::array<char, 16 * 1024> scratch_;
  // Who is at the other end: "SUBJECT at ADDR:PORT" once a client
  // certificate is verified, else "ADDR:PORT". Set in Run and OnHandshake,
  // read after (the session's strand).
  std::string peer_;
};

}  // namespace

class ExtenderServer::Impl {
 public:
  Impl(Extender* extender, ServerOptions options)
      : options_(std::move(options)),
        registry_(options_.registry ? options_.registry : std::make_shared<prometheus::Registry>()),
        handler_(extender, options_.url_prefix, options_.enable_echo, registry_.get()),
        metrics_(*registry_),
        bind_pool_(static_cast<size_t>(std::max(1, options_.threads))),
        ioc_(std::max(1, options_.threads)),
        acceptor_(ioc_) {
    shared_.handler = &handler_;
    shared_.max_body = static_cast<size_t>(options_.max_request_bytes);
    shared_.idle = std::chrono::seconds(options_.idle_timeout_seconds);
    shared_.metrics = &metrics_;
    shared_.bind_pool = &bind_pool_;
  }

  absl::Status Listen() {
    if (!options_.tls.cert_file.empty()) {
      ssl_.emplace(ssl::context::tls_server);
      ssl_->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                        ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
      beast::error_code ec;
      ssl_->use_certificate_chain_file(options_.tls.cert_file, ec);
      if (ec) {
        return absl::InvalidArgumentError(absl::StrCat(
            "extender.tls.cert_file ", options_.tls.cert_file, ": ", ec.message()));
      }
      ssl_->use_private_key_file(options_.tls.key_file, ssl::context::pem, ec);
      if (ec) {
        return absl::InvalidArgumentError(absl::StrCat(
            "extender.tls.key_file ", options_.tls.key_file, ": ", ec.message()));
      }
      const std::string& client_ca = options_.tls.client_ca_file;
      if (!client_ca.empty()) {
        ssl_->load_verify_file(client_ca, ec);
        if (ec) {
          return absl::InvalidArgumentError(
              absl::StrCat("extender.tls.client_ca_file ", client_ca, ": ", ec.message()));
        }
        // The CA's names go in the CertificateRequest: Go's TLS client (kube-
        // scheduler) sends its certificate only when its issuer is listed.
        STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(client_ca.c_str());
        if (names == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat("extender.tls.client_ca_file ", client_ca,
                                                         ": no certificate in it"));
        }
        SSL_CTX_set_client_CA_list(ssl_->native_handle(), names);
        ssl_->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
      }
    }
    const std::string& listen = options_.listen;
    const size_t colon = listen.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("extender.listen: \"", listen, "\" must be host:port"));
    }
    std::string host = listen.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    const std::string port = listen.substr(colon + 1);
    beast::error_code ec;
    tcp::resolver resolver(ioc_);
    auto results = resolver.resolve(host.empty() ? "0.0.0.0" : host, port,
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || results.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("extender.listen ", listen, ": ", ec.message()));
    }
    const tcp::endpoint ep = results.begin()->endpoint();
    // /bind lends duet-bridge's pods/binding permission to the caller: an
    // address others can reach needs client certificates, or the explicit
    // acceptance (the config's validation says the same).
    const bool authenticated = ssl_.has_value() && !options_.tls.client_ca_file.empty();
    if (!authenticated && !ep.address().is_loopback()) {
      if (!options_.allow_unauthenticated) {
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
          listen, ssl_.has_value() ? "HTTPS" : "plain HTTP");
    }
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("extender.listen ", listen, ": cannot listen: ", ec.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    DoAccept();
    for (int i = 0; i < std::max(1, options_.threads); ++i) {
      threads_.emplace_back([this] { ioc_.run(); });
    }
    return absl::OkStatus();
  }

  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    net::post(ioc_, [this] {
      beast::error_code ec;
      acceptor_.close(ec);
    });
    ioc_.stop();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    // Binds already running finish (a bind half done would leak a holding);
    // their answers are not sent.
    bind_pool_.join();
  }

  ~Impl() { Stop(); }

  int port() const { return port_; }
  bool tls() const { return ssl_.has_value(); }

 private:
  void DoAccept() {
    acceptor_.async_accept(net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket socket) {
      if (ec) {
        if (!acceptor_.is_open()) return;
      } else {
        beast::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        if (ssl_.has_value()) {
          std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(&shared_, std::move(socket), *ssl_)
              ->Run();
        } else {
          std::make_shared<Session<beast::tcp_stream>>(&shared_, std::move(socket))->Run();
        }
      }
      DoAccept();
    });
  }

  const ServerOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  Handler handler_;
  ServerMetrics metrics_;
  Shared shared_;
  net::thread_pool bind_pool_;
  std::optional<ssl::context> ssl_;
  // Declared last among what sessions use: destroyed first, with any
  // sessions still in it.
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  int port_ = 0;
  bool stopped_ = false;
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
