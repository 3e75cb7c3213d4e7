#include "bridge/ledger/usage.h"

namespace duet {

uint32_t GroupedUse(const std::vector<DeviceUse>& uses) {
  uint32_t total = 0;
  ForEachOwnerGroup(uses, [&total](const DeviceUse&, uint32_t milli) { total += milli; });
  return total;
}

ClassUse UseByClass(const std::vector<DeviceUse>& uses, uint32_t capacity_milli) {
  ClassUse out;
  out.capacity_milli = capacity_milli == 0 ? kWholeDevice : capacity_milli;
  uint64_t slurm = 0;
  uint64_t pods = 0;
  ForEachOwnerGroup(uses, [&](const DeviceUse& first, uint32_t milli) {
    (first.owner->holder_class() == HolderClass::kSlurm ? slurm : pods) += milli;
  });
  out.slurm_milli = static_cast<uint32_t>(std::min<uint64_t>(slurm, out.capacity_milli));
  out.pod_milli =
      static_cast<uint32_t>(std::min<uint64_t>(pods, out.capacity_milli - out.slurm_milli));
  return out;
}

int64_t MilliDevices(uint64_t milli, uint32_t capacity_milli) {
  const uint64_t cap = capacity_milli == 0 ? kWholeDevice : capacity_milli;
  return static_cast<int64_t>(milli * kWholeDevice / cap);
}

double Devices(uint64_t milli, uint32_t capacity_milli) {
  const uint64_t cap = capacity_milli == 0 ? kWholeDevice : capacity_milli;
  return static_cast<double>(milli) / static_cast<double>(cap);
}

}  // namespace duet
