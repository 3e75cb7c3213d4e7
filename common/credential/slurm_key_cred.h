#pragma once

// The slurm.key credential (DESIGN.md §9) on a Slurm-owned Hold/Release, for
// clusters that run auth/slurm and have no munge (Slinky, the GKE add-on).
//
// Both ends hold the cluster's slurm.key: slurmstepd (root) reads it on the
// node, duet-bridge mounts the same Secret. Neither uses the key itself: each
// derives a key for this one purpose, HMAC-SHA256(slurm.key, kKeyLabel), so a
// duet credential can never be mistaken for a Slurm one or the reverse.
//
//   credential = "duet-key2:" TS ":" NONCE ":" PAYLOAD ":" MAC
//     TS      = seconds since the epoch when it was made (decimal)
//     NONCE   = 16 random bytes, 32 lower-case hex digits
//     PAYLOAD = slurm_munge::Payload(binding) (munge_payload.h: duet/v3
//               and the request's canonical text), web-safe base64
//               without padding
//     MAC     = HMAC-SHA256(derived key, payload "\n" TS "\n" NONCE), 64
//               lower-case hex digits
//
// The MAC binds the payload, so a credential for one step, one call or one
// set of devices cannot serve another. The payload travels in clear so that
// the bridge can say which part differs (wrong_method, wrong_request) once the
// MAC has shown who made it. Freshness (TS) and single use (NONCE) are
// checked by the bridge (bridge/slurm/slurm_key_auth.h). The duet-key1 form
// (no payload, no request digest) is refused by name (kOldPrefix).
//
// Shared by spank_duet's client module and duet-bridge so both agree byte for
// byte. Thread-safe (no state).

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace duet::slurm_key {

// gRPC metadata key of the credential.
inline constexpr char kMetadataKey[] = "x-duet-slurm-key-cred";
inline constexpr char kPrefix[] = "duet-key2:";
// The form before duet/v2, from an older spank_duet.
inline constexpr char kOldPrefix[] = "duet-key1:";
inline constexpr char kKeyLabel[] = "duet spank step credential v1";
// Slurm itself refuses shorter keys as lacking entropy; so do we.
inline constexpr size_t kMinKeyBytes = 16;

// Reads `path` and derives duet's key from it. The file must be a regular
// file of kMinKeyBytes to 1 MiB that others cannot read or write (Slurm's
// rule for its key files; the group may read, as a Kubernetes Secret volume
// with fsGroup gives a non-root SlurmUser). NOT_FOUND / PERMISSION_DENIED /
// FAILED_PRECONDITION (insecure mode, too short) name the path.
absl::StatusOr<std::string> LoadDerivedKey(const std::string& path);

// duet's key derived from raw slurm.key bytes (tests, and LoadDerivedKey).
std::string DeriveKey(absl::string_view slurm_key);

// Where Slurm looks for slurm.key: the directory of `slurm_conf` ("" =
// $SLURM_CONF, else /etc/slurm/slurm.conf), file slurm.key.
std::string DefaultKeyPath(const std::string& slurm_conf);

// A credential for `payload` (slurm_munge::Payload of the call), made at
// `unix_seconds` with 16 random bytes. INVALID_ARGUMENT for an empty payload
// or one over 1024 bytes; INTERNAL when the system has no randomness.
absl::StatusOr<std::string> Make(absl::string_view derived_key, const std::string& payload,
                                 int64_t unix_seconds);

struct Parsed {
  int64_t unix_seconds = 0;
  std::string nonce;    // 32 hex digits
  std::string payload;  // decoded
  std::string mac;      // 64 hex digits
};

// Syntax only; INVALID_ARGUMENT says what is wrong.
absl::StatusOr<Parsed> Parse(absl::string_view credential);

// True when `p.mac` is the MAC of (payload, time, nonce) under
// `derived_key` (compared in constant time).
bool MacMatches(absl::string_view derived_key, const Parsed& p);

}  // namespace duet::slurm_key
