#pragma once

// What a munge credential on a Slurm-owned Hold/Release binds (DESIGN.md §9):
// spank_duet's client encodes it in slurmstepd, duet-bridge decodes it and
// compares (bridge/slurm/munge_auth.h). Shared so both sides agree byte for
// byte.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"

namespace duet::slurm_munge {

// gRPC metadata key of the credential (the "MUNGE:...:" text).
inline constexpr char kMetadataKey[] = "x-duet-munge";

// "duet/v1 node=gke-a job=12 step=0" (step omitted for a slurm_job owner).
inline std::string Payload(const std::string& node, uint32_t job_id,
                           std::optional<uint32_t> step_id) {
  std::string p = absl::StrCat("duet/v1 node=", node, " job=", job_id);
  if (step_id) absl::StrAppend(&p, " step=", *step_id);
  return p;
}

}  // namespace duet::slurm_munge
