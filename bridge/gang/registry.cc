#include "bridge/gang/registry.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "bridge/gang/slice.h"
#include "bridge/placement/tpu_slice.h"
#include "common/enum_name.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace gang {

const char* GangStateName(GangState state) {
  static constexpr const char* kNames[] = {nullptr, "gathering", "complete"};
  return EnumName(state, kNames);
}

const char* ReleaseReasonName(ReleaseReason reason) {
  static constexpr const char* kNames[] = {"member-deleted", "reserve-timeout", "idle"};
  return EnumName(reason, kNames);
}

std::string SlotUid(const GangKey& key, uint32_t slot) {
  return absl::StrCat(kGangSlotPrefix, key.ToString(), "#", slot);
}

absl::StatusOr<std::pair<GangKey, uint32_t>> ParseSlotUid(const std::string& uid) {
  const size_t hash = uid.rfind('#');
  uint32_t slot = 0;
  if (!absl::StartsWith(uid, kGangSlotPrefix) || hash == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(uid).substr(hash + 1), &slot)) {
    return absl::InvalidArgumentError(absl::StrCat("\"", uid, "\" is not a gang slot (gang:KEY#SLOT)"));
  }
  const size_t start = sizeof(kGangSlotPrefix) - 1;
  absl::StatusOr<GangKey> key = GangKey::Parse(uid.substr(start, hash - start));
  if (!key.ok()) return key.status();
  return std::make_pair(*std::move(key), slot);
}

bool SameMemberRequest(const placement::PodRequest& a, const placement::PodRequest& b) {
  return a.kind == b.kind && a.count == b.count && a.milli == b.milli && a.models == b.models &&
         a.cpu_milli == b.cpu_milli && a.memory_mib == b.memory_mib;
}

namespace {

std::string RequestText(const placement::PodRequest& r) {
  std::string out = absl::StrCat(r.count, " ", DeviceKindName(r.kind));
  if (r.milli != kWholeDevice) absl::StrAppend(&out, " x ", r.milli, "m");
  absl::StrAppend(&out, ", ", r.cpu_milli, "m cpu, ", r.memory_mib, " MiB");
  if (!r.models.empty()) absl::StrAppend(&out, ", models ", absl::StrJoin(r.models, "|"));
  return out;
}

// `member` times k: what k members ask of one node together.
placement::PodRequest Times(const placement::PodRequest& member, uint32_t k) {
  placement::PodRequest r = member;
  r.count = member.count * k;
  r.cpu_milli = member.cpu_milli * k;
  r.memory_mib = member.memory_mib * k;
  return r;
}

}  // namespace

GangRegistry::GangRegistry(Ledger* ledger, GangMaker* maker, GangRegistryOptions options)
    : ledger_(ledger), maker_(maker), options_(std::move(options)) {}

