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
// Untaint deletes (404 is success); Resync compares duet's rules with the
// wanted set and creates the missing, deletes the others (and rewrites one
// whose selector or taint differs); ResyncPool does the same for one pool's
// rules. Errors stop at the first failing write (the writes before it stay;
// every call is idempotent, so callers retry).
//
// The view of duet's rules: a cache of every rule carrying the managed-by
// label (its name, the device it selects, whether it is exactly the rule
// Taint writes), indexed by pool. With StartWatch, a k8s::Informer (label
// selector managed-by=duet) keeps it: Resync and ResyncPool then read no
// list, and an event that changes the cache other than as duet's own writes
// already did (a rule deleted or edited by someone) is reported to the
// RuleDriftListener with the device; each complete list (the first, and a
// relist after a watch gap) is reported as OnRulesRelisted. Without a watch,
// Resync LISTs duet's rules by label (paged) and replaces the cache with
// them. Either way each successful write updates the cache at once (so the
// watch event of duet's own write is no drift; an event of another uid than
// the cached rule's is of an older rule of that name and is ignored).
//
// Metrics: duet_dra_rule_writes_total{op=create|delete} (writes that
// reached the API server and succeeded). Thread-safe.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bridge/dra/dra_device.h"
#include "k8s_adapter/informer.h"
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
  // Stops the watch.
  ~TaintRules() override;
  TaintRules(const TaintRules&) = delete;
  TaintRules& operator=(const TaintRules&) = delete;

  // Lists duet's rules into the cache (reporting OnRulesRelisted) and
  // watches them on the informer's thread from then on. The list's error
  // otherwise (no watch started). Once only.
  absl::Status StartWatch();
  // Idempotent; no listener call after it returns.
  void StopWatch();

  // The rule's name for `device` (deterministic; see above).
  static std::string RuleName(const dra::DraDevice& device);
  // The rule object that Taint creates for `device`.
  nlohmann::json RuleObject(const dra::DraDevice& device) const;

  absl::Status Taint(const std::vector<dra::DraDevice>& devices) override;
  absl::Status Untaint(const std::vector<dra::DraDevice>& devices) override;
  absl::Status Resync(const std::vector<dra::DraDevice>& tainted) override;
  absl::Status ResyncPool(const std::string& pool,
                          const std::vector<dra::DraDevice>& tainted) override;
  void SetDriftListener(dra::RuleDriftListener* listener) override ABSL_LOCKS_EXCLUDED(listener_mu_);

  // Successful creates and deletes since construction.
  uint64_t creates() const { return creates_.load(); }
  uint64_t deletes() const { return deletes_.load(); }
  // LISTs of duet's rules made by Resync (not the watch's).
  uint64_t lists() const { return lists_.load(); }
  // The rules in the cache (tests).
  size_t cached() const ABSL_LOCKS_EXCLUDED(cache_mu_);

 private:
  // What the cache keeps of one rule.
  struct Cached {
    dra::DraDevice device;  // what it selects
    bool exact = false;     // the selector and taint Taint writes
    // metadata.uid: a watch event of another uid than the cache's is of an
    // older rule of that name (duet deleted and made it again since).
    std::string uid;
    bool operator==(const Cached& o) const { return device == o.device && exact == o.exact; }
  };
  class Watcher;

  std::string Collection() const;
  Cached Parse(const nlohmann::json& rule) const;
  absl::Status Create(const dra::DraDevice& device);
  absl::Status Remove(const std::string& name);
  // Makes `have` (name -> cached rule) exactly `want` (name -> device).
  absl::Status Converge(const std::map<std::string, Cached>& have,
                        std::map<std::string, dra::DraDevice> want);
  void CachePutLocked(const std::string& name, const Cached& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache_mu_);
  void CacheEraseLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(cache_mu_);
  void ReportDrift(const std::vector<dra::DraDevice>& devices, bool relisted)
      ABSL_LOCKS_EXCLUDED(listener_mu_);

  k8s::KubeClient* const kube_;
  const TaintRulesOptions options_;
  std::atomic<uint64_t> creates_{0};
  std::atomic<uint64_t> deletes_{0};
  std::atomic<uint64_t> lists_{0};
  prometheus::Counter* create_counter_ = nullptr;
  prometheus::Counter* delete_counter_ = nullptr;

  mutable absl::Mutex cache_mu_ ABSL_ACQUIRED_AFTER(listener_mu_);
  std::map<std::string, Cached> cache_ ABSL_GUARDED_BY(cache_mu_);
  std::map<std::string, std::set<std::string>> by_pool_ ABSL_GUARDED_BY(cache_mu_);
  // The cache says something (a watch listed, or a Resync listed).
  bool cache_valid_ ABSL_GUARDED_BY(cache_mu_) = false;
  bool watching_ ABSL_GUARDED_BY(cache_mu_) = false;

  absl::Mutex listener_mu_;
  dra::RuleDriftListener* listener_ ABSL_GUARDED_BY(listener_mu_) = nullptr;

  std::unique_ptr<Watcher> watcher_;
  std::unique_ptr<k8s::Informer> informer_;
};

}  // namespace k8s_dra
}  // namespace duet
