#pragma once

// gRPC rich error details for duet: a google.rpc.Status in the
// `grpc-status-details-bin` trailer carrying one google.rpc.ErrorInfo. The
// one writer (duet-bridge) and the one reader (the SPANK client module,
// duetctl, duet-node). Header-only so the SPANK client module, which
// compiles the generated sources itself, needs nothing more.

#include <map>
#include <string>
#include <utility>

#include "proto/duet/v1/reasons.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "grpcpp/support/status.h"

namespace duet::v1 {

// A refusal carrying `reason` (one of duet::v1::reason) in domain
// kErrorDomain with `metadata`. An empty reason gives a plain status.
inline grpc::Status StatusWithReason(grpc::StatusCode code, const std::string& message,
                                     const std::string& reason,
                                     const std::map<std::string, std::string>& metadata = {}) {
  if (code == grpc::StatusCode::OK || reason.empty()) return grpc::Status(code, message);
  google::rpc::ErrorInfo info;
  info.set_reason(reason);
  info.set_domain(kErrorDomain);
  for (const auto& [k, v] : metadata) (*info.mutable_metadata())[k] = v;
  google::rpc::Status details;
  details.set_code(static_cast<int>(code));
  details.set_message(message);
  details.add_details()->PackFrom(info);
  return grpc::Status(code, message, details.SerializeAsString());
}

// The duet ErrorInfo of `status`, if it carries one; false otherwise
// (success, an older bridge, or an error gRPC itself made).
inline bool ErrorInfoOf(const grpc::Status& status, google::rpc::ErrorInfo* out) {
  if (status.ok() || status.error_details().empty()) return false;
  google::rpc::Status details;
  if (!details.ParseFromString(status.error_details())) return false;
  for (const google::protobuf::Any& any : details.details()) {
    google::rpc::ErrorInfo info;
    if (!any.Is<google::rpc::ErrorInfo>() || !any.UnpackTo(&info)) continue;
    if (info.domain() != kErrorDomain) continue;
    *out = std::move(info);
    return true;
  }
  return false;
}

// The reason of `status` (e.g. "NODE_NOT_SHARED"); "" when it carries none.
// Callers compare it with duet::v1::reason constants.
inline std::string ReasonOf(const grpc::Status& status) {
  google::rpc::ErrorInfo info;
  return ErrorInfoOf(status, &info) ? info.reason() : std::string();
}

}  // namespace duet::v1
