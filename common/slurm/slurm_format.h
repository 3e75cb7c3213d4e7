#pragma once

// Slurm's text formats, read and written without libslurm: GRES strings,
// GRES details with device indices (IDX), index lists and feature names.
// Pure functions over plain values; duet-bridge's Slurm side, the SPANK
// client module and duet-node share them (common/README.md).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace duet {

// One GRES entry of a node, e.g. gpu:nvidia-h100-80gb:8 (type may be empty).
struct SlurmGres {
  std::string name;  // "gpu" / "tpu"
  std::string type;  // model; may be empty
  uint32_t count = 0;

  bool operator==(const SlurmGres& o) const {
    return name == o.name && type == o.type && count == o.count;
  }
  bool operator!=(const SlurmGres& o) const { return !(*this == o); }
};

// A job's devices on one of its nodes, read from the job's GRES detail.
struct SlurmJobNodeDevices {
  std::string node;
  std::vector<uint32_t> gpus;  // sorted indices
  std::vector<uint32_t> tpus;
};

enum class SlurmJobState { kPending, kRunning, kSuspended, kCompleting, kFinished, kOther };

// "gpu:h100:8,tpu:4" -> entries. Entries with "(...)" suffixes (gres_used)
// keep only the count. Unparsable entries are skipped.
std::vector<SlurmGres> ParseGres(const std::string& gres);
// Entries -> "gpu:h100:8,tpu:v5e:4" (zero counts are left out).
std::string FormatGres(const std::vector<SlurmGres>& gres);

// One GRES detail string of a job on one node, e.g.
// "gpu:h100:2(IDX:0-1),tpu:v5e:2(IDX:0,2)". Fills `gpus` and `tpus`.
// INVALID_ARGUMENT for an index list it cannot read.
absl::Status ParseGresDetail(const std::string& detail, SlurmJobNodeDevices* out);

// "0-2,5" -> {0,1,2,5}. INVALID_ARGUMENT on junk.
absl::StatusOr<std::vector<uint32_t>> ParseIndexList(const std::string& list);
// {0,1,2,5} -> "0,1,2,5".
std::string FormatIndexList(const std::vector<uint32_t>& indices);

// Turns a label value into a valid Slurm feature name: lower case, anything
// but [a-z0-9._-] becomes '_'. Empty in, empty out.
std::string SanitizeFeature(const std::string& value);

const char* SlurmJobStateName(SlurmJobState state);

}  // namespace duet
