#include "bridge/gang/gang.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/enum_name.h"

namespace duet {
namespace gang {

const char* GangSourceName(GangSource source) {
  static constexpr const char* kNames[] = {nullptr, "podgroup", "jobset", "lws", "workload"};
  return EnumName(source, kNames);
}

std::string GangKey::ToString() const {
  return absl::StrCat(GangSourceName(source), "/", ns, "/", name);
}

absl::StatusOr<GangKey> GangKey::Parse(const std::string& text) {
  // SOURCE/NS/NAME; NAME may itself hold '/' (a JobSet's "JOBSET/RJOB").
  std::vector<std::string> parts = absl::StrSplit(text, absl::MaxSplits('/', 2));
  if (parts.size() != 3 || parts[1].empty() || parts[2].empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gang key \"", text, "\": not SOURCE/NAMESPACE/NAME"));
  }
  GangKey key;
  bool known = false;
  for (GangSource s : {GangSource::kPodGroup, GangSource::kJobSet, GangSource::kLws,
                       GangSource::kWorkload}) {
    if (parts[0] == GangSourceName(s)) {
      key.source = s;
      known = true;
    }
  }
  if (!known) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gang key \"", text, "\": unknown source \"", parts[0],
        "\" (podgroup, jobset, lws or workload)"));
  }
  key.ns = std::move(parts[1]);
  key.name = std::move(parts[2]);
  return key;
}

}  // namespace gang
}  // namespace duet
