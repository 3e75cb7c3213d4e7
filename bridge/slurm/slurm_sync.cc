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
namespace {

constexpr char kDuetReason[] = "duet: ";

std::string Label(const NodeSpec& spec, const char* key) {
  auto it = spec.labels.find(key);
  return it == spec.labels.end() ? "" : it->second;
}

bool IsDuetDrain(const SlurmNodeInfo& n) {
  return n.drain && absl::StartsWith(n.reason, kDuetReason);
}

std::vector<SlurmGres> Sorted(std::vector<SlurmGres> g) {
  std::sort(g.begin(), g.end(), [](const SlurmGres& a, const SlurmGres& b) {
    return std::tie(a.name, a.type, a.count) < std::tie(b.name, b.type, b.count);
  });
  g.erase(std::remove_if(g.begin(), g.end(), [](const SlurmGres& x) { return x.count == 0; }),
          g.end());
  return g;
}

std::string DrainReasonFor(NodeState s) {
  switch (s) {
    case NodeState::kCordoned: return "duet: cordoned";
    case NodeState::kNotReady: return "duet: node not ready";
    case NodeState::kGone: return "duet: node left the inventory";
    case NodeState::kReady: return "";
  }
  return "";
}

std::vector<HeldDevice> ToHeld(const SlurmJobNodeDevices& d) {
  std::vector<HeldDevice> out;
  for (uint32_t g : d.gpus) out.push_back({DeviceKind::kGpu, g, kWholeDevice});
  for (uint32_t t : d.tpus) out.push_back({DeviceKind::kTpu, t, kWholeDevice});
  return out;
}

// GPU and TPU counts per GRES name ("gpu:8,tpu:0"), types ignored: a
// slurmd's GRES type is the operator's choice (Slinky: extraConf Gres=),
// what must agree with Kubernetes is how many devices Slurm hands out.
std::string DeviceCounts(const std::vector<SlurmGres>& gres) {
  uint64_t gpus = 0, tpus = 0;
  for (const SlurmGres& g : gres) {
    if (g.name == "gpu") gpus += g.count;
    if (g.name == "tpu") tpus += g.count;
  }
  return absl::StrCat("gpu:", gpus, ",tpu:", tpus);
}

}  // namespace

absl::StatusOr<SlurmNodeMode> ParseSlurmNodeMode(const std::string& s) {
  if (s == "create") return SlurmNodeMode::kCreate;
  if (s == "adopt") return SlurmNodeMode::kAdopt;
  return absl::InvalidArgumentError(
      absl::StrCat("slurm node mode \"", s, "\": must be create or adopt"));
}

std::string SlurmNameFor(const NodeSpec& spec) {
  const std::string over = Label(spec, kSlinkyHostnameOverride);
  if (!over.empty()) return over;
  return spec.name.substr(0, spec.name.find('.'));
}

SlurmNodeConfig SlurmNodeFor(const NodeView& view, const SlurmSyncOptions& options) {
  const NodeSpec& spec = view.spec;
  SlurmNodeConfig c;
  c.name = spec.name;
  c.addr = Label(spec, options.node_addr_label.c_str());
  c.cpus = std::max<uint32_t>(1, spec.cpus);
  c.real_memory_mib = std::max<uint64_t>(1, spec.memory_mib);
  std::map<std::pair<std::string, std::string>, uint32_t> gres;
  std::set<std::string> features;
  // The marker means "duet made it, duet may delete it": never on a node
  // that a slurmd registered.
  if (!options.managed_feature.empty() && options.node_mode == SlurmNodeMode::kCreate) {
    features.insert(options.managed_feature);
  }
  for (const DeviceState& d : view.devices) {
    const std::string name = d.spec.kind == DeviceKind::kGpu ? "gpu" : "tpu";
    ++gres[{name, SanitizeFeature(d.spec.model)}];
    if (!d.spec.model.empty()) features.insert(SanitizeFeature(d.spec.model));
    if (!d.spec.topology.tpu_topology.empty()) {
      features.insert(SanitizeFeature("tpu-topology-" + d.spec.topology.tpu_topology));
    }
  }
  for (const auto& [key, count] : gres) c.gres.push_back({key.first, key.second, count});
  for (const std::string& v :
       {spec.pool, spec.zone, Label(spec, "cloud.google.com/gke-accelerator"),
        Label(spec, "cloud.google.com/gke-tpu-accelerator")}) {
    if (!v.empty()) features.insert(SanitizeFeature(v));
  }
  // The block and sub-block as features, on every Slurm version (from 25.05
  // the block can also be the node's Topology=, SlurmTopologyFor): labels
  // first, then the devices' topology (placement::TopologyOf).
  const placement::NodeTopology topo = placement::TopologyOf(view);
  if (!topo.block.empty()) features.insert(SanitizeFeature("block-" + topo.block));
  if (!topo.subblock.empty()) features.insert(SanitizeFeature("subblock-" + topo.subblock));
  c.features.assign(features.begin(), features.end());
  c.weight = SlurmWeightFor(view, options);
  c.topology = SlurmTopologyFor(view, options);
  return c;
}

std::string SlurmTopologyFor(const NodeView& view, const SlurmSyncOptions& options) {
  // Only a node duet creates: a node slurmd registers (adopt) takes its
  // Topology= from its own --conf, as the operator set it.
  if (options.block_topology.empty() || options.node_mode != SlurmNodeMode::kCreate) return "";
  const std::string block = placement::TopologyOf(view).block;
  if (block.empty()) return "";
  // The unit as the features spell it (lower case, [a-z0-9._-]): the name
  // the operator lists in topology.conf (BlockName=) or topology.yaml.
  return absl::StrCat(options.block_topology, ":", SanitizeFeature(block));
}

