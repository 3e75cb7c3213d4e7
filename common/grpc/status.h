#pragma once

// absl::Status <-> grpc::Status, the one conversion every duet gRPC server
// and client uses. A duet reason (common/reason.h) travels as a
// google.rpc.ErrorInfo in the status details (proto/duet/v1/error_reason.h)
// and comes back as the same reason and metadata. Header-only: the SPANK
// client module compiles its generated sources itself and needs nothing more.

#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/reason.h"
#include "grpcpp/support/status.h"
#include "proto/duet/v1/error_reason.h"

namespace duet {

// `status` for a gRPC caller: the same code and message, and its reason (if
// any) as the duet ErrorInfo.
inline grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return v1::StatusWithReason(static_cast<grpc::StatusCode>(status.code()),
                              std::string(status.message()), ReasonOf(status),
                              ReasonMetadata(status));
}

// What a gRPC call `what` answered, as an absl::Status: the same code,
// "what: message", and the duet reason and metadata it carries, so callers
// decide on ReasonOf, never on the message.
inline absl::Status FromGrpc(const grpc::Status& status, absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  absl::Status out(static_cast<absl::StatusCode>(status.error_code()),
                   absl::StrCat(what, ": ", status.error_message()));
  google::rpc::ErrorInfo info;
  if (!v1::ErrorInfoOf(status, &info)) return out;
  return WithReason(std::move(out), info.reason(),
                    std::map<std::string, std::string>(info.metadata().begin(),
                                                       info.metadata().end()));
}

}  // namespace duet
