#include "bridge/gang/gang.h"

#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/enum_name.h"

namespace duet {
namespace gang {

// The ledger names slot owners without depending on this folder
// (bridge/ledger/types.h); both must say the same.
static_assert(std::string_view(kGangSlotPrefix) == std::string_view(kGangSlotGroupPrefix),
              "kGangSlotPrefix and the ledger's kGangSlotGroupPrefix differ");

namespace {
constexpr const char* kSourceNames[] = {nullptr, "podgroup", "jobset", "lws", "workload"};
}  // namespace

const char* GangSourceName(GangSource source) { return EnumName(source, kSourceNames); }

std::string GangKey::ToString() const {
  return absl::StrCat(GangSourceName(source), "/", ns, "/", name);
}

absl::StatusOr<GangKey> GangKey::Parse(const std::string& text) {
  auto refuse = [&text](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("gang key \"", text, "\": ", why, " (want SOURCE/NAMESPACE/NAME)"));
  };
  const absl::string_view t = text;
  const size_t a = t.find('/');
  if (a == absl::string_view::npos) return refuse("no namespace");
  const size_t b = t.find('/', a + 1);
  if (b == absl::string_view::npos) return refuse("no name");
  const absl::string_view source = t.substr(0, a);
  GangKey key;
  bool known = false;
  for (GangSource s :
       {GangSource::kPodGroup, GangSource::kJobSet, GangSource::kLws, GangSource::kWorkload}) {
    if (source == GangSourceName(s)) {
      key.source = s;
      known = true;
    }
  }
  if (!known) return refuse(absl::StrCat("unknown source \"", source, "\""));
  key.ns = std::string(t.substr(a + 1, b - a - 1));
  key.name = std::string(t.substr(b + 1));
  if (key.ns.empty()) return refuse("empty namespace");
  if (key.name.empty()) return refuse("empty name");
  for (char c : text) {
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f || c == '#') {
      return refuse("a space, control character or '#'");
    }
  }
  return key;
}

}  // namespace gang
}  // namespace duet