uint32_t SlurmWeightFor(const NodeView& view, const SlurmSyncOptions& options) {
  // One implementation: the placement library's policy decides Slurm's node
  // order too (fuller nodes weigh less, so Slurm's first fit packs).
  const std::shared_ptr<const placement::Workload> workload =
      options.workload ? options.workload() : nullptr;
  return placement::Scorer(options.policy, workload.get()).SlurmWeight(view, placement::NodeLoad{});
}

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

std::string UnusableReason(const SlurmNodeInfo& n) {
  if (n.future) return "";
  const std::string why = n.reason.empty() ? "" : absl::StrCat(" (", n.reason, ")");
  if (n.down) return absl::StrCat("down in Slurm", why);
  if (n.drain) return absl::StrCat("drained in Slurm", why);
  if (n.not_responding) return "not responding in Slurm";
  // Flags under which Slurm starts no new job on an otherwise idle node.
  if (n.reboot) return absl::StrCat("reboot requested in Slurm", why);
  if (n.failing) return absl::StrCat("failing in Slurm", why);
  if (n.powered_down) return absl::StrCat("powered down in Slurm", why);
  if (n.invalid_registration) return absl::StrCat("invalid registration in Slurm", why);
  return "";
}

std::string ReservationReason(const SlurmReservationInfo& r, absl::Time now) {
  if (r.end <= now) return "";
  std::string who;
  if (!r.users.empty()) absl::StrAppend(&who, " for users ", r.users);
  if (!r.accounts.empty()) absl::StrAppend(&who, who.empty() ? " for" : ",", " accounts ",
                                           r.accounts);
  const std::string when = r.start <= now
                               ? absl::StrCat("until ", absl::FormatTime(absl::RFC3339_sec, r.end,
                                                                         absl::UTCTimeZone()))
                               : absl::StrCat("from ", absl::FormatTime(absl::RFC3339_sec, r.start,
                                                                        absl::UTCTimeZone()),
                                              " (a placeholder has no end and would overlap it)");
  return absl::StrCat("reserved in Slurm: reservation ", r.name, r.maint ? " (MAINT)" : "", who,
                      " ", when);
}

void SlurmNodeLoads::Replace(const std::vector<SlurmNodeInfo>& nodes,
                             const std::vector<SlurmReservationInfo>& reservations,
                             absl::Time now) {
  absl::flat_hash_map<std::string, placement::NodeLoad> fresh;
  absl::flat_hash_map<std::string, std::pair<std::string, std::string>> states;
  absl::flat_hash_map<std::string, std::string> unusable;
  fresh.reserve(nodes.size());
  states.reserve(nodes.size());
  for (const SlurmNodeInfo& n : nodes) {
    states[n.name] = {n.state, n.reason};
    std::string why = UnusableReason(n);
    if (!why.empty()) unusable[n.name] = std::move(why);
    if (n.alloc_cpus == 0 && n.alloc_memory_mib == 0) continue;
    fresh[n.name] = placement::NodeLoad{uint64_t{n.alloc_cpus} * 1000, n.alloc_memory_mib};
  }
  // The earliest reservation of each node that is not over; a node state
  // that already refuses placeholders keeps its own reason.
  absl::flat_hash_map<std::string, const SlurmReservationInfo*> first;
  for (const SlurmReservationInfo& r : reservations) {
    if (r.end <= now) continue;
    for (const std::string& node : r.nodes) {
      auto [it, added] = first.emplace(node, &r);
      if (!added && r.start < it->second->start) it->second = &r;
    }
  }
  for (const auto& [node, r] : first) {
    if (!states.contains(node) || unusable.contains(node)) continue;
    unusable[node] = ReservationReason(*r, now);
  }
  absl::MutexLock lock(&mu_);
  loads_.swap(fresh);
  states_.swap(states);
  unusable_.swap(unusable);
  unusable_count_.store(unusable_.size());
}

std::string SlurmNodeLoads::Unusable(const std::string& node) const {
  if (unusable_count_.load(std::memory_order_relaxed) == 0) return "";
  absl::ReaderMutexLock lock(&mu_);
  auto it = unusable_.find(node);
  return it == unusable_.end() ? "" : it->second;
}

std::pair<std::string, std::string> SlurmNodeLoads::State(const std::string& node) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = states_.find(node);
  return it == states_.end() ? std::pair<std::string, std::string>() : it->second;
}

void SlurmNodeLoads::Add(const std::string& node, const placement::NodeLoad& load) {
  absl::MutexLock lock(&mu_);
  placement::NodeLoad& l = loads_[node];
  l.cpu_milli += load.cpu_milli;
  l.memory_mib += load.memory_mib;
}

void SlurmNodeLoads::MarkUnusable(const std::string& node, const std::string& state,
                                  const std::string& why) {
  absl::MutexLock lock(&mu_);
  states_[node] = {state, why};
  unusable_[node] = why;
  unusable_count_.store(unusable_.size());
}

placement::NodeLoad SlurmNodeLoads::Get(const std::string& node) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = loads_.find(node);
  return it == loads_.end() ? placement::NodeLoad{} : it->second;
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