std::vector<placement::GangCandidate> GangRegistry::Candidates(const placement::PodRequest& member,
                                                               uint32_t members) const {
  std::vector<placement::GangCandidate> out;
  // In the ledger's order, not by name: the planner's choice does not depend
  // on the candidates' order (PickGangNodes ranks them itself, ties broken by
  // a stable hash of the name, then the name), and the sort by name was a
  // third of this scan at 5,000 nodes.
  for (const std::shared_ptr<const NodeView>& view : ledger_->UnorderedViews()) {
    if (view->spec.state != NodeState::kReady) continue;
    if (promised_.contains(view->spec.name)) continue;  // another reservation's, in flight
    if (options_.node_filter && !options_.node_filter(view->spec.name)) continue;
    if (options_.unusable && !options_.unusable(view->spec.name).empty()) continue;
    // A multi-host slice's hosts go to a gang that selects the slice, whole.
    if (member.kind == DeviceKind::kTpu && placement::TpuSliceOf(*view).has_value()) continue;
    // Too few free devices for one member: no fit check (most nodes of a
    // busy pool end here, before the load and fit are worked out).
    uint64_t free_milli = 0;
    for (const DeviceState& d : view->devices) {
      if (d.spec.kind == member.kind) free_milli += d.free_milli();
    }
    if (free_milli < member.device_milli()) continue;
    const placement::NodeLoad load = options_.load ? options_.load(*view) : placement::NodeLoad{};
    uint32_t fits = 0;
    while (fits < members && placement::Fits(*view, load, Times(member, fits + 1))) ++fits;
    if (fits == 0) continue;
    placement::GangCandidate c;
    c.node = view->spec.name;
    c.pool = view->spec.pool;
    if (options_.topology) c.topology = options_.topology(*view);
    c.fits = fits;
    c.free_milli = free_milli;
    c.member_milli = member.device_milli();
    out.push_back(std::move(c));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<GangRegistry::Gang>> GangRegistry::Reserve(const GangSpec& spec) {
  const uint32_t n = spec.min_member;
  std::string why;
  std::optional<placement::GangPick> pick;
  absl::Status no_pick;
  for (;;) {
    why.clear();
    no_pick = absl::OkStatus();
    if (!spec.tpu_topology.empty()) {
      // A multi-host TPU slice: every host of one slice pool (slice.h). A
      // host another reservation has promised is not usable meanwhile, nor
      // one outside this registry's nodes (node_filter: the extender's
      // registry never takes a slice of a lending pool, and the other way
      // round).
      const absl::flat_hash_set<std::string> promised = promised_;
      auto unusable = [this, &promised](const std::string& node) {
        if (options_.node_filter && !options_.node_filter(node)) {
          return std::string("not one of the nodes this gang registry places on");
        }
        if (promised.contains(node)) return std::string("another gang is being reserved on it");
        return options_.unusable ? options_.unusable(node) : std::string();
      };
      pick = PickGangSlice(ledger_->Snapshot(), spec, options_.load, unusable, &why);
    } else {
      const std::vector<placement::GangCandidate> candidates = Candidates(spec.member, n);
      if (candidates.empty()) {
        no_pick = absl::ResourceExhaustedError(
            absl::StrCat("no node has room for one member (", RequestText(spec.member), ")"));
      } else {
        pick = options_.planner(candidates, n, &why);
      }
    }
    if (no_pick.ok() && !pick.has_value()) {
      no_pick = absl::ResourceExhaustedError(
          why.empty() ? absl::StrCat("no nodes of one pool hold ", n, " members of ",
                                     RequestText(spec.member), " evenly")
                      : why);
    }
    if (no_pick.ok() || promised_.empty()) break;
    // No room while other reservations are in flight: their nodes were left
    // out, and a failed one gives them back. Decide as if the reservations
    // ran one after another: wait until none is in flight, then look again.
    mu_.Await(absl::Condition(
        +[](absl::flat_hash_set<std::string>* p) { return p->empty(); }, &promised_));
  }
  if (!no_pick.ok()) return no_pick;
  if (pick->per_node == 0 || pick->nodes.size() * pick->per_node != n) {
    return absl::InternalError(absl::StrCat("the planner picked ", pick->nodes.size(), " nodes x ",
                                            pick->per_node, " for ", n, " members"));
  }
  // Slot s is on the (s / per_node)-th node by name: Recover relies on it.
  std::vector<std::string> nodes = pick->nodes;
  std::sort(nodes.begin(), nodes.end());
  std::vector<GangNode> gang_nodes;
  for (const std::string& node : nodes) gang_nodes.push_back({node, pick->per_node});

  // The Slurm call and the wait for durability run without mu_, so other
  // gangs' filters do not wait for them. Meanwhile the gang is reserving
  // (its members' Admit waits for it) and its nodes are promised (no other
  // reservation picks them); both end under mu_ below, whatever happened.
  reserving_.insert(spec.key);
  for (const std::string& node : nodes) promised_.insert(node);
  mu_.Unlock();
  absl::StatusOr<GangAllocation> alloc = maker_->Create(spec.key, spec, gang_nodes);
  absl::Status failed;
  if (!alloc.ok()) {
    failed = alloc.status();
  } else if (alloc->slots.size() != n) {
    absl::Status c = maker_->Cancel(spec.key, alloc->job_id);
    failed = absl::InternalError(absl::StrCat("Slurm job ", alloc->job_id, " came with ",
                                              alloc->slots.size(), " slots for ", n, " members",
                                              c.ok() ? "" : absl::StrCat("; cancel: ", c.message())));
  } else if (options_.wait_durable) {
    absl::Status d = options_.wait_durable(alloc->seq);
    if (!d.ok()) {
      absl::Status c = maker_->Cancel(spec.key, alloc->job_id);
      failed = absl::UnavailableError(absl::StrCat(
          "the reservation could not be made durable: ", d.message(),
          c.ok() ? "" : absl::StrCat("; cancel: ", c.message())));
    }
  }
  mu_.Lock();
  reserving_.erase(spec.key);
  for (const std::string& node : nodes) promised_.erase(node);
  if (!failed.ok()) return failed;
  auto gang = std::make_unique<Gang>();
  gang->key = spec.key;
  gang->spec = spec;
  gang->job_id = alloc->job_id;
  gang->reserved_at = options_.clock->Now();
  for (uint32_t s = 0; s < n; ++s) {
    Slot slot;
    slot.node = alloc->slots[s].node;
    slot.owner = alloc->slots[s].owner;
    gang->slots.push_back(std::move(slot));
  }
  ++reservations_;
  spdlog::info("gang {}: reserved {} members on {} (Slurm job {}, {} per node)",
               spec.key.ToString(), n, absl::StrJoin(nodes, ","), alloc->job_id, pick->per_node);
  return gang;
}

Admission GangRegistry::Take(Gang* gang, const MemberRef& member, Pending* pending) {
  Admission a;
  const uint32_t n = static_cast<uint32_t>(gang->slots.size());
  int found = -1;
  for (uint32_t s = 0; s < n; ++s) {
    if (gang->slots[s].member.uid == member.uid) found = static_cast<int>(s);
  }
  if (found < 0) {
    for (uint32_t s = 0; s < n && found < 0; ++s) {
      if (gang->slots[s].member.uid.empty()) found = static_cast<int>(s);
    }
    if (found < 0) {
      a.kind = Admission::kRefused;
      a.reason = absl::StrCat("GANG_FULL: all ", n, " slots of gang ", gang->key.ToString(),
                              " have members");
      return a;
    }
    gang->slots[found].member = member;
    member_gang_[member.uid] = gang->key;
    gang->idle_since = absl::InfinitePast();
  } else if (gang->slots[found].member.name.empty()) {
    gang->slots[found].member = member;  // recovered: only the uid was known
  }
  uint32_t members = 0;
  for (const Slot& s : gang->slots) members += s.member.uid.empty() ? 0 : 1;
  if (gang->state == GangState::kGathering && members == n) {
    gang->state = GangState::kComplete;
    std::vector<std::pair<MemberRef, std::string>> all;
    for (const Slot& s : gang->slots) all.emplace_back(s.member, s.node);
    pending->complete.emplace(gang->key, std::move(all));
    spdlog::info("gang {}: complete ({} members)", gang->key.ToString(), n);
  }
  a.slot = static_cast<uint32_t>(found);
  if (gang->state == GangState::kComplete) {
    a.kind = Admission::kReady;
    a.node = gang->slots[found].node;
  } else {
    a.kind = Admission::kWaiting;
    a.reason = absl::StrCat("GANG_WAITING: ", members, "/", n, " members (gang ",
                            gang->key.ToString(), ")");
  }
  return a;
}

Admission GangRegistry::Admit(const GangSpec& spec, const MemberRef& member) {
  Pending pending;
  Admission a;
  {
    absl::MutexLock lock(&mu_);
    // A gang being reserved (its Slurm call runs without mu_): its members
    // wait for the outcome, so that the gang is reserved once.
    struct NotReserving {
      const absl::flat_hash_set<GangKey>* reserving;
      const GangKey* key;
      bool operator()() const { return !reserving->contains(*key); }
    } not_reserving{&reserving_, &spec.key};
    mu_.Await(absl::Condition(&not_reserving));
    Gang* gang = nullptr;
    auto known = member_gang_.find(member.uid);
    if (known != member_gang_.end()) {
      gang = gangs_.at(known->second).get();
    } else if (auto it = gangs_.find(spec.key); it != gangs_.end()) {
      gang = it->second.get();
    } else if (spec.min_member == 0 || spec.member.count == 0) {
      a.kind = Admission::kRefused;
      a.reason = absl::StrCat("GANG_INVALID: gang ", spec.key.ToString(), " has ",
                              spec.min_member, " members asking ", spec.member.count, " devices");
      return a;
    } else {
      absl::StatusOr<std::unique_ptr<Gang>> g = Reserve(spec);
      if (!g.ok()) {
        ++unplaceable_;
        a.kind = g.status().code() == absl::StatusCode::kResourceExhausted ? Admission::kNoRoom
                                                                         : Admission::kRefused;
        a.reason = absl::StrCat(a.kind == Admission::kNoRoom ? "GANG_NO_ROOM: " : "GANG_NOT_RESERVED: ",
                                "gang ", spec.key.ToString(), " of ", spec.min_member,
                                " members: ", g.status().message());
        pending.events.push_back(
            {spec.key, "Warning", "DuetGangUnplaceable", absl::StrCat("duet: ", a.reason), {member}});
        gang = nullptr;
      } else {
        gang = g->get();
        gangs_.emplace(spec.key, *std::move(g));
      }
    }
    if (gang != nullptr) {
      const uint32_t n = static_cast<uint32_t>(gang->slots.size());
      if (spec.key != gang->key || spec.min_member != n) {
        a.kind = Admission::kMismatch;
        a.reason = absl::StrCat("GANG_MEMBER_MISMATCH: gang ", gang->key.ToString(), " has ", n,
                                " members; this pod says gang ", spec.key.ToString(), " of ",
                                spec.min_member);
      } else if (gang->member_known && !SameMemberRequest(gang->spec.member, spec.member)) {
        a.kind = Admission::kMismatch;
        a.reason = absl::StrCat("GANG_MEMBER_MISMATCH: the members of gang ", gang->key.ToString(),
                                " ask ", RequestText(gang->spec.member), "; this pod asks ",
                                RequestText(spec.member));
      } else if (!gang->member_known && (gang->spec.member.kind != spec.member.kind ||
                                         gang->spec.member.count != spec.member.count)) {
        a.kind = Admission::kMismatch;
        a.reason = absl::StrCat("GANG_MEMBER_MISMATCH: the slots of gang ", gang->key.ToString(),
                                " hold ", RequestText(gang->spec.member), "; this pod asks ",
                                RequestText(spec.member));
      } else {
        if (!gang->member_known) {
          gang->spec.member = spec.member;
          gang->spec.tpu_topology = spec.tpu_topology;
          gang->spec.tpu_accelerator = spec.tpu_accelerator;
          gang->member_known = true;
        }
        a = Take(gang, member, &pending);
      }
      if (a.kind == Admission::kMismatch) {
        pending.events.push_back(
            {gang->key, "Warning", "DuetGangMemberMismatch", absl::StrCat("duet: ", a.reason), {member}});
      }
    }
  }
  Run(std::move(pending));
  return a;
}

std::optional<std::string> GangRegistry::NodeOf(const std::string& uid) const {
  absl::MutexLock lock(&mu_);
  auto known = member_gang_.find(uid);
  if (known == member_gang_.end()) return std::nullopt;
  const Gang& gang = *gangs_.at(known->second);
  if (gang.state != GangState::kComplete) return std::nullopt;
  for (const Slot& s : gang.slots) {
    if (s.member.uid == uid) return s.node;
  }
  return std::nullopt;
}

GangRegistry::Gang* GangRegistry::GangOfMember(const std::string& uid, Slot** slot) {
  auto known = member_gang_.find(uid);
  if (known == member_gang_.end()) return nullptr;
  Gang* gang = gangs_.at(known->second).get();
  for (Slot& s : gang->slots) {
    if (s.member.uid == uid) *slot = &s;
  }
  return gang;
}

absl::StatusOr<MemberBind> GangRegistry::BindMember(const std::string& uid, const std::string& node) {
  absl::MutexLock lock(&mu_);
  Slot* slot = nullptr;
  Gang* gang = GangOfMember(uid, &slot);
  if (gang == nullptr || slot == nullptr) {
    return absl::NotFoundError(absl::StrCat("pod uid ", uid, " is no member of a reserved gang"));
  }
  if (gang->state != GangState::kComplete) {
    return absl::FailedPreconditionError(
        absl::StrCat("gang ", gang->key.ToString(), " is not complete"));
  }
  if (slot->node != node) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the member's slot of gang ", gang->key.ToString(), " is on node ", slot->node));
  }
  const Owner placeholder = Owner::Placeholder(gang->job_id, uid);
  MemberBind out;
  if (slot->bound) {
    std::optional<Holding> h = ledger_->FindHolding(node, placeholder);
    if (h.has_value()) {
      out.holding = *std::move(h);
      out.seq = ledger_->seq();
      return out;
    }
    slot->bound = false;  // gone under us; take the slot again below
  }
  absl::StatusOr<HoldResult> r = ledger_->Rebind(node, slot->owner, placeholder);
  if (!r.ok()) return r.status();
  slot->bound = true;
  out.holding = r->holding;
  out.created = true;
  out.seq = r->seq;
  return out;
}

absl::Status GangRegistry::ReturnToSlot(Gang* gang, Slot* slot) {
  if (!slot->bound) return absl::OkStatus();
  const Owner placeholder = Owner::Placeholder(gang->job_id, slot->member.uid);
  absl::StatusOr<HoldResult> r = ledger_->Rebind(slot->node, placeholder, slot->owner);
  if (!r.ok() && !(r.status().code() == absl::StatusCode::kNotFound &&
                   ledger_->FindHolding(slot->node, slot->owner).has_value())) {
    return r.status();
  }
  slot->bound = false;
  return absl::OkStatus();
}

absl::Status GangRegistry::UnbindMember(const std::string& uid) {
  absl::MutexLock lock(&mu_);
  Slot* slot = nullptr;
  Gang* gang = GangOfMember(uid, &slot);
  if (gang == nullptr || slot == nullptr) return absl::OkStatus();
  return ReturnToSlot(gang, slot);
}

absl::StatusOr<bool> GangRegistry::OnMemberGone(const std::string& uid) {
  Pending pending;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    Slot* slot = nullptr;
    Gang* gang = GangOfMember(uid, &slot);
    if (gang == nullptr || slot == nullptr) return false;
    if (gang->state == GangState::kGathering) {
      const std::string who = slot->member.name.empty()
                                  ? absl::StrCat("uid ", uid)
                                  : absl::StrCat(slot->member.ns, "/", slot->member.name);
      status = Release(gang->key, ReleaseReason::kMemberDeleted,
                       absl::StrCat("member ", who, " was deleted before the gang was complete"),
                       &pending);
    } else {
      status = ReturnToSlot(gang, slot);
      if (status.ok()) {
        slot->member = MemberRef{};
        member_gang_.erase(uid);
        bool any = false;
        for (const Slot& s : gang->slots) any = any || !s.member.uid.empty();
        if (!any) gang->idle_since = options_.clock->Now();
      }
    }
  }
  Run(std::move(pending));
  if (!status.ok()) return status;
  return true;
}

