#pragma once

// What a credential on a Slurm-owned Hold/Release binds (DESIGN.md §9), for
// both kinds: the munge credential carries Payload() as its munge payload,
// the slurm.key credential signs it (slurm_key_cred.h). spank_duet's client
// makes it in slurmstepd, duet-bridge makes the same from the request it
// got and compares (bridge/slurm/munge_auth.h, slurm_key_auth.h). Shared so
// both sides agree byte for byte; request_digest.h fills in Binding from
// the gRPC request on either side.
//
//   duet/v3 Hold node=5:gke-a owner=slurm_step:12.0 devices=1:0:0 generation=0
//
// The version, then the canonical text of the whole request (owner, node,
// devices or count, expected generation; request_digest.h), so a credential
// serves exactly one call with exactly that content. The text itself rather
// than a digest of it: the plugin then needs no hashing for a munge
// credential, and a GPU step on an auth/munge cluster loads no libcrypto
// (bench/slurm/RESULTS.md). At most about 800 bytes (a 255-byte node name,
// 64 devices), inside the 1024 a slurm.key credential signs.
//
// duet/v2, the previous release's form, is still accepted, so duet-bridge
// can be upgraded before the nodes' spank_duet:
//
//   duet/v2 method=Hold node=gke-a job=12 step=0 request=<SHA-256 hex of the canonical text>
//
// `step` is left out for a slurm_job owner. duet/v1 (no method, no request)
// is refused by name.
//
// Thread-safety: no state.

#include <openssl/sha.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace duet::slurm_munge {

// gRPC metadata key of the munge credential (the "MUNGE:...:" text).
inline constexpr char kMetadataKey[] = "x-duet-munge";
// The first word of every payload this build makes.
inline constexpr char kVersion[] = "duet/v3";
// The previous release's first word, still accepted.
inline constexpr char kPreviousVersion[] = "duet/v2";

// One Slurm-owned call as its credential names it.
struct Binding {
  std::string method;  // "Hold" or "Release"
  std::string node;
  uint32_t job_id = 0;
  std::optional<uint32_t> step_id;  // nullopt: a slurm_job owner
  std::string request;              // CanonicalRequest() of the call (request_digest.h)
};

inline std::string Payload(const Binding& b) { return absl::StrCat(kVersion, " ", b.request); }

// The duet/v2 payload of the same call (a previous release's spank_duet).
inline std::string PreviousPayload(const Binding& b) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(b.request.data()), b.request.size(), d);
  std::string p = absl::StrCat(kPreviousVersion, " method=", b.method, " node=", b.node,
                               " job=", b.job_id);
  if (b.step_id) absl::StrAppend(&p, " step=", *b.step_id);
  absl::StrAppend(&p, " request=",
                  absl::BytesToHexString(
                      absl::string_view(reinterpret_cast<const char*>(d), sizeof d)));
  return p;
}

// The first word of `payload` ("duet/v1" for an old plugin's), for messages.
inline std::string VersionOf(absl::string_view payload) {
  return std::string(payload.substr(0, payload.find(' ')));
}

// How a payload a credential carries differs from the one a call needs.
enum class Mismatch {
  kNone,     // identical
  kVersion,  // neither duet/v3 nor duet/v2 (an older plugin's duet/v1, or garbage)
  kMethod,   // made for the other call (a Hold's credential on a Release)
  kRequest,  // same call, other node, owner or content
};

inline Mismatch Compare(absl::string_view got, const Binding& want) {
  const std::string version = VersionOf(got);
  absl::string_view rest = got.substr(std::min(got.size(), version.size() + 1));
  if (version == kVersion) {
    if (got == Payload(want)) return Mismatch::kNone;
    // The canonical text starts with the method.
    return rest.substr(0, rest.find(' ')) == want.method ? Mismatch::kRequest
                                                         : Mismatch::kMethod;
  }
  if (version != kPreviousVersion) return Mismatch::kVersion;
  if (got == PreviousPayload(want)) return Mismatch::kNone;
  for (absl::string_view field : absl::StrSplit(rest, ' ')) {
    if (absl::ConsumePrefix(&field, "method=")) {
      return field == want.method ? Mismatch::kRequest : Mismatch::kMethod;
    }
  }
  return Mismatch::kMethod;  // a v2 payload that names no method names no call
}

// What Compare accepts, for messages: "duet/v3 (or duet/v2)".
inline std::string AcceptedVersions() {
  return absl::StrCat(kVersion, " (or the previous release's ", kPreviousVersion, ")");
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