absl::Status SlurmSync::AfterCtldStart(const std::vector<SlurmNodeInfo>& nodes) {
  absl::StatusOr<int64_t> boot = slurm_->ControllerBootTime();
  if (absl::IsUnimplemented(boot.status())) return absl::OkStatus();
  if (!boot.ok()) return boot.status();
  if (*boot == ctld_boot_) return absl::OkStatus();
  // Newer Slurm (seen on 24.11) carries `scontrol reconfigure` out by
  // restarting slurmctld, which gives it a new BOOT_TIME. A new start seen
  // within a few seconds of the sync's own reconfigure is that restart, not
  // another start: reconfiguring again would restart slurmctld again, on
  // every pass. (Slurm 22.05 reconfigures in place and keeps BOOT_TIME.)
  if (own_reconfigure_at_ != 0 && ctld_boot_ != 0 && *boot > ctld_boot_ &&
      *boot <= own_reconfigure_at_ + kOwnReconfigureRestartSeconds) {
    spdlog::info("slurm sync: slurmctld restarted at {} to carry out duet's reconfigure; nothing "
                 "more to do",
                 *boot);
    ctld_boot_ = *boot;
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
        "slurm sync: slurmctld started at {} with GRES nodes: scontrol reconfigure (Slurm 22.05 "
        "refuses GRES steps on recovered dynamic nodes until then)",
        *boot);
  }
  ctld_boot_ = *boot;
  return absl::OkStatus();
}

absl::Status SlurmSync::Retire(const SlurmNodeInfo& node, const std::string& reason) {
  if (!node.future && !node.drain) {
    SlurmNodeUpdate u;
    u.name = node.name;
    u.drain_reason = reason;
    DUET_RETURN_IF_ERROR(slurm_->UpdateNode(u));
    Count(&SlurmSyncStats::drains);
    spdlog::info("slurm sync: drained {} ({})", node.name, reason);
  }
  absl::Status s = slurm_->DeleteNode(node.name);
  if (absl::IsFailedPrecondition(s)) return absl::OkStatus();  // jobs left: next pass
  if (!s.ok() && !absl::IsNotFound(s)) return s;
  Count(&SlurmSyncStats::nodes_deleted);
  spdlog::info("slurm sync: deleted Slurm node {} ({})", node.name, reason);
  return absl::OkStatus();
}

absl::Status SlurmSync::DrainOrResume(const SlurmNodeInfo& have, const std::string& reason) {
  if (!reason.empty() && !have.drain) {
    SlurmNodeUpdate u;
    u.name = have.name;
    u.drain_reason = reason;
    absl::Status s = slurm_->UpdateNode(u);
    if (!s.ok()) return s;
    Count(&SlurmSyncStats::drains);
    spdlog::info("slurm sync: drained {} ({})", have.name, reason);
    // Unusable from now, not from the next pass's read (this pass read the
    // node before draining it): the node may be uncordoned in the ledger
    // before then, and a filter that passed it would send binds that Slurm
    // refuses ("Required node not available") until a pass resumes it.
    if (options_.loads != nullptr) {
      SlurmNodeInfo drained = have;
      drained.drain = true;
      drained.reason = reason;
      options_.loads->MarkUnusable(have.name, have.state + "+DRAIN", UnusableReason(drained));
    }
    if (options_.on_drain) options_.on_drain(have.name, true, reason);
  } else if (reason.empty() && IsDuetDrain(have)) {
    SlurmNodeUpdate u;
    u.name = have.name;
    u.drain_reason = "";
    absl::Status s = slurm_->UpdateNode(u);
    if (!s.ok()) return s;
    Count(&SlurmSyncStats::resumes);
    spdlog::info("slurm sync: resumed {} (was: {})", have.name, have.reason);
    // Usable again from the next pass's read, not at once: Slurm 22.05 can
    // report a resumed dynamic node not responding until its slurmd's next
    // registration, and refuses placeholders there until then.
    if (options_.on_drain) options_.on_drain(have.name, false, have.reason);
  } else if (!reason.empty() && IsDuetDrain(have) && have.reason != reason) {
    SlurmNodeUpdate u;
    u.name = have.name;
    u.drain_reason = reason;
    return slurm_->UpdateNode(u);
  }
  return absl::OkStatus();
}

absl::Status SlurmSync::SyncNodes(const LedgerSnapshot& snap,
                                  const std::vector<SlurmNodeInfo>& nodes) {
  if (options_.node_mode == SlurmNodeMode::kAdopt) return AdoptNodes(snap, nodes);
  absl::Status first;
  auto note = [&first](absl::Status s) {
    if (first.ok() && !s.ok()) first = std::move(s);
  };
  absl::flat_hash_map<std::string, const SlurmNodeInfo*> by_name;
  for (const SlurmNodeInfo& n : nodes) by_name[n.name] = &n;
  absl::flat_hash_set<std::string> wanted;

  for (const auto& view : snap.nodes) {
    const NodeSpec& spec = view->spec;
    wanted.insert(spec.name);
    auto it = by_name.find(spec.name);
    if (spec.state == NodeState::kGone) {
      if (it != by_name.end()) note(Retire(*it->second, DrainReasonFor(NodeState::kGone)));
      continue;
    }
    const SlurmNodeConfig want = SlurmNodeFor(*view, options_);
    if (it == by_name.end()) {
      absl::Status s = slurm_->CreateNode(want);
      if (s.ok()) {
        Count(&SlurmSyncStats::nodes_created);
        spdlog::info("slurm sync: created Slurm node {}: {}", want.name, SlurmNodeLine(want));
      } else if (!absl::IsAlreadyExists(s)) {
        note(s);
      }
      continue;
    }
    const SlurmNodeInfo& have = *it->second;
    // GRES: Slurm refuses count changes on a node with File= devices; drain,
    // then delete and recreate once empty.
    const std::string want_gres = FormatGres(Sorted(want.gres));
    const std::string have_gres = FormatGres(Sorted(have.gres));
    if (want_gres != have_gres && recreated_for_[spec.name] != want_gres) {
      if (have.busy) {
        if (!have.drain) {
          SlurmNodeUpdate u;
          u.name = have.name;
          u.drain_reason = "duet: GRES changed, recreating once empty";
          note(slurm_->UpdateNode(u));
          Count(&SlurmSyncStats::drains);
          spdlog::info("slurm sync: {} GRES {} -> {}: drained, recreated once empty", have.name,
                       have_gres, want_gres);
        }
        continue;
      }
      absl::Status s = slurm_->DeleteNode(have.name);
      if (s.ok()) s = slurm_->CreateNode(want);
      if (s.ok()) {
        // A recreated node comes back FUTURE; RESUME makes a running slurmd
        // register again.
        SlurmNodeUpdate u;
        u.name = have.name;
        u.drain_reason = "";
        (void)slurm_->UpdateNode(u);
        recreated_for_[spec.name] = want_gres;
        Count(&SlurmSyncStats::nodes_recreated);
        spdlog::info("slurm sync: recreated Slurm node {} for GRES {} -> {}", have.name, have_gres,
                     want_gres);
      }
      note(s);
      continue;
    }
    if (have.features != want.features) {
      SlurmNodeUpdate u;
      u.name = have.name;
      u.features = want.features;
      note(slurm_->UpdateNode(u));
    }
    if (have.future) continue;  // no slurmd yet: state changes wait for it
    note(DrainOrResume(have, DrainReasonFor(spec.state)));
  }
  // Nodes duet made that left the ledger: drain, delete once empty.
  for (const SlurmNodeInfo& n : nodes) {
    if (wanted.contains(n.name)) continue;
    if (options_.managed_feature.empty() ||
        std::find(n.features.begin(), n.features.end(), options_.managed_feature) ==
            n.features.end()) {
      continue;  // not ours
    }
    note(Retire(n, DrainReasonFor(NodeState::kGone)));
  }
  return first;
}

