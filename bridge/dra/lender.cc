#include "bridge/dra/lender.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "bridge/placement/tpu_slice.h"
#include "common/metrics/metrics.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace dra {
namespace {

// Who holds one device of a lending node.
enum class HeldBy { kNobody, kLend, kClaim, kGangSlot, kOther };
struct DeviceHolder {
  HeldBy by = HeldBy::kNobody;
  const Owner* owner = nullptr;  // the (first) holder; null when kNobody
};

DeviceHolder HolderOf(const DeviceState& d) {
  if (d.uses.empty()) return {};
  const Owner* first = d.uses.front().owner.get();
  // The lending owners hold whole devices alone; anything else beside them
  // is someone else's use.
  if (d.uses.size() == 1 && first->kind == OwnerKind::kLend) return {HeldBy::kLend, first};
  if (d.uses.size() == 1 && first->kind == OwnerKind::kClaim) return {HeldBy::kClaim, first};
  if (d.uses.size() == 1 && first->kind == OwnerKind::kGangSlot) return {HeldBy::kGangSlot, first};
  return {HeldBy::kOther, first};
}

const DeviceState* FindDevice(const NodeView& view, DeviceKind kind, uint32_t index) {
  for (const DeviceState& d : view.devices) {
    if (d.spec.kind == kind && d.spec.index == index) return &d;
  }
  return nullptr;
}

std::string Describe(const LedgerDevice& d) {
  return absl::StrCat("node ", d.node, " ", DeviceKindName(d.kind), " ", d.index);
}

AdmissionVerdict Refuse(const char* reason, std::string message) {
  return AdmissionVerdict{false, reason, std::move(message)};
}

std::vector<LedgerDevice> DevicesOf(const Holding& h) {
  std::vector<LedgerDevice> out;
  for (const HeldDevice& d : h.devices) out.push_back({h.node, d.kind, d.index});
  return out;
}

}  // namespace

Lender::Lender(Ledger* ledger, LendMaker* lends, const DeviceMapView* map, RuleWriter* rules,
               ClaimLister* claims, DurableWait durable, const Clock* clock, LenderOptions options,
               prometheus::Registry* registry)
    : ledger_(ledger),
      lends_(lends),
      map_(map),
      rules_(rules),
      claims_(claims),
      durable_(std::move(durable)),
      clock_(clock),
      options_(std::move(options)),
      started_at_(clock->Now()) {
  if (registry != nullptr) {
    lent_gauge_ = &RegisterFamily(prometheus::BuildGauge(), *registry, "duet_dra_lent_devices",
                                  "Devices lent to Kubernetes (lent and free, or allocated to a "
                                  "claim), as of the last Tick or Resync")
                       .Add({});
    admissions_total_ = &RegisterFamily(prometheus::BuildCounter(), *registry,
                                        "duet_dra_admissions_total",
                                        "Admission reviews of claim allocations, by result "
                                        "(allowed, refused) and refusal reason");
    lends_total_ = &RegisterFamily(prometheus::BuildCounter(), *registry, "duet_dra_lends_total",
                                   "Devices lent to Kubernetes")
                        .Add({});
    reclaims_total_ = &RegisterFamily(prometheus::BuildCounter(), *registry,
                                      "duet_dra_reclaims_total",
                                      "Reclaims of lent, free devices, by result (done, aborted)");
    releases_total_ = &RegisterFamily(prometheus::BuildCounter(), *registry,
                                      "duet_dra_claim_releases_total",
                                      "Fenced releases of claims' devices, by result (released: "
                                      "back to lent, free; kept: the quorum read still shows the "
                                      "allocation; failed)");
  }
  // Listen first, then index the snapshot: a change between the two is
  // indexed by the listener from its later view, and the snapshot leaves
  // that node alone.
  rules_->SetDriftListener(this);  // drift only marks nodes dirty
  ledger_->AddListener(this);
  const LedgerSnapshot snap = ledger_->Snapshot();
  absl::MutexLock lock(&index_mu_);
  for (const auto& view : snap.nodes) {
    respec_.insert(view->spec.name);
    if (!touched_.count(view->spec.name)) IndexNodeLocked(view->spec.name, view.get());
  }
  building_ = false;
  touched_.clear();
}

Lender::~Lender() {
  rules_->SetDriftListener(nullptr);
  ledger_->RemoveListener(this);
}

void Lender::OnChange(const Change& change) {
  absl::MutexLock lock(&index_mu_);
  const std::string& node = *change.node;
  if (building_) touched_.insert(node);
  dirty_.insert(node);
  if (change.type == Change::Type::kUpsertNode || change.type == Change::Type::kRemoveNode ||
      change.erased) {
    respec_.insert(node);
  }
  IndexNodeLocked(node, change.erased ? nullptr : change.view->get());
}

