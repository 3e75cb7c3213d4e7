#include "slurm_plugin/plugin_config.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace duet::spank {

absl::StatusOr<PluginConfig> ParsePluginArgs(int argc, const char* const* argv) {
  PluginConfig c;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i] ? argv[i] : "";
    const auto eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    auto bad = [&](const char* why) {
      return absl::InvalidArgumentError(absl::StrCat("plugstack argument \"", arg, "\": ", why));
    };
    if (key == "bridge") {
      if (value.empty()) return bad("address is empty");
      c.bridge = value;
    } else if (key == "timeout_ms") {
      if (!absl::SimpleAtoi(value, &c.timeout_ms) || c.timeout_ms < 1 || c.timeout_ms > 60000) {
        return bad("must be an integer in 1..60000");
      }
    } else if (key == "on_unreachable") {
      if (value == "fail") {
        c.on_unreachable = OnUnreachable::kFail;
      } else if (value == "allow") {
        c.on_unreachable = OnUnreachable::kAllow;
      } else {
        return bad("must be fail or allow");
      }
    } else if (key == "tpu") {
      if (value == "auto") {
        c.tpu = TpuProbe::kAuto;
      } else if (value == "yes") {
        c.tpu = TpuProbe::kYes;
      } else if (value == "no") {
        c.tpu = TpuProbe::kNo;
      } else {
        return bad("must be auto, yes or no");
      }
    } else if (arg == "disabled") {
      c.disabled = true;
    } else {
      return bad("unknown key (known: bridge, timeout_ms, on_unreachable, tpu, disabled)");
    }
  }
  return c;
}

}  // namespace duet::spank
