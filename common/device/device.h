#pragma once

// The accelerator vocabulary every duet binary shares: the device kinds, and
// the environment a process owning some of a host's devices is given. Slurm
// steps (the SPANK plugin) and containers (duet-node) get the same TPU
// variables from here. Pure functions, no I/O.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace duet {

enum class DeviceKind : uint8_t { kGpu = 1, kTpu = 2 };

// "gpu" / "tpu".
const char* DeviceKindName(DeviceKind kind);

// Devices one process owns on a host, by host index (/dev/nvidiaN,
// /dev/accelN), sorted.
struct HostDevices {
  std::vector<uint32_t> gpus;
  std::vector<uint32_t> tpus;
  bool empty() const { return gpus.empty() && tpus.empty(); }
};

// Environment for a process owning `devices` under their host indices:
// CUDA_VISIBLE_DEVICES for GPUs; TPU_VISIBLE_CHIPS, TPU_CHIPS_PER_PROCESS_BOUNDS
// and TPU_PROCESS_BOUNDS for TPUs (one process owning all of the chips).
// Empty for no devices.
std::vector<std::pair<std::string, std::string>> DeviceEnv(const HostDevices& devices);

// Chip bounds "x,y,1" for n chips on one host: 1 -> 1,1,1; 2 -> 1,2,1;
// 4 -> 2,2,1; 8 -> 2,4,1; otherwise 1,n,1.
std::string TpuChipBounds(size_t n);

}  // namespace duet