void Lender::IndexNodeLocked(const std::string& node, const NodeView* view) {
  auto it = nodes_.find(node);
  if (it != nodes_.end()) {
    const NodeEntry& old = it->second;
    if (old.free_gpus > 0) room_.erase(RoomKey{UINT32_MAX - old.free_gpus, node, 0});
    if (old.tpu_room) room_.erase(RoomKey{UINT32_MAX - old.tpus, node, 1});
    if (old.lent > 0) lent_nodes_.erase(node);
    for (const Owner& c : old.claims) {
      auto places = claim_places_.find(c.pod_uid);
      if (places == claim_places_.end()) continue;
      places->second.erase({node, c.job_id});
      if (places->second.empty()) claim_places_.erase(places);
    }
  }
  if (view == nullptr) {
    if (it != nodes_.end()) nodes_.erase(it);
    return;
  }
  NodeEntry e;
  uint32_t free_tpus = 0;
  for (const DeviceState& d : view->devices) {
    const HeldBy by = HolderOf(d).by;
    if (d.spec.kind == DeviceKind::kTpu) ++e.tpus;
    if (by == HeldBy::kNobody) (d.spec.kind == DeviceKind::kGpu ? e.free_gpus : free_tpus) += 1;
    if (by == HeldBy::kLend || by == HeldBy::kClaim) ++e.lent;
    // The node's holders are its devices' users (as Ledger::ListHoldings
    // finds them): every Claim owner among them, whoever shares the device.
    for (const DeviceUse& u : d.uses) {
      if (u.owner->kind != OwnerKind::kClaim) continue;
      if (std::find(e.claims.begin(), e.claims.end(), *u.owner) == e.claims.end()) {
        e.claims.push_back(*u.owner);
      }
    }
  }
  e.tpu_room = e.tpus > 0 && free_tpus == e.tpus;
  if (e.free_gpus > 0) room_.insert(RoomKey{UINT32_MAX - e.free_gpus, node, 0});
  if (e.tpu_room) room_.insert(RoomKey{UINT32_MAX - e.tpus, node, 1});
  if (e.lent > 0) lent_nodes_.insert(node);
  for (const Owner& c : e.claims) claim_places_[c.pod_uid].insert_or_assign({node, c.job_id}, c);
  nodes_[node] = std::move(e);
}

std::vector<Holding> Lender::ClaimHoldings(const std::string& claim_uid) const {
  std::vector<std::pair<std::string, Owner>> places;
  {
    absl::MutexLock lock(&index_mu_);
    auto it = claim_places_.find(claim_uid);
    if (it == claim_places_.end()) return {};
    for (const auto& [key, owner] : it->second) places.emplace_back(key.first, owner);
  }
  // Outside index_mu_ (the ledger's lock comes first). Sorted as
  // ListHoldings sorts: by node, then (for one claim's owners) by lend job.
  std::vector<Holding> out;
  for (const auto& [node, owner] : places) {
    if (std::optional<Holding> h = ledger_->FindHolding(node, owner)) out.push_back(*std::move(h));
  }
  return out;
}

std::vector<std::pair<std::string, uint32_t>> Lender::IndexedClaim(
    const std::string& claim_uid) const {
  absl::MutexLock lock(&index_mu_);
  std::vector<std::pair<std::string, uint32_t>> out;
  auto it = claim_places_.find(claim_uid);
  if (it == claim_places_.end()) return out;
  for (const auto& [key, owner] : it->second) out.push_back(key);
  return out;
}

std::vector<std::string> Lender::IndexedLentNodes() const {
  absl::MutexLock lock(&index_mu_);
  return std::vector<std::string>(lent_nodes_.begin(), lent_nodes_.end());
}

uint32_t Lender::IndexedLent(const std::string& node) const {
  absl::MutexLock lock(&index_mu_);
  auto it = nodes_.find(node);
  return it == nodes_.end() ? 0 : it->second.lent;
}

void Lender::CountAdmission(const AdmissionVerdict& v) {
  if (admissions_total_ == nullptr) return;
  admissions_total_->Add({{"result", v.allowed ? "allowed" : "refused"}, {"reason", v.reason}})
      .Increment();
}

void Lender::CountReclaim(const char* result) {
  if (reclaims_total_ != nullptr) reclaims_total_->Add({{"result", result}}).Increment();
}

void Lender::CountRelease(const char* result) {
  if (releases_total_ != nullptr) releases_total_->Add({{"result", result}}).Increment();
}

bool Lender::Lending(const std::string& node) const {
  return options_.pool_of && !options_.pool_of(node).empty();
}

bool Lender::Reclaiming(const LedgerDevice& device) const {
  absl::MutexLock lock(&mu_);
  return reclaiming_.count(device);
}

bool Lender::Releasing(const std::string& claim_uid) const {
  absl::MutexLock lock(&mu_);
  return releasing_.count(claim_uid);
}

absl::StatusOr<std::vector<DraDevice>> Lender::DraNames(
    const std::vector<LedgerDevice>& devices) const {
  std::vector<DraDevice> out;
  for (const LedgerDevice& d : devices) {
    std::optional<DraDevice> dra = map_->ToDra(d);
    if (!dra) {
      return absl::FailedPreconditionError(
          absl::StrCat(Describe(d), " has no DRA device (its node is not mappable)"));
    }
    out.push_back(*std::move(dra));
  }
  return out;
}

// ---------------------------------------------------------------------------
// Admission

std::map<std::string, AdmissionVerdict> Lender::GangVerdicts(const AdmissionAsk& ask) const {
  std::map<std::string, AdmissionVerdict> out;
  if (!options_.gang_admit) return out;
  std::map<std::string, Owner> slots;  // by the slot owner's uid
  for (const AllocationResult& r : ask.new_results) {
    if (r.admin_access) continue;
    std::optional<LedgerDevice> ld = map_->ToLedger(r.device);
    if (!ld) continue;
    std::shared_ptr<const NodeView> view = ledger_->GetNode(ld->node);
    const DeviceState* ds = view ? FindDevice(*view, ld->kind, ld->index) : nullptr;
    if (ds == nullptr) continue;
    const DeviceHolder h = HolderOf(*ds);
    if (h.by == HeldBy::kGangSlot) slots.emplace(h.owner->pod_uid, *h.owner);
  }
  for (const auto& [uid, slot] : slots) out.emplace(uid, options_.gang_admit(slot, ask.pods));
  return out;
}