absl::Status SlurmSync::AdoptNodes(const LedgerSnapshot& snap,
                                   const std::vector<SlurmNodeInfo>& nodes) {
  absl::Status first;
  auto note = [&first](absl::Status s) {
    if (first.ok() && !s.ok()) first = std::move(s);
  };
  absl::flat_hash_map<std::string, const SlurmNodeInfo*> by_name;
  for (const SlurmNodeInfo& n : nodes) by_name[n.name] = &n;
  std::set<std::string> unregistered, unmapped, mismatched;

  for (const auto& view : snap.nodes) {
    const NodeSpec& spec = view->spec;
    const std::string slurm_name = SlurmNameFor(spec);
    if (slurm_name != spec.name) {
      // Placeholders, job import and the SPANK plugin's Hold/Release all
      // name a node by one name: a Slurm node of another name is not
      // served (nothing granted on a guess).
      const std::string why = absl::StrCat("slurmd registers it as ", slurm_name,
                                           ", not its Kubernetes name: not adopted");
      unmapped.insert(spec.name);
      if (!unmapped_.count(spec.name)) {
        spdlog::error(
            "slurm sync: {}: {} (duet needs the Slurm node named like the Kubernetes node: "
            "Kubernetes node names without a dot and no {} annotation)",
            spec.name, why, kSlinkyHostnameOverride);
      }
      if (options_.loads != nullptr) options_.loads->MarkUnusable(spec.name, "UNMAPPED", why);
      continue;
    }
    auto it = by_name.find(spec.name);
    if (it == by_name.end() || it->second->future) {
      if (spec.state == NodeState::kGone) continue;
      unregistered.insert(spec.name);
      if (!unregistered_.count(spec.name)) {
        spdlog::warn(
            "slurm sync: {}: no slurmd has registered Slurm node {} yet (slurm.nodes: adopt): "
            "nothing is made for it, no placeholders until it registers",
            spec.name, slurm_name);
      }
      if (options_.loads != nullptr) {
        options_.loads->MarkUnusable(spec.name, "UNREGISTERED", "no slurmd registered in Slurm");
      }
      continue;
    }
    const SlurmNodeInfo& have = *it->second;
    if (unregistered_.count(spec.name)) {
      spdlog::info("slurm sync: {}: slurmd registered, adopted ({})", spec.name, have.state);
    }
    const SlurmNodeConfig want = SlurmNodeFor(*view, options_);
    // Features: duet's are added to slurmd's own (a NodeSet's feature puts
    // the node in its partition); none is ever removed.
    std::set<std::string> features(have.features.begin(), have.features.end());
    const size_t had = features.size();
    features.insert(want.features.begin(), want.features.end());
    if (features.size() != had) {
      SlurmNodeUpdate u;
      u.name = have.name;
      u.features = std::vector<std::string>(features.begin(), features.end());
      note(slurm_->UpdateNode(u));
    }
    // GRES: never recreated (slurmd owns the node); a mismatch drains it.
    std::string reason = DrainReasonFor(spec.state);
    const std::string want_counts = DeviceCounts(want.gres);
    const std::string have_counts = DeviceCounts(have.gres);
    if (want_counts != have_counts) {
      mismatched.insert(spec.name);
      reason = absl::StrCat("duet: GRES mismatch: slurmd registered ", have_counts,
                            ", Kubernetes node has ", want_counts);
      if (!mismatched_.count(spec.name)) {
        spdlog::error(
            "slurm sync: {}: slurmd registered GRES {} ({}), the Kubernetes node has {}: "
            "draining it (fix the NodeSet's Gres= or gres.conf; duet never recreates a node "
            "slurmd owns)",
            spec.name, FormatGres(have.gres), have_counts, want_counts);
      }
      if (!have.drain) Count(&SlurmSyncStats::gres_mismatch_drains);
    } else if (mismatched_.count(spec.name)) {
      spdlog::info("slurm sync: {}: GRES agree again ({})", spec.name, have_counts);
    }
    note(DrainOrResume(have, reason));
  }
  unregistered_.swap(unregistered);
  unmapped_.swap(unmapped);
  mismatched_.swap(mismatched);
  {
    absl::MutexLock lock(&stats_mu_);
    stats_.nodes_unregistered = unregistered_.size();
    stats_.nodes_unmapped = unmapped_.size();
    stats_.nodes_gres_mismatch = mismatched_.size();
  }
  // Slurm nodes that are not (or no longer) in the ledger are slurmd's:
  // left as they are.
  return first;
}

