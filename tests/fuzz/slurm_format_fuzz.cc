// Fuzzes the Slurm string readers of bridge/slurm/slurm_format.cc (GRES
// strings, job GRES details with IDX lists, index lists, feature names) with
// arbitrary bytes. Checks: no crash or hang; an accepted index list is sorted
// and unique and reads back the same from FormatIndexList; GRES entries read
// back the same from FormatGres (zero counts left out); a refusal is
// INVALID_ARGUMENT; SanitizeFeature keeps the length and yields only
// [a-z0-9._-]. (Hostlists are expanded by libslurm itself, not here.)

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/slurm/slurm_format.h"

namespace {

void CheckSortedUnique(const std::vector<uint32_t>& v) {
  for (size_t i = 1; i < v.size(); ++i) {
    if (v[i - 1] >= v[i]) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string s(reinterpret_cast<const char*>(data), size);

  const absl::StatusOr<std::vector<uint32_t>> idx = duet::ParseIndexList(s);
  if (idx.ok()) {
    CheckSortedUnique(*idx);
    const absl::StatusOr<std::vector<uint32_t>> again =
        duet::ParseIndexList(duet::FormatIndexList(*idx));
    if (!again.ok() || *again != *idx) std::abort();
  } else if (idx.status().code() != absl::StatusCode::kInvalidArgument) {
    std::abort();
  }

  const std::vector<duet::SlurmGres> gres = duet::ParseGres(s);
  std::vector<duet::SlurmGres> nonzero;
  for (const duet::SlurmGres& g : gres) {
    if (g.count != 0) nonzero.push_back(g);
  }
  if (duet::ParseGres(duet::FormatGres(gres)) != nonzero) std::abort();

  duet::SlurmJobNodeDevices dev;
  const absl::Status detail = duet::ParseGresDetail(s, &dev);
  if (!detail.ok() && detail.code() != absl::StatusCode::kInvalidArgument) std::abort();
  if (detail.ok()) {
    CheckSortedUnique(dev.gpus);
    CheckSortedUnique(dev.tpus);
  }

  const std::string f = duet::SanitizeFeature(s);
  if (f.size() != s.size()) std::abort();
  for (char c : f) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')) {
      std::abort();
    }
  }
  return 0;
}
