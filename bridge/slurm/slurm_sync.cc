// SlurmSync (slurm_sync.h): the pass (RunOnce) and its thread, the stats, and
// the steps on slurmctld as a whole (the Slurm 22.05 reconfigure after a
// slurmctld start, the placeholder policy check). The node, job, gang, lost
// placeholder and weight passes live one per file (slurm_sync_internal.h).

#include "bridge/slurm/slurm_sync.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "bridge/placement/placement.h"
#include "bridge/placement/topology.h"
#include "bridge/slurm/libslurm_client.h"
#include "bridge/slurm/placeholder_policy.h"
#include "bridge/slurm/placeholders.h"
#include "spdlog/spdlog.h"

namespace duet {

SlurmSync::SlurmSync(SlurmSyncOptions options, Ledger* ledger, SlurmClient* slurm,
                     const Clock* clock)
    : options_(std::move(options)), ledger_(ledger), slurm_(slurm), clock_(clock) {}

SlurmSync::~SlurmSync() { Stop(); }

void SlurmSync::Start() {
  if (thread_.joinable()) return;
  {
    absl::MutexLock l(&stop_mu_);
    stopping_ = false;
  }
  thread_ = std::thread([this] {
    while (true) {
      absl::Status s = RunOnce();
      if (!s.ok()) spdlog::warn("slurm sync: {}", s.ToString());
      absl::MutexLock l(&stop_mu_);
      if (clock_->AwaitWithTimeout(&stop_mu_, absl::Condition(&stopping_), options_.sync_period)) return;
    }
  });
}

void SlurmSync::Stop() {
  if (!thread_.joinable()) return;
  {
    absl::MutexLock l(&stop_mu_);
    stopping_ = true;
  }
  thread_.join();
}

SlurmSyncStats SlurmSync::stats() const {
  absl::MutexLock lock(&stats_mu_);
  return stats_;
}

void SlurmSync::Count(uint64_t SlurmSyncStats::*field, uint64_t n) {
  absl::MutexLock lock(&stats_mu_);
  stats_.*field += n;
}

absl::Status SlurmSync::RunOnce() {
  absl::MutexLock run(&run_mu_);
  Count(&SlurmSyncStats::passes);
  absl::Status ping = slurm_->Ping();
  auto nodes = ping.ok() ? slurm_->ListNodes() : absl::StatusOr<std::vector<SlurmNodeInfo>>(ping);
  if (!nodes.ok()) {
    // Ping's FAILED_PRECONDITION: a slurmctld of a release this build cannot serve.
    if (absl::IsFailedPrecondition(ping)) Count(&SlurmSyncStats::version_refusals);
    if (!degraded_.exchange(true)) {
      spdlog::error("slurm sync: Slurm unreachable, serving from the ledger (degraded): {}",
                    nodes.status().ToString());
    }
    Count(&SlurmSyncStats::failed_passes);
    return nodes.status();
  }
  if (options_.loads != nullptr) {
    // Reservations keep placeholders off their nodes (ReservationReason);
    // a client that cannot list them (fakes) reports none.
    absl::StatusOr<std::vector<SlurmReservationInfo>> reservations = slurm_->ListReservations();
    if (!reservations.ok() && !absl::IsUnimplemented(reservations.status())) {
      spdlog::warn("slurm sync: cannot list reservations: {}", reservations.status().ToString());
    }
    options_.loads->Replace(*nodes,
                            reservations.ok() ? *reservations
                                              : std::vector<SlurmReservationInfo>{},
                            absl::Now());
  }
  CheckPlaceholderPolicy();
  LedgerSnapshot snap = ledger_->Snapshot();
  absl::Status first;
  auto note = [&first](absl::Status s) {
    if (first.ok() && !s.ok()) first = std::move(s);
  };
  if (options_.manage_nodes) note(AfterCtldStart(*nodes));
  if (options_.manage_nodes) note(SyncNodes(snap, *nodes));
  if (options_.import_jobs) note(ImportJobs(snap, *nodes));
  if (options_.manage_weights) {
    // Weights from the ledger after the import.
    note(SyncWeights(ledger_->Snapshot(), *nodes));
  }
  if (absl::IsUnavailable(first)) {
    degraded_.store(true);
    Count(&SlurmSyncStats::failed_passes);
    return first;
  }
  if (degraded_.exchange(false)) spdlog::info("slurm sync: Slurm reachable again, reconciled");
  {
    absl::MutexLock lock(&stats_mu_);
    stats_.last_success = clock_->Now();
  }
  return first;
}

namespace {
// How long after the sync's own reconfigure a new slurmctld start is taken
// for the restart that carries it out (AfterCtldStart).
constexpr int64_t kOwnReconfigureRestartSeconds = 10;
}  // namespace

bool GresStepsNeedReconfigureAfterStart(absl::string_view ctld_version) {
  const std::optional<SlurmRelease> release = ParseSlurmRelease(ctld_version);
  return !release.has_value() || *release < SlurmRelease{24, 11};
}

absl::Status SlurmSync::AfterCtldStart(const std::vector<SlurmNodeInfo>& nodes) {
  absl::StatusOr<SlurmControllerInfo> ctld = slurm_->Controller();
  if (absl::IsUnimplemented(ctld.status())) return absl::OkStatus();
  if (!ctld.ok()) return ctld.status();
  const int64_t boot = ctld->boot_time;
  if (boot == ctld_boot_) return absl::OkStatus();
  if (!GresStepsNeedReconfigureAfterStart(ctld->version)) {
    // Measured: 24.11.5, 25.11.7 and 26.05.5 run GRES steps on recovered
    // dynamic nodes right after a restart, and carry a reconfigure out by
    // restarting slurmctld, which a bridge start must not cause.
    ctld_boot_ = boot;
    own_reconfigure_at_ = 0;
    return absl::OkStatus();
  }
  // A release that carries `scontrol reconfigure` out by restarting
  // slurmctld (24.11 and later do; an unmeasured one before 24.11 may) gives
  // it a new BOOT_TIME. A new start seen within a few seconds of the sync's
  // own reconfigure is that restart, not another start: reconfiguring again
  // would restart slurmctld again, on every pass. (Slurm 22.05 reconfigures
  // in place and keeps BOOT_TIME.)
  if (own_reconfigure_at_ != 0 && ctld_boot_ != 0 && boot > ctld_boot_ &&
      boot <= own_reconfigure_at_ + kOwnReconfigureRestartSeconds) {
    spdlog::info("slurm sync: slurmctld restarted at {} to carry out duet's reconfigure; nothing "
                 "more to do",
                 boot);
    ctld_boot_ = boot;
    own_reconfigure_at_ = 0;
    return absl::OkStatus();
  }
  own_reconfigure_at_ = 0;
  const bool any_gres = std::any_of(nodes.begin(), nodes.end(),
                                    [](const SlurmNodeInfo& n) { return !n.gres.empty(); });
  if (any_gres) {
    DUET_RETURN_IF_ERROR(slurm_->Reconfigure());
    own_reconfigure_at_ = absl::ToUnixSeconds(absl::Now());
    Count(&SlurmSyncStats::reconfigures);
    spdlog::info(
        "slurm sync: slurmctld {} started at {} with GRES nodes: scontrol reconfigure (Slurm "
        "22.05 refuses GRES steps on recovered dynamic nodes until then)",
        ctld->version, boot);
  }
  ctld_boot_ = boot;
  return absl::OkStatus();
}

PodLiveness SlurmSync::PodOf(const std::string& uid) const {
  return options_.pod_liveness ? options_.pod_liveness(uid) : PodLiveness::kUnknown;
}

void SlurmSync::CheckPlaceholderPolicy() {
  absl::StatusOr<SlurmClusterConfig> config = slurm_->ClusterConfig();
  if (absl::IsUnimplemented(config.status())) return;
  absl::StatusOr<std::vector<SlurmPartitionInfo>> partitions =
      config.ok() ? slurm_->ListPartitions()
                  : absl::StatusOr<std::vector<SlurmPartitionInfo>>(config.status());
  if (!partitions.ok()) {
    spdlog::warn("slurm sync: cannot check where placeholders go: {}",
                 partitions.status().ToString());
    return;
  }
  std::map<std::string, std::string> risks;
  for (const PlaceholderRisk& r :
       PlaceholderRisks(*config, *partitions, options_.placeholder_partition,
                        options_.preemption == "evict-pods")) {
    risks[PlaceholderRiskName(r.kind)] = r.detail;
  }
  std::map<std::string, std::string> before;
  {
    absl::MutexLock lock(&stats_mu_);
    before.swap(stats_.placeholder_risks);
    stats_.placeholder_risks = risks;
    stats_.placeholder_risks_known = true;
  }
  for (const auto& [name, detail] : risks) {
    auto it = before.find(name);
    if (it != before.end() && it->second == detail) continue;
    spdlog::error("slurm sync: placeholder risk {}: {}", name, detail);
  }
  for (const auto& [name, detail] : before) {
    if (risks.count(name) == 0) spdlog::info("slurm sync: placeholder risk {} cleared", name);
  }
}

}  // namespace duet