absl::Status SlurmSync::ImportJobs(const LedgerSnapshot& snap,
                                   const std::vector<SlurmNodeInfo>& nodes) {
  const absl::Time listed_at = clock_->Now();
  auto jobs = slurm_->ListJobs();
  if (!jobs.ok()) return jobs.status();
  absl::flat_hash_set<std::string> ledger_nodes;
  for (const auto& v : snap.nodes) ledger_nodes.insert(v->spec.name);
  absl::flat_hash_set<uint32_t> live;
  // Jobs Slurm lists as ended: their holdings go whenever they were granted
  // (the grace below is for jobs too new to be in the list). Keeping one
  // for the grace made the next job on its devices a false conflict.
  absl::flat_hash_set<uint32_t> ended;
  absl::Status first;

  for (const SlurmJobInfo& job : *jobs) {
    if (job.live()) live.insert(job.job_id);
    if (job.state == SlurmJobState::kFinished) ended.insert(job.job_id);
    if (!job.live()) continue;
    if (std::optional<PlaceholderPod> pod = ParsePlaceholderComment(job.comment)) {
      placeholders_seen_[job.job_id] = {*pod, job.cpus, job.memory_mib};
    } else if (ParseLendComment(job.comment) || ParseGangJobName(job.name)) {
      // A lend or gang job is duet's, not a user's job.
    } else if (options_.on_live_job) {
      options_.on_live_job(job);
    }
  }
  // First release holdings of jobs Slurm no longer runs. Only what was granted before the
  // list was read: a step may have registered since.
  absl::flat_hash_set<uint32_t> kept;  // lost placeholders still held
  // Jobs' and steps' holdings kept only for the grace although they were
  // granted before the list was read and their job is not live in it: if a
  // live job of the list needs their devices, they belong to a job that had
  // ended by then (Slurm never gives a device to two running jobs).
  std::map<std::string, std::vector<Holding>> in_grace;  // by node
  std::set<std::string> placeholder_pods;  // pods holding a placeholder
  // (lend job, node) pairs whose devices a claim now holds (DRA lending).
  std::set<std::pair<uint32_t, std::string>> claimed;
  uint64_t claims_without_lend_job = 0;
  for (const Holding& h : ledger_->ListHoldings()) {
    if (h.owner.kind == OwnerKind::kPlaceholder) placeholder_pods.insert(h.owner.pod_uid);
    if (h.owner.kind == OwnerKind::kClaim) {
      claimed.emplace(h.owner.job_id, h.node);
      // Kubernetes still uses the device: kept, never repaired here.
      if (!live.contains(h.owner.job_id)) {
        ++claims_without_lend_job;
        if (!claims_reported_.contains(h.owner)) {
          spdlog::warn("slurm sync: {} on {}: its lend job {} no longer runs in Slurm; the claim "
                       "keeps the device until it is deallocated",
                       h.owner.ToString(), h.node, h.owner.job_id);
        }
      }
      continue;
    }
    // A gang's slots (GangSlot{J}) and members (Placeholder{J}) go with
    // their gang job J like a placeholder: slots are released, members whose
    // pod may run are kept (HandleLost below).
    const bool slurm_side = h.owner.kind == OwnerKind::kSlurmJob ||
                            h.owner.kind == OwnerKind::kSlurmStep ||
                            h.owner.kind == OwnerKind::kPlaceholder ||
                            h.owner.kind == OwnerKind::kLend ||
                            h.owner.kind == OwnerKind::kGangSlot;
    if (!slurm_side || live.contains(h.owner.job_id)) continue;
    if (!ended.contains(h.owner.job_id) && h.granted_at > listed_at - options_.release_grace) {
      if (h.owner.kind != OwnerKind::kPlaceholder && h.owner.kind != OwnerKind::kLend &&
          h.owner.kind != OwnerKind::kGangSlot && h.granted_at <= listed_at) {
        in_grace[h.node].push_back(h);
      }
      continue;
    }
    if (h.owner.kind == OwnerKind::kPlaceholder && PodOf(h.owner.pod_uid) != PodLiveness::kGone) {
      HandleLost(h, *jobs, nodes);
      kept.insert(h.owner.job_id);
      continue;
    }
    auto r = ledger_->Release(h.node, h.owner);
    if (r.ok() && r->released) {
      Count(&SlurmSyncStats::holdings_released);
      spdlog::info("slurm sync: released {} on {}: job {} no longer runs", h.owner.ToString(),
                   h.node, h.owner.job_id);
    }
  }
  {
    absl::flat_hash_set<Owner> reported;
    for (const Holding& h : ledger_->ListHoldings()) {
      if (h.owner.kind == OwnerKind::kClaim && !live.contains(h.owner.job_id)) {
        reported.insert(h.owner);
      }
    }
    claims_reported_.swap(reported);
    absl::MutexLock lock(&stats_mu_);
    stats_.claims_without_lend_job = claims_without_lend_job;
  }
  if (options_.evictions != nullptr) options_.evictions->Retain(placeholder_pods);
  // Gang jobs (duet-gang:KEY) are recorded by their slots and members, never
  // as Slurm jobs.
  const absl::flat_hash_set<uint32_t> gang_held = GangJobsHeld(*jobs);
  // Then record every live job (placeholders as such) the ledger lacks.
  for (const SlurmJobInfo& job : *jobs) {
    if (!job.live()) continue;
    if (std::optional<gang::GangKey> key = ParseGangJobName(job.name)) {
      if (!gang_held.contains(job.job_id)) ImportGangJob(job, *key, ledger_nodes, listed_at);
      continue;
    }
    const std::optional<PlaceholderPod> pod = ParsePlaceholderComment(job.comment);
    if (pod && PodOf(pod->uid) == PodLiveness::kGone) {
      absl::Status s = slurm_->KillJob(job.job_id);
      if (s.ok()) {
        for (const SlurmJobNodeDevices& d : job.devices) {
          (void)ledger_->Release(d.node, Owner::Placeholder(job.job_id, pod->uid));
        }
        Count(&SlurmSyncStats::placeholders_cancelled);
        spdlog::info("slurm sync: cancelled placeholder job {}: pod {}/{} (uid {}) is gone",
                     job.job_id, pod->ns, pod->name, pod->uid);
      } else if (first.ok()) {
        first = s;
      }
      continue;
    }
    const bool lend = !pod && ParseLendComment(job.comment).has_value();
    for (const SlurmJobNodeDevices& d : job.devices) {
      if (!ledger_nodes.contains(d.node)) continue;
      std::vector<HeldDevice> devices = ToHeld(d);
      if (devices.empty()) continue;
      const Owner owner = pod    ? Owner::Placeholder(job.job_id, pod->uid)
                          : lend ? Owner::Lend(job.job_id, d.node)
                                 : Owner::SlurmJob(job.job_id);
      if (ledger_->FindHolding(d.node, owner)) continue;
      // A lend job whose devices a claim holds is present, not lost.
      if (lend && claimed.count({job.job_id, d.node})) continue;
      HoldRequest req;
      req.node = d.node;
      req.owner = owner;
      req.devices = devices;
      auto held = ledger_->Hold(req);
      if (!held.ok() && absl::IsResourceExhausted(held.status()) &&
          ReleaseEndedHolders(d.node, devices, &in_grace[d.node]) > 0) {
        held = ledger_->Hold(req);
      }
      if (held.ok()) {
        Count(&SlurmSyncStats::holdings_imported);
        spdlog::info("slurm sync: imported {} on {}", owner.ToString(), d.node);
      } else if (options_.evictions != nullptr && absl::IsResourceExhausted(held.status()) &&
                 PodEvictionWait(*options_.evictions, *ledger_, req, clock_->Now(),
                                 /*ask_slurm=*/false)) {
        // A preemptor on the devices of a pod being evicted (slurm.preemption:
        // evict-pods): imported once the pod has left; not a conflict.
      } else {
        Count(&SlurmSyncStats::conflicts);
        spdlog::error("slurm sync: cannot record {} on {} (Slurm runs it): {}", owner.ToString(),
                      d.node, held.status().ToString());
      }
    }
  }
  // Forget what no longer matters: placeholder jobs neither live nor kept,
  // fenced entries whose holding is gone (repaired, or the pod ended).
  for (auto it = placeholders_seen_.begin(); it != placeholders_seen_.end();) {
    it = live.contains(it->first) || kept.contains(it->first) ? std::next(it)
                                                              : placeholders_seen_.erase(it);
  }
  for (auto it = fenced_.begin(); it != fenced_.end();) {
    it = kept.contains(it->second) ? std::next(it) : fenced_.erase(it);
  }
  for (auto it = repairs_.begin(); it != repairs_.end();) {
    it = kept.contains(it->first.second) ? std::next(it) : repairs_.erase(it);
  }
  {
    absl::MutexLock lock(&stats_mu_);
    stats_.placeholders_fenced = fenced_.size();
  }
  return first;
}

