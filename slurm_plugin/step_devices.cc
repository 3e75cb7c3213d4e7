#include "slurm_plugin/step_devices.h"

#include "absl/strings/str_cat.h"
#include "common/slurm/slurm_format.h"

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

}  // namespace duet::spank