AdmissionVerdict Lender::Review(const AdmissionAsk& ask) {
  std::vector<LedgerDevice> touched;
  std::vector<Moved> moved;
  uint64_t seq = 0;
  AdmissionVerdict verdict;
  // The gang fence is asked first, without the lock (it reads the gangs'
  // registry, which a reservation holds across its Slurm call); only asks
  // that touch a gang's slot pay for it.
  const std::map<std::string, AdmissionVerdict> gangs = GangVerdicts(ask);
  {
    absl::MutexLock lock(&mu_);
    verdict = DecideLocked(ask, gangs, &touched, &moved, &seq);
    if (verdict.allowed && seq != 0 && !ask.dry_run) {
      for (const LedgerDevice& d : touched) {
        Admissions& a = admissions_[d];
        ++a.in_flight;
        a.last = clock_->Now();
      }
      Admissions& c = claim_admissions_[ask.claim.uid];
      ++c.in_flight;
      c.last = clock_->Now();
    } else {
      touched.clear();
    }
  }
  if (verdict.allowed && seq != 0 && !ask.dry_run) {
    absl::Status durable = durable_ ? durable_(seq) : absl::OkStatus();
    absl::MutexLock lock(&mu_);
    if (!durable.ok()) {
      UndoLocked(moved);
      verdict = Refuse(kReasonUnavailable,
                       absl::StrCat("duet could not make the allocation durable: ",
                                    durable.message()));
    }
    for (const LedgerDevice& d : touched) --admissions_[d].in_flight;
    --claim_admissions_[ask.claim.uid].in_flight;
  }
  CountAdmission(verdict);
  return verdict;
}

AdmissionVerdict Lender::DecideLocked(const AdmissionAsk& ask,
                                      const std::map<std::string, AdmissionVerdict>& gangs,
                                      std::vector<LedgerDevice>* touched,
                                      std::vector<Moved>* moved, uint64_t* seq) {
  const ClaimRef& claim = ask.claim;
  if (claim.uid.empty()) return Refuse(kReasonNotLent, "the claim has no uid");

  // The new allocation's devices that are duet's, by node.
  std::map<std::string, std::set<LedgerDevice>> wanted;
  for (const AllocationResult& r : ask.new_results) {
    if (r.admin_access) continue;  // holds nothing (monitoring)
    std::optional<LedgerDevice> ld = map_->ToLedger(r.device);
    if (!ld) {
      const std::string node = ask.node.empty() ? r.device.pool : ask.node;
      if (Lending(node)) {
        std::string why;
        map_->Lendable(node, &why);
        return Refuse(kReasonUnmappableNode,
                      absl::StrCat(r.device.ToString(), ": node ", node,
                                   " lends no devices (its devices do not map",
                                   why.empty() ? "" : ": ", why, ")"));
      }
      continue;  // not a lending node: not duet's to judge
    }
    wanted[ld->node].insert(*ld);
  }
  // The old allocation's devices (etcd's, as the apiserver sends them). What
  // the new allocation no longer has is not acted on: the write may still
  // fail, and a deallocation is given back by ReleaseClaimIfDeallocated.
  std::set<LedgerDevice> before;
  for (const AllocationResult& r : ask.old_results) {
    if (r.admin_access) continue;
    if (std::optional<LedgerDevice> ld = map_->ToLedger(r.device)) before.insert(*ld);
  }
  // A claim being released may keep what it already had (a write that does
  // not change its allocation), but is admitted nothing anew, not even what
  // its holding still has: that holding may be on its way back to Lend.
  const bool releasing = releasing_.count(claim.uid) > 0;

  // Decide every wanted device; collect the Lend (and gang slot) holdings
  // to rebind: (node, job, owner uid) -> owner.
  std::map<std::tuple<std::string, uint32_t, std::string>, Owner> to_rebind;
  bool already_held = false;
  for (const auto& [node, devices] : wanted) {
    std::shared_ptr<const NodeView> view = ledger_->GetNode(node);
    if (!view) {
      return Refuse(kReasonNotLent, absl::StrCat("node ", node, " is not in duet's ledger"));
    }
    bool has_tpu = false;
    for (const LedgerDevice& d : devices) {
      has_tpu = has_tpu || d.kind == DeviceKind::kTpu;
      const DeviceState* ds = FindDevice(*view, d.kind, d.index);
      if (ds == nullptr) {
        return Refuse(kReasonNotLent, absl::StrCat(Describe(d), " is not in duet's ledger"));
      }
      const DeviceHolder h = HolderOf(*ds);
      switch (h.by) {
        case HeldBy::kClaim:
          if (h.owner->pod_uid == claim.uid) {
            if (releasing && !before.count(d)) {
              return Refuse(kReasonReleasing,
                            absl::StrCat(Describe(d), " is being given back by this claim; "
                                         "it is admitted again once lent again"));
            }
            already_held = true;
            break;
          }
          return Refuse(kReasonHeldByOtherClaim,
                        absl::StrCat(Describe(d), " is allocated to ", h.owner->ToString()));
        case HeldBy::kLend: {
          if (releasing) {
            return Refuse(kReasonReleasing,
                          absl::StrCat(Describe(d), ": the claim's devices are being given "
                                       "back; it is admitted nothing until that is done"));
          }
          if (reclaiming_.count(d)) {
            return Refuse(kReasonReclaiming,
                          absl::StrCat(Describe(d), " is being taken back from Kubernetes"));
          }
          to_rebind.emplace(std::make_tuple(node, h.owner->job_id, h.owner->pod_uid), *h.owner);
          break;
        }
        case HeldBy::kGangSlot: {
          auto v = gangs.find(h.owner->pod_uid);
          if (v == gangs.end()) {
            // Not asked before the lock: the slot was made since, or there
            // is no gang fence.
            return Refuse(options_.gang_admit ? kReasonGangWaiting : kReasonNotLent,
                          absl::StrCat(Describe(d), " is reserved for a gang (",
                                       h.owner->ToString(), ")", options_.gang_admit ? "; ask again" : ""));
          }
          if (!v->second.allowed) return v->second;
          if (releasing) {
            return Refuse(kReasonReleasing,
                          absl::StrCat(Describe(d), ": the claim's devices are being given "
                                       "back; it is admitted nothing until that is done"));
          }
          // One slot per node: two would be one Claim{J} owner twice.
          for (const auto& [key, other] : to_rebind) {
            if (std::get<0>(key) == node && std::get<1>(key) == h.owner->job_id &&
                other != *h.owner) {
              return Refuse(kReasonPartialHost,
                            absl::StrCat("node ", node, ": a claim takes one slot of gang job ",
                                         h.owner->job_id, " per node; it asks ",
                                         other.ToString(), " and ", h.owner->ToString()));
            }
          }
          to_rebind.emplace(std::make_tuple(node, h.owner->job_id, h.owner->pod_uid), *h.owner);
          break;
        }
        case HeldBy::kNobody:
          return Refuse(kReasonNotLent,
                        absl::StrCat(Describe(d), " is not lent to Kubernetes (free in duet)"));
        case HeldBy::kOther:
          return Refuse(kReasonNotLent, absl::StrCat(Describe(d), " is not lent to Kubernetes (",
                                                     h.owner->ToString(), " holds it)"));
      }
      touched->push_back(d);
    }
    // TPUs are lent per host: a claim takes every chip or none.
    if (has_tpu) {
      for (const DeviceState& ds : view->devices) {
        if (ds.spec.kind != DeviceKind::kTpu) continue;
        if (!devices.count(LedgerDevice{node, DeviceKind::kTpu, ds.spec.index})) {
          return Refuse(kReasonPartialHost,
                        absl::StrCat("node ", node, ": a claim must take every TPU chip of the "
                                     "host; it leaves out tpu ",
                                     ds.spec.index));
        }
      }
    }
  }
  // A lend job's devices move together: the claim must take all of them.
  for (const auto& [key, lend] : to_rebind) {
    const std::string& node = std::get<0>(key);
    std::optional<Holding> h = ledger_->FindHolding(node, lend);
    if (!h) return Refuse(kReasonNotLent, absl::StrCat(lend.ToString(), " lends nothing now"));
    for (const LedgerDevice& d : DevicesOf(*h)) {
      if (!wanted[node].count(d)) {
        return Refuse(kReasonPartialHost,
                      absl::StrCat(lend.ToString(), " lends its devices together; the claim "
                                   "leaves out ",
                                   DeviceKindName(d.kind), " ", d.index));
      }
    }
  }
  if (ask.dry_run) return AdmissionVerdict{true, "", ""};

  // Record: every Lend holding becomes the claim's.
  for (const auto& [key, lend] : to_rebind) {
    const std::string& node = std::get<0>(key);
    const Owner to = Owner::Claim(lend.job_id, claim.uid, claim.ns, claim.name);
    absl::StatusOr<HoldResult> r = ledger_->Rebind(node, lend, to);
    if (!r.ok()) {
      UndoLocked(*moved);
      moved->clear();
      return Refuse(kReasonNotLent, absl::StrCat("node ", node, ": ", r.status().message()));
    }
    moved->push_back({node, lend, to});
    *seq = r->seq;
  }
  // A retry: what the claim holds may still be on its way to disk.
  if (*seq == 0 && already_held) *seq = ledger_->seq();
  return AdmissionVerdict{true, "", ""};
}

