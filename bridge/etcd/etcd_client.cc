#include "bridge/etcd/etcd_client.h"

#include <curl/curl.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "nlohmann/json.hpp"

namespace duet {
namespace etcd {
namespace {

using nlohmann::json;

size_t WriteCb(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

// int64 fields come as JSON strings from the gateway (proto3 JSON mapping).
int64_t Int64Field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  int64_t v = 0;
  if (it->is_string() && absl::SimpleAtoi(it->get<std::string>(), &v)) return v;
  return 0;
}

std::string B64(const std::string& s) { return absl::Base64Escape(s); }

absl::StatusOr<std::string> Unb64(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return std::string();  // proto3 JSON omits empty bytes
  std::string out;
  if (!it->is_string() || !absl::Base64Unescape(it->get<std::string>(), &out)) {
    return absl::DataLossError(absl::StrCat("etcd: field ", name, " is not base64"));
  }
  return out;
}

absl::StatusOr<json> ParseJson(const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::UnavailableError("etcd: the gateway's answer is not a JSON object");
  }
  return j;
}

bool IsHttps(const std::string& url) { return url.rfind("https://", 0) == 0; }

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

BioPtr MemBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// Why a TLS request failed, in terms of the settings that fix it. libcurl's
// own words for a refused client certificate are often only "connection
// reset" or "getpeername() failed": etcd's --client-cert-auth closes the
// connection at the end of the handshake, and which read or write notices
// it first is a race.
std::string TlsHint(CURLcode rc, const std::string& url, const TlsOptions& tls) {
  if (!IsHttps(url)) {
    return rc == CURLE_GOT_NOTHING ? " (etcd closed the plaintext connection: does it serve https?)"
                                   : "";
  }
  switch (rc) {
    case CURLE_PEER_FAILED_VERIFICATION:
      return absl::StrCat(" (etcd's server certificate is not signed by a CA in ", tls.field,
                          ".ca_file, or does not name the endpoint's host)");
    case CURLE_SSL_CACERT_BADFILE:
      return absl::StrCat(" (", tls.field, ".ca_file ", tls.ca_file, " cannot be loaded)");
    case CURLE_SSL_CERTPROBLEM:
      return absl::StrCat(" (", tls.field, ".cert_file or key_file cannot be loaded)");
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
      if (tls.cert_file.empty()) {
        return absl::StrCat(
            " (etcd closed the TLS connection: with --client-cert-auth it refuses a client "
            "without a certificate, and this one presents none: set ",
            tls.field, ".cert_file and key_file)");
      }
      return absl::StrCat(
          " (etcd closed the TLS connection: with --client-cert-auth it refuses a client "
          "certificate no CA of its --trusted-ca-file signed; this one presents ",
          tls.field, ".cert_file ", tls.cert_file, ")");
    default:
      return "";
  }
}

}  // namespace

absl::Status CheckTls(const std::vector<std::string>& endpoints, const TlsOptions& tls) {
  const std::string& f = tls.field;
  bool https = false;
  for (size_t i = 0; i < endpoints.size(); ++i) {
    const bool this_https = IsHttps(endpoints[i]);
    if (i == 0) {
      https = this_https;
    } else if (this_https != https) {
      return absl::InvalidArgumentError(
          absl::StrCat("endpoints[", i, "]: \"", endpoints[i], "\" and endpoints[0] \"",
                       endpoints[0], "\": use one scheme, http:// or https://, for all"));
    }
  }
  if (!https) {
    if (tls.enabled()) {
      return absl::InvalidArgumentError(
          absl::StrCat(f, ": set, but the endpoints are plaintext http://: use https://"));
    }
    return absl::OkStatus();
  }
  if (tls.ca_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(f,
                     ".ca_file: required with https:// endpoints (the CA that signs etcd's server "
                     "certificate; the system's store is not used)"));
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(f, ": cert_file and key_file must be set together"));
  }
  absl::StatusOr<std::string> ca =
      ReadFileToString(tls.ca_file, absl::StatusCode::kNotFound, absl::StrCat(f, ".ca_file"));
  if (!ca.ok()) return ca.status();
  {
    BioPtr bio = MemBio(*ca);
    X509Ptr first(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (first == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(f, ".ca_file: ", tls.ca_file, " holds no PEM certificate"));
    }
  }
  if (tls.cert_file.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> cert =
      ReadFileToString(tls.cert_file, absl::StatusCode::kNotFound, absl::StrCat(f, ".cert_file"));
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key =
      ReadFileToString(tls.key_file, absl::StatusCode::kNotFound, absl::StrCat(f, ".key_file"));
  if (!key.ok()) return key.status();
  BioPtr cert_bio = MemBio(*cert);
  X509Ptr x509(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (x509 == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(f, ".cert_file: ", tls.cert_file, " holds no PEM certificate"));
  }
  BioPtr key_bio = MemBio(*key);
  // A passphrase callback that gives none: an encrypted key is refused here
  // rather than prompted for on a terminal.
  PkeyPtr pkey(PEM_read_bio_PrivateKey(
      key_bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr));
  if (pkey == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(f, ".key_file: ", tls.key_file, " holds no unencrypted PEM private key"));
  }
  if (X509_check_private_key(x509.get(), pkey.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        f, ".key_file: ", tls.key_file, " is not the key of ", f, ".cert_file ", tls.cert_file));
  }
  return absl::OkStatus();
}

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(end.back());
    if (c < 0xff) {
      ++c;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

Client::Client(Options options) : options_(std::move(options)) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  curl_ = curl_easy_init();
}

