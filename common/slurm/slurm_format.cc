#include "common/slurm/slurm_format.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace duet {
namespace {

// Splits on commas that are not inside parentheses:
// "gpu:h100:2(IDX:0,2),tpu:1" -> {"gpu:h100:2(IDX:0,2)", "tpu:1"}.
std::vector<std::string> SplitTopLevel(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char c : s) {
    if (c == '(') ++depth;
    if (c == ')' && depth > 0) --depth;
    if (c == ',' && depth == 0) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
      continue;
    }
    cur.push_back(c);
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

}  // namespace

std::vector<SlurmGres> ParseGres(const std::string& gres) {
  std::vector<SlurmGres> out;
  for (std::string entry : SplitTopLevel(gres)) {
    if (auto paren = entry.find('('); paren != std::string::npos) entry.resize(paren);
    if (entry.empty() || entry == "(null)") continue;
    std::vector<std::string> parts = absl::StrSplit(entry, ':');
    SlurmGres g;
    g.name = parts[0];
    uint32_t count = 1;
    if (parts.size() == 2) {
      if (!absl::SimpleAtoi(parts[1], &count)) {
        g.type = parts[1];  // "gpu:h100" means one
        count = 1;
      }
    } else if (parts.size() >= 3) {
      g.type = parts[1];
      if (!absl::SimpleAtoi(parts[2], &count)) continue;
    }
    g.count = count;
    out.push_back(std::move(g));
  }
  return out;
}

std::string FormatGres(const std::vector<SlurmGres>& gres) {
  std::vector<std::string> parts;
  for (const SlurmGres& g : gres) {
    if (g.count == 0) continue;
    parts.push_back(g.type.empty() ? absl::StrCat(g.name, ":", g.count)
                                   : absl::StrCat(g.name, ":", g.type, ":", g.count));
  }
  return absl::StrJoin(parts, ",");
}

absl::StatusOr<std::vector<uint32_t>> ParseIndexList(const std::string& list) {
  std::vector<uint32_t> out;
  if (list.empty()) return out;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    std::vector<std::string> range = absl::StrSplit(part, '-');
    uint32_t lo = 0, hi = 0;
    if (range.size() == 1 && absl::SimpleAtoi(range[0], &lo)) {
      hi = lo;
    } else if (range.size() != 2 || !absl::SimpleAtoi(range[0], &lo) ||
               !absl::SimpleAtoi(range[1], &hi) || hi < lo || hi - lo > 4096) {
      return absl::InvalidArgumentError(absl::StrCat("bad index list \"", list, "\""));
    }
    // Stops at hi itself: `i <= hi` would never fail for hi == UINT32_MAX.
    for (uint32_t i = lo;; ++i) {
      out.push_back(i);
      if (i == hi) break;
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string FormatIndexList(const std::vector<uint32_t>& indices) {
  return absl::StrJoin(indices, ",");
}

absl::Status ParseGresDetail(const std::string& detail, SlurmJobNodeDevices* out) {
  for (const std::string& entry : SplitTopLevel(detail)) {
    const std::string name = entry.substr(0, entry.find_first_of(":("));
    std::vector<uint32_t>* target = nullptr;
    if (name == "gpu") target = &out->gpus;
    if (name == "tpu") target = &out->tpus;
    if (target == nullptr) continue;
    auto idx = entry.find("(IDX:");
    if (idx == std::string::npos) continue;  // count-only GRES: no identities
    auto end = entry.find(')', idx);
    if (end == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("bad GRES detail \"", detail, "\""));
    }
    const std::string list = entry.substr(idx + 5, end - idx - 5);
    if (list == "N/A") continue;
    auto parsed = ParseIndexList(list);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad GRES detail \"", detail, "\": ", parsed.status().message()));
    }
    target->insert(target->end(), parsed->begin(), parsed->end());
    std::sort(target->begin(), target->end());
    target->erase(std::unique(target->begin(), target->end()), target->end());
  }
  return absl::OkStatus();
}

std::string SanitizeFeature(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    unsigned char u = static_cast<unsigned char>(c);
    char l = static_cast<char>(std::tolower(u));
    out.push_back((std::isalnum(u) || l == '.' || l == '_' || l == '-') ? l : '_');
  }
  return out;
}

const char* SlurmJobStateName(SlurmJobState state) {
  switch (state) {
    case SlurmJobState::kPending: return "PENDING";
    case SlurmJobState::kRunning: return "RUNNING";
    case SlurmJobState::kSuspended: return "SUSPENDED";
    case SlurmJobState::kCompleting: return "COMPLETING";
    case SlurmJobState::kFinished: return "FINISHED";
    case SlurmJobState::kOther: return "OTHER";
  }
  return "OTHER";
}

}  // namespace duet
