#include "bridge/slurm/munge_auth.h"

#include <munge.h>
#include <openssl/sha.h>

#include <cstdlib>
#include <ctime>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/reason.h"

namespace duet {

namespace why = credential_why;

std::string DescribeCall(const slurm_munge::Binding& b) {
  return absl::StrCat(b.method, " for slurm job ", b.job_id,
                      b.step_id ? absl::StrCat(" step ", *b.step_id) : "", " on node ", b.node);
}

std::string SlurmIdentity(const slurm_munge::Binding& b) {
  return absl::StrCat("slurm job=", b.job_id, b.step_id ? absl::StrCat(" step=", *b.step_id) : "");
}

absl::Status MungeAuth::Check(const std::string& credential, const slurm_munge::Binding& want,
                              std::string* who) {
  const std::string what = DescribeCall(want);
  auto refuse = [&](absl::Status s, const char* w) {
    return CredentialRefusedError(std::move(s), w, want.node);
  };
  if (credential.empty()) {
    return refuse(absl::UnauthenticatedError(absl::StrCat(
                      what, " has no munge credential (metadata ", slurm_munge::kMetadataKey,
                      "); duet-bridge requires one for Slurm owners (slurm.credential: munge)")),
                  why::kMissing);
  }
  munge_ctx_t ctx = munge_ctx_create();
  if (ctx == nullptr) return absl::ResourceExhaustedError("munge_ctx_create failed");
  if (!options_.socket.empty() &&
      munge_ctx_set(ctx, MUNGE_OPT_SOCKET, options_.socket.c_str()) != EMUNGE_SUCCESS) {
    munge_ctx_destroy(ctx);
    return absl::InternalError(absl::StrCat("munge socket ", options_.socket, " not accepted"));
  }
  void* buf = nullptr;
  int len = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  const munge_err_t e = munge_decode(credential.c_str(), ctx, &buf, &len, &uid, &gid);
  const std::string reason = munge_ctx_strerror(ctx) ? munge_ctx_strerror(ctx) : munge_strerror(e);
  time_t encoded = 0;
  const bool have_time =
      e == EMUNGE_SUCCESS && munge_ctx_get(ctx, MUNGE_OPT_ENCODE_TIME, &encoded) == EMUNGE_SUCCESS;
  munge_ctx_destroy(ctx);
  const std::string payload = buf ? std::string(static_cast<char*>(buf), len) : "";
  free(buf);
  switch (e) {
    case EMUNGE_SUCCESS:
      break;
    case EMUNGE_SOCKET:
    case EMUNGE_TIMEOUT:
    case EMUNGE_SNAFU:
    case EMUNGE_NO_MEMORY:
    case EMUNGE_OVERFLOW:
      return absl::UnavailableError(
          absl::StrCat(what, ": cannot verify its munge credential: ", reason));
    case EMUNGE_CRED_EXPIRED:
    case EMUNGE_CRED_REWOUND:
      return refuse(absl::UnauthenticatedError(
                        absl::StrCat(what, ": munge credential rejected: ", reason)),
                    why::kExpired);
    case EMUNGE_CRED_REPLAYED:
      return refuse(absl::UnauthenticatedError(
                        absl::StrCat(what, ": munge credential rejected: ", reason)),
                    why::kReplayed);
    default:  // invalid, unauthorized, bad fields
      return refuse(absl::UnauthenticatedError(
                        absl::StrCat(what, ": munge credential rejected: ", reason)),
                    why::kBadSignature);
  }
  if (uid != 0 && uid != options_.slurm_uid) {
    return refuse(absl::PermissionDeniedError(absl::StrCat(
                      what, ": munge credential was encoded by uid ", uid,
                      ", not by root (slurmstepd)",
                      options_.slurm_uid != 0 ? absl::StrCat(" or uid ", options_.slurm_uid) : "")),
                  why::kWrongUid);
  }
  switch (slurm_munge::Compare(payload, want)) {
    case slurm_munge::Mismatch::kNone:
      break;
    case slurm_munge::Mismatch::kVersion:
      return refuse(absl::UnauthenticatedError(absl::StrCat(
                        what, ": munge credential has payload version \"",
                        slurm_munge::VersionOf(payload), "\"; this duet-bridge accepts ",
                        slurm_munge::AcceptedVersions(),
                        " (spank_duet may be at most one release older than duet-bridge)")),
                    why::kWrongVersion);
    case slurm_munge::Mismatch::kMethod:
      return refuse(absl::PermissionDeniedError(absl::StrCat(
                        what, ": munge credential was made for another call (\"", payload,
                        "\")")),
                    why::kWrongMethod);
    case slurm_munge::Mismatch::kRequest:
      return refuse(absl::PermissionDeniedError(absl::StrCat(
                        what, ": munge credential is for \"", payload, "\", not \"",
                        slurm_munge::Payload(want), "\"")),
                    why::kWrongRequest);
  }
  const absl::Time now = options_.clock->Now();
  const absl::Time made = absl::FromTimeT(encoded);
  if (!have_time || now - made > options_.max_age || made - now > options_.max_age) {
    return refuse(absl::UnauthenticatedError(absl::StrCat(
                      what, ": munge credential encoded at ",
                      have_time ? absl::FormatTime(made, absl::UTCTimeZone()) : "an unknown time",
                      ", more than slurm.credential_max_age ",
                      absl::FormatDuration(options_.max_age), " from this bridge's clock (",
                      absl::FormatTime(now, absl::UTCTimeZone()),
                      "): expired, or the clocks differ")),
                  why::kExpired);
  }
  // munged refuses a second decode itself, but only its own: remember it
  // here too (a digest, not the credential) for the same max age.
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(credential.data()), credential.size(), d);
  switch (seen_.Remember(std::string(reinterpret_cast<const char*>(d), sizeof d),
                         made + options_.max_age, now)) {
    case credential::ReplayMemory::Result::kFirst:
      break;
    case credential::ReplayMemory::Result::kReplayed:
      return refuse(absl::UnauthenticatedError(
                        absl::StrCat(what, ": munge credential rejected: already used (replayed)")),
                    why::kReplayed);
    case credential::ReplayMemory::Result::kFull:
      return refuse(absl::ResourceExhaustedError(absl::StrCat(
                        what, ": more than ", seen_.max_entries(), " credentials within ",
                        absl::FormatDuration(options_.max_age),
                        "; refused until older ones expire")),
                    why::kFull);
  }
  if (who != nullptr) {
    *who = absl::StrCat(SlurmIdentity(want), " uid=", uid, " credential=munge");
  }
  return absl::OkStatus();
}

}  // namespace duet
