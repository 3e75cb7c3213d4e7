#include "bridge/slurm/slurm_key_auth.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/credential/slurm_key_cred.h"
#include "common/enum_name.h"

namespace duet {

absl::StatusOr<std::unique_ptr<SlurmKeyAuth>> SlurmKeyAuth::Create(SlurmKeyAuthOptions options) {
  if (options.ttl < absl::Seconds(1)) {
    return absl::InvalidArgumentError("slurm.credential_ttl: must be at least 1s");
  }
  if (options.key_file.empty()) options.key_file = slurm_key::DefaultKeyPath(options.slurm_conf);
  absl::StatusOr<std::string> key = slurm_key::LoadDerivedKey(options.key_file);
  if (!key.ok()) return key.status();
  return std::make_unique<SlurmKeyAuth>(std::move(*key), std::move(options));
}

SlurmKeyAuth::SlurmKeyAuth(std::string derived_key, SlurmKeyAuthOptions options)
    : key_(std::move(derived_key)), options_(std::move(options)) {}

const char* SlurmKeyAuth::WhyName(Why w) {
  static constexpr const char* kNames[] = {"none",    "missing",  "malformed", "bad_mac",
                                           "expired", "replayed", "full"};
  return EnumName(w, kNames);
}

absl::Status SlurmKeyAuth::Check(const std::string& credential, const char* method,
                                 const std::string& node, const Owner& owner, Why* why) {
  Why ignored;
  if (why == nullptr) why = &ignored;
  *why = Why::kNone;
  if (owner.holder_class() != HolderClass::kSlurm) return absl::OkStatus();
  const std::optional<uint32_t> step =
      owner.kind == OwnerKind::kSlurmStep ? std::optional<uint32_t>(owner.step_id) : std::nullopt;
  const std::string what = absl::StrCat(method, " for ", owner.ToString(), " on node ", node);
  if (credential.empty()) {
    *why = Why::kMissing;
    return absl::UnauthenticatedError(absl::StrCat(
        what, " has no slurm.key credential (metadata ", slurm_key::kMetadataKey,
        "); duet-bridge requires one for Slurm owners (slurm.credential: slurm_key; the plugin "
        "needs auth=slurm_key)"));
  }
  absl::StatusOr<slurm_key::Parsed> p = slurm_key::Parse(credential);
  if (!p.ok()) {
    *why = Why::kMalformed;
    return absl::UnauthenticatedError(
        absl::StrCat(what, ": slurm.key credential rejected: ", p.status().message()));
  }
  if (!slurm_key::MacMatches(key_, *p, node, owner.job_id, step, method)) {
    *why = Why::kBadMac;
    return absl::UnauthenticatedError(absl::StrCat(
        what, ": slurm.key credential rejected: it was not made with this cluster's slurm.key (",
        options_.key_file, ") for this node, job, step and call"));
  }
  const absl::Time now = options_.clock->Now();
  const absl::Time made = absl::FromUnixSeconds(p->unix_seconds);
  if (made + options_.ttl < now || made - options_.ttl > now) {
    *why = Why::kExpired;
    return absl::UnauthenticatedError(absl::StrCat(
        what, ": slurm.key credential rejected: made at ", absl::FormatTime(made, absl::UTCTimeZone()),
        ", more than ", absl::FormatDuration(options_.ttl), " from this bridge's clock (",
        absl::FormatTime(now, absl::UTCTimeZone()), "): expired, or the clocks differ"));
  }
  absl::MutexLock lock(&mu_);
  while (!order_.empty() && order_.front().first < now) {
    seen_.erase(order_.front().second);
    order_.pop_front();
  }
  if (seen_.contains(p->nonce)) {
    *why = Why::kReplayed;
    return absl::UnauthenticatedError(
        absl::StrCat(what, ": slurm.key credential rejected: already used (replayed)"));
  }
  if (seen_.size() >= options_.max_remembered) {
    *why = Why::kFull;
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": more than ", options_.max_remembered, " credentials within ",
        absl::FormatDuration(options_.ttl), "; refused until older ones expire"));
  }
  seen_.emplace(p->nonce, made + options_.ttl);
  order_.emplace_back(made + options_.ttl, p->nonce);
  return absl::OkStatus();
}

}  // namespace duet