bool GangRegistry::IsGangJob(uint32_t job_id) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [key, gang] : gangs_) {
    if (gang->job_id == job_id) return true;
  }
  return false;
}

absl::Status GangRegistry::Release(const GangKey& key, ReleaseReason reason, const std::string& why,
                                   Pending* pending) {
  auto it = gangs_.find(key);
  if (it == gangs_.end()) return absl::OkStatus();
  Gang& gang = *it->second;
  absl::Status c = maker_->Cancel(key, gang.job_id);
  if (!c.ok()) {
    spdlog::warn("gang {}: release ({}) failed, kept: {}", key.ToString(), ReleaseReasonName(reason),
                 c.ToString());
    return c;
  }
  GangEvent e{key, "Normal", "DuetGangReleased",
              absl::StrCat("duet released gang ", key.ToString(), " (Slurm job ", gang.job_id,
                           ", ", gang.slots.size(), " slots): ", why),
              {}};
  for (const Slot& s : gang.slots) {
    if (s.member.uid.empty()) continue;
    member_gang_.erase(s.member.uid);
    if (!s.member.name.empty()) e.members.push_back(s.member);
  }
  ++releases_[static_cast<int>(reason)];
  spdlog::info("gang {}: released ({}): {}", key.ToString(), ReleaseReasonName(reason), why);
  gangs_.erase(it);
  pending->events.push_back(std::move(e));
  return absl::OkStatus();
}

