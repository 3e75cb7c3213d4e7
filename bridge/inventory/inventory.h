#pragma once

// Where the ledger's nodes come from. A source delivers the shared nodes it
// knows to a sink; the file source below reads a YAML node list (development,
// tests, the embedded demo), and the Kubernetes Node watch is the next source.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bridge/ledger/ledger.h"

namespace duet {

// Receives inventory changes. Implementations are thread-safe.
class InventorySink {
 public:
  virtual ~InventorySink() = default;
  // The complete set of shared nodes: nodes not in `nodes` have left.
  virtual void ReplaceAll(const std::vector<NodeSpec>& nodes) = 0;
  virtual void Upsert(const NodeSpec& node) = 0;
  virtual void Remove(const std::string& name) = 0;
};

class InventorySource {
 public:
  virtual ~InventorySource() = default;
  // Delivers the first complete inventory to `sink` before returning, then
  // keeps it current until Stop(). An error means no inventory was delivered.
  virtual absl::Status Start(InventorySink* sink) = 0;
  // Idempotent; no sink calls after it returns.
  virtual void Stop() = 0;
};

// Applies inventory changes to the ledger. A change the ledger refuses (a
// held device would vanish) is logged and retried on the next delivery.
class LedgerInventorySink final : public InventorySink {
 public:
  explicit LedgerInventorySink(Ledger* ledger) : ledger_(ledger) {}
  void ReplaceAll(const std::vector<NodeSpec>& nodes) override;
  void Upsert(const NodeSpec& node) override;
  void Remove(const std::string& name) override;

 private:
  Ledger* const ledger_;
};

// Parses a YAML node list:
//   nodes:
//     - name: gke-a            # required
//       cpus: 32
//       memory_mib: 262144
//       pool: shared-h100
//       zone: us-central1-a
//       state: ready           # ready | cordoned | not-ready
//       labels: {k: v}
//       topology: {block: b1, subblock: s1, host: h1}
//       gpus: {count: 8, model: nvidia-h100-80gb, nvlink_domain: d0, ids: [GPU-..]}
//       tpus: {count: 4, model: tpu-v5-lite-podslice, host_bounds: 2x2,
//              topology: 2x4, subslice_shapes: [1x1, 2x2]}
// Errors name the path (`nodes[1].gpus.count: must be an integer`).
absl::StatusOr<std::vector<NodeSpec>> ParseInventory(const std::string& yaml_text);

// A small built-in inventory for `duet-bridge --dev`: two 8-GPU H100 nodes
// and one 4-chip TPU v5e host.
const char* EmbeddedInventoryYaml();

// Reads `path` at Start and again whenever its modification time changes
// (checked every `reload_period`). A file that stops parsing keeps the last
// good inventory and logs the error.
std::unique_ptr<InventorySource> NewFileInventory(std::string path, absl::Duration reload_period);
// Serves a fixed YAML text (the embedded inventory, tests).
std::unique_ptr<InventorySource> NewStaticInventory(std::string yaml_text);

}  // namespace duet
