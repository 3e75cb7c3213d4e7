#pragma once

// Who may Hold/Release for a Slurm owner over gRPC (DESIGN.md §9): a caller
// with a munge credential that munged at `socket` decodes, encoded by root
// (slurmstepd; spank_duet's client regains root for the encode) or by
// `slurm_uid`, whose payload is exactly slurm_munge::Payload(request node,
// owner job, owner step). munged itself refuses replays and expired
// credentials (default TTL 5 min).
//
// Refusals: UNAUTHENTICATED (no credential, or munged rejects it),
// PERMISSION_DENIED (valid, but wrong uid or not for this request),
// UNAVAILABLE (munged cannot be reached). Every message says which.
//
// Thread-safety: thread-safe (each Check uses its own munge context).

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "bridge/ledger/types.h"

namespace duet {

struct MungeAuthOptions {
  // munged socket; "" = libmunge's default (/run/munge/munge.socket.2).
  std::string socket;
  // Accepted besides root (Slurm's SlurmUser).
  uint32_t slurm_uid = 0;
};

class MungeAuth {
 public:
  explicit MungeAuth(MungeAuthOptions options) : options_(std::move(options)) {}

  // OK for owners that are not Slurm's. `credential` is the metadata value
  // (empty when absent); `method` ("Hold"/"Release") is for messages.
  absl::Status Check(const std::string& credential, const char* method, const std::string& node,
                     const Owner& owner) const;

 private:
  MungeAuthOptions options_;
};

}  // namespace duet
