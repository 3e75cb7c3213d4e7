#include "k8s_adapter/informer.h"

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace k8s {
namespace {

// A printable prefix of a bad frame for the log and the error.
std::string Snippet(absl::string_view s) {
  std::string out;
  for (char c : s.substr(0, 80)) out.push_back(c >= 0x20 && c < 0x7f ? c : '?');
  if (s.size() > 80) absl::StrAppend(&out, "... (", s.size(), " bytes)");
  return out;
}

std::string Selectors(const InformerOptions& o) {
  std::string q;
  if (!o.label_selector.empty()) absl::StrAppend(&q, "&labelSelector=", QueryEscape(o.label_selector));
  if (!o.field_selector.empty()) absl::StrAppend(&q, "&fieldSelector=", QueryEscape(o.field_selector));
  return q;
}

}  // namespace

Informer::Informer(KubeClient* client, InformerOptions options, InformerHandler* handler)
    : client_(client), options_(std::move(options)), handler_(handler) {}

Informer::~Informer() { Stop(); }

std::string Informer::Key(const nlohmann::json& object) {
  const nlohmann::json& md = object.at("metadata");
  std::string name = md.at("name").get<std::string>();
  auto ns = md.find("namespace");
  if (ns != md.end() && ns->is_string() && !ns->get_ref<const std::string&>().empty()) {
    return absl::StrCat(ns->get_ref<const std::string&>(), "/", name);
  }
  return name;
}

absl::Status Informer::Start() {
  absl::Status s = List();
  if (!s.ok()) return s;
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void Informer::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

InformerStats Informer::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

bool Informer::Sleep(absl::Duration d) {
  absl::MutexLock l(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), d);
  return !stopping_;
}

absl::Duration Informer::NextBackoff(int attempt) {
  absl::Duration d = options_.min_backoff;
  for (int i = 0; i < attempt && d < options_.max_backoff; ++i) d *= 2;
  d = std::min(d, options_.max_backoff);
  // Jitter: uniform in [d/2, d], so replicas and informers spread out.
  const double f = absl::Uniform(rng_, 0.5, 1.0);
  return d * f;
}

void Informer::Fail(const absl::Status& s) {
  spdlog::warn("k8s informer {}: {}", options_.path, std::string(s.ToString()));
  absl::MutexLock l(&mu_);
  ++stats_.failures;
  stats_.last_error = std::string(s.ToString());
}

void Informer::Run() {
  bool need_list = false;
  int attempt = 0;
  while (!stop_) {
    if (need_list) {
      absl::Status s = List();
      if (stop_) return;
      if (!s.ok()) {
        Fail(s);
        if (!Sleep(NextBackoff(attempt++))) return;
        continue;
      }
      need_list = false;
    }
    const absl::Time started = absl::Now();
    const uint64_t events_before = stats().events;
    relist_ = false;
    absl::Status s = Watch();
    if (stop_) return;
    const bool progressed =
        stats().events > events_before || absl::Now() - started > absl::Seconds(30);
    if (progressed) attempt = 0;
    if (s.ok()) {
      // The server ended the watch (timeoutSeconds): resume at once, unless
      // it keeps ending them empty-handed straight away.
      if (!progressed && absl::Now() - started < absl::Seconds(1)) {
        if (!Sleep(NextBackoff(attempt++))) return;
      }
      continue;
    }
    if (relist_) {
      need_list = true;
      if (s.code() == absl::StatusCode::kOutOfRange) {
        spdlog::info("k8s informer {}: resourceVersion {} is gone (410); relisting", options_.path, rv_);
        // A relist is the expected answer to 410: no backoff the first time.
        if (attempt++ == 0) continue;
        if (!Sleep(NextBackoff(attempt - 1))) return;
        continue;
      }
    }
    Fail(s);
    if (!Sleep(NextBackoff(attempt++))) return;
  }
}

absl::Status Informer::List() {
  absl::flat_hash_map<std::string, std::string> fresh;
  fresh.reserve(store_.size());
  // A list that fails after some pages has delivered their objects: they are
  // kept as delivered, so that a later list that lacks one delivers its
  // deletion. (Dismissed once the whole list has been applied.)
  auto keep_delivered = absl::MakeCleanup([&] {
    for (auto& [key, rv] : fresh) store_[key] = std::move(rv);
  });
  std::string cont;
  std::string list_rv;
  do {
    std::string url = absl::StrCat(options_.path, "?limit=", options_.page_size, Selectors(options_));
    if (!cont.empty()) absl::StrAppend(&url, "&continue=", QueryEscape(cont));
    absl::StatusOr<std::string> body = client_->Get(url);
    if (!body.ok()) return body.status();
    nlohmann::json page = nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
    if (page.is_discarded() || !page.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("list ", options_.path, ": reply is not JSON: ",
                                                     Snippet(*body)));
    }
    body->clear();
    body->shrink_to_fit();
    try {
      const nlohmann::json& md = page.at("metadata");
      if (list_rv.empty()) list_rv = md.at("resourceVersion").get<std::string>();
      cont = md.value("continue", "");
      const nlohmann::json& items = page.at("items");
      if (!items.is_null()) {
        for (const nlohmann::json& obj : items) {
          std::string key = Key(obj);
          std::string rv = obj.at("metadata").at("resourceVersion").get<std::string>();
          auto it = store_.find(key);
          const bool changed = it == store_.end() || it->second != rv;
          fresh[key] = std::move(rv);
          if (changed) handler_->OnUpsert(obj);
        }
      }
    } catch (const nlohmann::json::exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("list ", options_.path, ": unexpected shape: ", e.what()));
    }
  } while (!cont.empty() && !stop_);
  if (stop_) return absl::CancelledError("stopping");
  for (const auto& [key, rv] : store_) {
    if (!fresh.contains(key)) handler_->OnDelete(key, nullptr);
  }
  std::move(keep_delivered).Cancel();
  store_ = std::move(fresh);
  rv_ = list_rv;
  handler_->OnSynced();
  absl::MutexLock l(&mu_);
  ++stats_.lists;
  stats_.resource_version = rv_;
  stats_.objects = store_.size();
  return absl::OkStatus();
}