void GangRegistry::Tick() {
  // Ask about gathering members without the lock (the answer may be an API
  // call).
  std::vector<MemberRef> ask;
  if (options_.member_exists) {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, gang] : gangs_) {
      if (gang->state != GangState::kGathering) continue;
      for (const Slot& s : gang->slots) {
        if (!s.member.uid.empty()) ask.push_back(s.member);
      }
    }
  }
  for (const MemberRef& m : ask) {
    absl::StatusOr<bool> exists = options_.member_exists(m);
    if (exists.ok() && !*exists) {
      absl::StatusOr<bool> gone = OnMemberGone(m.uid);
      if (!gone.ok()) spdlog::warn("gang member {}/{}: {}", m.ns, m.name, gone.status().ToString());
    }
  }
  Pending pending;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = options_.clock->Now();
    std::vector<std::pair<GangKey, ReleaseReason>> due;
    if (options_.in_use) {
      // The lending mode: a complete gang is idle while no claim holds any
      // of its devices.
      for (const auto& [key, gang] : gangs_) {
        if (gang->state != GangState::kComplete) continue;
        std::vector<std::string> nodes;
        for (const Slot& s : gang->slots) {
          if (nodes.empty() || nodes.back() != s.node) nodes.push_back(s.node);
        }
        if (options_.in_use(gang->job_id, nodes)) {
          gang->idle_since = absl::InfinitePast();
        } else if (gang->idle_since == absl::InfinitePast()) {
          gang->idle_since = now;
        }
      }
    }
    for (const auto& [key, gang] : gangs_) {
      if (gang->state == GangState::kGathering && now - gang->reserved_at >= options_.reserve_timeout) {
        due.emplace_back(key, ReleaseReason::kReserveTimeout);
      } else if (gang->state == GangState::kComplete && gang->idle_since != absl::InfinitePast() &&
                 now - gang->idle_since >= options_.idle_release) {
        due.emplace_back(key, ReleaseReason::kIdle);
      }
    }
    for (const auto& [key, reason] : due) {
      Gang& gang = *gangs_.at(key);
      uint32_t members = 0;
      for (const Slot& s : gang.slots) members += s.member.uid.empty() ? 0 : 1;
      const std::string why =
          reason == ReleaseReason::kReserveTimeout
              ? absl::StrCat("only ", members, "/", gang.slots.size(), " members arrived within ",
                             absl::FormatDuration(options_.reserve_timeout), " (gang.reserve_timeout)")
              : absl::StrCat("no member for ", absl::FormatDuration(options_.idle_release),
                             " (gang.idle_release)");
      (void)Release(key, reason, why, &pending);  // logged; the next Tick tries again
    }
  }
  Run(std::move(pending));
}

