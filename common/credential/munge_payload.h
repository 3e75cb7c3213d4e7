#pragma once

// What a credential on a Slurm-owned Hold/Release binds (DESIGN.md §9), for
// both kinds: the munge credential carries Payload() as its munge payload,
// the slurm.key credential signs it (slurm_key_cred.h). spank_duet's client
// makes it in slurmstepd, duet-bridge makes the same from the request it
// got and compares (bridge/slurm/munge_auth.h, slurm_key_auth.h). Shared so
// both sides agree byte for byte; request_digest.h fills in Binding from
// the gRPC request on either side.
//
//   duet/v2 method=Hold node=gke-a job=12 step=0 request=<64 hex>
//
// `step` is left out for a slurm_job owner. `request` is the SHA-256 of the
// canonical text of the whole request (owner, node, devices or count,
// expected generation), so a credential serves exactly one call with exactly
// that content. duet/v1 (no method, no request) is refused by name: the
// plugin and the bridge ship together.
//
// Thread-safety: no state.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace duet::slurm_munge {

// gRPC metadata key of the munge credential (the "MUNGE:...:" text).
inline constexpr char kMetadataKey[] = "x-duet-munge";
// The first word of every payload this build makes and accepts.
inline constexpr char kVersion[] = "duet/v2";

// One Slurm-owned call as its credential names it.
struct Binding {
  std::string method;  // "Hold" or "Release"
  std::string node;
  uint32_t job_id = 0;
  std::optional<uint32_t> step_id;  // nullopt: a slurm_job owner
  std::string request;              // RequestDigest() of the call (64 hex digits)
};

inline std::string Payload(const Binding& b) {
  std::string p = absl::StrCat(kVersion, " method=", b.method, " node=", b.node, " job=", b.job_id);
  if (b.step_id) absl::StrAppend(&p, " step=", *b.step_id);
  absl::StrAppend(&p, " request=", b.request);
  return p;
}

// The first word of `payload` ("duet/v1" for an old plugin's), for messages.
inline std::string VersionOf(absl::string_view payload) {
  return std::string(payload.substr(0, payload.find(' ')));
}

// How a payload a credential carries differs from the one a call needs.
enum class Mismatch {
  kNone,     // identical
  kVersion,  // not a duet/v2 payload (an older plugin's duet/v1, or garbage)
  kMethod,   // made for the other call (a Hold's credential on a Release)
  kRequest,  // same call, other node, owner or content
};

inline Mismatch Compare(absl::string_view got, const Binding& want) {
  if (got == Payload(want)) return Mismatch::kNone;
  if (VersionOf(got) != kVersion) return Mismatch::kVersion;
  for (absl::string_view field : absl::StrSplit(got, ' ')) {
    if (absl::ConsumePrefix(&field, "method=")) {
      return field == want.method ? Mismatch::kRequest : Mismatch::kMethod;
    }
  }
  return Mismatch::kMethod;  // a v2 payload that names no method names no call
}

}  // namespace duet::slurm_munge

namespace duet::credential_why {
// The `why` of a CREDENTIAL_REFUSED refusal (common/reason.h), also the
// label of duet_slurm_credential_refusals_total and what spank_duet prints.
inline constexpr char kMissing[] = "missing";              // no credential sent
inline constexpr char kMalformed[] = "malformed";          // not a credential of its kind
inline constexpr char kBadSignature[] = "bad_signature";   // forged, or another cluster's key
inline constexpr char kWrongVersion[] = "wrong_version";   // a duet/v1 credential (old plugin)
inline constexpr char kWrongMethod[] = "wrong_method";     // made for the other call
inline constexpr char kWrongRequest[] = "wrong_request";   // other node, owner or devices
inline constexpr char kWrongUid[] = "wrong_uid";           // munge: not root or SlurmUser
inline constexpr char kExpired[] = "expired";              // older than slurm.credential_max_age
inline constexpr char kReplayed[] = "replayed";            // used before
inline constexpr char kFull[] = "full";                    // the replay memory is full
}  // namespace duet::credential_why
