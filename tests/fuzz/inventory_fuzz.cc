// Fuzzes the node inventory file reader (bridge/inventory/inventory.h,
// ParseInventory) with arbitrary bytes as the YAML text. Checks: no crash and
// no escaping yaml-cpp exception; refusals are INVALID_ARGUMENT; every node
// accepted can be given to a Ledger (UpsertNode answers, never crashes) and
// the ledger then passes CheckInvariants.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bridge/inventory/inventory.h"
#include "bridge/ledger/ledger.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<std::vector<duet::NodeSpec>> nodes = duet::ParseInventory(yaml);
  if (!nodes.ok()) {
    if (nodes.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  duet::Ledger ledger;
  for (const duet::NodeSpec& n : *nodes) (void)ledger.UpsertNode(n);
  if (!ledger.CheckInvariants().ok()) std::abort();
  return 0;
}
