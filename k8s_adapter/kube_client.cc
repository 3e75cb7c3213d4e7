#include "k8s_adapter/kube_client.h"

#include <curl/curl.h>

#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/file.h"
#include "nlohmann/json.hpp"

namespace duet {
namespace k8s {
namespace {

// Points curl at PEM material given inline (`pem`, copied by curl) or as a
// file path; sets `type_opt` to "PEM" when given.
void SetPem(CURL* curl, const std::string& pem, const std::string& file, CURLoption blob_opt,
            CURLoption file_opt, std::optional<CURLoption> type_opt) {
  if (!pem.empty()) {
    curl_blob blob{const_cast<char*>(pem.data()), pem.size(), CURL_BLOB_COPY};
    curl_easy_setopt(curl, blob_opt, &blob);
  } else if (!file.empty()) {
    curl_easy_setopt(curl, file_opt, file.c_str());
  } else {
    return;
  }
  if (type_opt) curl_easy_setopt(curl, *type_opt, "PEM");
}

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct CurlSlist {
  curl_slist* list = nullptr;
  ~CurlSlist() { curl_slist_free_all(list); }
  void Add(const std::string& s) { list = curl_slist_append(list, s.c_str()); }
};

// State shared with libcurl's callbacks during one transfer.
struct Transfer {
  CURL* curl = nullptr;
  // Buffered reply (requests) or the partial line (streams).
  std::string buf;
  size_t limit = 0;
  bool streaming = false;
  bool stream_ok = false;  // 2xx seen at the first body byte of a stream
  const std::function<absl::Status(absl::string_view)>* on_line = nullptr;
  const std::atomic<bool>* cancel = nullptr;
  absl::Status abort;  // why a callback stopped the transfer
};

size_t WriteCb(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t len = size * n;
  if (!t->streaming) {
    if (t->buf.size() + len > t->limit) {
      t->abort = absl::ResourceExhaustedError(
          absl::StrCat("reply larger than ", t->limit, " bytes"));
      return 0;
    }
    t->buf.append(data, len);
    return len;
  }
  if (!t->stream_ok) {
    long code = 0;
    curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &code);
    if (code < 200 || code >= 300) {
      // An error reply: keep (a bounded prefix of) its body for the Status.
      if (t->buf.size() < (64 << 10)) t->buf.append(data, std::min(len, size_t{64 << 10}));
      return len;
    }
    t->stream_ok = true;
  }
  absl::string_view chunk(data, len);
  while (!chunk.empty()) {
    const size_t nl = chunk.find('\n');
    const size_t take = nl == absl::string_view::npos ? chunk.size() : nl;
    if (t->buf.size() + take > t->limit) {
      t->abort = absl::ResourceExhaustedError(absl::StrCat(
          "watch frame larger than ", t->limit, " bytes (", t->buf.size() + take, "+ so far)"));
      return 0;
    }
    if (nl == absl::string_view::npos) {
      t->buf.append(chunk.data(), chunk.size());
      break;
    }
    absl::string_view line;
    if (t->buf.empty()) {
      line = chunk.substr(0, nl);  // whole line in this chunk: no copy
    } else {
      t->buf.append(chunk.data(), nl);
      line = t->buf;
    }
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.empty()) {
      absl::Status s = (*t->on_line)(line);
      if (!s.ok()) {
        t->abort = std::move(s);
        return 0;
      }
    }
    t->buf.clear();
    chunk.remove_prefix(nl + 1);
  }
  return len;
}

int ProgressCb(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  return t->cancel != nullptr && t->cancel->load() ? 1 : 0;
}

class CurlKubeClient final : public KubeClient {
 public:
  CurlKubeClient(KubeConfig config, KubeClientOptions options)
      : config_(std::move(config)), options_(std::move(options)) {
    token_ = config_.token;
  }

  ~CurlKubeClient() override {
    absl::MutexLock l(&mu_);
    for (CURL* c : idle_) curl_easy_cleanup(c);
  }

