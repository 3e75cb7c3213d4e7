#include "slurm_plugin/step_devices.h"

#include "absl/strings/str_cat.h"
#include "bridge/slurm/slurm_client.h"

namespace duet::spank {

absl::StatusOr<std::vector<uint32_t>> GpusFromEnv(const char* step_gpus, const char* job_gpus,
                                                  const char* cuda_visible) {
  for (const char* v : {step_gpus, job_gpus, cuda_visible}) {
    if (v == nullptr || *v == '\0') continue;
    auto parsed = ParseIndexList(v);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read the step's GPUs from \"", v, "\""));
    }
    return parsed;
  }
  return std::vector<uint32_t>();
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

std::vector<std::pair<std::string, std::string>> DeviceEnv(const StepDevices& d) {
  std::vector<std::pair<std::string, std::string>> env;
  if (!d.gpus.empty()) env.emplace_back("CUDA_VISIBLE_DEVICES", FormatIndexList(d.gpus));
  if (!d.tpus.empty()) {
    env.emplace_back("TPU_VISIBLE_CHIPS", FormatIndexList(d.tpus));
    env.emplace_back("TPU_CHIPS_PER_PROCESS_BOUNDS", TpuChipBounds(d.tpus.size()));
    env.emplace_back("TPU_PROCESS_BOUNDS", "1,1,1");
  }
  return env;
}

}  // namespace duet::spank
