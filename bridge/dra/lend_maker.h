#pragma once

// The Slurm side of the DRA lending mode (docs/dra.md, "Lend"): lend jobs.
// The Lender lends and reclaims devices only through this interface;
// bridge/slurm's Placeholders implements it.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bridge/ledger/types.h"

namespace duet {
namespace dra {

class LendMaker {
 public:
  virtual ~LendMaker() = default;
  // Asks Slurm for `count` devices of `kind` on `node` in one lend job and
  // records Owner::Lend(job, node) holding the devices Slurm chose. Returns
  // that holding. Nothing is left behind on error.
  virtual absl::StatusOr<Holding> CreateLend(const std::string& node, DeviceKind kind,
                                             uint32_t count) = 0;
  // Cancels lend job `job_id` and releases its Lend holding on `node`. OK
  // when there is none. UNAVAILABLE (Slurm unreachable) keeps the holding.
  virtual absl::Status CancelLend(const std::string& node, uint32_t job_id) = 0;
};

}  // namespace dra
}  // namespace duet