  absl::StatusOr<std::string> Get(const std::string& path) override {
    return Request("GET", path, nullptr, "");
  }
  absl::StatusOr<std::string> Post(const std::string& path, const std::string& json) override {
    return Request("POST", path, &json, "application/json");
  }
  absl::StatusOr<std::string> Put(const std::string& path, const std::string& json) override {
    return Request("PUT", path, &json, "application/json");
  }
  absl::StatusOr<std::string> Patch(const std::string& path, const std::string& json,
                                    PatchType type) override {
    return Request("PATCH", path, &json,
                   type == PatchType::kMerge ? "application/merge-patch+json"
                                             : "application/strategic-merge-patch+json");
  }
  absl::StatusOr<std::string> Delete(const std::string& path) override {
    return Request("DELETE", path, nullptr, "");
  }

  absl::Status Stream(const std::string& path, const StreamOptions& options,
                      const std::function<absl::Status(absl::string_view)>& on_line) override {
    Transfer t;
    t.streaming = true;
    t.limit = options.max_line_bytes;
    t.on_line = &on_line;
    t.cancel = options.cancel;
    CURL* curl = Acquire();
    t.curl = curl;
    CurlSlist headers;
    char err[CURL_ERROR_SIZE] = {0};
    Setup(curl, "GET", path, nullptr, "", &headers, &t, err);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 0L);
    if (options.idle_timeout > absl::ZeroDuration()) {
      curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
      curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                       static_cast<long>(std::max<int64_t>(1, absl::ToInt64Seconds(options.idle_timeout))));
    }
    long code = 0;
    const CURLcode rc = Perform(curl, &code);
    if (rc != CURLE_OK) {
      if (!t.abort.ok()) return t.abort;
      if (rc == CURLE_ABORTED_BY_CALLBACK) return absl::CancelledError("watch cancelled");
      if (rc == CURLE_OPERATION_TIMEDOUT) {
        return absl::DeadlineExceededError(absl::StrCat("watch ", path, ": idle: ", err));
      }
      return absl::UnavailableError(
          absl::StrCat("watch ", path, ": ", err[0] ? err : curl_easy_strerror(rc)));
    }
    if (code < 200 || code >= 300) return StatusFromHttp(code, t.buf);
    if (!t.buf.empty()) {
      // A final line without a newline: deliver it like any other.
      absl::Status s = on_line(t.buf);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<std::string> Request(const char* method, const std::string& path,
                                      const std::string* body, const char* content_type) {
    Transfer t;
    t.limit = options_.max_response_bytes;
    CURL* curl = Acquire();
    t.curl = curl;
    CurlSlist headers;
    char err[CURL_ERROR_SIZE] = {0};
    Setup(curl, method, path, body, content_type, &headers, &t, err);
    long code = 0;
    const CURLcode rc = Perform(curl, &code);
    if (rc != CURLE_OK) {
      if (!t.abort.ok()) return t.abort;
      const std::string what = absl::StrCat(method, " ", path, ": ", err[0] ? err : curl_easy_strerror(rc));
      if (rc == CURLE_OPERATION_TIMEDOUT) return absl::DeadlineExceededError(what);
      return absl::UnavailableError(what);
    }
    absl::Status s = StatusFromHttp(code, t.buf);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(method, " ", path, ": ", s.message()));
    return std::move(t.buf);
  }

