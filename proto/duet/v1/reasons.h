#pragma once

// Why duet-bridge refused a call: the `reason` of the google.rpc.ErrorInfo
// it attaches to the refusal (domain kErrorDomain). Callers decide on these,
// never on the status message, which is for people and may change. The
// contract (which call sends which reason, with which metadata) is in
// proto/README.md. No dependencies: the ledger uses these names too.

namespace duet::v1 {

inline constexpr char kErrorDomain[] = "duet.dev";

namespace reason {
// NOT_FOUND: the ledger does not know the node; it is not shared with
// Kubernetes (a Slurm-only node). Metadata: node.
inline constexpr char kNodeNotShared[] = "NODE_NOT_SHARED";
// NOT_FOUND: the node is shared but has no such device index. Metadata:
// node, device.
inline constexpr char kDeviceUnknown[] = "DEVICE_UNKNOWN";
// RESOURCE_EXHAUSTED: a named device is held by a pod (or a pod's Slurm
// placeholder). Metadata: node, device, holder.
inline constexpr char kHeldByPod[] = "HELD_BY_POD";
// RESOURCE_EXHAUSTED: a named device is held by a pod whose Slurm
// placeholder Slurm preempted, and the bridge is evicting that pod
// (slurm.preemption: evict-pods): a Slurm step may ask again until the wait
// is over. Metadata: node, device, holder (the pod, "NS/NAME"), wait_s (whole
// seconds the step may still wait, at least 1).
inline constexpr char kPodEvicting[] = "POD_EVICTING";
// RESOURCE_EXHAUSTED: a named device is held by a Slurm job or step.
// Metadata: node, device, holder.
inline constexpr char kHeldBySlurm[] = "HELD_BY_SLURM";
// RESOURCE_EXHAUSTED: a count request (any N devices) found too few with
// room. Metadata: node.
inline constexpr char kNoRoom[] = "NO_ROOM";
// FAILED_PRECONDITION: the node is cordoned or not ready; no new pod
// holdings. Metadata: node, state.
inline constexpr char kNodeNotReady[] = "NODE_NOT_READY";
// FAILED_PRECONDITION: the node is leaving the inventory. Metadata: node.
inline constexpr char kNodeGone[] = "NODE_GONE";
// ALREADY_EXISTS: the owner already holds other devices on the node.
// Metadata: node, holder.
inline constexpr char kAlreadyHeld[] = "ALREADY_HELD";
// ABORTED: expected_generation is not the node's generation. Metadata: node.
inline constexpr char kStaleGeneration[] = "STALE_GENERATION";
// UNAVAILABLE: this replica is a standby, not the leader; retry against the
// leader (e.g. the bridge's Service).
inline constexpr char kStandby[] = "STANDBY";
// UNAVAILABLE: the bridge stopped granting (its journal failed, or it is
// shutting down).
inline constexpr char kNotServing[] = "NOT_SERVING";
// UNAUTHENTICATED: a mutating call for a pod or placeholder owner without a
// caller identity the bridge accepts (auth.mode token: no token, a token
// the API server rejects, or one sent in clear). Metadata: why.
inline constexpr char kNotAuthenticated[] = "NOT_AUTHENTICATED";
// PERMISSION_DENIED: the caller is known but not entitled to act for that
// owner on that node (duet-node of another node, a pod bound elsewhere, an
// identity that is neither duet-node nor an operator). Metadata: why, node.
inline constexpr char kNotPermitted[] = "NOT_PERMITTED";
// UNAUTHENTICATED or PERMISSION_DENIED (RESOURCE_EXHAUSTED for why=full): a
// Hold or Release for a Slurm owner whose credential (slurm.credential) the
// bridge refused. Metadata: why (missing, malformed, bad_signature,
// wrong_version, wrong_method, wrong_request, wrong_uid, expired, replayed,
// full), node.
inline constexpr char kCredentialRefused[] = "CREDENTIAL_REFUSED";
// RESOURCE_EXHAUSTED: WatchNodes refused for lack of a stream slot: the
// caller (its peer address) already has its share open (scope "caller"),
// or the bridge has all it serves (scope "total"). Close a stream or retry
// later. Metadata: scope, limit.
inline constexpr char kTooManyWatches[] = "TOO_MANY_WATCHES";
}  // namespace reason

}  // namespace duet::v1
