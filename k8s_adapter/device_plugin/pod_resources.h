#pragma once

// kubelet's PodResources v1 API, as duet-node reads it: which devices kubelet
// has for our resources (is duet-node their only advertiser?), and which
// slots and how many devices kubelet has already given to which pods. Each
// call opens its own channel to the socket: no state, safe from any thread.

#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "common/device/device.h"

namespace duet {
namespace node {

// One advertiser per resource: asks kubelet's PodResources
// GetAllocatableResources which devices it has for nvidia.com/gpu and
// google.com/tpu. A device whose ID is not one of duet-node's slot IDs comes
// from another device plugin (GKE's managed NVIDIA or TPU plugin, NVIDIA's),
// and two plugins for one resource on a kubelet is unsafe: then
// FAILED_PRECONDITION naming the resource and the foreign IDs. OK when none
// is seen, and OK (with a warning) when kubelet cannot be asked (no socket,
// a kubelet without GetAllocatableResources): nothing is refused on a guess.
absl::Status CheckSoleAdvertiser(const std::string& pod_resources_socket);

// What kubelet's PodResources List says it has given out.
struct KubeletGiven {
  // Our slot numbers kubelet reports allocated, per kind.
  std::map<DeviceKind, std::set<int>> allocated;
  // "ns/name" -> resource name -> devices.
  std::map<std::string, std::map<std::string, int>> served;
};

// Lists PodResources (2 s deadline). nullopt when the socket is not
// configured or absent, or the call fails (logged at debug): the caller
// keeps what it knew.
std::optional<KubeletGiven> ListKubeletGiven(const std::string& pod_resources_socket);

}  // namespace node
}  // namespace duet
