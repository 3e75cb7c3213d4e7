#pragma once

// A pod's resource request as Kubernetes computes it (the scheduler's and
// kubelet's reading), for every component of duet that reads a pod: the
// scheduler extender (what to place) and duet-node (which pending pod a
// container belongs to). The rules, from the Kubernetes documentation
// ("Resource Management for Pods and Containers", "Init Containers",
// "Sidecar Containers", "Pod Overhead"):
//
//  - A container's request for a resource is resources.requests[r]; when
//    that is absent and resources.limits[r] is set, the limit is the request.
//  - Extended resources (a domain-prefixed name outside *kubernetes.io, such
//    as nvidia.com/gpu) cannot be overcommitted: when a container sets both,
//    request and limit must be equal.
//  - Init containers run one at a time before the app containers. A sidecar
//    (an init container with restartPolicy: Always) keeps running beside
//    every container started after it. So the pod's request is
//        max(sum over app containers and sidecars,
//            max over init containers i of (i + the sidecars before i))
//    plus spec.overhead.
//
// Amounts are milli-units (memory: milli-bytes), exactly as
// ParseQuantityMilli reads them. Quantities may be strings or JSON numbers
// (Kubernetes' decoder takes both). Nothing here throws: a field of the wrong
// type is INVALID_ARGUMENT naming its path.

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace duet {
namespace k8s {

// Resource name -> amount in milli-units; only the names the pod mentions.
using ResourceList = std::map<std::string, int64_t, std::less<>>;

// The amount of `name` in `list`; 0 when absent.
int64_t Amount(const ResourceList& list, absl::string_view name);

// Whether Kubernetes treats `name` as an extended resource: it has a domain
// prefix ("example.com/foo") that is not kubernetes.io or a subdomain of it.
bool IsExtendedResource(absl::string_view name);

// One quantity value (a string such as "500m", or a number) in milli-units.
// INVALID_ARGUMENT naming `where` when it is not a quantity or is negative.
absl::StatusOr<int64_t> QuantityMilli(const nlohmann::json& value, absl::string_view where);

// One container's effective request (requests, limits standing in for
// absent requests). `where` names the container in errors
// ("spec.containers[0]").
absl::StatusOr<ResourceList> ContainerRequest(const nlohmann::json& container,
                                              absl::string_view where);

// The pod's effective request (the rules above). INVALID_ARGUMENT naming the
// field, e.g. "spec.containers[0].resources.limits[nvidia.com/gpu]: \"x\":
// not a quantity (no digits)", "spec.containers: missing or not a list".
absl::StatusOr<ResourceList> EffectivePodRequest(const nlohmann::json& pod);

// JSON reads that never throw, for the callers' other fields of a pod.
// The member `key` of `obj`; null when `obj` is not an object or lacks it.
const nlohmann::json* Field(const nlohmann::json& obj, const char* key);
// A string member: "" when absent or null; INVALID_ARGUMENT naming
// "<where>.<key>" when another type.
absl::StatusOr<std::string> StringField(const nlohmann::json& obj, const char* key,
                                        absl::string_view where);

}  // namespace k8s
}  // namespace duet
