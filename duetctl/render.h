#pragma once

// Pure functions that turn duet.v1 responses into what duetctl prints: tables
// for people and JSON for scripts. No I/O, no clock (callers pass `now`), so
// every output is testable byte for byte.
//
// Counting. A device counts for the holder class whose owners use it:
// slurm_job / slurm_step owners are "slurm", pod / placeholder owners are
// "pods". Owners nest in groups (a job with its steps, a pod with its
// placeholder), so a device held by job 12 and by its step 0 counts once.
// Shares count as milli/capacity of a device, so two 500m holders on one GPU
// count as 1 and a single 500m holder as 0.5 (the bridge's one definition,
// bridge/ledger/usage.h, which duet_devices follows too). Counts are kept in
// milli-devices (1000 = one device) and printed as decimals ("0.5", "2.25").
//
// JSON (documented shape, not protobuf's JSON mapping; keys in this order):
//
//   nodes:  {"nodes": [{"name", "state", ["slurm_state", "slurm_reason",]
//                       "pool", "zone", "generation",
//                       "models": [{"kind", "model", "total", "slurm",
//                                   "pods", "free"}]}],
//            "summary": {"nodes", "kinds": [{"kind", "total", "slurm",
//                                            "pods", "free"}]}}
//   holds:  {"holdings": [{"node", "owner", "owner_text", "holder",
//                          "devices": [{"kind", "index", "id", "milli"}],
//                          "granted_at", "generation"}]}
//   node:   {"name", "state", ["slurm_state", "slurm_reason",] "pool", "zone",
//            "cpus", "memory_mib",
//            "generation", "labels": {..},
//            "devices": [{"kind", "index", "id", "model", "capacity_milli",
//                         "used_milli", "topology": {..non-empty fields..},
//                         "holders": [{"owner", "owner_text", "holder",
//                                      "milli"}]}]}
//
// where "state" is ready|cordoned|not_ready|gone|unknown (Kubernetes' side),
// "slurm_state"/"slurm_reason" are Slurm's (present when the bridge runs the
// Slurm side and Slurm knows the node), "kind" of a device
// is gpu|tpu, "holder" is slurm|pods, counts (total/slurm/pods/free) are
// numbers of devices (integers when whole, else decimals), "granted_at" is
// RFC 3339 UTC or null, and "owner" is one of
//   {"kind": "slurm_job", "job_id"}
//   {"kind": "slurm_step", "job_id", "step_id"}
//   {"kind": "pod", "uid", "namespace", "name"}
//   {"kind": "placeholder", "job_id", "pod_uid"}

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "duet/v1/duet.pb.h"
#include "google/protobuf/repeated_field.h"
#include "nlohmann/json.hpp"

namespace duet::ctl {

using Json = nlohmann::ordered_json;

// One row of `duetctl nodes`: the devices of one kind and model on one node,
// in milli-devices (1000 = one device).
struct ModelTally {
  std::string node;
  v1::NodeState state = v1::NODE_STATE_UNSPECIFIED;
  std::string slurm_state;  // empty when the bridge reports none
  v1::DeviceKind kind = v1::DEVICE_KIND_UNSPECIFIED;
  std::string model;
  int64_t total = 0;
  int64_t slurm = 0;
  int64_t pods = 0;
  int64_t free = 0;
};

// Rows for every node, sorted by node name, then kind, then model. A node
// without devices gets one row with kind UNSPECIFIED and zero counts.
std::vector<ModelTally> TallyNodes(const google::protobuf::RepeatedPtrField<v1::Node>& nodes);

// The `duetctl nodes` table plus a summary line; "No nodes.\n" when empty.
std::string RenderNodesTable(const v1::ListNodesResponse& response);
// The `duetctl holds` table; `now` gives the SINCE column. "No holdings.\n"
// when empty.
std::string RenderHoldsTable(const v1::ListHoldingsResponse& response, absl::Time now);
// `duetctl node NAME`: the node's fields, then one row per device.
std::string RenderNodeDetail(const v1::Node& node);

Json NodesJson(const v1::ListNodesResponse& response);
Json HoldsJson(const v1::ListHoldingsResponse& response);

// The `duetctl workload` table: the learned workload's exported shapes,
// heaviest first, and a summary line; and its JSON form
// {"shapes": [{"kind", "count", "milli", "models", "cpu_milli",
// "memory_mib", "weight", "share"}], "tracked", "coverage", "total_weight",
// "arrivals", "duplicates", "evictions", "half_life"}.
std::string RenderWorkloadTable(const v1::WorkloadResponse& response);
Json WorkloadJson(const v1::WorkloadResponse& response);
Json NodeJson(const v1::Node& node);

// Building blocks, exposed for tests.

// `text` made safe to print to a terminal: every string that came from the
// ledger or the cluster (names, holders, reasons, labels, error messages)
// may hold bytes a terminal acts on. Printable UTF-8 is kept ("…", "é");
// `\` becomes "\\", newline, carriage return and tab become "\n", "\r",
// "\t", other C0 controls, DEL and bytes that are not UTF-8 become "\xNN",
// and C1 controls, bidirectional overrides and other invisible format
// characters become "\uNNNN". So one value is one line of visible text, and
// the escaped form is unambiguous. Table and plain outputs pass every cell
// through it; JSON outputs need not (nlohmann escapes controls itself).
std::string Printable(std::string_view text);

// 1500 -> "1.5", 2000 -> "2", 250 -> "0.25", 0 -> "0".
std::string MilliDevices(int64_t milli);
// "job 12", "job 12 step 0", "job 12 step batch", "pod ns/name",
// "placeholder job 7 (pod uid 0a1b2c3d…)". `pod_name` may give "ns/name" for
// a placeholder's pod when the caller knows it (empty: show the uid).
std::string OwnerText(const v1::Owner& owner, const std::string& pod_name = "");
// "gpu0-3", "gpu0,gpu2@500m", "tpu0-1,gpu4". Whole devices in runs of
// consecutive indices collapse to a range; shares show their milli-units.
std::string DevicesText(const google::protobuf::RepeatedPtrField<v1::HeldDevice>& devices);
// "12s", "5m3s", "2h4m", "3d2h"; negative ages print as "0s".
std::string AgeText(absl::Duration age);
// "gpu" / "tpu" / "-".
std::string KindText(v1::DeviceKind kind);
// "Ready", "Cordoned", "NotReady", "Gone", "Unknown".
std::string StateText(v1::NodeState state);

}  // namespace duet::ctl