void Lender::UndoLocked(const std::vector<Moved>& moved) {
  for (auto it = moved.rbegin(); it != moved.rend(); ++it) {
    absl::StatusOr<HoldResult> r = ledger_->Rebind(it->node, it->to, it->from);
    if (!r.ok()) {
      spdlog::error("dra: cannot undo {} -> {} on {}: {}", it->from.ToString(),
                    it->to.ToString(), it->node, r.status().ToString());
    }
  }
}

absl::Status Lender::ReleaseClaimIfDeallocated(const std::string& claim_uid) {
  if (claim_uid.empty()) return absl::InvalidArgumentError("claim uid: must be set");
  ClaimRef ref{claim_uid, "", ""};
  {
    absl::MutexLock lock(&mu_);
    bool holds = false;
    for (const Holding& h : ClaimHoldings(claim_uid)) {
      holds = true;
      if (ref.name.empty()) {
        ref.ns = h.owner.pod_namespace;
        ref.name = h.owner.pod_name;
      }
    }
    if (!holds) {
      ForgetClaimAdmissionsLocked(claim_uid);
      return absl::OkStatus();
    }
    if (releasing_.count(claim_uid)) {
      return absl::FailedPreconditionError(
          absl::StrCat("claim uid ", claim_uid, ": already being released"));
    }
    // (1) Flag: Review no longer admits the claim on what it holds.
    releasing_.insert(claim_uid);
    // (2) Its admissions in flight, and the apiserver's writes after them.
    AwaitClaimAdmissionsLocked(claim_uid);
  }
  // (3) The quorum read: which devices the claim still allocates (nullopt:
  // the claim is gone).
  std::optional<std::vector<DraDevice>> allocated;
  absl::Status read;
  if (!ref.ns.empty() && !ref.name.empty()) {
    absl::StatusOr<std::optional<AllocatedClaim>> got = claims_->GetClaim(ref);
    if (!got.ok()) {
      read = got.status();
    } else if (*got) {
      allocated = (*got)->devices;
    }
  } else {
    absl::StatusOr<std::vector<AllocatedClaim>> listed = claims_->ListAllocated();
    if (!listed.ok()) {
      read = listed.status();
    } else {
      for (const AllocatedClaim& c : *listed) {
        if (c.claim.uid == claim_uid) allocated = c.devices;
      }
    }
  }
  // Where each holding goes back to: a gang job's to one of its slots on
  // that node (asked here, outside mu_), a lend job's to its Lend owner.
  std::map<std::pair<std::string, uint32_t>, std::vector<Owner>> slots;
  if (options_.gang_slots && read.ok()) {
    for (const Holding& h : ClaimHoldings(claim_uid)) {
      const auto key = std::make_pair(h.node, h.owner.job_id);
      if (!slots.count(key)) slots[key] = options_.gang_slots(h.owner.job_id, h.node);
    }
  }
  absl::MutexLock lock(&mu_);
  releasing_.erase(claim_uid);
  if (!read.ok()) {
    CountRelease("failed");
    return absl::Status(read.code(), absl::StrCat("claim uid ", claim_uid,
                                                  ": its devices stay held; reading it: ",
                                                  read.message()));
  }
  ForgetClaimAdmissionsLocked(claim_uid);
  absl::Status first;
  bool kept = false;
  bool released = false;
  for (const Holding& h : ClaimHoldings(claim_uid)) {
    if (allocated && !allocated->empty()) {
      // Still allocated (or not known not to be: a device that does not map
      // now): the holding stays.
      bool still = false;
      for (const LedgerDevice& d : DevicesOf(h)) {
        std::optional<DraDevice> dra = map_->ToDra(d);
        still = still || !dra ||
                std::find(allocated->begin(), allocated->end(), *dra) != allocated->end();
      }
      if (still) {
        kept = true;
        continue;
      }
    }
    Owner home = Owner::Lend(h.owner.job_id, h.node);
    auto gang = slots.find(std::make_pair(h.node, h.owner.job_id));
    if (gang != slots.end() && !gang->second.empty()) {
      // A gang's claim: back to a slot of its node that holds nothing.
      const Owner* vacant = nullptr;
      for (const Owner& o : gang->second) {
        if (!ledger_->FindHolding(h.node, o).has_value()) {
          vacant = &o;
          break;
        }
      }
      if (vacant == nullptr) {
        absl::Status s = absl::InternalError(
            absl::StrCat("node ", h.node, ": every slot of gang job ", h.owner.job_id,
                         " there holds already; the claim's devices stay held"));
        spdlog::warn("dra: claim uid {}: {}", claim_uid, s.ToString());
        if (first.ok()) first = s;
        continue;
      }
      home = *vacant;
    }
    absl::Status s = ledger_->Rebind(h.node, h.owner, home).status();
    if (absl::IsFailedPrecondition(s)) {
      // The node is leaving the inventory: nothing to lend back to.
      s = ledger_->Release(h.node, h.owner).status();
    }
    if (!s.ok()) {
      spdlog::warn("dra: claim uid {}: cannot return its devices on {}: {}", claim_uid, h.node,
                   s.ToString());
      if (first.ok()) first = s;
      continue;
    }
    released = true;
  }
  if (kept) {
    CountRelease("kept");
    spdlog::info("dra: claim uid {} still allocates what it holds: kept", claim_uid);
  }
  if (released) CountRelease("released");
  if (!first.ok()) CountRelease("failed");
  return first;
}

