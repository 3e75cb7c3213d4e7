#include "bridge/server/metrics.h"

#include <map>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bridge/ledger/usage.h"
#include "common/enum_name.h"
#include "common/metrics/metrics.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace duet {
namespace {

const char* OwnerKindLabel(const Owner& o) {
  static constexpr const char* kNames[] = {nullptr, "slurm_job", "slurm_step", "pod",
                                           "placeholder", "claim", "lend", "gang_slot"};
  return EnumName(o.kind, kNames);
}

}  // namespace

std::string CodeLabel(absl::StatusCode code) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(code));
}

// Reads a ledger snapshot at scrape time. Devices are counted by owner
// group, shares as fractions of their device (bridge/ledger/usage.h).
class Metrics::LedgerCollector final : public prometheus::Collectable {
 public:
  explicit LedgerCollector(const Ledger* ledger) : ledger_(ledger) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    LedgerSnapshot snap = ledger_->Snapshot();
    using prometheus::MetricType;
    auto devices = NewFamily("duet_devices",
                             "Devices by node, kind, model and holder class (slurm, pod, free); "
                             "shared devices count as fractions",
                             MetricType::Gauge);
    auto nodes = NewFamily("duet_nodes", "Nodes in the ledger by state", MetricType::Gauge);
    std::map<std::string, int> by_state;
    for (const auto& view : snap.nodes) {
      ++by_state[NodeStateName(view->spec.state)];
      // (kind, model) -> devices held by slurm, pods, free
      std::map<std::pair<std::string, std::string>, std::tuple<double, double, double>> sums;
      for (const DeviceState& d : view->devices) {
        auto& [slurm, pods, free] = sums[{DeviceKindName(d.spec.kind), d.spec.model}];
        const ClassUse use = UseByClass(d);
        slurm += Devices(use.slurm_milli, use.capacity_milli);
        pods += Devices(use.pod_milli, use.capacity_milli);
        free += Devices(use.free_milli(), use.capacity_milli);
      }
      for (const auto& [key, v] : sums) {
        const auto& [slurm, pods, free] = v;
        const std::string& node = view->spec.name;
        AddValue(&devices, {{"node", node}, {"kind", key.first}, {"model", key.second}, {"holder", "slurm"}}, slurm);
        AddValue(&devices, {{"node", node}, {"kind", key.first}, {"model", key.second}, {"holder", "pod"}}, pods);
        AddValue(&devices, {{"node", node}, {"kind", key.first}, {"model", key.second}, {"holder", "free"}}, free);
      }
    }
    for (const char* state : {"ready", "cordoned", "not-ready", "gone"}) {
      AddValue(&nodes, {{"state", state}}, by_state[state]);
    }
    auto holdings = NewFamily("duet_holdings", "Live holdings in the ledger", MetricType::Gauge);
    AddValue(&holdings, {}, static_cast<double>(ledger_->holding_count()));
    auto seq = NewFamily("duet_ledger_sequence", "Sequence number of the last ledger change",
                         MetricType::Gauge);
    AddValue(&seq, {}, static_cast<double>(snap.seq));
    return {std::move(devices), std::move(nodes), std::move(holdings), std::move(seq)};
  }

 private:
  const Ledger* const ledger_;
};

// Families from callbacks added with AddCollector.
class Metrics::FunctionCollector final : public prometheus::Collectable {
 public:
  void Add(std::function<std::vector<prometheus::MetricFamily>()> fn) {
    absl::MutexLock lock(&mu_);
    fns_.push_back(std::move(fn));
  }
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    absl::MutexLock lock(&mu_);
    for (const auto& fn : fns_) {
      for (auto& f : fn()) out.push_back(std::move(f));
    }
    return out;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::function<std::vector<prometheus::MetricFamily>()>> fns_ ABSL_GUARDED_BY(mu_);
};