absl::StatusOr<size_t> GangRegistry::Recover() {
  struct Found {
    std::optional<GangKey> key;
    std::map<uint32_t, Holding> slots;
    std::vector<Holding> members;  // Placeholder{J, member uid}
    std::vector<Holding> claims;   // Claim{J, claim uid} (with in_use)
  };
  std::map<uint32_t, Found> jobs;
  std::vector<Holding> placeholders;
  std::vector<Holding> claims;
  for (Holding& h : ledger_->ListHoldings()) {
    if (absl::StartsWith(h.owner.pod_uid, kGangSlotPrefix)) {
      absl::StatusOr<std::pair<GangKey, uint32_t>> parsed = ParseSlotUid(h.owner.pod_uid);
      if (!parsed.ok() || h.owner.job_id == 0) {
        spdlog::warn("gang recovery: holding of {} on {} left alone: {}", h.owner.ToString(), h.node,
                     parsed.ok() ? "no job id" : std::string(parsed.status().message()));
        continue;
      }
      Found& f = jobs[h.owner.job_id];
      f.key = parsed->first;
      f.slots[parsed->second] = std::move(h);
    } else if (h.owner.kind == OwnerKind::kPlaceholder) {
      placeholders.push_back(std::move(h));
    } else if (h.owner.kind == OwnerKind::kClaim && options_.in_use) {
      claims.push_back(std::move(h));
    }
  }
  // job_gang is asked once per job.
  std::map<uint32_t, std::optional<GangKey>> asked;
  auto gang_of_job = [&](uint32_t job) -> std::optional<GangKey> {
    auto it = asked.find(job);
    if (it != asked.end()) return it->second;
    std::optional<GangKey> key = options_.job_gang ? options_.job_gang(job) : std::nullopt;
    asked.emplace(job, key);
    return key;
  };
  for (Holding& h : placeholders) {
    auto it = jobs.find(h.owner.job_id);
    if (it == jobs.end()) {
      std::optional<GangKey> key = gang_of_job(h.owner.job_id);
      if (!key.has_value()) continue;  // a single pod's placeholder
      it = jobs.emplace(h.owner.job_id, Found{}).first;
      it->second.key = *key;
    }
    it->second.members.push_back(std::move(h));
  }
  for (Holding& h : claims) {
    auto it = jobs.find(h.owner.job_id);
    if (it == jobs.end()) {
      std::optional<GangKey> key = gang_of_job(h.owner.job_id);
      if (!key.has_value()) continue;  // a claim on a lend job
      it = jobs.emplace(h.owner.job_id, Found{}).first;
      it->second.key = *key;
    }
    it->second.claims.push_back(std::move(h));
  }
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock->Now();
  size_t rebuilt = 0;
  for (auto& [job, f] : jobs) {
    const GangKey& key = *f.key;
    std::set<std::string> node_set;
    for (const auto& [s, h] : f.slots) node_set.insert(h.node);
    for (const Holding& h : f.members) node_set.insert(h.node);
    for (const Holding& h : f.claims) node_set.insert(h.node);
    const std::vector<std::string> nodes(node_set.begin(), node_set.end());
    const uint32_t n = static_cast<uint32_t>(f.slots.size() + f.members.size() + f.claims.size());
    const uint32_t per_node = static_cast<uint32_t>(n / nodes.size());
    std::string bad;
    if (gangs_.count(key) != 0) bad = "the gang is known already";
    for (const std::string& node : nodes) {
      if (bad.empty() && options_.node_filter && !options_.node_filter(node)) {
        bad = absl::StrCat("node ", node, " is not this registry's");
      }
    }
    if (bad.empty() && per_node * nodes.size() != n) {
      bad = absl::StrCat(n, " holdings over ", nodes.size(), " nodes are uneven");
    }
    for (const auto& [s, h] : f.slots) {
      if (bad.empty() && (s >= n || nodes[s / per_node] != h.node)) {
        bad = absl::StrCat("slot ", s, " is on node ", h.node, ", not where slot ", s, " of ", n,
                           " belongs");
      }
    }
    if (!bad.empty()) {
      spdlog::warn("gang recovery: gang {} (Slurm job {}) left alone: {}", key.ToString(), job, bad);
      continue;
    }
    auto gang = std::make_unique<Gang>();
    gang->key = key;
    gang->job_id = job;
    gang->spec.key = key;
    gang->spec.min_member = n;
    gang->member_known = false;
    gang->reserved_at = now;
    gang->slots.resize(n);
    const Holding& any = !f.slots.empty()     ? f.slots.begin()->second
                         : !f.members.empty() ? f.members.front()
                                              : f.claims.front();
    gang->spec.member.count = static_cast<uint32_t>(any.devices.size());
    if (!any.devices.empty()) {
      gang->spec.member.kind = any.devices.front().kind;
      gang->spec.member.milli = any.devices.front().milli;
    }
    for (uint32_t s = 0; s < n; ++s) {
      gang->slots[s].node = nodes[s / per_node];
      gang->slots[s].owner.kind = OwnerKind::kPlaceholder;  // replaced below
    }
    std::vector<bool> taken(n, false);
    for (const auto& [s, h] : f.slots) {
      gang->slots[s].owner = h.owner;
      taken[s] = true;
    }
    // Bound members take the free slots of their node, lowest first.
    std::sort(f.members.begin(), f.members.end(),
              [](const Holding& a, const Holding& b) { return a.owner.pod_uid < b.owner.pod_uid; });
    for (const Holding& h : f.members) {
      for (uint32_t s = 0; s < n; ++s) {
        if (taken[s] || gang->slots[s].node != h.node) continue;
        taken[s] = true;
        Slot& slot = gang->slots[s];
        slot.member.uid = h.owner.pod_uid;
        slot.bound = true;
        member_gang_[h.owner.pod_uid] = key;
        break;
      }
    }
    // A claim's holding takes a free slot of its node too (no member).
    std::vector<bool> claimed(n, false);
    for (const Holding& h : f.claims) {
      for (uint32_t s = 0; s < n; ++s) {
        if (taken[s] || gang->slots[s].node != h.node) continue;
        taken[s] = true;
        claimed[s] = true;
        break;
      }
    }
    // The slot owner of a bound slot (its holding is the member's now):
    // `slot_owner`, else a free slot's kind with the slot's own uid.
    const OwnerKind slot_kind = f.slots.empty() ? OwnerKind::kPlaceholder
                                                : f.slots.begin()->second.owner.kind;
    for (uint32_t s = 0; s < n; ++s) {
      Slot& slot = gang->slots[s];
      if (!slot.bound && !claimed[s]) continue;
      if (options_.slot_owner) {
        slot.owner = options_.slot_owner(job, key, s);
        continue;
      }
      slot.owner = Owner{};
      slot.owner.kind = slot_kind;
      slot.owner.job_id = job;
      slot.owner.pod_uid = SlotUid(key, s);
    }
    gang->state = f.members.empty() && f.claims.empty() ? GangState::kGathering
                                                        : GangState::kComplete;
    spdlog::info("gang recovery: gang {} (Slurm job {}): {} slots on {}, {} bound, {} claimed, {}",
                 key.ToString(), job, n, absl::StrJoin(nodes, ","), f.members.size(),
                 f.claims.size(), GangStateName(gang->state));
    gangs_.emplace(key, std::move(gang));
    ++rebuilt;
  }
  return rebuilt;
}

