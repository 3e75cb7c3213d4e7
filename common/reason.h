#pragma once

// Reasons on absl::Status: the bridge's logic (the ledger, the service)
// tags each refusal a caller acts on with one duet::v1::reason and its
// metadata, as status payloads; the gRPC boundary (ToGrpc in
// bridge/api/convert.h) turns them into a google.rpc.ErrorInfo, once.
// Header-only: the SPANK client module uses it on the client side too.

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/optional.h"
#include "proto/duet/v1/reasons.h"

namespace duet {

inline constexpr char kReasonPayload[] = "duet.dev/reason";
inline constexpr char kReasonMetadataPrefix[] = "duet.dev/metadata/";

// `status` (not OK) with `reason` and `metadata` attached.
inline absl::Status WithReason(absl::Status status, absl::string_view reason,
                               const std::map<std::string, std::string>& metadata = {}) {
  if (status.ok()) return status;
  status.SetPayload(kReasonPayload, absl::Cord(reason));
  for (const auto& [k, v] : metadata) {
    status.SetPayload(absl::StrCat(kReasonMetadataPrefix, k), absl::Cord(v));
  }
  return status;
}

// The reason attached to `status`; "" when none.
inline std::string ReasonOf(const absl::Status& status) {
  absl::optional<absl::Cord> r = status.GetPayload(kReasonPayload);
  return r.has_value() ? std::string(*r) : std::string();
}

// The metadata attached with the reason.
inline std::map<std::string, std::string> ReasonMetadata(const absl::Status& status) {
  std::map<std::string, std::string> out;
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& value) {
    if (absl::StartsWith(url, kReasonMetadataPrefix)) {
      out[std::string(url.substr(sizeof(kReasonMetadataPrefix) - 1))] = std::string(value);
    }
  });
  return out;
}

// `status` with `message` instead of its own, its reason and metadata kept.
// Rewording a status any other way drops the reason.
inline absl::Status WithMessage(const absl::Status& status, absl::string_view message) {
  if (status.ok()) return status;
  absl::Status out(status.code(), message);
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& value) { out.SetPayload(url, value); });
  return out;
}

// `status` with `prefix` before its message, its reason and metadata kept.
inline absl::Status WithPrefix(const absl::Status& status, absl::string_view prefix) {
  return WithMessage(status, absl::StrCat(prefix, status.message()));
}

// NOT_FOUND "unknown node <name>" with reason NODE_NOT_SHARED: the one
// answer for a node the ledger does not know.
inline absl::Status UnknownNodeError(absl::string_view node) {
  return WithReason(absl::NotFoundError(absl::StrCat("unknown node ", node)),
                    v1::reason::kNodeNotShared, {{"node", std::string(node)}});
}

// `status` (not OK) as a refused Slurm credential: reason CREDENTIAL_REFUSED
// with metadata why (credential_why in common/credential/munge_payload.h)
// and node.
inline absl::Status CredentialRefusedError(absl::Status status, absl::string_view why,
                                           absl::string_view node) {
  return WithReason(std::move(status), v1::reason::kCredentialRefused,
                    {{"why", std::string(why)}, {"node", std::string(node)}});
}

}  // namespace duet
