#pragma once

// What a pending pod wants of the lending drivers (docs/dra.md "Lend on
// demand"): from the pod, its ResourceClaims / ResourceClaimTemplates and the
// DeviceClasses, how many devices of which lending driver it asks for.
//
// Counted:
//   - each spec.resourceClaims entry: the claim it names (resourceClaimName,
//     or for a resourceClaimTemplateName the claim pod
//     status.resourceClaimStatuses names, else the template's spec.spec); a
//     claim already allocated counts nothing. Each spec.devices.requests[]
//     `exactly` request whose deviceClassName belongs to a lending driver:
//     allocationMode ExactCount (the default) adds `count` (default 1); All
//     marks the driver `all` (a whole host: every device of a node).
//   - each container's extended resources (KEP-5004): a resource named by a
//     DeviceClass's spec.extendedResourceName (the class created last wins,
//     ties to the first name) or `deviceclass.resource.kubernetes.io/<class>`
//     adds its quantity (requests, else limits; a whole number). Skipped when
//     pod status.extendedResourceClaimStatus names the claim already made.
// A class belongs to driver D when one of its spec.selectors[].cel
// expressions is `device.driver == "D"`, alone or as one `&&` term (the form
// vendors' classes use); classes of no lending driver count nothing.
// firstAvailable requests (prioritized lists) count nothing: their driver is
// only chosen at allocation.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace duet {
namespace k8s_dra {

struct DemandInputs {
  // "namespace/name" -> the object.
  std::map<std::string, nlohmann::json> claims;
  std::map<std::string, nlohmann::json> templates;
  // Every DeviceClass.
  std::vector<nlohmann::json> device_classes;
};

struct DeviceDemand {
  int64_t count = 0;  // ExactCount devices
  bool all = false;   // some request takes every device of a node
};

// Whether kube-scheduler gave up on the pod for now: status.conditions has
// PodScheduled False with reason Unschedulable, and it is not bound.
bool UnschedulablePod(const nlohmann::json& pod);

// The pod's demand by lending driver (drivers it wants nothing of are
// absent). NOT_FOUND names a claim or template the pod refers to that is not
// in `inputs` (the caller waits for its informer); INVALID_ARGUMENT a field
// of the wrong shape or an extended-resource quantity that is not a whole
// number.
absl::StatusOr<std::map<std::string, DeviceDemand>> PodDemand(
    const nlohmann::json& pod, const DemandInputs& inputs,
    const std::vector<std::string>& lending_drivers);

}  // namespace k8s_dra
}  // namespace duet
