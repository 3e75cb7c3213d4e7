#pragma once

// A small keep-alive HTTP/1.1 client (Boost.Beast, blocking) for the
// extender's tests and benchmark: one connection, requests in sequence,
// optionally over TLS (verifying the server against a CA file), optionally
// presenting a client certificate.

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/ssl.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "boost/beast/ssl.hpp"

namespace duet {
namespace extender {
namespace testing {

struct Reply {
  int status = 0;
  std::string body;
  std::string content_type;
  bool keep_alive = false;
};

class HttpClient {
 public:
  // `ca_file` non-empty: TLS, verifying the server against it; `cert_file`
  // and `key_file` non-empty: the client certificate it presents.
  explicit HttpClient(int port, std::string ca_file = "", std::string cert_file = "",
                      std::string key_file = "")
      : port_(port),
        ca_file_(std::move(ca_file)),
        cert_file_(std::move(cert_file)),
        key_file_(std::move(key_file)) {}

  absl::StatusOr<Reply> Post(const std::string& target, const std::string& body) {
    return Request(boost::beast::http::verb::post, target, body);
  }
  absl::StatusOr<Reply> Get(const std::string& target) {
    return Request(boost::beast::http::verb::get, target, "");
  }

  absl::StatusOr<Reply> Request(boost::beast::http::verb method, const std::string& target,
                                const std::string& body) {
    namespace http = boost::beast::http;
    boost::beast::error_code ec;
    if (!connected_) {
      absl::Status s = Connect();
      if (!s.ok()) return s;
    }
    http::request<http::string_body> req{method, target, 11};
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    req.keep_alive(true);
    req.body() = body;
    req.prepare_payload();
    http::response<http::string_body> res;
    http::response_parser<http::string_body> parser;
    parser.body_limit(1u << 30);
    if (tls_) {
      http::write(*tls_, req, ec);
      if (!ec) http::read(*tls_, buffer_, parser, ec);
    } else {
      http::write(*plain_, req, ec);
      if (!ec) http::read(*plain_, buffer_, parser, ec);
    }
    if (ec) {
      connected_ = false;
      return absl::UnavailableError(absl::StrCat("http ", target, ": ", ec.message()));
    }
    res = parser.release();
    Reply r;
    r.status = static_cast<int>(res.result_int());
    r.body = std::move(res.body());
    r.content_type = std::string(res[http::field::content_type]);
    r.keep_alive = res.keep_alive();
    if (!r.keep_alive) connected_ = false;
    return r;
  }

  bool connected() const { return connected_; }

 private:
  absl::Status Connect() {
    namespace net = boost::asio;
    using tcp = net::ip::tcp;
    boost::beast::error_code ec;
    buffer_.clear();
    // Large reads, as the server does (https_server.cc): without this Beast
    // reads a 100 KB reply in small pieces.
    buffer_.reserve(256 * 1024);
    const tcp::endpoint ep(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_));
    if (ca_file_.empty()) {
      plain_ = std::make_unique<boost::beast::tcp_stream>(ioc_);
      plain_->connect(ep, ec);
      if (!ec) plain_->socket().set_option(tcp::no_delay(true), ec);
    } else {
      ctx_ = std::make_unique<net::ssl::context>(net::ssl::context::tls_client);
      ctx_->load_verify_file(ca_file_, ec);
      if (ec) return absl::InvalidArgumentError(absl::StrCat("ca ", ca_file_, ": ", ec.message()));
      ctx_->set_verify_mode(net::ssl::verify_peer);
      if (!cert_file_.empty()) {
        ctx_->use_certificate_chain_file(cert_file_, ec);
        if (!ec) ctx_->use_private_key_file(key_file_, net::ssl::context::pem, ec);
        if (ec) return absl::InvalidArgumentError(absl::StrCat("client cert: ", ec.message()));
      }
      tls_ = std::make_unique<boost::beast::ssl_stream<boost::beast::tcp_stream>>(ioc_, *ctx_);
      boost::beast::get_lowest_layer(*tls_).connect(ep, ec);
      if (!ec) tls_->handshake(net::ssl::stream_base::client, ec);
    }
    if (ec) return absl::UnavailableError(absl::StrCat("connect 127.0.0.1:", port_, ": ", ec.message()));
    connected_ = true;
    return absl::OkStatus();
  }

  const int port_;
  const std::string ca_file_;
  const std::string cert_file_;
  const std::string key_file_;
  boost::asio::io_context ioc_;
  std::unique_ptr<boost::asio::ssl::context> ctx_;
  std::unique_ptr<boost::beast::tcp_stream> plain_;
  std::unique_ptr<boost::beast::ssl_stream<boost::beast::tcp_stream>> tls_;
  boost::beast::flat_buffer buffer_;
  bool connected_ = false;
};

}  // namespace testing
}  // namespace extender
}  // namespace duet
