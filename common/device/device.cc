#include "common/device/device.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace duet {

const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kGpu:
      return "gpu";
    case DeviceKind::kTpu:
      return "tpu";
  }
  return "device";
}

std::string TpuChipBounds(size_t n) {
  switch (n) {
    case 1: return "1,1,1";
    case 2: return "1,2,1";
    case 4: return "2,2,1";
    case 8: return "2,4,1";
    default: return absl::StrCat("1,", n, ",1");
  }
}

std::vector<std::pair<std::string, std::string>> DeviceEnv(const HostDevices& d) {
  std::vector<std::pair<std::string, std::string>> env;
  if (!d.gpus.empty()) env.emplace_back("CUDA_VISIBLE_DEVICES", absl::StrJoin(d.gpus, ","));
  if (!d.tpus.empty()) {
    env.emplace_back("TPU_VISIBLE_CHIPS", absl::StrJoin(d.tpus, ","));
    env.emplace_back("TPU_CHIPS_PER_PROCESS_BOUNDS", TpuChipBounds(d.tpus.size()));
    env.emplace_back("TPU_PROCESS_BOUNDS", "1,1,1");
  }
  return env;
}

}  // namespace duet
