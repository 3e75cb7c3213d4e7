#include "bridge/slurm/munge_auth.h"

#include <munge.h>

#include <cstdlib>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/credential/munge_payload.h"

namespace duet {

absl::Status MungeAuth::Check(const std::string& credential, const char* method,
                              const std::string& node, const Owner& owner) const {
  if (owner.holder_class() != HolderClass::kSlurm) return absl::OkStatus();
  const std::string want = slurm_munge::Payload(
      node, owner.job_id,
      owner.kind == OwnerKind::kSlurmStep ? std::optional<uint32_t>(owner.step_id) : std::nullopt);
  const std::string what = absl::StrCat(method, " for ", owner.ToString(), " on node ", node);
  if (credential.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        what, " has no munge credential (metadata ", slurm_munge::kMetadataKey,
        "); duet-bridge requires one for Slurm owners (slurm.require_munge)"));
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
  const std::string why = munge_ctx_strerror(ctx) ? munge_ctx_strerror(ctx) : munge_strerror(e);
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
          absl::StrCat(what, ": cannot verify its munge credential: ", why));
    default:  // invalid, expired, rewound, replayed, unauthorized, bad fields
      return absl::UnauthenticatedError(
          absl::StrCat(what, ": munge credential rejected: ", why));
  }
  if (uid != 0 && uid != options_.slurm_uid) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, ": munge credential was encoded by uid ", uid, ", not by root (slurmstepd)",
        options_.slurm_uid != 0 ? absl::StrCat(" or uid ", options_.slurm_uid) : ""));
  }
  if (payload != want) {
    return absl::PermissionDeniedError(absl::StrCat(what, ": munge credential is for \"",
                                                    payload, "\", not \"", want, "\""));
  }
  return absl::OkStatus();
}

}  // namespace duet