absl::Status Informer::Watch() {
  // client-go's spread: [t, 2t).
  const double spread = absl::Uniform(rng_, 1.0, 2.0);
  const int64_t timeout_s = std::max<int64_t>(1, absl::ToInt64Seconds(options_.watch_timeout * spread));
  const std::string url =
      absl::StrCat(options_.path, "?watch=1&allowWatchBookmarks=true&resourceVersion=", QueryEscape(rv_),
                   "&timeoutSeconds=", timeout_s, Selectors(options_));
  {
    absl::MutexLock l(&mu_);
    ++stats_.watches;
  }
  StreamOptions so;
  so.max_line_bytes = options_.max_frame_bytes;
  so.idle_timeout = options_.idle_timeout;
  so.cancel = &stop_;
  absl::Status s = client_->Stream(url, so, [this](absl::string_view line) { return OnFrame(line); });
  if (s.code() == absl::StatusCode::kOutOfRange && !relist_) {
    // HTTP 410 on the watch request itself (an ERROR frame was counted).
    relist_ = true;
    absl::MutexLock l(&mu_);
    ++stats_.gone;
  } else if (s.code() == absl::StatusCode::kResourceExhausted && !relist_) {
    // An oversized frame: whatever it carried is lost, so relist.
    relist_ = true;
    absl::MutexLock l(&mu_);
    ++stats_.frame_errors;
  }
  return s;
}

absl::Status Informer::OnFrame(absl::string_view line) {
  nlohmann::json frame = nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
  if (frame.is_discarded() || !frame.is_object()) {
    relist_ = true;
    absl::MutexLock l(&mu_);
    ++stats_.frame_errors;
    return absl::InvalidArgumentError(
        absl::StrCat("watch ", options_.path, ": frame is not JSON: ", Snippet(line)));
  }
  try {
    const std::string& type = frame.at("type").get_ref<const std::string&>();
    const nlohmann::json& obj = frame.at("object");
    if (type == "BOOKMARK") {
      rv_ = obj.at("metadata").at("resourceVersion").get<std::string>();
      absl::MutexLock l(&mu_);
      ++stats_.bookmarks;
      stats_.resource_version = rv_;
      return absl::OkStatus();
    }
    if (type == "ERROR") {
      relist_ = true;
      const int code = obj.value("code", 500);
      absl::Status s = StatusFromHttp(code, obj.dump());
      if (code == 410) {
        absl::MutexLock l(&mu_);
        ++stats_.gone;
      }
      return s.ok() ? absl::UnknownError("watch ERROR frame without a code") : s;
    }
    std::string key = Key(obj);
    std::string rv = obj.at("metadata").at("resourceVersion").get<std::string>();
    if (type == "ADDED" || type == "MODIFIED") {
      store_[key] = rv;
      handler_->OnUpsert(obj);
    } else if (type == "DELETED") {
      store_.erase(key);
      handler_->OnDelete(key, &obj);
    } else {
      relist_ = true;
      return absl::InvalidArgumentError(
          absl::StrCat("watch ", options_.path, ": unknown frame type \"", type, "\""));
    }
    rv_ = std::move(rv);
    absl::MutexLock l(&mu_);
    ++stats_.events;
    stats_.resource_version = rv_;
    stats_.objects = store_.size();
  } catch (const nlohmann::json::exception& e) {
    relist_ = true;
    absl::MutexLock l(&mu_);
    ++stats_.frame_errors;
    return absl::InvalidArgumentError(
        absl::StrCat("watch ", options_.path, ": bad frame (", e.what(), "): ", Snippet(line)));
  }
  return absl::OkStatus();
}

}  // namespace k8s
}  // namespace duet
