#pragma once

// The kube-scheduler extender protocol (k8s.io/kube-scheduler/extender/v1),
// as kube-scheduler sends and reads it: Go structs without json tags, so every
// key is the Go field name in PascalCase ("Pod", "NodeNames", "FailedNodes",
// "PodUID", ...). Go's decoder matches keys case-insensitively, so the
// parsers here do too; what they write is always PascalCase.
//
// Also here: the pod's request as duet's placement sees it (ParsePodRequest),
// computed with Kubernetes' effective-request rules.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bridge/placement/request.h"
#include "nlohmann/json.hpp"

namespace duet {
namespace extender {

// extenderv1.MaxExtenderPriority: prioritize scores lie in 0..10.
inline constexpr int64_t kMaxExtenderPriority = 10;

inline constexpr char kGpuResource[] = "nvidia.com/gpu";
inline constexpr char kTpuResource[] = "google.com/tpu";
// Optional pod annotations (duet's own hints):
//  - per-device share in milli-units, for a pod that asks for one device and
//    is content with part of it ("500" = half a GPU);
inline constexpr char kDeviceMilliAnnotation[] = "duet.dev/device-milli";
//  - acceptable device models, comma-separated ("nvidia-h100-80gb,nvidia-h200-141gb").
inline constexpr char kModelsAnnotation[] = "duet.dev/models";
// Node selector keys that name the device model (GKE's labels).
inline constexpr char kGpuModelSelector[] = "cloud.google.com/gke-accelerator";
inline constexpr char kTpuModelSelector[] = "cloud.google.com/gke-tpu-accelerator";

// ExtenderArgs {Pod, Nodes, NodeNames}. With nodeCacheCapable: true,
// kube-scheduler sends NodeNames; Nodes (a v1.NodeList) is accepted too and
// only its items' metadata.name are read.
struct ExtenderArgs {
  nlohmann::json pod;  // the v1.Pod, as sent
  std::vector<std::string> node_names;
  // True when the names came from Nodes.items (the reply then fills Nodes).
  bool from_node_list = false;
  nlohmann::json node_list;  // kept only when from_node_list
  // The pod's JSON text exactly as sent, set by ParseExtenderArgsFast ("" on
  // the general path): the key under which the extender keeps the pod's
  // parsed request for the prioritize that follows the filter.
  std::string pod_text;
};

// A prioritize request as the server's fast path reads it
// (ParsePrioritizeArgsFast): the pod's JSON text as sent, not yet parsed,
// and the names as views into one block of their own (no string per name).
// Movable: the views stay valid.
struct PrioritizeArgs {
  std::string pod_text;
  std::vector<std::string_view> node_names;
  std::unique_ptr<char[]> name_block;  // what node_names point into
};

// ExtenderFilterResult.
struct FilterResult {
  std::vector<std::string> node_names;  // the nodes that pass
  std::map<std::string, std::string> failed;                 // FailedNodes
  std::map<std::string, std::string> failed_unresolvable;    // FailedAndUnresolvableNodes
  std::string error;
};

// One HostPriority.
struct HostPriority {
  std::string host;
  int64_t score = 0;
};

// ExtenderBindingArgs.
struct BindingArgs {
  std::string pod_name;
  std::string pod_namespace;
  std::string pod_uid;
  std::string node;
};

// Parsers: INVALID_ARGUMENT naming the problem ("ExtenderArgs.Pod: missing",
// "ExtenderArgs.NodeNames[3]: not a string", ...). Bounded: at most
// kMaxNodesPerRequest names.
// `body` is taken by value: the pod and the names are moved out of it
// (pass std::move(parsed) to avoid copying a 100 KB document).
absl::StatusOr<ExtenderArgs> ParseExtenderArgs(nlohmann::json body);
absl::StatusOr<BindingArgs> ParseBindingArgs(const nlohmann::json& body);

// The fast path for the request kube-scheduler actually sends: an object with
// exactly the keys "Pod" (an object), "NodeNames" (a list of strings) and
// optionally "Nodes": null, in any order. It reads the names with simdjson
// On-Demand (no DOM for the list) and parses only the pod with nlohmann.
// nullopt for anything else -- other or differently cased keys, duplicates,
// other types, invalid JSON, trailing content --, and the caller then takes
// the general path (nlohmann::json::parse + ParseExtenderArgs), which gives
// the same result on every body this accepts and the usual errors on the rest.
std::optional<ExtenderArgs> ParseExtenderArgsFast(const std::string& body);

// The same reading (the same bodies accepted, the same names) without a DOM
// of the pod: only its text is kept, so a pod that simdjson skipped over is
// not yet known to be valid JSON. The caller either finds that exact text
// among texts that parsed before (Extender::PrioritizeScoresFromText) or
// parses it (ParsePodText) and takes the general path when that fails.
std::optional<PrioritizeArgs> ParsePrioritizeArgsFast(const std::string& body);

// The pod's DOM from its text as ParseExtenderArgsFast builds it: nullopt
// when it nests too deep, is not valid JSON or is not an object.
std::optional<nlohmann::json> ParsePodText(std::string_view pod_text);

inline constexpr size_t kMaxNodesPerRequest = 100000;

// The deepest nesting of JSON objects and arrays a request body may have (the
// top-level object is 1). A Pod is about 15 deep (managedFields); every
// body is checked before a DOM is built, because a DOM of a megabyte of
// '[' costs hundreds of MiB.
inline constexpr int kMaxJsonDepth = 64;

// OK when `json` nests at most `max_depth` levels; INVALID_ARGUMENT saying
// so when deeper. Reads with nlohmann's SAX parser and builds nothing;
// stops at the first level too deep. Text that is not JSON passes (the
// parse that follows words that error).
absl::Status CheckJsonDepth(std::string_view json, int max_depth = kMaxJsonDepth);

// Serialisers (PascalCase). `args` is needed to echo Nodes when the request
// carried a NodeList instead of names.
nlohmann::json FilterResultJson(const FilterResult& result, const ExtenderArgs* args = nullptr);
nlohmann::json PriorityListJson(const std::vector<HostPriority>& list);
nlohmann::json BindingResultJson(const std::string& error);

// The same documents, already dumped: byte for byte what
// FilterResultJson(...).dump() / PriorityListJson(...).dump() give (compact,
// keys in order, invalid UTF-8 replaced), written without building the DOM
// (thousands of names per request). A request that carried a NodeList takes
// the DOM path.
std::string FilterResultBody(const FilterResult& result, const ExtenderArgs* args = nullptr);
std::string PriorityListBody(const std::vector<HostPriority>& list);
// The same list given as names and their scores (parallel; scores.size()
// entries): the server's path, which copies no name.
std::string PriorityListBody(const std::vector<std::string>& hosts, const std::vector<int64_t>& scores);
// The same with the names as views (ParsePrioritizeArgsFast's).
std::string PriorityListBodyOfViews(const std::vector<std::string_view>& hosts,
                                   const std::vector<int64_t>& scores);

// The pod's identity, for ledger owners and events.
struct PodRef {
  std::string ns;
  std::string name;
  std::string uid;
  std::string node_name;  // spec.nodeName ("" while unbound)
};
PodRef PodRefOf(const nlohmann::json& pod);

// The pod's request as placement sees it: devices (nvidia.com/gpu or
// google.com/tpu; asking for both is INVALID_ARGUMENT, and so is a fraction
// of a device), CPU (milli) and memory (MiB, rounded up), from the pod's
// effective request (k8s::EffectivePodRequest: Kubernetes' rules for limits,
// init containers, sidecars and overhead). Models come from the annotation
// kModelsAnnotation, else the node selector of the device kind; the share
// from kDeviceMilliAnnotation. INVALID_ARGUMENT names the field (e.g.
// "spec.containers[0].resources.limits[nvidia.com/gpu]: \"x\": ...").
// The result's model_ids are resolved against the ledger's model table.
absl::StatusOr<placement::PodRequest> ParsePodRequest(const nlohmann::json& pod);

}  // namespace extender
}  // namespace duet