std::optional<GangInfo> GangRegistry::Find(const GangKey& key) const {
  absl::MutexLock lock(&mu_);
  auto it = gangs_.find(key);
  if (it == gangs_.end()) return std::nullopt;
  const Gang& gang = *it->second;
  GangInfo info;
  info.key = gang.key;
  info.state = gang.state;
  info.job_id = gang.job_id;
  info.slots = static_cast<uint32_t>(gang.slots.size());
  for (const Slot& s : gang.slots) info.members += s.member.uid.empty() ? 0 : 1;
  return info;
}

std::vector<Owner> GangRegistry::SlotOwners(uint32_t job_id, const std::string& node) const {
  absl::MutexLock lock(&mu_);
  std::vector<Owner> out;
  for (const auto& [key, gang] : gangs_) {
    if (gang->job_id != job_id) continue;
    for (const Slot& s : gang->slots) {
      if (s.node == node) out.push_back(s.owner);
    }
  }
  return out;
}

GangStats GangRegistry::stats() const {
  absl::MutexLock lock(&mu_);
  GangStats s;
  s.reservations = reservations_;
  s.unplaceable = unplaceable_;
  for (int i = 0; i < kReleaseReasons; ++i) s.releases[i] = releases_[i];
  for (const auto& [key, gang] : gangs_) {
    if (gang->state == GangState::kGathering) {
      ++s.gathering;
    } else {
      ++s.complete;
    }
  }
  return s;
}

void GangRegistry::Run(Pending pending) {
  if (options_.on_event) {
    for (const GangEvent& e : pending.events) {
      if (!e.members.empty()) options_.on_event(e);
    }
  }
  if (pending.complete.has_value() && options_.on_complete) {
    options_.on_complete(pending.complete->first, pending.complete->second);
  }
}

}  // namespace gang
}  // namespace duet
