#pragma once

// What a step got on this node; the environment each device kind needs is
// common/device/device.h's DeviceEnv. Pure functions: no Slurm, no network.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/device/device.h"

namespace duet::spank {

// The step's devices on this node (common/device/device.h).
using StepDevices = ::duet::HostDevices;
using ::duet::DeviceEnv;
using ::duet::TpuChipBounds;

// The step's GPU indices from the first non-empty of SLURM_STEP_GPUS (srun
// steps), SLURM_JOB_GPUS (batch step) and CUDA_VISIBLE_DEVICES. Values such
// as "NoDevFiles" or UUIDs are INVALID_ARGUMENT.
absl::StatusOr<std::vector<uint32_t>> GpusFromEnv(const char* step_gpus, const char* job_gpus,
                                                  const char* cuda_visible);

}  // namespace duet::spank
