#pragma once

// Conversions between the ledger's types and duet.v1 protos. The one place
// where the wire format meets the core; used by the gRPC service, the journal
// and duetctl's tests.

#include "absl/status/statusor.h"
#include "bridge/ledger/ledger.h"
#include "bridge/ledger/types.h"
#include "common/grpc/status.h"  // ToGrpc: every duet.v1.Ledger server answers through it
#include "duet/v1/duet.pb.h"
#include "grpcpp/support/status.h"

namespace duet {

v1::DeviceKind ToProto(DeviceKind kind);
absl::StatusOr<DeviceKind> FromProto(v1::DeviceKind kind, const char* field);

v1::NodeState ToProto(NodeState state);

void ToProto(const Owner& owner, v1::Owner* out);
// INVALID_ARGUMENT when no owner kind is set. Does not validate values
// (ValidateOwner does).
absl::StatusOr<Owner> FromProto(const v1::Owner& owner);

void ToProto(const Holding& holding, v1::Holding* out);
// Device ids are filled from `view` when given.
void ToProto(const Holding& holding, const NodeView* view, v1::Holding* out);
absl::StatusOr<Holding> FromProto(const v1::Holding& holding);

// The node's spec only (devices without holders), for the journal.
void ToProto(const NodeSpec& spec, v1::Node* out);
absl::StatusOr<NodeSpec> FromProto(const v1::Node& node);

// The node as clients see it: spec, holders per device, generation.
void ToProto(const NodeView& view, v1::Node* out);

// A HoldRequest from the wire, checked for shape (the ledger checks the rest).
absl::StatusOr<HoldRequest> FromProto(const v1::HoldRequest& request);

}  // namespace duet