// ---------------------------------------------------------------------------
// Lending and reclaiming

absl::StatusOr<std::vector<LedgerDevice>> Lender::Lend(const std::string& node, DeviceKind kind,
                                                       uint32_t count) {
  std::string why;
  if (!Lending(node)) {
    return absl::FailedPreconditionError(absl::StrCat("node ", node, " is not in a lending pool"));
  }
  if (!map_->Lendable(node, &why)) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", node, " is not lendable: ", why.empty() ? "unknown" : why));
  }
  std::vector<uint32_t> jobs;  // GPU: one device per job
  if (kind == DeviceKind::kTpu) {
    std::shared_ptr<const NodeView> view = ledger_->GetNode(node);
    uint32_t chips = 0;
    if (view) {
      for (const DeviceState& d : view->devices) chips += d.spec.kind == DeviceKind::kTpu ? 1 : 0;
    }
    if (chips == 0) return absl::FailedPreconditionError(absl::StrCat("node ", node, " has no TPU"));
    jobs.push_back(chips);
  } else {
    if (count == 0) return absl::InvalidArgumentError("lend: count must be at least 1");
    jobs.assign(count, 1);
  }
  std::vector<LedgerDevice> lent;
  absl::Status failed;
  // The lend jobs, up to kLendJobsInFlight at once: a thread for each but
  // the first of a wave, which runs here; all joined before the next wave.
  // A wave with a failure is the last: what its other jobs lent stays lent,
  // as the jobs before the failure did when they ran one at a time. No lock
  // is held here (CreateLend is thread-safe; the ledger's holdings reach the
  // index through the listener).
  for (size_t begin = 0; begin < jobs.size() && failed.ok(); begin += kLendJobsInFlight) {
    const size_t end = std::min(jobs.size(), begin + kLendJobsInFlight);
    std::vector<absl::StatusOr<Holding>> made(end - begin, absl::UnknownError("not asked"));
    std::vector<std::thread> threads;
    threads.reserve(end - begin - 1);
    for (size_t i = begin + 1; i < end; ++i) {
      threads.emplace_back([this, &node, kind, n = jobs[i], h = &made[i - begin]] {
        *h = lends_->CreateLend(node, kind, n);
      });
    }
    made[0] = lends_->CreateLend(node, kind, jobs[begin]);
    for (std::thread& t : threads) t.join();
    for (absl::StatusOr<Holding>& h : made) {
      if (!h.ok()) {
        if (failed.ok()) failed = h.status();
        continue;
      }
      for (const LedgerDevice& d : DevicesOf(*h)) lent.push_back(d);
    }
  }
  if (lent.empty()) return failed;
  std::sort(lent.begin(), lent.end());  // whichever job answered first
  if (!failed.ok()) {
    spdlog::info("dra: lent {} of {} {} on {}: {}", lent.size(), jobs.size(),
                 DeviceKindName(kind), node, failed.ToString());
  }
  if (lends_total_ != nullptr) lends_total_->Increment(static_cast<double>(lent.size()));
  absl::StatusOr<std::vector<DraDevice>> names = DraNames(lent);
  if (!names.ok()) return names.status();
  absl::Status untainted = rules_->Untaint(*names);
  if (!untainted.ok()) {
    return absl::Status(untainted.code(),
                        absl::StrCat("node ", node, ": devices lent, their rules not deleted yet: ",
                                     untainted.message()));
  }
  return lent;
}

