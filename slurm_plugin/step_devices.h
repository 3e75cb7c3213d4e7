#pragma once

// What a step got on this node and the environment each device kind needs.
// Pure functions: no Slurm, no network.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace duet::spank {

struct StepDevices {
  std::vector<uint32_t> gpus;  // sorted physical indices
  std::vector<uint32_t> tpus;
  bool empty() const { return gpus.empty() && tpus.empty(); }
};

// The step's GPU indices from the first non-empty of SLURM_STEP_GPUS (srun
// steps), SLURM_JOB_GPUS (batch step) and CUDA_VISIBLE_DEVICES. Values such
// as "NoDevFiles" or UUIDs are INVALID_ARGUMENT.
absl::StatusOr<std::vector<uint32_t>> GpusFromEnv(const char* step_gpus, const char* job_gpus,
                                                  const char* cuda_visible);

// Environment for the step's tasks: CUDA_VISIBLE_DEVICES for GPUs;
// TPU_VISIBLE_CHIPS, TPU_CHIPS_PER_PROCESS_BOUNDS and TPU_PROCESS_BOUNDS for
// TPUs (one process owning all of the step's chips).
std::vector<std::pair<std::string, std::string>> DeviceEnv(const StepDevices& devices);

// Chip bounds "x,y,1" for n chips on one host: 1 -> 1,1,1; 2 -> 1,2,1;
// 4 -> 2,2,1; 8 -> 2,4,1; otherwise 1,n,1.
std::string TpuChipBounds(size_t n);

}  // namespace duet::spank