Client::~Client() {
  if (curl_ != nullptr) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

absl::StatusOr<std::string> Client::Post(const std::string& path, const std::string& body) {
  if (curl_ == nullptr) return absl::InternalError("etcd: curl_easy_init failed");
  if (options_.endpoints.empty()) return absl::FailedPreconditionError("etcd: no endpoints");
  CURL* curl = static_cast<CURL*>(curl_);
  const TlsOptions& tls = options_.tls;
  std::string last_error;
  // Each endpoint once, starting with the one that answered last.
  for (size_t tried = 0; tried < options_.endpoints.size(); ++tried) {
    const size_t at = (next_endpoint_ + tried) % options_.endpoints.size();
    const std::string url = options_.endpoints[at] + path;
    std::string response;
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    curl_easy_reset(curl);
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, WriteCb);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    const long timeout_ms = static_cast<long>(absl::ToInt64Milliseconds(options_.request_timeout));
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, std::min(timeout_ms, 1000L));
    // The same protocol with and without TLS (ALPN would pick HTTP/2).
    curl_easy_setopt(curl, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
    char error_text[CURL_ERROR_SIZE] = {0};
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error_text);
    if (IsHttps(url)) {
      curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 1L);
      curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 2L);
      // Only the configured CA: no system directory besides it.
      curl_easy_setopt(curl, CURLOPT_CAINFO, tls.ca_file.empty() ? nullptr : tls.ca_file.c_str());
      curl_easy_setopt(curl, CURLOPT_CAPATH, nullptr);
#if LIBCURL_VERSION_NUM >= 0x075700
      // No cached CA store: the file is read again for each new connection,
      // as the client certificate and key are.
      curl_easy_setopt(curl, CURLOPT_CA_CACHE_TIMEOUT, 0L);