void Lender::AwaitQuietLocked(const std::function<int()>& in_flight,
                              const std::function<absl::Time()>& last) {
  while (true) {
    const int n = in_flight();
    const absl::Time until = std::max(started_at_, last()) + options_.admission_grace;
    if (n == 0 && clock_->Now() >= until) return;
    // Wakes at the deadline (a later admission moves it: look again), or
    // when the admissions in flight are done.
    const absl::Time deadline =
        n == 0 ? until : clock_->Now() + std::max(options_.admission_grace, absl::Milliseconds(10));
    auto done = [n, &in_flight]() { return n > 0 && in_flight() == 0; };
    clock_->AwaitWithDeadline(&mu_, absl::Condition(&done), deadline);
  }
}

void Lender::AwaitAdmissionsLocked(const std::vector<LedgerDevice>& devices) {
  AwaitQuietLocked(
      [this, &devices]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        int n = 0;
        for (const LedgerDevice& d : devices) {
          auto it = admissions_.find(d);
          if (it != admissions_.end()) n += it->second.in_flight;
        }
        return n;
      },
      [this, &devices]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        absl::Time last = absl::InfinitePast();
        for (const LedgerDevice& d : devices) {
          auto it = admissions_.find(d);
          if (it != admissions_.end()) last = std::max(last, it->second.last);
        }
        return last;
      });
}

void Lender::ForgetClaimAdmissionsLocked(const std::string& claim_uid) {
  auto it = claim_admissions_.find(claim_uid);
  if (it != claim_admissions_.end() && it->second.in_flight == 0 &&
      clock_->Now() >= it->second.last + options_.admission_grace) {
    claim_admissions_.erase(it);
  }
}

void Lender::AwaitClaimAdmissionsLocked(const std::string& claim_uid) {
  AwaitQuietLocked(
      [this, &claim_uid]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        auto it = claim_admissions_.find(claim_uid);
        return it == claim_admissions_.end() ? 0 : it->second.in_flight;
      },
      [this, &claim_uid]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        auto it = claim_admissions_.find(claim_uid);
        return it == claim_admissions_.end() ? absl::InfinitePast() : it->second.last;
      });
}

absl::Status Lender::Reclaim(const LedgerDevice& device) {
  // (1) Flag every device of its lend job, so Review refuses them.
  Owner lend;
  std::vector<LedgerDevice> devices;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<const NodeView> view = ledger_->GetNode(device.node);
    const DeviceState* ds = view ? FindDevice(*view, device.kind, device.index) : nullptr;
    if (ds == nullptr) return absl::NotFoundError(absl::StrCat(Describe(device), " is unknown"));
    const DeviceHolder h = HolderOf(*ds);
    if (h.by != HeldBy::kLend) {
      return absl::FailedPreconditionError(
          absl::StrCat(Describe(device), " is not lent and free"));
    }
    lend = *h.owner;
    std::optional<Holding> holding = ledger_->FindHolding(device.node, lend);
    if (!holding) return absl::FailedPreconditionError(absl::StrCat(Describe(device), " is not lent"));
    devices = DevicesOf(*holding);
    for (const LedgerDevice& d : devices) {
      if (reclaiming_.count(d)) {
        return absl::FailedPreconditionError(
            absl::StrCat(Describe(d), " is already being reclaimed"));
      }
    }
    reclaiming_.insert(devices.begin(), devices.end());
  }
  MarkDirty(device.node);
  std::vector<DraDevice> names;
  auto abort = [&](absl::Status why) {
    {
      absl::MutexLock lock(&mu_);
      for (const LedgerDevice& d : devices) reclaiming_.erase(d);
    }
    MarkDirty(device.node);
    if (!names.empty()) {
      absl::Status u = rules_->Untaint(names);
      if (!u.ok()) {
        spdlog::warn("dra: reclaim of {} aborted; its rules stay until the next resync: {}",
                     lend.ToString(), u.ToString());
      }
    }
    CountReclaim("aborted");
    spdlog::info("dra: reclaim of {} aborted: {}", lend.ToString(), why.ToString());
    return why;
  };
  // (2) Taint.
  absl::StatusOr<std::vector<DraDevice>> dra = DraNames(devices);
  if (!dra.ok()) return abort(dra.status());
  names = *dra;
  if (absl::Status s = rules_->Taint(names); !s.ok()) return abort(s);
  // (3) Admissions in flight.
  {
    absl::MutexLock lock(&mu_);
    AwaitAdmissionsLocked(devices);
  }
  // (4) The quorum LIST shows nobody.
  absl::StatusOr<std::vector<AllocatedClaim>> listed = claims_->ListAllocated();
  if (!listed.ok()) return abort(listed.status());
  for (const AllocatedClaim& c : *listed) {
    for (const DraDevice& d : c.devices) {
      if (std::find(names.begin(), names.end(), d) != names.end()) {
        return abort(absl::FailedPreconditionError(
            absl::StrCat(d.ToString(), " is allocated to claim ", c.claim.ns, "/", c.claim.name,
                         " (uid ", c.claim.uid, ")")));
      }
    }
  }
  // (5) Cancel the lend job.
  if (absl::Status s = lends_->CancelLend(device.node, lend.job_id); !s.ok()) return abort(s);
  {
    absl::MutexLock lock(&mu_);
    for (const LedgerDevice& d : devices) {
      reclaiming_.erase(d);
      idle_since_.erase(d);
    }
  }
  MarkDirty(device.node);
  CountReclaim("done");
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Warm buffer and rules