Metrics::Metrics(const Ledger* ledger)
    : registry_(std::make_shared<prometheus::Registry>()),
      ledger_collector_(std::make_shared<LedgerCollector>(ledger)),
      extra_collector_(std::make_shared<FunctionCollector>()) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  rpc_latency_ = &RegisterFamily(BuildHistogram(), *registry_, "duet_rpc_duration_seconds",
                                 "gRPC handling time by method, from request to answer");
  rpc_total_ = &RegisterFamily(BuildCounter(), *registry_, "duet_rpc_total",
                               "gRPC calls by method and result code");
  grants_ = &RegisterFamily(BuildCounter(), *registry_, "duet_holdings_granted_total",
                            "Holdings granted, by owner kind");
  releases_ = &RegisterFamily(BuildCounter(), *registry_, "duet_holdings_released_total",
                              "Holdings released, by owner kind");
  refusals_ = &RegisterFamily(BuildCounter(), *registry_, "duet_holdings_refused_total",
                              "Hold requests refused, by reason");
  for (absl::StatusCode c :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound,
        absl::StatusCode::kAlreadyExists, absl::StatusCode::kResourceExhausted,
        absl::StatusCode::kFailedPrecondition, absl::StatusCode::kAborted,
        absl::StatusCode::kUnavailable}) {
    refusals_->Add({{"reason", CodeLabel(c)}});
  }
  conflicts_ = &RegisterFamily(BuildCounter(), *registry_, "duet_holdings_conflicts_total",
                               "Hold requests refused because a live owner holds a device they "
                               "name, by the holder's side (pod or slurm)");
  for (const char* holder : {"pod", "slurm"}) conflicts_->Add({{"holder", holder}});
  stale_retries_ =
      &RegisterFamily(BuildCounter(), *registry_, "duet_holdings_stale_retries_total",
                      "Slurm Holds that met holdings of Slurm jobs or placeholders that had ended "
                      "in Slurm, released them and tried again, by result");
  for (const char* result : {"granted", "refused"}) stale_retries_->Add({{"result", result}});
  auth_refusals_ =
      &RegisterFamily(BuildCounter(), *registry_, "duet_grpc_auth_refusals_total",
                      "Mutating gRPC calls for pods and placeholders refused for their caller "
                      "(auth.mode token), by method and reason; nothing changed");
  credential_refusals_ =
      &RegisterFamily(BuildCounter(), *registry_, "duet_slurm_credential_refusals_total",
                      "Slurm owners' Hold/Release refused for their credential, by the credential "
                      "the bridge asks for and why; the ledger is not touched");
  audit_records_ =
      &RegisterFamily(BuildCounter(), *registry_, "duet_audit_records_total",
                      "Audit log lines written, one per successful mutating gRPC call, by method");
  audit_dropped_ =
      &RegisterFamily(BuildCounter(), *registry_, "duet_audit_dropped_total",
                      "Audit log lines not written because of the audit rate limit, by method");
  fsync_latency_ =
      &RegisterFamily(BuildHistogram(), *registry_, "duet_journal_fsync_duration_seconds",
                      "Journal write+fdatasync time per group commit")
           .Add({},
                prometheus::Histogram::BucketBoundaries{0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                                        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1});
  fsync_batch_ = &RegisterFamily(BuildHistogram(), *registry_, "duet_journal_commit_records",
                                 "Records per group commit")
                      .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128,
                                                                       256, 1024});
  journal_bytes_ = &RegisterFamily(BuildCounter(), *registry_, "duet_journal_written_bytes_total",
                                   "Bytes appended to the journal")
                        .Add({});
  journal_records_ = &RegisterFamily(BuildCounter(), *registry_, "duet_journal_records_total",
                                     "Records appended to the journal")
                          .Add({});
  watch_streams_ =
      &RegisterFamily(BuildGauge(), *registry_, "duet_watch_streams", "Open WatchNodes streams")
           .Add({});
  serving_ =
      &RegisterFamily(
           BuildGauge(), *registry_, "duet_serving",
           "1 while the bridge grants holdings, 0 when it cannot (journal failed, shutting down)")
           .Add({});
}

void Metrics::ObserveRpc(const std::string& method, absl::StatusCode code, double seconds) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1};
  rpc_latency_->Add({{"method", method}}, kBuckets).Observe(seconds);
  rpc_total_->Add({{"method", method}, {"code", CodeLabel(code)}}).Increment();
}

void Metrics::CountGrant(const Owner& owner) {
  grants_->Add({{"owner_kind", OwnerKindLabel(owner)}}).Increment();
}

void Metrics::CountRelease(const Owner& owner) {
  releases_->Add({{"owner_kind", OwnerKindLabel(owner)}}).Increment();
}

void Metrics::CountRefusal(absl::StatusCode code) {
  refusals_->Add({{"reason", CodeLabel(code)}}).Increment();
}

void Metrics::CountAuthRefusal(const std::string& method, const std::string& why) {
  auth_refusals_->Add({{"method", method}, {"reason", why}}).Increment();
}

void Metrics::CountCredentialRefusal(const std::string& credential, const std::string& why) {
  credential_refusals_->Add({{"credential", credential}, {"why", why}}).Increment();
}

void Metrics::CountAuditRecord(const std::string& method) {
  audit_records_->Add({{"method", method}}).Increment();
}

void Metrics::CountAuditDropped(const std::string& method) {
  audit_dropped_->Add({{"method", method}}).Increment();
}

void Metrics::CountConflict(HolderClass blocking) {
  conflicts_->Add({{"holder", blocking == HolderClass::kPod ? "pod" : "slurm"}}).Increment();
}

void Metrics::CountStaleRetry(bool granted) {
  stale_retries_->Add({{"result", granted ? "granted" : "refused"}}).Increment();
}

void Metrics::ObserveFsync(double seconds, size_t records, size_t bytes) {
  fsync_latency_->Observe(seconds);
  fsync_batch_->Observe(static_cast<double>(records));
  journal_bytes_->Increment(static_cast<double>(bytes));
  journal_records_->Increment(static_cast<double>(records));
}

void Metrics::SetWatchStreams(int streams) { watch_streams_->Set(streams); }
void Metrics::SetServing(bool serving) { serving_->Set(serving ? 1 : 0); }

void Metrics::AddCollector(std::function<std::vector<prometheus::MetricFamily>()> collect) {
  extra_collector_->Add(std::move(collect));
}

std::string Metrics::Render() const {
  std::vector<prometheus::MetricFamily> all = registry_->Collect();
  for (auto& f : ledger_collector_->Collect()) all.push_back(std::move(f));
  for (auto& f : extra_collector_->Collect()) all.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(all);
}

void Metrics::RegisterOn(prometheus::Exposer* exposer) {
  exposer->RegisterCollectable(registry_);
  exposer->RegisterCollectable(ledger_collector_);
  exposer->RegisterCollectable(extra_collector_);
}

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> Metrics::Serve(const std::string& listen) {
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> exposer =
      ServeMetrics("metrics.listen", listen);
  if (exposer.ok()) RegisterOn(exposer->get());
  return exposer;
}

}  // namespace duet
