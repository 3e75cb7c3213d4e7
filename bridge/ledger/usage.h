#pragma once

// Owner-group accounting: how much of one device its holders use. The one
// definition; the ledger (admission and DeviceState::used_milli), the
// metrics (duet_devices) and duetctl (nodes) all count with it.
//
// Owners nest in groups (Owner::SameGroup: a Slurm job with its steps, a pod
// with its placeholders). The members of a group hold a device for the same
// work, so a group uses the largest share any member holds, counted once; a
// device's use is the sum over its groups, in the device's milli-units.
//
// In devices, a use is its milli over the device's capacity_milli (not over
// 1000): a device counts as one device whatever its capacity, so a holder of
// all of a 500-milli device holds 1 device, a 250-milli share of a 1000-milli
// device is 0.25, and slurm + pods + free is the node's device count.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bridge/ledger/types.h"

namespace duet {

// Calls fn(first, group_milli) once per owner group among `uses`, in the
// order of each group's first use: `first` is that use (its owner stands for
// the group), `group_milli` the group's largest share. Allocates nothing: the
// ledger runs it for every candidate device of every hold.
template <typename Fn>
void ForEachOwnerGroup(const std::vector<DeviceUse>& uses, Fn&& fn) {
  for (size_t i = 0; i < uses.size(); ++i) {
    const Owner& o = *uses[i].owner;
    bool seen = false;
    for (size_t j = 0; j < i && !seen; ++j) seen = uses[j].owner->SameGroup(o);
    if (seen) continue;
    uint32_t group_milli = uses[i].milli;
    for (size_t j = i + 1; j < uses.size(); ++j) {
      if (uses[j].owner->SameGroup(o)) group_milli = std::max(group_milli, uses[j].milli);
    }
    fn(uses[i], group_milli);
  }
}

// The device's use in its milli-units: the sum over owner groups of each
// group's largest share (DeviceState::used_milli).
uint32_t GroupedUse(const std::vector<DeviceUse>& uses);

// One device's use by holder class, in the device's milli-units. Clamped so
// that slurm + pod never exceed the capacity (the ledger never over-commits;
// a bad answer read back by a client must not print negative free counts):
// Slurm's use first, then the pods' in what is left.
struct ClassUse {
  uint32_t capacity_milli = kWholeDevice;
  uint32_t slurm_milli = 0;
  uint32_t pod_milli = 0;
  uint32_t free_milli() const { return capacity_milli - slurm_milli - pod_milli; }
};
ClassUse UseByClass(const std::vector<DeviceUse>& uses, uint32_t capacity_milli);
inline ClassUse UseByClass(const DeviceState& d) { return UseByClass(d.uses, d.spec.capacity_milli); }

// `milli` of a device of `capacity_milli` (0: kWholeDevice), in thousandths of
// a device: 1000 is the whole device. Exact for capacity 1000; otherwise
// rounded down.
int64_t MilliDevices(uint64_t milli, uint32_t capacity_milli);
// The same in devices (a fraction), for gauges.
double Devices(uint64_t milli, uint32_t capacity_milli);

}  // namespace duet
