#include "k8s_adapter/http/https_server.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/ssl.hpp"
#include "boost/asio/strand.hpp"
#include "boost/asio/thread_pool.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "boost/beast/ssl.hpp"
#include "openssl/err.h"
#include "openssl/ssl.h"
#include "openssl/x509.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace http {
namespace {

namespace beast = boost::beast;
namespace bhttp = beast::http;
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

// A failed handshake's reason; "" for a peer that closed before or during it
// (a TCP probe, a client that went away), which is not reported.
const char* TlsFailureReason(const beast::error_code& ec) {
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

// What every session shares (owned by the server, which joins its threads
// before it goes).
struct Shared {
  const HttpsServerOptions* options = nullptr;
  std::chrono::seconds idle{120};
  net::thread_pool* pool = nullptr;
};

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
  const HttpsServerOptions& options() const { return *shared_->options; }

  void OnHandshake(beast::error_code ec) {
    // Not a TLS client, one without an acceptable client certificate (with
    // client_ca_file), or it went away: nothing was read.
    if (ec) {
      const char* reason = TlsFailureReason(ec);
      if (*reason != '\0' && options().tls_failure) options().tls_failure(reason);
      spdlog::debug("{}: TLS handshake with {} failed: {}", options().log_name, peer_, ec.message());
      return;
    }
    const std::string subject = PeerSubject(stream_.native_handle());
    if (!subject.empty()) peer_ = absl::StrCat(subject, " at ", peer_);
    DoRead();
  }

  void DoRead() {
    parser_.emplace();
    parser_->body_limit(options().max_request_bytes);
    parser_->header_limit(64 * 1024);
    beast::get_lowest_layer(stream_).expires_after(shared_->idle);
    bhttp::async_read(stream_, buffer_, *parser_,
                      beast::bind_front_handler(&Session::OnRead, this->shared_from_this()));
  }

  void OnRead(beast::error_code ec, size_t) {
    if (ec == bhttp::error::end_of_stream) return DoClose();
    const auto start = std::chrono::steady_clock::now();
    if (ec == bhttp::error::body_limit) {
      // The start line is parsed by now (the limit is checked against the
      // Content-Length header or the body read so far).
      const std::string target(parser_->get().target());
      return Write(Text(413, absl::StrCat("request body larger than ", options().max_request_bytes,
                                          " bytes (", options().config_prefix,
                                          "max_request_bytes)")),
                   /*keep_alive=*/false, target, start);
    }
    if (ec == bhttp::error::header_limit) {
      return Write(Text(431, "request header too large"), false, "", start);
    }
    if (ec) {
      if (ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category()) {
        return Write(Text(400, absl::StrCat("malformed HTTP request: ", ec.message())), false, "",
                     start);
      }
      return;  // timeout, reset, TLS error: drop the connection
    }
    bhttp::request<bhttp::string_body> req = parser_->release();
    const std::string method(req.method_string());
    const std::string target(req.target());
    const bool keep_alive = req.keep_alive();
    if (options().blocking && options().blocking(target)) {
      // Off the io threads: the handler waits on something slow.
      auto self = this->shared_from_this();
      net::post(*shared_->pool, [self, method, target, keep_alive, start,
                                 body = std::move(req.body())]() mutable {
        HttpReply reply = self->options().handler(method, target, body, self->peer_);
        net::post(self->stream_.get_executor(),
                  [self, reply = std::move(reply), keep_alive, target, start]() mutable {
                    self->Write(std::move(reply), keep_alive, target, start);
                  });
      });
      return;
    }
    Write(options().handler(method, target, req.body(), peer_), keep_alive, target, start);
  }

  void Write(HttpReply reply, bool keep_alive, const std::string& target,
             std::chrono::steady_clock::time_point start) {
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>();
    res->version(11);
    res->result(static_cast<bhttp::status>(reply.status));
    res->set(bhttp::field::server, "duet-bridge");
    res->set(bhttp::field::content_type, reply.content_type);
    if (!reply.allow.empty()) res->set(bhttp::field::allow, reply.allow);
    res->keep_alive(keep_alive);
    res->body() = std::move(reply.body);
    res->prepare_payload();
    if (options().observe) {
      options().observe(
          target, reply.status,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    res_ = res;
    beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(30));
    bhttp::async_write(stream_, *res_,
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
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::shared_ptr<bhttp::response<bhttp::string_body>> res_;
  std::array<char, 16 * 1024> scratch_;
  // Who is at the other end: "SUBJECT at ADDR:PORT" once a client
  // certificate is verified, else "ADDR:PORT". Set in Run and OnHandshake,
  // read after (the session's strand).
  std::string peer_;
};

}  // namespace

class HttpsServer::Impl {
 public:
  explicit Impl(HttpsServerOptions options)
      : options_(std::move(options)),
        pool_(static_cast<size_t>(
            std::max(1, options_.blocking_threads > 0 ? options_.blocking_threads : options_.threads))),
        ioc_(std::max(1, options_.threads)),
        acceptor_(ioc_) {
    shared_.options = &options_;
    shared_.idle = std::chrono::seconds(options_.idle_timeout_seconds);
    shared_.pool = &pool_;
  }

  absl::Status Listen() {
    const std::string& prefix = options_.config_prefix;
    if (!options_.handler) return absl::InvalidArgumentError("HttpsServer: no handler");
    if (options_.cert_file.empty() != options_.key_file.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "tls: cert_file and key_file must be set together"));
    }
    if (!options_.client_ca_file.empty() && options_.cert_file.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "tls.client_ca_file: client certificates are checked only over HTTPS"));
    }
    if (!options_.cert_file.empty()) {
      ssl_.emplace(ssl::context::tls_server);
      ssl_->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                        ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
      beast::error_code ec;
      ssl_->use_certificate_chain_file(options_.cert_file, ec);
      if (ec) {
        return absl::InvalidArgumentError(
            absl::StrCat(prefix, "tls.cert_file ", options_.cert_file, ": ", ec.message()));
      }
      ssl_->use_private_key_file(options_.key_file, ssl::context::pem, ec);
      if (ec) {
        return absl::InvalidArgumentError(
            absl::StrCat(prefix, "tls.key_file ", options_.key_file, ": ", ec.message()));
      }
      const std::string& client_ca = options_.client_ca_file;
      if (!client_ca.empty()) {
        ssl_->load_verify_file(client_ca, ec);
        if (ec) {
          return absl::InvalidArgumentError(
              absl::StrCat(prefix, "tls.client_ca_file ", client_ca, ": ", ec.message()));
        }
        // The CA's names go in the CertificateRequest: Go's TLS clients send
        // their certificate only when its issuer is listed.
        STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(client_ca.c_str());
        if (names == nullptr) {
          return absl::InvalidArgumentError(
              absl::StrCat(prefix, "tls.client_ca_file ", client_ca, ": no certificate in it"));
        }
        SSL_CTX_set_client_CA_list(ssl_->native_handle(), names);
        ssl_->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
      }
    }
    const std::string& listen = options_.listen;
    const size_t colon = listen.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "listen: \"", listen, "\" must be host:port"));
    }
    std::string host = listen.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    const std::string port = listen.substr(colon + 1);
    beast::error_code ec;
    tcp::resolver resolver(ioc_);
    auto results = resolver.resolve(host.empty() ? "0.0.0.0" : host, port,
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || results.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, "listen ", listen, ": ", ec.message()));
    }
    const tcp::endpoint ep = results.begin()->endpoint();
    if (options_.check_exposure) {
      const bool client_certs = ssl_.has_value() && !options_.client_ca_file.empty();
      if (absl::Status s = options_.check_exposure(ep.address().is_loopback(), client_certs);
          !s.ok()) {
        return s;
      }
    }
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat(prefix, "listen ", listen, ": cannot listen: ", ec.message()));
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
    // The posted close may not have run before the stop: close here (no
    // thread runs the io_context now), so new connections are refused at
    // once instead of waiting in the backlog.
    beast::error_code ec;
    acceptor_.close(ec);
    // Blocking requests already running finish (one half done could leave
    // its work half done); their answers are not sent.
    pool_.join();
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
          std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(&shared_, std::move(socket),
                                                                         *ssl_)
              ->Run();
        } else {
          std::make_shared<Session<beast::tcp_stream>>(&shared_, std::move(socket))->Run();
        }
      }
      DoAccept();
    });
  }

  const HttpsServerOptions options_;
  Shared shared_;
  net::thread_pool pool_;
  std::optional<ssl::context> ssl_;
  // Declared last among what sessions use: destroyed first, with any
  // sessions still in it.
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  int port_ = 0;
  bool stopped_ = false;
};

HttpsServer::HttpsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<HttpsServer>> HttpsServer::Start(HttpsServerOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  if (absl::Status s = impl->Listen(); !s.ok()) return s;
  return std::unique_ptr<HttpsServer>(new HttpsServer(std::move(impl)));
}

HttpsServer::~HttpsServer() { Stop(); }

int HttpsServer::port() const { return impl_->port(); }
bool HttpsServer::tls() const { return impl_->tls(); }
void HttpsServer::Stop() { impl_->Stop(); }

}  // namespace http
}  // namespace duet
