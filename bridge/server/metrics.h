#pragma once

// duet-bridge's Prometheus metrics (all prefixed `duet_`).
//
// Gauges that mirror ledger state (devices by node/kind/model/holder, nodes,
// holdings) are computed at scrape time from a ledger snapshot by a
// Collectable; counters and histograms are created once here.
//
// Thread-safety: every method may be called from any thread (prometheus-cpp
// metrics are atomic; the family maps are filled at construction).

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bridge/ledger/ledger.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace duet {

class Metrics {
 public:
  // `ledger` must outlive this object.
  explicit Metrics(const Ledger* ledger);
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // RPC latency (seconds) by method, and the result code.
  void ObserveRpc(const std::string& method, absl::StatusCode code, double seconds);
  void CountGrant(const Owner& owner);
  void CountRelease(const Owner& owner);
  // A refused Hold, by reason (the status code, lower-case).
  void CountRefusal(absl::StatusCode code);
  // A Hold refused because a live owner holds one of the devices it names
  // (a real conflict), by the blocking owner's side: "pod" (pods and their
  // placeholders) or "slurm" (jobs and steps).
  void CountConflict(HolderClass blocking);
  // A Slurm owner's Hold that first hit holdings of Slurm jobs or
  // placeholders that turned out to have ended in Slurm (StaleHolders), by
  // result: "granted" on the second try, or "refused".
  void CountStaleRetry(bool granted);
  // A Slurm owner's Hold/Release refused for its credential (DESIGN.md §9),
  // by the credential kind the bridge asks for ("munge", "slurm_key") and
  // why (credential_why in common/credential/munge_payload.h, and
  // "unavailable" when munged cannot be asked).
  void CountCredentialRefusal(const std::string& credential, const std::string& why);
  // A mutating call refused by auth.mode token (bridge/auth/authz.h): the
  // method and why (missing_token, invalid_token, wrong_node, ...).
  void CountAuthRefusal(const std::string& method, const std::string& why);
  // An audit line written for a successful mutation (bridge/server/audit.h),
  // by method; and one dropped by the audit log's rate limit.
  void CountAuditRecord(const std::string& method);
  void CountAuditDropped(const std::string& method);
  void ObserveFsync(double seconds, size_t records, size_t bytes);
  void SetWatchStreams(int streams);
  void SetServing(bool serving);

  // Adds families computed at scrape time (e.g. another component's stats).
  // Call before Serve().
  void AddCollector(std::function<std::vector<prometheus::MetricFamily>()> collect);

  // The registry behind /metrics, for components that make their own
  // counters and histograms (the scheduler extender).
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // Every family in the text exposition format (what /metrics serves).
  std::string Render() const;

  // Serves /metrics on `listen` ("host:port"). Errors name the address.
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> Serve(const std::string& listen);
  // Adds every family to an exposer someone else serves (the standby's, under
  // leader election). The exposer holds them weakly: they vanish with this.
  void RegisterOn(prometheus::Exposer* exposer);

 private:
  class LedgerCollector;
  class FunctionCollector;

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<LedgerCollector> ledger_collector_;
  std::shared_ptr<FunctionCollector> extra_collector_;
  prometheus::Family<prometheus::Histogram>* rpc_latency_;
  prometheus::Family<prometheus::Counter>* rpc_total_;
  prometheus::Family<prometheus::Counter>* grants_;
  prometheus::Family<prometheus::Counter>* releases_;
  prometheus::Family<prometheus::Counter>* refusals_;
  prometheus::Family<prometheus::Counter>* conflicts_;
  prometheus::Family<prometheus::Counter>* stale_retries_;
  prometheus::Family<prometheus::Counter>* credential_refusals_;
  prometheus::Family<prometheus::Counter>* auth_refusals_;
  prometheus::Family<prometheus::Counter>* audit_records_;
  prometheus::Family<prometheus::Counter>* audit_dropped_;
  prometheus::Histogram* fsync_latency_;
  prometheus::Histogram* fsync_batch_;
  prometheus::Counter* journal_bytes_;
  prometheus::Counter* journal_records_;
  prometheus::Gauge* watch_streams_;
  prometheus::Gauge* serving_;
};

// "ok", "invalid_argument", "resource_exhausted", ...
std::string CodeLabel(absl::StatusCode code);

}  // namespace duet