absl::Status Lender::Tick() {
  absl::MutexLock tick(&tick_mu_);
  // The pools of the nodes whose spec changed since the last pass (every
  // node on the first).
  std::set<std::string> respec;
  {
    absl::MutexLock lock(&index_mu_);
    respec.swap(respec_);
  }
  for (const std::string& node : respec) {
    auto it = pool_of_node_.find(node);
    if (it != pool_of_node_.end()) {
      if (!it->second.empty() && --pool_nodes_[it->second] == 0) pool_nodes_.erase(it->second);
      pool_of_node_.erase(it);
    }
    if (ledger_->GetNode(node) == nullptr) continue;
    std::string pool = options_.pool_of ? options_.pool_of(node) : "";
    if (!pool.empty()) ++pool_nodes_[pool];
    pool_of_node_.emplace(node, std::move(pool));
  }
  // Only the nodes with lent devices: what is lent, free and idle.
  std::vector<std::string> names;
  {
    absl::MutexLock lock(&index_mu_);
    names.assign(lent_nodes_.begin(), lent_nodes_.end());
  }
  const std::vector<std::shared_ptr<const NodeView>> views = ledger_->GetNodes(names);
  const absl::Time now = clock_->Now();
  struct Pool {
    uint32_t lent_free = 0;
    // Lend holdings lent and free: (idle since, device, chips).
    std::vector<std::tuple<absl::Time, LedgerDevice, uint32_t>> idle;
  };
  std::map<std::string, Pool> pools;
  for (const auto& [pool, count] : pool_nodes_) pools[pool];
  uint32_t lent_total = 0;
  {
    absl::MutexLock lock(&mu_);
    std::map<LedgerDevice, absl::Time> idle_since;
    for (const auto& view : views) {
      if (view == nullptr) continue;
      const std::string& node = view->spec.name;
      if (!Lending(node) || !map_->Lendable(node, nullptr)) continue;
      Pool& pool = pools[options_.pool_of(node)];
      std::map<uint32_t, std::vector<LedgerDevice>> by_job;  // lent, free, unflagged
      for (const DeviceState& d : view->devices) {
        const DeviceHolder h = HolderOf(d);
        if (h.by == HeldBy::kLend || h.by == HeldBy::kClaim) ++lent_total;
        if (h.by != HeldBy::kLend) continue;
        const LedgerDevice ld{node, d.spec.kind, d.spec.index};
        if (reclaiming_.count(ld)) continue;
        auto it = idle_since_.find(ld);
        idle_since[ld] = it == idle_since_.end() ? now : it->second;
        by_job[h.owner->job_id].push_back(ld);
      }
      for (const auto& [job, devices] : by_job) {
        pool.lent_free += static_cast<uint32_t>(devices.size());
        absl::Time since = now;
        for (const LedgerDevice& d : devices) since = std::min(since, idle_since[d]);
        pool.idle.emplace_back(since, devices.front(), static_cast<uint32_t>(devices.size()));
      }
    }
    idle_since_.swap(idle_since);
  }
  if (lent_gauge_ != nullptr) lent_gauge_->Set(lent_total);

  absl::Status first;
  auto note = [&first](const absl::Status& s) {
    if (!s.ok() && first.ok()) first = s;
  };
  for (auto& [name, pool] : pools) {
    // Below the buffer: lend on the nodes with the most free devices first.
    if (pool.lent_free < options_.warm_buffer) pool.lent_free = FillPool(name, pool.lent_free, note);
    // Above it: the longest idle first, once idle for reclaim_after.
    std::sort(pool.idle.begin(), pool.idle.end());
    for (const auto& [since, device, chips] : pool.idle) {
      if (pool.lent_free < options_.warm_buffer + chips) break;
      if (now - since < options_.reclaim_after) break;
      absl::Status s = Reclaim(device);
      note(s);
      if (s.ok()) pool.lent_free -= chips;
    }
  }
  return first;
}

uint32_t Lender::FillPool(const std::string& pool, uint32_t lent_free,
                          const std::function<void(const absl::Status&)>& note) {
  // The room index, walked in order a step at a time (a Lend changes it:
  // the walk resumes after the last key it looked at, and never tries a
  // node and kind twice).
  std::set<std::pair<std::string, int>> tried;
  std::optional<RoomKey> after;
  while (lent_free < options_.warm_buffer) {
    std::optional<RoomKey> next;
    {
      absl::MutexLock lock(&index_mu_);
      for (auto it = after ? room_.upper_bound(*after) : room_.begin(); it != room_.end(); ++it) {
        const std::string& node = std::get<1>(*it);
        auto p = pool_of_node_.find(node);
        if (p == pool_of_node_.end() || p->second != pool) continue;
        if (tried.count({node, std::get<2>(*it)})) continue;
        next = *it;
        break;
      }
    }
    if (!next) break;
    after = next;
    const auto& [neg_free, node, kind_rank] = *next;
    tried.insert({node, kind_rank});
    if (!map_->Lendable(node, nullptr)) continue;
    const uint32_t free = UINT32_MAX - neg_free;
    const DeviceKind kind = kind_rank == 0 ? DeviceKind::kGpu : DeviceKind::kTpu;
    if (kind == DeviceKind::kTpu) {
      // A host of a multi-host TPU slice goes to Kubernetes only with its
      // whole slice, to a gang (docs/gangs.md 6): never kept lent for any
      // claim.
      std::shared_ptr<const NodeView> view = ledger_->GetNode(node);
      if (view == nullptr || placement::TpuSliceOf(*view).has_value()) continue;
    }
    const uint32_t want =
        kind == DeviceKind::kTpu ? free : std::min(free, options_.warm_buffer - lent_free);
    absl::StatusOr<std::vector<LedgerDevice>> lent = Lend(node, kind, want);
    note(lent.status());
    if (lent.ok()) lent_free += static_cast<uint32_t>(lent->size());
  }
  return lent_free;
}

