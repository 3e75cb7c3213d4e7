// Fuzzes duet-bridge's YAML config reader (bridge/config/config.h) with
// arbitrary bytes as the config text. Checks: ParseConfig never crashes or
// lets an exception escape (yaml-cpp throws; config.cc must catch), refuses
// only with INVALID_ARGUMENT, and ValidateConfig of whatever it accepts
// answers OK or INVALID_ARGUMENT without crashing.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "bridge/config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<duet::Config> c = duet::ParseConfig(yaml);
  if (!c.ok()) {
    if (c.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  const absl::Status v = duet::ValidateConfig(*c);
  if (!v.ok() && v.code() != absl::StatusCode::kInvalidArgument) std::abort();
  return 0;
}