absl::flat_hash_set<uint32_t> SlurmSync::GangJobsHeld(const std::vector<SlurmJobInfo>& jobs) const {
  absl::flat_hash_set<uint32_t> out;
  const bool any = std::any_of(jobs.begin(), jobs.end(), [](const SlurmJobInfo& j) {
    return j.live() && ParseGangJobName(j.name).has_value();
  });
  if (!any) return out;
  for (const Holding& h : ledger_->ListHoldings()) {
    // A claim on a gang job's device (the DRA lending mode) holds it too.
    if (h.owner.kind == OwnerKind::kGangSlot || h.owner.kind == OwnerKind::kPlaceholder ||
        h.owner.kind == OwnerKind::kClaim) {
      out.insert(h.owner.job_id);
    }
  }
  return out;
}

void SlurmSync::ImportGangJob(const SlurmJobInfo& job, const gang::GangKey& key,
                              const absl::flat_hash_set<std::string>& ledger_nodes,
                              absl::Time listed_at) {
  // Placeholders::Create records the slots right after Slurm grants the
  // job: a job this new may be on its way into the ledger.
  if (job.start_time > listed_at - options_.release_grace) return;
  // The slots per node the job was made for ("slots=N" in its comment, the
  // same number on every node); one slot per node when it cannot be read.
  uint32_t slots = 0;
  for (absl::string_view kv : absl::StrSplit(job.comment, ' ', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&kv, "slots=") && !absl::SimpleAtoi(kv, &slots)) slots = 0;
  }
  const size_t nodes = job.devices.size();
  uint32_t per_node = nodes > 0 && slots > 0 && slots % nodes == 0
                          ? static_cast<uint32_t>(slots / nodes)
                          : 1;
  for (const SlurmJobNodeDevices& d : job.devices) {
    if (per_node > 1 && ToHeld(d).size() % per_node != 0) per_node = 1;
  }
  const std::string gang = key.ToString();
  uint32_t slot = 0;
  for (const SlurmJobNodeDevices& d : job.devices) {
    const std::vector<HeldDevice> devices = ToHeld(d);  // sorted by (kind, index)
    const size_t each = devices.size() / per_node;
    for (uint32_t m = 0; m < per_node; ++m, ++slot) {
      if (!ledger_nodes.contains(d.node) || each == 0) continue;
      HoldRequest req;
      req.node = d.node;
      req.owner = Owner::GangSlot(job.job_id, gang, slot);
      req.devices.assign(devices.begin() + m * each, devices.begin() + (m + 1) * each);
      absl::StatusOr<HoldResult> held = ledger_->Hold(req);
      if (held.ok()) {
        Count(&SlurmSyncStats::holdings_imported);
        spdlog::info("slurm sync: imported {} on {} (the ledger had nothing of gang job {})",
                     req.owner.ToString(), d.node, job.job_id);
      } else {
        Count(&SlurmSyncStats::conflicts);
        spdlog::error("slurm sync: cannot record {} on {} (Slurm runs it): {}",
                      req.owner.ToString(), d.node, held.status().ToString());
      }
    }
  }
}