  void Setup(CURL* curl, const char* method, const std::string& path, const std::string* body,
             const char* content_type, CurlSlist* headers, Transfer* t, char* err) {
    const std::string url = config_.server + path;
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, err);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(absl::ToInt64Milliseconds(options_.connect_timeout)));
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(absl::ToInt64Milliseconds(options_.request_timeout)));
    curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(curl, CURLOPT_USERAGENT, options_.user_agent.c_str());
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, WriteCb);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, ProgressCb);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, t);
    curl_easy_setopt(curl, CURLOPT_ACCEPT_ENCODING, "");
    if (config_.insecure_skip_tls_verify) {
      curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 0L);
      curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 0L);
    }
    // Each PEM comes inline (kubeconfig *-data) or from a file.
    SetPem(curl, config_.ca_pem, config_.ca_file, CURLOPT_CAINFO_BLOB, CURLOPT_CAINFO, std::nullopt);
    SetPem(curl, config_.client_cert_pem, config_.client_cert_file, CURLOPT_SSLCERT_BLOB,
           CURLOPT_SSLCERT, CURLOPT_SSLCERTTYPE);
    SetPem(curl, config_.client_key_pem, config_.client_key_file, CURLOPT_SSLKEY_BLOB,
           CURLOPT_SSLKEY, CURLOPT_SSLKEYTYPE);
    headers->Add("Accept: application/json");
    const std::string token = Token();
    if (!token.empty()) headers->Add("Authorization: Bearer " + token);
    if (body != nullptr) {
      headers->Add(absl::StrCat("Content-Type: ", content_type));
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body->data());
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body->size()));
    }
    if (std::string(method) != "GET" && !(std::string(method) == "POST")) {
      curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
    }
    headers->Add("Expect:");  // no 100-continue round trip
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers->list);
  }

  std::string Token() {
    absl::MutexLock l(&mu_);
    if (!config_.token_file.empty() && absl::Now() - token_read_ >= options_.token_reload) {
      absl::StatusOr<std::string> t =
          ReadFileToString(config_.token_file, absl::StatusCode::kInvalidArgument);
      // A failed re-read keeps the last good token.
      if (t.ok()) token_ = std::string(absl::StripAsciiWhitespace(*t));
      token_read_ = absl::Now();
    }
    return token_;
  }

  CURL* Acquire() {
    {
      absl::MutexLock l(&mu_);
      if (!idle_.empty()) {
        CURL* c = idle_.back();
        idle_.pop_back();
        curl_easy_reset(c);
        return c;
      }
    }
    return curl_easy_init();
  }

  // Runs the transfer set up on `curl`, reads its HTTP status into `code` and
  // hands the handle back (Release). A transfer's own abort reason, if any,
  // is in its Transfer.
  CURLcode Perform(CURL* curl, long* code) {
    const CURLcode rc = curl_easy_perform(curl);
    *code = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, code);
    Release(curl, rc == CURLE_OK);
    return rc;
  }

  // Keeps a handle (and its connection) for reuse after a clean transfer.
  void Release(CURL* c, bool reuse) {
    if (reuse) {
      absl::MutexLock l(&mu_);
      if (idle_.size() < 8) {
        idle_.push_back(c);
        return;
      }
    }
    curl_easy_cleanup(c);
  }

  const KubeConfig config_;
  const KubeClientOptions options_;
  absl::Mutex mu_;
  std::vector<CURL*> idle_ ABSL_GUARDED_BY(mu_);
  std::string token_ ABSL_GUARDED_BY(mu_);
  absl::Time token_read_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace

absl::Status StatusFromHttp(long code, absl::string_view body) {
  if (code >= 200 && code < 300) return absl::OkStatus();
  std::string message;
  std::string reason;
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  // A field of the Status, or "" when it is missing or not a string (any
  // body may come back, not only an apiserver's).
  auto text = [&j](const char* key) -> std::string {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (j.is_object() && text("kind") == "Status") {
    message = text("message");
    reason = text("reason");
  }
  if (message.empty()) message = std::string(body.substr(0, 200));
  message = absl::StrCat("HTTP ", code, reason.empty() ? "" : " ", reason, ": ", message);
  switch (code) {
    case 400:
    case 415:
    case 422:
      return absl::InvalidArgumentError(message);
    case 401:
      return absl::UnauthenticatedError(message);
    case 403:
      return absl::PermissionDeniedError(message);
    case 404:
      return absl::NotFoundError(message);
    case 409:
      return reason == "AlreadyExists" ? absl::AlreadyExistsError(message) : absl::AbortedError(message);
    case 410:
      return absl::OutOfRangeError(message);
    case 429:
      return absl::ResourceExhaustedError(message);
    default:
      if (code >= 500) return absl::UnavailableError(message);
      return absl::UnknownError(message);
  }
}

std::string QueryEscape(absl::string_view value) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : value) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<KubeClient>> NewCurlKubeClient(KubeConfig config,
                                                              KubeClientOptions options) {
  GlobalInit();
  if (config.server.empty()) return absl::InvalidArgumentError("kubernetes server: must be set");
  for (const std::string* f : {&config.ca_file, &config.client_cert_file, &config.client_key_file}) {
    if (!f->empty()) {
      absl::StatusOr<std::string> text = ReadFileToString(*f, absl::StatusCode::kInvalidArgument);
      if (!text.ok()) return text.status();
    }
  }
  while (!config.server.empty() && config.server.back() == '/') config.server.pop_back();
  return std::unique_ptr<KubeClient>(new CurlKubeClient(std::move(config), std::move(options)));
}

}  // namespace k8s
}  // namespace duet