#endif
      if (!tls.cert_file.empty()) {
        curl_easy_setopt(curl, CURLOPT_SSLCERT, tls.cert_file.c_str());
        curl_easy_setopt(curl, CURLOPT_SSLCERTTYPE, "PEM");
        curl_easy_setopt(curl, CURLOPT_SSLKEY, tls.key_file.c_str());
        curl_easy_setopt(curl, CURLOPT_SSLKEYTYPE, "PEM");
      }
    }
    const CURLcode rc = curl_easy_perform(curl);
    curl_slist_free_all(headers);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);
    if (rc != CURLE_OK) {
      last_error = absl::StrCat(options_.endpoints[at], ": ",
                                error_text[0] != '\0' ? error_text : curl_easy_strerror(rc),
                                TlsHint(rc, url, tls));
      continue;
    }
    long code = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
    next_endpoint_ = at;
    if (code == 200) return response;
    // The gateway's error body: {"error": ..., "code": <gRPC code>, "message": ...}.
    absl::StatusCode status = code >= 500 ? absl::StatusCode::kUnavailable
                                          : absl::StatusCode::kInvalidArgument;
    std::string message = response;
    if (absl::StatusOr<json> j = ParseJson(response); j.ok()) {
      if (auto c = j->find("code"); c != j->end() && c->is_number_integer()) {
        const int grpc_code = c->get<int>();
        if (grpc_code > 0 && grpc_code <= 16) status = static_cast<absl::StatusCode>(grpc_code);
      }
      if (auto m = j->find("message"); m != j->end() && m->is_string()) message = m->get<std::string>();
    }
    // Timeouts and leader changes inside etcd: the caller may retry.
    if (status == absl::StatusCode::kDeadlineExceeded || status == absl::StatusCode::kAborted ||
        status == absl::StatusCode::kUnknown) {
      status = absl::StatusCode::kUnavailable;
    }
    return absl::Status(status, absl::StrCat("etcd ", path, ": HTTP ", code, ": ", message));
  }
  return absl::UnavailableError(absl::StrCat("etcd ", path, ": no endpoint answered (", last_error, ")"));
}

absl::StatusOr<RangeResult> Client::Range(const std::string& key, const std::string& range_end,
                                          int64_t limit, int64_t revision) {
  json req = {{"key", B64(key)}};
  if (!range_end.empty()) req["range_end"] = B64(range_end);
  if (limit > 0) req["limit"] = std::to_string(limit);
  if (revision > 0) req["revision"] = std::to_string(revision);
  absl::StatusOr<std::string> body = Post("/v3/kv/range", req.dump());
  if (!body.ok()) return body.status();
  absl::StatusOr<json> j = ParseJson(*body);
  if (!j.ok()) return j.status();
  RangeResult out;
  if (auto h = j->find("header"); h != j->end() && h->is_object()) {
    out.revision = Int64Field(*h, "revision");
  }
  if (auto m = j->find("more"); m != j->end() && m->is_boolean()) out.more = m->get<bool>();
  if (auto kvs = j->find("kvs"); kvs != j->end() && kvs->is_array()) {
    for (const json& kv : *kvs) {
      KeyValue o;
      absl::StatusOr<std::string> k = Unb64(kv, "key");
      if (!k.ok()) return k.status();
      absl::StatusOr<std::string> v = Unb64(kv, "value");
      if (!v.ok()) return v.status();
      o.key = *std::move(k);
      o.value = *std::move(v);
      o.mod_revision = Int64Field(kv, "mod_revision");
      out.kvs.push_back(std::move(o));
    }
  }
  return out;
}

absl::StatusOr<TxnResult> Client::Txn(const std::string& fence_key, int64_t fence_revision,
                                      const std::vector<Op>& ops) {
  json req = json::object();
  if (!fence_key.empty()) {
    req["compare"] = json::array({json{{"key", B64(fence_key)},
                                       {"target", "MOD"},
                                       {"result", "EQUAL"},
                                       {"mod_revision", std::to_string(fence_revision)}}});
  }
  json success = json::array();
  for (const Op& op : ops) {
    if (op.type == Op::Type::kPut) {
      success.push_back({{"request_put", {{"key", B64(op.key)}, {"value", B64(op.value)}}}});
    } else {
      json d = {{"key", B64(op.key)}};
      if (!op.range_end.empty()) d["range_end"] = B64(op.range_end);
      success.push_back({{"request_delete_range", d}});
    }
  }
  req["success"] = std::move(success);
  absl::StatusOr<std::string> body = Post("/v3/kv/txn", req.dump());
  if (!body.ok()) return body.status();
  absl::StatusOr<json> j = ParseJson(*body);
  if (!j.ok()) return j.status();
  TxnResult out;
  if (auto s = j->find("succeeded"); s != j->end() && s->is_boolean()) out.succeeded = s->get<bool>();
  if (auto h = j->find("header"); h != j->end() && h->is_object()) {
    out.revision = Int64Field(*h, "revision");
  }
  return out;
}

}  // namespace etcd
}  // namespace duet
