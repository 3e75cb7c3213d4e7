#pragma once

// What duet.v1 requests may carry, checked at the gRPC boundary before the
// service looks anything up, asks an authorizer, or journals: anyone who
// reaches the port can send anything, and a name that gets past here ends
// up in the ledger, the journal, logs, metrics labels and error messages.
// Every refusal is INVALID_ARGUMENT without a reason (proto/README.md,
// "Reasons") and quotes the offending value through Echo, never whole.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "bridge/ledger/types.h"
#include "duet/v1/duet.pb.h"
#include "google/protobuf/repeated_ptr_field.h"

namespace duet {

// Node names one ListNodes or WatchNodes request may list. A larger cluster
// lists every node by sending no names.
inline constexpr size_t kMaxNamesPerRequest = 5000;
// Bytes of a bad value an error message quotes.
inline constexpr size_t kMaxEchoBytes = 64;
// A Kubernetes namespace is an RFC 1123 label.
inline constexpr size_t kMaxNamespaceLength = 63;
// PlacePod's CPU and memory requests: far beyond any node (2^20 CPUs, 1 EiB),
// low enough that sums over every pod of a node stay far from int64's end
// (placement subtracts them from a node's free amounts as int64).
inline constexpr uint32_t kMaxPodCpus = uint32_t{1} << 20;
inline constexpr uint64_t kMaxPodMemoryMib = uint64_t{1} << 40;

// `value` for an error message: double-quoted, bytes outside printable ASCII
// (and `"`, `\`) as \xNN, cut once kMaxEchoBytes of it are written, then
// "…(N bytes)" when it was cut: a 3 MiB name stays a short message.
std::string Echo(absl::string_view value);

// A node name the ledger may know: 1..253 bytes of printable ASCII without
// blanks. Not Kubernetes' rule: a Slurm step names its node as slurmd does
// (SLURMD_NODENAME, upper case and '_' allowed), and on a node that is not
// shared it must still get NODE_NOT_SHARED, never INVALID_ARGUMENT.
absl::Status CheckNodeName(absl::string_view field, absl::string_view name);
// A Kubernetes Node name (an RFC 1123 subdomain): what pod-side calls name.
absl::Status CheckKubeNodeName(absl::string_view field, absl::string_view name);
// ListNodes/WatchNodes `names`: at most kMaxNamesPerRequest, each a node
// name (CheckNodeName), none twice (a name listed N times would be answered
// N times).
absl::Status CheckNodeNames(absl::string_view field,
                            const google::protobuf::RepeatedPtrField<std::string>& names);
// The pod fields of a pod or placeholder owner: uid (1..kMaxUidLength bytes
// of printable ASCII without blanks), namespace (an RFC 1123 label) and name
// (an RFC 1123 subdomain) where set. Slurm owners carry no strings: OK.
// Claim and lend owners are refused (INVALID_ARGUMENT): only duet-bridge
// makes them, so Hold and Release never take one.
absl::Status CheckOwnerStrings(const Owner& owner);
// HoldRequest beyond its owner: the device list no longer than a node can
// be (checked before it is converted) and the count's model printable.
absl::Status CheckHoldSelection(const v1::HoldRequest& request);
// PlacePod's amounts: devices, CPUs and memory within the bounds above.
absl::Status CheckPlacePodAmounts(const v1::PlacePodRequest& request);

}  // namespace duet
