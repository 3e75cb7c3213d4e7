#include "bridge/slurm/slurm_key_auth.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "bridge/slurm/munge_auth.h"
#include "common/credential/slurm_key_cred.h"
#include "common/reason.h"

namespace duet {

namespace why = credential_why;

absl::StatusOr<std::unique_ptr<SlurmKeyAuth>> SlurmKeyAuth::Create(SlurmKeyAuthOptions options) {
  if (options.max_age < absl::Seconds(1)) {
    return absl::InvalidArgumentError("slurm.credential_max_age: must be at least 1s");
  }
  if (options.key_file.empty()) options.key_file = slurm_key::DefaultKeyPath(options.slurm_conf);
  absl::StatusOr<std::string> key = slurm_key::LoadDerivedKey(options.key_file);
  if (!key.ok()) return key.status();
  return std::make_unique<SlurmKeyAuth>(std::move(*key), std::move(options));
}

SlurmKeyAuth::SlurmKeyAuth(std::string derived_key, SlurmKeyAuthOptions options)
    : key_(std::move(derived_key)),
      options_(std::move(options)),
      seen_(options_.max_remembered) {}

absl::Status SlurmKeyAuth::Check(const std::string& credential, const slurm_munge::Binding& want,
                                 std::string* who) {
  const std::string what = DescribeCall(want);
  auto refuse = [&](absl::Status s, const char* w) {
    return CredentialRefusedError(std::move(s), w, want.node);
  };
  auto rejected = [&](absl::string_view why_text) {
    return absl::StrCat(what, ": slurm.key credential rejected: ", why_text);
  };
  if (credential.empty()) {
    return refuse(
        absl::UnauthenticatedError(absl::StrCat(
            what, " has no slurm.key credential (metadata ", slurm_key::kMetadataKey,
            "); duet-bridge requires one for Slurm owners (slurm.credential: slurm_key; the "
            "plugin needs auth=slurm_key)")),
        why::kMissing);
  }
  if (absl::StartsWith(credential, slurm_key::kOldPrefix)) {
    return refuse(absl::UnauthenticatedError(rejected(absl::StrCat(
                      "it is a ", slurm_key::kOldPrefix, " (duet/v1) credential; this duet-bridge "
                      "accepts ", slurm_key::kPrefix, " (", slurm_munge::AcceptedVersions(),
                      ") only (spank_duet may be at most one release older than duet-bridge)"))),
                  why::kWrongVersion);
  }
  absl::StatusOr<slurm_key::Parsed> p = slurm_key::Parse(credential);
  if (!p.ok()) {
    return refuse(absl::UnauthenticatedError(rejected(p.status().message())), why::kMalformed);
  }
  if (!slurm_key::MacMatches(key_, *p)) {
    return refuse(absl::UnauthenticatedError(rejected(absl::StrCat(
                      "it was not made with this cluster's slurm.key (", options_.key_file,
                      "), or was changed on the way"))),
                  why::kBadSignature);
  }
  switch (slurm_munge::Compare(p->payload, want)) {
    case slurm_munge::Mismatch::kNone:
      break;
    case slurm_munge::Mismatch::kVersion:
      return refuse(absl::UnauthenticatedError(rejected(absl::StrCat(
                        "payload version \"", slurm_munge::VersionOf(p->payload),
                        "\"; this duet-bridge accepts ", slurm_munge::AcceptedVersions()))),
                    why::kWrongVersion);
    case slurm_munge::Mismatch::kMethod:
      return refuse(absl::PermissionDeniedError(rejected(absl::StrCat(
                        "it was made for another call (\"", p->payload, "\")"))),
                    why::kWrongMethod);
    case slurm_munge::Mismatch::kRequest:
      return refuse(absl::PermissionDeniedError(rejected(absl::StrCat(
                        "it is for \"", p->payload, "\", not \"", slurm_munge::Payload(want),
                        "\""))),
                    why::kWrongRequest);
  }
  const absl::Time now = options_.clock->Now();
  const absl::Time made = absl::FromUnixSeconds(p->unix_seconds);
  if (now - made > options_.max_age || made - now > options_.max_age) {
    return refuse(absl::UnauthenticatedError(rejected(absl::StrCat(
                      "made at ", absl::FormatTime(made, absl::UTCTimeZone()),
                      ", more than slurm.credential_max_age ",
                      absl::FormatDuration(options_.max_age), " from this bridge's clock (",
                      absl::FormatTime(now, absl::UTCTimeZone()),
                      "): expired, or the clocks differ"))),
                  why::kExpired);
  }
  switch (seen_.Remember(p->nonce, made + options_.max_age, now)) {
    case credential::ReplayMemory::Result::kFirst:
      break;
    case credential::ReplayMemory::Result::kReplayed:
      return refuse(absl::UnauthenticatedError(rejected("already used (replayed)")),
                    why::kReplayed);
    case credential::ReplayMemory::Result::kFull:
      return refuse(absl::ResourceExhaustedError(absl::StrCat(
                        what, ": more than ", seen_.max_entries(), " credentials within ",
                        absl::FormatDuration(options_.max_age),
                        "; refused until older ones expire")),
                    why::kFull);
  }
  if (who != nullptr) *who = absl::StrCat(SlurmIdentity(want), " credential=slurm_key");
  return absl::OkStatus();
}

}  // namespace duet