int SlurmSync::ReleaseEndedHolders(const std::string& node, const std::vector<HeldDevice>& devices,
                                   std::vector<Holding>* candidates) {
  int released = 0;
  for (auto it = candidates->begin(); it != candidates->end();) {
    const bool overlaps = std::any_of(it->devices.begin(), it->devices.end(),
                                      [&](const HeldDevice& x) {
                                        return std::any_of(
                                            devices.begin(), devices.end(), [&](const HeldDevice& y) {
                                              return x.kind == y.kind && x.index == y.index;
                                            });
                                      });
    if (!overlaps) {
      ++it;
      continue;
    }
    auto r = ledger_->Release(node, it->owner);
    if (r.ok() && r->released) {
      ++released;
      Count(&SlurmSyncStats::holdings_released);
      spdlog::info("slurm sync: released {} on {}: job {} had ended (a running job holds its "
                   "devices in Slurm)",
                   it->owner.ToString(), node, it->owner.job_id);
    }
    it = candidates->erase(it);
  }
  return released;
}

PodLiveness SlurmSync::PodOf(const std::string& uid) const {
  return options_.pod_liveness ? options_.pod_liveness(uid) : PodLiveness::kUnknown;
}

const char* RepairFailureName(RepairFailure f) {
  switch (f) {
    case RepairFailure::kNodeUnusable: return "node_unusable";
    case RepairFailure::kSlurmDevicesBusy: return "slurm_devices_busy";
    case RepairFailure::kLedgerConflict: return "ledger_conflict";
    case RepairFailure::kSlurmUnavailable: return "slurm_unavailable";
    case RepairFailure::kOther: return "other";
  }
  return "other";
}

namespace {

// Why a repair failed, from Placeholders::Repair's status (see its errors).
RepairFailure ClassifyRepairFailure(const absl::Status& s) {
  if (absl::IsUnavailable(s)) return RepairFailure::kSlurmUnavailable;
  const absl::string_view m = s.message();
  if (absl::StrContains(m, "also held by another owner in the ledger")) {
    return RepairFailure::kLedgerConflict;
  }
  // Slurm had no room for, or chose other indices than, devices no other
  // owner holds in the ledger: Slurm counts them in use although no job the
  // ledger knows holds them (e.g. GRES it keeps counted after a restart).
  if (absl::IsResourceExhausted(s) || absl::StrContains(m, "Slurm gave job")) {
    return RepairFailure::kSlurmDevicesBusy;
  }
  if (absl::IsFailedPrecondition(s)) return RepairFailure::kNodeUnusable;
  return RepairFailure::kOther;
}

// Waits between repair attempts of one lost placeholder: the first retry
// at the next pass, then doubling up to five minutes, so a placeholder Slurm
// cannot re-make does not allocate and cancel jobs every pass.
absl::Duration RepairBackoff(int failures) {
  if (failures <= 1) return absl::ZeroDuration();
  return std::min(absl::Seconds(5) * (1 << std::min(failures - 2, 6)), absl::Minutes(5));
}

}  // namespace