void Lender::AppendTaintedLocked(const NodeView& view, std::vector<DraDevice>* out) const {
  const std::string& node = view.spec.name;
  for (const DeviceState& d : view.devices) {
    const LedgerDevice ld{node, d.spec.kind, d.spec.index};
    const DeviceHolder h = HolderOf(d);
    if (h.by == HeldBy::kClaim) continue;
    if (h.by == HeldBy::kLend && !reclaiming_.count(ld)) continue;
    // A gang's slot is lent to the gang (the webhook fences it).
    if (h.by == HeldBy::kGangSlot && options_.gang_admit) continue;
    std::optional<DraDevice> dra = map_->ToDra(ld);
    if (dra) out->push_back(*std::move(dra));
  }
}

std::vector<DraDevice> Lender::DesiredTainted() const {
  const LedgerSnapshot snap = ledger_->Snapshot();
  std::vector<DraDevice> out;
  absl::MutexLock lock(&mu_);
  for (const auto& view : snap.nodes) {
    const std::string& node = view->spec.name;
    if (!Lending(node) || !map_->Lendable(node, nullptr)) continue;
    AppendTaintedLocked(*view, &out);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void Lender::MarkDirty(const std::string& node) {
  absl::MutexLock lock(&index_mu_);
  dirty_.insert(node);
}

void Lender::MarkRulesDirty(const std::vector<std::string>& nodes) {
  absl::MutexLock lock(&index_mu_);
  dirty_.insert(nodes.begin(), nodes.end());
}

void Lender::OnRuleDrift(const DraDevice& device) {
  // The device's node; a rule for a device that maps to none is looked for
  // under its pool's name (the node, for the NVIDIA and TPU drivers).
  std::optional<LedgerDevice> ld = map_->ToLedger(device);
  const std::string node = ld ? ld->node : device.pool;
  absl::MutexLock lock(&index_mu_);
  if (node.empty()) {
    full_due_ = true;  // a rule selecting no pool: only a full pass removes it
  } else {
    dirty_.insert(node);
  }
}

void Lender::OnRulesRelisted() {
  absl::MutexLock lock(&index_mu_);
  full_due_ = true;
}

RuleSyncStats Lender::rule_stats() const {
  absl::MutexLock lock(&index_mu_);
  return rule_stats_;
}

std::vector<std::string> Lender::DirtyNodes() const {
  absl::MutexLock lock(&index_mu_);
  return std::vector<std::string>(dirty_.begin(), dirty_.end());
}

absl::Status Lender::FullResyncLocked() {
  {
    absl::MutexLock lock(&index_mu_);
    dirty_.clear();
    full_due_ = false;
    ++rule_stats_.full;
  }
  absl::Status s = rules_->Resync(DesiredTainted());
  if (!s.ok()) {
    absl::MutexLock lock(&index_mu_);
    full_due_ = true;
  }
  return s;
}

absl::Status Lender::Resync() {
  absl::MutexLock lock(&rules_mu_);
  return FullResyncLocked();
}

absl::Status Lender::ReconcileNode(const std::string& node) {
  std::vector<DraDevice> tainted;
  std::shared_ptr<const NodeView> view = ledger_->GetNode(node);
  if (view && Lending(node) && map_->Lendable(node, nullptr)) {
    absl::MutexLock lock(&mu_);
    AppendTaintedLocked(*view, &tainted);
  }
  // The pools this node's rules can be in.
  std::set<std::string> pools{node};
  for (const DraDevice& d : map_->NodeDevices(node)) pools.insert(d.pool);
  for (const DraDevice& d : tainted) pools.insert(d.pool);
  for (const std::string& pool : pools) {
    std::vector<DraDevice> mine;
    for (const DraDevice& d : tainted) {
      if (d.pool == pool) mine.push_back(d);
    }
    if (absl::Status s = rules_->ResyncPool(pool, mine); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Lender::ReconcileRules() {
  absl::MutexLock pass(&rules_mu_);
  bool full = false;
  std::set<std::string> dirty;
  {
    absl::MutexLock lock(&index_mu_);
    full = full_due_;
    if (!full) {
      if (dirty_.empty()) return absl::OkStatus();
      dirty.swap(dirty_);
      ++rule_stats_.incremental;
      rule_stats_.nodes += dirty.size();
    }
  }
  if (full) return FullResyncLocked();
  absl::Status first;
  std::vector<std::string> failed;
  for (const std::string& node : dirty) {
    absl::Status s = ReconcileNode(node);
    if (s.ok()) continue;
    failed.push_back(node);
    if (first.ok()) first = absl::Status(s.code(), absl::StrCat("node ", node, ": ", s.message()));
  }
  if (!failed.empty()) MarkRulesDirty(failed);
  return first;
}

}  // namespace dra
}  // namespace duet
