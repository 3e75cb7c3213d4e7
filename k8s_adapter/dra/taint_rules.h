#pragma once

// TaintRules: the DeviceTaintRules duet owns (docs/dra.md "DeviceTaintRules"),
// a dra::RuleWriter over the Kubernetes API.
//
// One rule per device that is not lent:
//   metadata.name    duet-<pool>-<device> (the pool is the node for the
//                    NVIDIA and TPU drivers), lower-cased, characters outside
//                    [a-z0-9-] turned to '-'; when that changed anything or the
//                    name passes 253 characters, cut to fit and suffixed with
//                    "-" and 10 hex digits of SHA-256(driver/pool/device), so
//                    names stay unique and the same for the same device
//   metadata.labels  app.kubernetes.io/managed-by: duet
//   spec.deviceSelector {driver, pool, device}: all three, always (a rule
//                    with an empty selector taints every device); a device
//                    with any of them empty is refused with INVALID_ARGUMENT
//                    before anything is written
//   spec.taint       {key: taint_key, value: "", effect: NoSchedule}
// at resource.k8s.io/v1 (Kubernetes 1.37+) or v1beta2 (1.36 with the
// DRADeviceTaints and DRADeviceTaintRules gates): DetectRuleApi says which.
//
// Taint creates (409 AlreadyExists is success when the existing rule selects
// the same device; a name held by another device's rule is ALREADY_EXISTS);
// Untaint deletes (404 is success); Resync lists duet's rules by label and
// creates the missing, deletes the others (and rewrites one whose selector or
// taint differs). Errors stop at the first failing write (the writes before
// it stay; every call is idempotent, so callers retry).
//
// Metrics: duet_dra_rule_writes_total{op=create|delete} (writes that
// reached the API server and succeeded). Thread-safe.

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bridge/dra/dra_device.h"
#include "k8s_adapter/kube_client.h"
#include "nlohmann/json.hpp"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace duet {
namespace k8s_dra {

// The label every duet rule carries.
inline constexpr char kManagedByLabel[] = "app.kubernetes.io/managed-by";
inline constexpr char kManagedByValue[] = "duet";

// The resource.k8s.io version that serves devicetaintrules: "v1" when v1
// does, else "v1beta2" when it does; FAILED_PRECONDITION naming what is
// missing otherwise (on 1.36 the DRADeviceTaints / DRADeviceTaintRules gates
// and the resource.k8s.io/v1beta2 API). Errors reading discovery are
// returned as they are.
absl::StatusOr<std::string> DetectRuleApi(k8s::KubeClient* kube);

struct TaintRulesOptions {
  // "v1" or "v1beta2" (DetectRuleApi).
  std::string api_version = "v1";
  // dra.taint_key.
  std::string taint_key = "duet.dev/not-lent";
  // Where duet_dra_rule_writes_total goes (null: not exported; the counts
  // below still work).
  prometheus::Registry* registry = nullptr;
};

class TaintRules : public dra::RuleWriter {
 public:
  TaintRules(k8s::KubeClient* kube, TaintRulesOptions options);

  // The rule's name for `device` (deterministic; see above).
  static std::string RuleName(const dra::DraDevice& device);
  // The rule object that Taint creates for `device`.
  nlohmann::json RuleObject(const dra::DraDevice& device) const;

  absl::Status Taint(const std::vector<dra::DraDevice>& devices) override;
  absl::Status Untaint(const std::vector<dra::DraDevice>& devices) override;
  absl::Status Resync(const std::vector<dra::DraDevice>& tainted) override;

  // Successful creates and deletes since construction.
  uint64_t creates() const { return creates_.load(); }
  uint64_t deletes() const { return deletes_.load(); }

 private:
  std::string Collection() const;
  absl::Status Create(const dra::DraDevice& device);
  absl::Status Remove(const std::string& name);

  k8s::KubeClient* const kube_;
  const TaintRulesOptions options_;
  std::atomic<uint64_t> creates_{0};
  std::atomic<uint64_t> deletes_{0};
  prometheus::Counter* create_counter_ = nullptr;
  prometheus::Counter* delete_counter_ = nullptr;
};

}  // namespace k8s_dra
}  // namespace duet