void SlurmSync::HandleLost(const Holding& h, const std::vector<SlurmJobInfo>& jobs,
                           const std::vector<SlurmNodeInfo>& nodes) {
  const auto key = std::make_pair(h.node, h.owner.job_id);
  const bool reported = fenced_.count(key) > 0;
  RepairState& state = repairs_[key];
  const absl::Time now = clock_->Now();
  if (now < state.next_try) return;  // backing off; reported already
  PlaceholderLoss loss;
  loss.node = h.node;
  loss.lost_job_id = h.owner.job_id;
  loss.devices = h.devices;
  loss.pod.uid = h.owner.pod_uid;
  uint32_t cpus = 1;
  uint64_t memory_mib = 0;
  if (auto it = placeholders_seen_.find(h.owner.job_id); it != placeholders_seen_.end()) {
    loss.pod = it->second.pod;
    cpus = std::max<uint32_t>(1, it->second.cpus);
    memory_mib = it->second.memory_mib;
  } else {
    for (const SlurmJobInfo& j : jobs) {  // a finished record Slurm still keeps
      if (j.job_id != h.owner.job_id) continue;
      if (auto pod = ParsePlaceholderComment(j.comment)) loss.pod = *pod;
      cpus = std::max<uint32_t>(1, j.cpus);
      memory_mib = j.memory_mib;
    }
  }
  // Neither the bridge nor Slurm kept the job (slurmctld lost it right
  // after the bind, before a pass saw it): the pod watch names the pod, so
  // the new placeholder is still "duet-pod:NS/NAME".
  if ((loss.pod.ns.empty() || loss.pod.name.empty()) && options_.pod_name) {
    if (std::optional<PlaceholderPod> named = options_.pod_name(h.owner.pod_uid)) {
      loss.pod.ns = named->ns;
      loss.pod.name = named->name;
    }
  }
  // Slurm preempted it: the preemptor runs on the pod's devices now, so a
  // repair cannot get them back. slurm.preemption decides.
  bool preempted = false;
  for (const SlurmJobInfo& j : jobs) {
    if (j.job_id == h.owner.job_id) preempted = j.preempted;
  }
  if (preempted && options_.evictions != nullptr && !loss.pod.name.empty()) {
    if (now < options_.evictions->Preempted(loss.pod, h.node, h.owner.job_id)) return;
    // The wait is over and the pod stays (a PodDisruptionBudget): its
    // placeholder is re-made like any lost one, so that Slurm stops giving
    // its devices to jobs that duet would refuse.
  } else if (preempted && !reported) {
    spdlog::error(
        "slurm sync: Slurm preempted placeholder job {} of pod {}/{} (uid {}) on {} although "
        "slurm.preemption is {}: its devices stay fenced and the preemptor's steps on them are "
        "refused; exempt the placeholder partition from preemption (docs/config.md, "
        "\"Placeholders in Slurm\") or set slurm.preemption: evict-pods",
        h.owner.job_id, loss.pod.ns, loss.pod.name, loss.pod.uid, h.node, options_.preemption);
  }
  std::string unusable = "not known to Slurm";
  for (const SlurmNodeInfo& n : nodes) {
    if (n.name != h.node) continue;
    unusable = n.future ? "no slurmd registered" : UnusableReason(n);
  }
  RepairFailure failure = RepairFailure::kNodeUnusable;
  if (unusable.empty()) {
    absl::StatusOr<std::vector<Holding>> fixed =
        Placeholders(ledger_, slurm_,
                     {options_.placeholder_partition, options_.placeholder_qos})
            .Repair(h, loss.pod, cpus, memory_mib);
    if (fixed.ok()) {
      loss.repaired = true;
      for (const Holding& n : *fixed) loss.new_job_ids.push_back(n.owner.job_id);
    } else {
      loss.detail = std::string(fixed.status().message());
      failure = ClassifyRepairFailure(fixed.status());
    }
  } else {
    loss.detail = absl::StrCat("node ", h.node, " is ", unusable);
  }
  if (loss.repaired) {
    Count(&SlurmSyncStats::placeholder_repairs);
    if (!reported) Count(&SlurmSyncStats::placeholders_lost_repaired);
    fenced_.erase(key);
    repairs_.erase(key);
    spdlog::warn(
        "slurm sync: placeholder job {} of pod {}/{} (uid {}) on {} was gone from Slurm; "
        "repaired as job(s) {}",
        h.owner.job_id, loss.pod.ns, loss.pod.name, loss.pod.uid, h.node,
        absl::StrJoin(loss.new_job_ids, ","));
  } else {
    loss.failure = failure;
    // Waiting for a node to come back costs nothing; a refused repair made
    // and cancelled Slurm jobs, so it backs off.
    if (failure != RepairFailure::kNodeUnusable) {
      ++state.failures;
      state.next_try = now + RepairBackoff(state.failures);
      {
        absl::MutexLock lock(&stats_mu_);
        ++stats_.repair_failures[RepairFailureName(failure)];
      }
    }
    if (state.last_failure != failure || !reported) {
      state.last_failure = failure;
      std::string why = RepairFailureName(failure);
      if (failure == RepairFailure::kSlurmDevicesBusy) {
        absl::StrAppend(&why, ": Slurm counts these devices in use although no job the ledger "
                              "knows holds them");
      }
      if (failure != RepairFailure::kNodeUnusable) {
        absl::StrAppend(&why, "; next try in ",
                        absl::FormatDuration(RepairBackoff(state.failures)));
      }
      spdlog::error(
          "slurm sync: placeholder job {} of pod {}/{} (uid {}) on {} is gone from Slurm while "
          "the pod runs; its devices stay held in the ledger (Slurm steps on them are refused) "
          "until a repair succeeds or the pod is deleted ({}): {}",
          h.owner.job_id, loss.pod.ns, loss.pod.name, loss.pod.uid, h.node, why, loss.detail);
    }
    if (reported) return;  // reported once; a later pass tries again
    Count(&SlurmSyncStats::placeholders_lost_fenced);
    fenced_.insert(key);
  }
  if (options_.on_placeholder_lost) options_.on_placeholder_lost(loss);
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

absl::Status SlurmSync::SyncWeights(const LedgerSnapshot& snap,
                                    const std::vector<SlurmNodeInfo>& nodes) {
  absl::flat_hash_map<std::string, uint32_t> have;
  for (const SlurmNodeInfo& n : nodes) have[n.name] = n.weight;
  absl::Status first;
  for (const auto& view : snap.nodes) {
    auto it = have.find(view->spec.name);
    if (it == have.end()) continue;
    const uint32_t want = SlurmWeightFor(*view, options_);
    if (it->second == want) continue;
    SlurmNodeUpdate u;
    u.name = view->spec.name;
    u.weight = want;
    absl::Status s = slurm_->UpdateNode(u);
    if (s.ok()) {
      Count(&SlurmSyncStats::weight_updates);
    } else if (first.ok()) {
      first = s;
    }
  }
  return first;
}

}  // namespace duet
