#include "bridge/server/audit.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "bridge/server/metrics.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace {

// `v` as is when it is one plain word, else double-quoted with quotes and
// backslashes escaped.
std::string Value(const std::string& v) {
  const bool plain = !v.empty() && std::none_of(v.begin(), v.end(), [](char c) {
    return c == ' ' || c == '"' || c == '\\' || c == '=' || static_cast<unsigned char>(c) < 0x20;
  });
  if (plain) return v;
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') out.push_back('\\');
    // Control characters (a newline would start a forged line) as '?'.
    out.push_back(static_cast<unsigned char>(c) < 0x20 ? '?' : c);
  }
  out.push_back('"');
  return out;
}

}  // namespace

std::string FormatAuditLine(const AuditRecord& r, uint64_t dropped) {
  std::string line = absl::StrCat("audit method=", Value(r.method), " who=", Value(r.who),
                                  " node=", Value(r.node), " owner=", Value(r.owner),
                                  " devices=", Value(r.devices),
                                  " changed=", r.changed ? "true" : "false");
  if (dropped > 0) absl::StrAppend(&line, " dropped=", dropped);
  return line;
}

AuditLog::AuditLog(Options options)
    : options_(std::move(options)), tokens_(options_.burst), refilled_(options_.clock->Now()) {}

bool AuditLog::Record(const AuditRecord& r) {
  uint64_t dropped_before = 0;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    if (now > refilled_) {
      tokens_ = std::min(options_.burst, tokens_ + absl::ToDoubleSeconds(now - refilled_) *
                                                       options_.rate_per_second);
      refilled_ = now;
    }
    if (tokens_ < 1) {
      ++dropped_since_line_;
      ++dropped_total_;
      if (options_.metrics != nullptr) options_.metrics->CountAuditDropped(r.method);
      return false;
    }
    tokens_ -= 1;
    dropped_before = dropped_since_line_;
    dropped_since_line_ = 0;
  }
  const std::string line = FormatAuditLine(r, dropped_before);
  if (options_.logger != nullptr) {
    options_.logger->info("{}", line);
  } else {
    spdlog::info("{}", line);
  }
  if (options_.metrics != nullptr) options_.metrics->CountAuditRecord(r.method);
  return true;
}

uint64_t AuditLog::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_total_;
}

}  // namespace duet
