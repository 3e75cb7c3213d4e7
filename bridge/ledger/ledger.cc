#include "bridge/ledger/ledger.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/reason.h"
#include "common/status_macros.h"
#include "bridge/ledger/usage.h"

namespace duet {
namespace {

// "gpu 3": a device on its node, as ErrorInfo metadata.
std::string DeviceRef(DeviceKind kind, uint32_t index) {
  return absl::StrCat(DeviceKindName(kind), " ", index);
}

// Who blocks a named device decides the conflict's reason: a placeholder
// stands for its pod.
const char* HeldByReason(const Owner& holder) {
  return holder.holder_class() == HolderClass::kPod ? v1::reason::kHeldByPod
                                                     : v1::reason::kHeldBySlurm;
}

// What `owner` adding a share of `milli` would bring the device's use to.
// Returns the first holder of another group when it does not fit. Counted
// as everywhere (usage.h); `uses` is tiny (one entry per holder of one
// device), so quadratic is the fast choice.
const Owner* Blocker(const DeviceState& d, const Owner& owner, uint32_t milli,
                     uint32_t* used_after) {
  uint32_t own = 0;
  uint32_t others = 0;
  const Owner* first_other = nullptr;
  ForEachOwnerGroup(d.uses, [&](const DeviceUse& first, uint32_t group_milli) {
    if (first.owner->SameGroup(owner)) {
      own = group_milli;
      return;
    }
    if (first_other == nullptr) first_other = first.owner.get();
    others += group_milli;
  });
  const uint32_t after = others + std::max(own, milli);
  if (used_after != nullptr) *used_after = after;
  if (after <= d.spec.capacity_milli) return nullptr;
  return first_other;
}

std::string DeviceName(const std::string& node, DeviceKind kind, uint32_t index) {
  return absl::StrCat("node ", node, " ", DeviceKindName(kind), " ", index);
}

std::string DeviceListString(const std::vector<HeldDevice>& devices) {
  return absl::StrJoin(devices, ",", [](std::string* out, const HeldDevice& d) {
    absl::StrAppend(out, DeviceKindName(d.kind), d.index);
    if (d.milli != kWholeDevice) absl::StrAppend(out, "@", d.milli, "m");
  });
}

bool SameSpec(const NodeView& view, const NodeSpec& spec) {
  const NodeSpec& cur = view.spec;
  if (cur.cpus != spec.cpus || cur.memory_mib != spec.memory_mib || cur.labels != spec.labels ||
      cur.pool != spec.pool || cur.zone != spec.zone || cur.state != spec.state ||
      view.devices.size() != spec.devices.size()) {
    return false;
  }
  for (size_t i = 0; i < spec.devices.size(); ++i) {
    if (!(view.devices[i].spec == spec.devices[i])) return false;
  }
  return true;
}

bool DeviceLess(const DeviceSpec& a, const DeviceSpec& b) {
  return std::make_pair(a.kind, a.index) < std::make_pair(b.kind, b.index);
}

DeviceState* FindDevice(NodeView* view, DeviceKind kind, uint32_t index) {
  auto it = std::lower_bound(view->devices.begin(), view->devices.end(), std::make_pair(kind, index),
                             [](const DeviceState& d, const std::pair<DeviceKind, uint32_t>& k) {
                               return std::make_pair(d.spec.kind, d.spec.index) < k;
                             });
  if (it == view->devices.end() || it->spec.kind != kind || it->spec.index != index) return nullptr;
  return &*it;
}
const DeviceState* FindDevice(const NodeView& view, DeviceKind kind, uint32_t index) {
  return FindDevice(const_cast<NodeView*>(&view), kind, index);
}

}  // namespace

absl::Status ValidateOwner(const Owner& owner) {
  switch (owner.kind) {
    case OwnerKind::kSlurmJob:
    case OwnerKind::kSlurmStep:
      if (owner.job_id == 0) return absl::InvalidArgumentError("owner: slurm job_id must be set");
      if (!owner.pod_uid.empty()) {
        return absl::InvalidArgumentError("owner: a slurm owner carries no pod uid");
      }
      if (owner.kind == OwnerKind::kSlurmJob && owner.step_id != 0) {
        return absl::InvalidArgumentError("owner: a slurm job owner carries no step id");
      }
      return absl::OkStatus();
    case OwnerKind::kPod:
    case OwnerKind::kPlaceholder:
      if (owner.pod_uid.empty()) return absl::InvalidArgumentError("owner: pod uid must be set");
      if (owner.pod_uid.size() > kMaxUidLength) {
        return absl::InvalidArgumentError(
            absl::StrCat("owner: pod uid is ", owner.pod_uid.size(), " bytes; max ", kMaxUidLength));
      }
      if (owner.pod_namespace.size() > kMaxNameLength || owner.pod_name.size() > kMaxNameLength) {
        return absl::InvalidArgumentError(
            absl::StrCat("owner: pod namespace/name longer than ", kMaxNameLength));
      }
      if (owner.kind == OwnerKind::kPlaceholder && owner.job_id == 0) {
        return absl::InvalidArgumentError("owner: placeholder job_id must be set");
      }
      if (owner.kind == OwnerKind::kPod && owner.job_id != 0) {
        return absl::InvalidArgumentError("owner: a pod owner carries no job id");
      }
      return absl::OkStatus();
    case OwnerKind::kClaim:
    case OwnerKind::kLend:
      if (owner.job_id == 0) return absl::InvalidArgumentError("owner: lend job_id must be set");
      if (owner.pod_uid.empty()) {
        return absl::InvalidArgumentError(owner.kind == OwnerKind::kClaim
                                              ? "owner: claim uid must be set"
                                              : "owner: lend node must be set");
      }
      if (owner.pod_uid.size() > kMaxLendUidLength) {
        return absl::InvalidArgumentError(absl::StrCat("owner: claim uid / lend group is ",
                                                       owner.pod_uid.size(), " bytes; max ",
                                                       kMaxLendUidLength));
      }
      if (owner.pod_namespace.size() > kMaxNameLength || owner.pod_name.size() > kMaxNameLength) {
        return absl::InvalidArgumentError(
            absl::StrCat("owner: claim namespace/name longer than ", kMaxNameLength));
      }
      if (owner.kind == OwnerKind::kLend &&
          (!owner.pod_namespace.empty() || !owner.pod_name.empty())) {
        return absl::InvalidArgumentError("owner: a lend owner carries no namespace or name");
      }
      return absl::OkStatus();
    case OwnerKind::kGangSlot: {
      if (owner.job_id == 0) return absl::InvalidArgumentError("owner: gang job_id must be set");
      if (owner.pod_uid.size() > kMaxGangSlotUidLength) {
        return absl::InvalidArgumentError(absl::StrCat(
            "owner: gang slot is ", owner.pod_uid.size(), " bytes; max ", kMaxGangSlotUidLength));
      }
      std::string gang;
      uint32_t slot = 0;
      if (!ParseGangSlotUid(owner.pod_uid, &gang, &slot)) {
        return absl::InvalidArgumentError(
            absl::StrCat("owner: gang slot must be \"gang:KEY#SLOT\", not \"", owner.pod_uid,
                         "\""));
      }
      if (!owner.pod_namespace.empty() || !owner.pod_name.empty()) {
        return absl::InvalidArgumentError("owner: a gang slot owner carries no namespace or name");
      }
      if (owner.step_id != 0) {
        return absl::InvalidArgumentError("owner: a gang slot owner carries no step id");
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError("owner: kind must be set");
}

absl::Status ValidateNodeSpec(const NodeSpec& spec) {
  if (spec.name.empty()) return absl::InvalidArgumentError("node.name: must be set");
  if (spec.name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("node.name: ", spec.name.size(), " bytes; max ", kMaxNameLength));
  }
  if (spec.state == NodeState::kGone) {
    return absl::InvalidArgumentError(
        absl::StrCat("node ", spec.name, ": state GONE is set by the ledger, not the inventory"));
  }
  if (spec.devices.size() > kMaxDevicesPerNode) {
    return absl::InvalidArgumentError(absl::StrCat("node ", spec.name, ": ", spec.devices.size(),
                                                   " devices; max ", kMaxDevicesPerNode));
  }
  std::vector<std::pair<DeviceKind, uint32_t>> keys;
  for (size_t i = 0; i < spec.devices.size(); ++i) {
    const DeviceSpec& d = spec.devices[i];
    if (d.kind != DeviceKind::kGpu && d.kind != DeviceKind::kTpu) {
      return absl::InvalidArgumentError(
          absl::StrCat("node ", spec.name, ".devices[", i, "].kind: must be gpu or tpu"));
    }
    if (d.capacity_milli == 0 || d.capacity_milli > kWholeDevice) {
      return absl::InvalidArgumentError(absl::StrCat("node ", spec.name, ".devices[", i,
                                                     "].capacity_milli: must be 1..", kWholeDevice));
    }
    keys.emplace_back(d.kind, d.index);
  }
  std::sort(keys.begin(), keys.end());
  auto dup = std::adjacent_find(keys.begin(), keys.end());
  if (dup != keys.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node ", spec.name, ": ", DeviceKindName(dup->first), " ", dup->second, " listed twice"));
  }
  return absl::OkStatus();
}

Ledger::Ledger() : Ledger(Options{}) {}
Ledger::Ledger(Options options) : options_(options) {}

void Ledger::AddListener(ChangeListener* listener) {
  absl::MutexLock lock(&mu_);
  listeners_.push_back(listener);
}

void Ledger::RemoveListener(ChangeListener* listener) {
  absl::MutexLock lock(&mu_);
  listeners_.erase(std::remove(listeners_.begin(), listeners_.end(), listener), listeners_.end());
}

void Ledger::Notify(const Change& change) {
  for (ChangeListener* l : listeners_) l->OnChange(change);
}

NodeView* Ledger::MutableView(Slot& slot) {
  // Readers only copy the pointer under mu_, which we hold, so a count of one
  // cannot grow while we write.
  if (slot.view.use_count() > 1) slot.view = std::make_shared<NodeView>(*slot.view);
  return slot.view.get();
}

absl::StatusOr<uint64_t> Ledger::UpsertNode(const NodeSpec& in) {
  absl::Status valid = ValidateNodeSpec(in);
  if (!valid.ok()) return valid;
  NodeSpec spec = in;
  std::sort(spec.devices.begin(), spec.devices.end(), DeviceLess);
  for (DeviceSpec& d : spec.devices) d.model_id = InternModel(d.model);

  absl::MutexLock lock(&mu_);
  auto it = node_ids_.find(spec.name);
  uint32_t id;
  if (it == node_ids_.end()) {
    if (!free_slots_.empty()) {
      id = free_slots_.back();
      free_slots_.pop_back();
    } else {
      id = static_cast<uint32_t>(slots_.size());
      slots_.emplace_back();
    }
    node_ids_.emplace(spec.name, id);
    auto view = std::make_shared<NodeView>();
    for (const DeviceSpec& d : spec.devices) view->devices.push_back(DeviceState{0, {}, d});
    view->spec = spec;
    view->spec.devices.clear();
    view->generation = 1;
    slots_[id].view = std::move(view);
  } else {
    id = it->second;
    Slot& slot = slots_[id];
    if (SameSpec(*slot.view, spec)) return seq_;
    // Every held device must survive with room for what is held.
    for (const DeviceState& d : slot.view->devices) {
      if (d.uses.empty()) continue;
      auto nd = std::lower_bound(spec.devices.begin(), spec.devices.end(), d.spec, DeviceLess);
      if (nd == spec.devices.end() || nd->kind != d.spec.kind || nd->index != d.spec.index) {
        return absl::FailedPreconditionError(
            absl::StrCat(DeviceName(spec.name, d.spec.kind, d.spec.index),
                         " is held by ", d.uses.front().owner->ToString(),
                         " and cannot leave the inventory until released"));
      }
      if (nd->capacity_milli < d.used_milli) {
        return absl::FailedPreconditionError(
            absl::StrCat(DeviceName(spec.name, d.spec.kind, d.spec.index), " has ", d.used_milli,
                         " milli held; capacity cannot drop to ", nd->capacity_milli));
      }
    }
    NodeView* view = MutableView(slot);
    std::vector<DeviceState> devices;
    devices.reserve(spec.devices.size());
    for (const DeviceSpec& d : spec.devices) {
      DeviceState* old = FindDevice(view, d.kind, d.index);
      if (old != nullptr) {
        devices.push_back(DeviceState{old->used_milli, std::move(old->uses), d});
      } else {
        devices.push_back(DeviceState{0, {}, d});
      }
    }
    view->devices = std::move(devices);
    view->spec = spec;
    view->spec.devices.clear();
    ++view->generation;
  }
  const uint64_t seq = ++seq_;
  Change c{Change::Type::kUpsertNode};
  c.seq = seq;
  c.node = &spec.name;
  c.spec = &spec;
  std::shared_ptr<const NodeView> view = slots_[id].view;
  c.view = &view;
  Notify(c);
  return seq;
}

uint64_t Ledger::EraseNode(uint32_t node_id) {
  Slot& slot = slots_[node_id];
  node_ids_.erase(slot.view->spec.name);
  slot.view.reset();
  slot.holdings = 0;
  free_slots_.push_back(node_id);
  return seq_;
}

absl::StatusOr<uint64_t> Ledger::RemoveNode(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = node_ids_.find(name);
  if (it == node_ids_.end()) return UnknownNodeError(name);
  const uint32_t id = it->second;
  Slot& slot = slots_[id];
  std::shared_ptr<const NodeView> last;
  bool erased = false;
  if (slot.holdings == 0) {
    last = slot.view;
    erased = true;
  } else {
    if (slot.view->spec.state == NodeState::kGone) return seq_;
    NodeView* view = MutableView(slot);
    view->spec.state = NodeState::kGone;
    ++view->generation;
    last = slot.view;
  }
  const std::string node = name;  // `name` may alias the erased key
  if (erased) EraseNode(id);
  const uint64_t seq = ++seq_;
  Change c{Change::Type::kRemoveNode};
  c.seq = seq;
  c.node = &node;
  c.view = &last;
  c.erased = erased;
  Notify(c);
  return seq;
}

absl::Status Ledger::PickDevices(const NodeView& view, const HoldRequest& request,
                                 std::vector<HeldDevice>* out) const {
  const std::string& node = view.spec.name;
  if (!request.devices.empty()) {
    for (const HeldDevice& want : request.devices) {
      const DeviceState* d = FindDevice(view, want.kind, want.index);
      if (d == nullptr) {
        // Not NODE_NOT_SHARED: the node is shared, so a caller must not
        // take this for "nothing to fence".
        return WithReason(absl::NotFoundError(absl::StrCat(
                              DeviceName(node, want.kind, want.index), " does not exist")),
                          v1::reason::kDeviceUnknown,
                          {{"node", node}, {"device", DeviceRef(want.kind, want.index)}});
      }
      HeldDevice h = want;
      if (h.milli == 0) h.milli = d->spec.capacity_milli;
      if (h.milli > d->spec.capacity_milli) {
        return absl::InvalidArgumentError(
            absl::StrCat(DeviceName(node, want.kind, want.index), ": ", h.milli,
                         " milli requested, capacity is ", d->spec.capacity_milli));
      }
      if (const Owner* b = Blocker(*d, request.owner, h.milli, nullptr)) {
        return WithReason(absl::ResourceExhaustedError(absl::StrCat(
                              DeviceName(node, want.kind, want.index), " is held by ",
                              b->ToString())),
                          HeldByReason(*b),
                          {{"node", node},
                           {"device", DeviceRef(want.kind, want.index)},
                           {"holder", b->ToString()}});
      }
      out->push_back(h);
    }
    return absl::OkStatus();
  }

  const CountSelector& sel = *request.count;
  struct Candidate {
    uint32_t used_after;
    uint32_t index;
    uint32_t milli;
  };
  absl::InlinedVector<Candidate, 16> fits;
  uint32_t of_kind = 0;
  const Owner* blocker = nullptr;
  for (const DeviceState& d : view.devices) {
    if (d.spec.kind != sel.kind) continue;
    if (!sel.model.empty() && d.spec.model != sel.model) continue;
    ++of_kind;
    const uint32_t milli = sel.milli == 0 ? d.spec.capacity_milli : sel.milli;
    if (milli > d.spec.capacity_milli) continue;
    uint32_t after = 0;
    const Owner* b = Blocker(d, request.owner, milli, &after);
    if (b == nullptr) {
      fits.push_back({after, d.spec.index, milli});
    } else if (blocker == nullptr) {
      blocker = b;
    }
  }
  const std::string what =
      absl::StrCat(DeviceKindName(sel.kind), sel.model.empty() ? "" : " ", sel.model);
  if (sel.count > of_kind) {
    return absl::InvalidArgumentError(absl::StrCat("count ", sel.count, " is more than node ", node,
                                                   "'s ", of_kind, " ", what, " devices"));
  }
  if (fits.size() < sel.count) {
    std::string msg = absl::StrCat("node ", node, ": ", fits.size(), " of ", of_kind, " ", what,
                                   " devices have room, ", sel.count, " requested");
    if (blocker != nullptr) absl::StrAppend(&msg, " (held by ", blocker->ToString(), ", ...)");
    return WithReason(absl::ResourceExhaustedError(msg), v1::reason::kNoRoom, {{"node", node}});
  }
  // Best fit: the fullest devices that still fit first, so shares pack onto
  // devices already in use and whole devices stay whole; then lowest index.
  std::stable_sort(fits.begin(), fits.end(), [](const Candidate& a, const Candidate& b) {
    return a.used_after > b.used_after;
  });
  for (uint32_t i = 0; i < sel.count; ++i) out->push_back({sel.kind, fits[i].index, fits[i].milli});
  std::sort(out->begin(), out->end(), [](const HeldDevice& a, const HeldDevice& b) {
    return std::make_pair(a.kind, a.index) < std::make_pair(b.kind, b.index);
  });
  return absl::OkStatus();
}

absl::StatusOr<HoldResult> Ledger::Hold(const HoldRequest& request) {
  absl::Status valid = ValidateOwner(request.owner);
  if (!valid.ok()) return valid;
  if (request.node.empty()) return absl::InvalidArgumentError("node: must be set");
  if (request.node.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(absl::StrCat("node: name longer than ", kMaxNameLength));
  }
  if (request.devices.empty() == !request.count.has_value()) {
    return absl::InvalidArgumentError("exactly one of devices and count must be set");
  }
  if (request.count.has_value()) {
    if (request.count->count == 0) return absl::InvalidArgumentError("count: must be at least 1");
    if (request.count->milli > kWholeDevice) {
      return absl::InvalidArgumentError(
          absl::StrCat("count.milli: ", request.count->milli, " is more than ", kWholeDevice));
    }
  } else {
    if (request.devices.size() > kMaxDevicesPerNode) {
      return absl::InvalidArgumentError(absl::StrCat("devices: more than ", kMaxDevicesPerNode));
    }
    std::vector<std::pair<DeviceKind, uint32_t>> keys;
    for (const HeldDevice& d : request.devices) keys.emplace_back(d.kind, d.index);
    std::sort(keys.begin(), keys.end());
    auto dup = std::adjacent_find(keys.begin(), keys.end());
    if (dup != keys.end()) {
      return absl::InvalidArgumentError(absl::StrCat("devices: ", DeviceKindName(dup->first), " ",
                                                     dup->second, " listed twice"));
    }
  }

  absl::MutexLock lock(&mu_);
  auto it = node_ids_.find(request.node);
  if (it == node_ids_.end()) return UnknownNodeError(request.node);
  const uint32_t id = it->second;
  Slot& slot = slots_[id];
  const NodeView& cur = *slot.view;

  std::vector<HeldDevice> picked;
  auto existing = holdings_.find(HoldingKeyRef{&request.owner, id});
  if (existing != holdings_.end()) {
    const Holding& h = existing->second.holding;
    bool same;
    if (request.count.has_value()) {
      const CountSelector& sel = *request.count;
      same = h.devices.size() == sel.count;
      for (const HeldDevice& d : h.devices) {
        const DeviceState* ds = FindDevice(cur, d.kind, d.index);
        const uint32_t milli = sel.milli == 0 ? ds->spec.capacity_milli : sel.milli;
        same = same && d.kind == sel.kind && d.milli == milli &&
               (sel.model.empty() || ds->spec.model == sel.model);
      }
    } else {
      std::vector<HeldDevice> want;
      for (HeldDevice d : request.devices) {
        const DeviceState* ds = FindDevice(cur, d.kind, d.index);
        if (d.milli == 0 && ds != nullptr) d.milli = ds->spec.capacity_milli;
        want.push_back(d);
      }
      std::sort(want.begin(), want.end(), [](const HeldDevice& a, const HeldDevice& b) {
        return std::make_pair(a.kind, a.index) < std::make_pair(b.kind, b.index);
      });
      same = want == h.devices;
    }
    if (!same) {
      return WithReason(
          absl::AlreadyExistsError(absl::StrCat(request.owner.ToString(), " already holds ",
                                                DeviceListString(h.devices), " on node ",
                                                request.node, "; release it first")),
          v1::reason::kAlreadyHeld, {{"node", request.node}, {"holder", request.owner.ToString()}});
    }
    return HoldResult{h, false, seq_};
  }

  if (cur.spec.state == NodeState::kGone) {
    return WithReason(absl::FailedPreconditionError(
                          absl::StrCat("node ", request.node, " is leaving the inventory")),
                      v1::reason::kNodeGone, {{"node", request.node}});
  }
  // Slurm has already placed its jobs (its drain/down states govern them);
  // cordoned or unready nodes take no new pods.
  if (request.owner.holder_class() == HolderClass::kPod && cur.spec.state != NodeState::kReady) {
    return WithReason(absl::FailedPreconditionError(absl::StrCat("node ", request.node, " is ",
                                                                 NodeStateName(cur.spec.state),
                                                                 ": no new pod holdings")),
                      v1::reason::kNodeNotReady,
                      {{"node", request.node}, {"state", NodeStateName(cur.spec.state)}});
  }
  if (request.expected_generation != 0 && request.expected_generation != cur.generation) {
    return WithReason(absl::AbortedError(absl::StrCat("node ", request.node, " is at generation ",
                                                      cur.generation, ", not ",
                                                      request.expected_generation)),
                      v1::reason::kStaleGeneration, {{"node", request.node}});
  }
  absl::Status picked_ok = PickDevices(cur, request, &picked);
  if (!picked_ok.ok()) return picked_ok;

  auto owner = std::make_shared<const Owner>(request.owner);
  NodeView* view = MutableView(slot);
  for (const HeldDevice& h : picked) {
    DeviceState* d = FindDevice(view, h.kind, h.index);
    d->uses.push_back(DeviceUse{owner, h.milli});
    d->used_milli = GroupedUse(d->uses);
  }
  ++view->generation;
  ++slot.holdings;
  HoldingEntry entry;
  entry.holding.owner = request.owner;
  entry.holding.node = request.node;
  entry.holding.devices = std::move(picked);
  entry.holding.granted_at = request.granted_at.value_or(options_.clock->Now());
  entry.holding.generation = view->generation;
  auto inserted = holdings_.emplace(HoldingKey{owner, id}, std::move(entry)).first;

  const uint64_t seq = ++seq_;
  const Holding& held = inserted->second.holding;
  if (!listeners_.empty()) {
    Change c{Change::Type::kHold};
    c.seq = seq;
    c.node = &held.node;
    c.holding = &held;
    std::shared_ptr<const NodeView> v = slot.view;
    c.view = &v;
    Notify(c);
  }
  return HoldResult{held, true, seq};
}

absl::StatusOr<ReleaseResult> Ledger::Release(const std::string& node, const Owner& owner) {
  absl::Status valid = ValidateOwner(owner);
  if (!valid.ok()) return valid;
  if (node.empty()) return absl::InvalidArgumentError("node: must be set");

  absl::MutexLock lock(&mu_);
  auto it = node_ids_.find(node);
  if (it == node_ids_.end()) return ReleaseResult{false, {}, seq_};
  const uint32_t id = it->second;
  auto h = holdings_.find(HoldingKeyRef{&owner, id});
  if (h == holdings_.end()) return ReleaseResult{false, {}, seq_};

  Slot& slot = slots_[id];
  NodeView* view = MutableView(slot);
  const Owner* key = h->first.owner.get();
  for (const HeldDevice& hd : h->second.holding.devices) {
    DeviceState* d = FindDevice(view, hd.kind, hd.index);
    d->uses.erase(std::remove_if(d->uses.begin(), d->uses.end(),
                                 [key](const DeviceUse& u) { return u.owner.get() == key; }),
                  d->uses.end());
    d->used_milli = GroupedUse(d->uses);
  }
  ++view->generation;
  --slot.holdings;
  ReleaseResult result{true, std::move(h->second.holding), 0};
  holdings_.erase(h);

  std::shared_ptr<const NodeView> last = slot.view;
  const bool erased = slot.holdings == 0 && view->spec.state == NodeState::kGone;
  if (erased) EraseNode(id);
  result.seq = ++seq_;
  if (!listeners_.empty()) {
    Change c{Change::Type::kRelease};
    c.seq = result.seq;
    c.node = &result.holding.node;
    c.holding = &result.holding;
    c.view = &last;
    c.erased = erased;
    Notify(c);
  }
  return result;
}

absl::StatusOr<HoldResult> Ledger::Rebind(const std::string& node, const Owner& from,
                                          const Owner& to) {
  DUET_RETURN_IF_ERROR(ValidateOwner(from));
  DUET_RETURN_IF_ERROR(ValidateOwner(to));
  if (node.empty()) return absl::InvalidArgumentError("node: must be set");
  if (from == to) return absl::InvalidArgumentError("rebind: from and to are the same owner");
  if (from.holder_class() != to.holder_class()) {
    return absl::InvalidArgumentError(absl::StrCat("rebind: ", from.ToString(), " and ",
                                                   to.ToString(), " are not one holder class"));
  }

  absl::MutexLock lock(&mu_);
  auto it = node_ids_.find(node);
  if (it == node_ids_.end()) return UnknownNodeError(node);
  const uint32_t id = it->second;
  Slot& slot = slots_[id];
  auto h = holdings_.find(HoldingKeyRef{&from, id});
  if (h == holdings_.end()) {
    return absl::NotFoundError(absl::StrCat(from.ToString(), " holds nothing on node ", node));
  }
  if (holdings_.find(HoldingKeyRef{&to, id}) != holdings_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(to.ToString(), " already holds devices on node ", node));
  }
  // Replay releases, then holds: on a GONE node the release of its last
  // holding would erase the node before the hold.
  if (slot.view->spec.state == NodeState::kGone) {
    return WithReason(
        absl::FailedPreconditionError(absl::StrCat("node ", node, " is leaving the inventory")),
        v1::reason::kNodeGone, {{"node", node}});
  }
  const Owner* from_key = h->first.owner.get();
  // `to` must fit where `from` was (it does unless groups already overlap).
  for (const HeldDevice& hd : h->second.holding.devices) {
    DeviceState without = *FindDevice(*slot.view, hd.kind, hd.index);
    without.uses.erase(std::remove_if(without.uses.begin(), without.uses.end(),
                                      [from_key](const DeviceUse& u) {
                                        return u.owner.get() == from_key;
                                      }),
                       without.uses.end());
    if (const Owner* b = Blocker(without, to, hd.milli, nullptr)) {
      return WithReason(absl::ResourceExhaustedError(
                            absl::StrCat(DeviceName(node, hd.kind, hd.index), " is held by ",
                                         b->ToString())),
                        HeldByReason(*b), {{"node", node}});
    }
  }

  // The release, as Release does it (the node is not GONE: never erased).
  NodeView* view = MutableView(slot);
  for (const HeldDevice& hd : h->second.holding.devices) {
    DeviceState* d = FindDevice(view, hd.kind, hd.index);
    d->uses.erase(std::remove_if(d->uses.begin(), d->uses.end(),
                                 [from_key](const DeviceUse& u) { return u.owner.get() == from_key; }),
                  d->uses.end());
    d->used_milli = GroupedUse(d->uses);
  }
  ++view->generation;
  Holding released = std::move(h->second.holding);
  holdings_.erase(h);
  const uint64_t release_seq = ++seq_;
  if (!listeners_.empty()) {
    // Listeners may keep the view: the hold below then copies the node.
    std::shared_ptr<const NodeView> after_release = slot.view;
    Change c{Change::Type::kRelease};
    c.seq = release_seq;
    c.node = &released.node;
    c.holding = &released;
    c.view = &after_release;
    Notify(c);
  }

  // The hold of the same devices for `to`.
  auto owner = std::make_shared<const Owner>(to);
  view = MutableView(slot);
  for (const HeldDevice& hd : released.devices) {
    DeviceState* d = FindDevice(view, hd.kind, hd.index);
    d->uses.push_back(DeviceUse{owner, hd.milli});
    d->used_milli = GroupedUse(d->uses);
  }
  ++view->generation;
  HoldingEntry entry;
  entry.holding.owner = to;
  entry.holding.node = node;
  entry.holding.devices = released.devices;
  entry.holding.granted_at = options_.clock->Now();
  entry.holding.generation = view->generation;
  auto inserted = holdings_.emplace(HoldingKey{owner, id}, std::move(entry)).first;
  const uint64_t seq = ++seq_;
  const Holding& held = inserted->second.holding;
  if (!listeners_.empty()) {
    Change c{Change::Type::kHold};
    c.seq = seq;
    c.node = &held.node;
    c.holding = &held;
    std::shared_ptr<const NodeView> v = slot.view;
    c.view = &v;
    Notify(c);
  }
  return HoldResult{held, true, seq};
}

std::shared_ptr<const NodeView> Ledger::GetNode(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = node_ids_.find(name);
  if (it == node_ids_.end()) return nullptr;
  return slots_[it->second].view;
}

std::vector<std::shared_ptr<const NodeView>> Ledger::GetNodes(
    const std::vector<std::string>& names) const {
  // Batches bound how long a writer waits behind a large request (5,000
  // names take about a quarter of a millisecond in all).
  constexpr size_t kBatch = 256;
  std::vector<std::shared_ptr<const NodeView>> out(names.size());
  for (size_t start = 0; start < names.size(); start += kBatch) {
    const size_t end = std::min(names.size(), start + kBatch);
    absl::MutexLock lock(&mu_);
    for (size_t i = start; i < end; ++i) {
      auto it = node_ids_.find(names[i]);
      if (it != node_ids_.end()) out[i] = slots_[it->second].view;
    }
  }
  return out;
}

LedgerSnapshot Ledger::Snapshot() const {
  LedgerSnapshot snap;
  std::vector<std::shared_ptr<const NodeView>> views;
  {
    absl::MutexLock lock(&mu_);
    snap.seq = seq_;
    views.reserve(node_ids_.size());
    for (const Slot& s : slots_) {
      if (s.view) views.push_back(s.view);
    }
  }
  // Sort (name, position) keys, not the views: a comparison then reads the
  // names without going through each view, and a swap moves no reference
  // counts. Names are unique, so the order is the same as sorting the views.
  std::vector<std::pair<std::string_view, size_t>> keys;
  keys.reserve(views.size());
  for (size_t i = 0; i < views.size(); ++i) keys.emplace_back(views[i]->spec.name, i);
  std::sort(keys.begin(), keys.end());
  snap.nodes.reserve(views.size());
  for (const auto& key : keys) snap.nodes.push_back(std::move(views[key.second]));
  return snap;
}

std::vector<std::shared_ptr<const NodeView>> Ledger::UnorderedViews() const {
  std::vector<std::shared_ptr<const NodeView>> views;
  absl::MutexLock lock(&mu_);
  views.reserve(node_ids_.size());
  for (const Slot& s : slots_) {
    if (s.view) views.push_back(s.view);
  }
  return views;
}

std::vector<Holding> Ledger::ListHoldings(const std::string& node) const {
  std::vector<Holding> out;
  {
    absl::MutexLock lock(&mu_);
    if (node.empty()) {
      out.reserve(holdings_.size());
      for (const auto& [key, entry] : holdings_) out.push_back(entry.holding);
    } else {
      auto it = node_ids_.find(node);
      if (it == node_ids_.end()) return out;
      // The node's holders are the owners of its device uses.
      const NodeView& view = *slots_[it->second].view;
      for (const DeviceState& d : view.devices) {
        for (const DeviceUse& u : d.uses) {
          auto h = holdings_.find(HoldingKeyRef{u.owner.get(), it->second});
          if (h != holdings_.end() && h->first.owner == u.owner) {
            bool dup = false;
            for (const Holding& o : out) dup = dup || o.owner == *u.owner;
            if (!dup) out.push_back(h->second.holding);
          }
        }
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const Holding& a, const Holding& b) {
    if (a.node != b.node) return a.node < b.node;
    return std::make_tuple(a.owner.kind, a.owner.job_id, a.owner.step_id, a.owner.pod_uid) <
           std::make_tuple(b.owner.kind, b.owner.job_id, b.owner.step_id, b.owner.pod_uid);
  });
  return out;
}

std::optional<Holding> Ledger::FindHolding(const std::string& node, const Owner& owner) const {
  absl::MutexLock lock(&mu_);
  auto it = node_ids_.find(node);
  if (it == node_ids_.end()) return std::nullopt;
  auto h = holdings_.find(HoldingKeyRef{&owner, it->second});
  if (h == holdings_.end()) return std::nullopt;
  return h->second.holding;
}

size_t Ledger::node_count() const {
  absl::MutexLock lock(&mu_);
  return node_ids_.size();
}

size_t Ledger::holding_count() const {
  absl::MutexLock lock(&mu_);
  return holdings_.size();
}

uint64_t Ledger::seq() const {
  absl::MutexLock lock(&mu_);
  return seq_;
}

void Ledger::RestoreSeq(uint64_t seq) {
  absl::MutexLock lock(&mu_);
  if (seq > seq_) seq_ = seq;
}

absl::Status Ledger::RestoreGeneration(const std::string& node, uint64_t generation) {
  absl::MutexLock lock(&mu_);
  auto it = node_ids_.find(node);
  if (it == node_ids_.end()) return UnknownNodeError(node);
  Slot& slot = slots_[it->second];
  if (slot.view->generation < generation) MutableView(slot)->generation = generation;
  return absl::OkStatus();
}

absl::Status Ledger::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  size_t total_holdings = 0;
  for (uint32_t id = 0; id < slots_.size(); ++id) {
    const Slot& slot = slots_[id];
    if (!slot.view) continue;
    const NodeView& view = *slot.view;
    const std::string& node = view.spec.name;
    total_holdings += slot.holdings;
    for (const DeviceState& d : view.devices) {
      const std::string dev = DeviceName(node, d.spec.kind, d.spec.index);
      if (GroupedUse(d.uses) != d.used_milli) {
        return absl::InternalError(absl::StrCat(dev, ": used_milli ", d.used_milli, " != ",
                                                GroupedUse(d.uses)));
      }
      if (d.used_milli > d.spec.capacity_milli) {
        return absl::InternalError(absl::StrCat("I1: ", dev, " over capacity: ", d.used_milli));
      }
      for (const DeviceUse& u : d.uses) {
        // A whole-device share excludes every other group.
        for (const DeviceUse& v : d.uses) {
          if (!u.owner->SameGroup(*v.owner) && u.milli >= d.spec.capacity_milli) {
            return absl::InternalError(absl::StrCat("I1: ", dev, " held whole by ",
                                                    u.owner->ToString(), " and by ",
                                                    v.owner->ToString()));
          }
        }
        auto h = holdings_.find(HoldingKeyRef{u.owner.get(), id});
        if (h == holdings_.end() || h->first.owner != u.owner) {
          return absl::InternalError(
              absl::StrCat(dev, ": use by ", u.owner->ToString(), " has no holding"));
        }
        const auto& hd = h->second.holding.devices;
        if (std::find(hd.begin(), hd.end(), HeldDevice{d.spec.kind, d.spec.index, u.milli}) ==
            hd.end()) {
          return absl::InternalError(absl::StrCat(dev, ": holding of ", u.owner->ToString(),
                                                  " does not list it"));
        }
      }
    }
  }
  if (total_holdings != holdings_.size()) {
    return absl::InternalError(absl::StrCat("holding count ", total_holdings, " != ",
                                            holdings_.size()));
  }
  for (const auto& [key, entry] : holdings_) {
    if (key.node_id >= slots_.size() || !slots_[key.node_id].view) {
      return absl::InternalError(absl::StrCat(entry.holding.owner.ToString(),
                                              " holds on a missing node"));
    }
    for (const HeldDevice& hd : entry.holding.devices) {
      const DeviceState* d = FindDevice(*slots_[key.node_id].view, hd.kind, hd.index);
      bool found = false;
      if (d != nullptr) {
        for (const DeviceUse& u : d->uses) found = found || u.owner == key.owner;
      }
      if (!found) {
        return absl::InternalError(absl::StrCat(entry.holding.owner.ToString(), "'s ",
                                                DeviceKindName(hd.kind), hd.index,
                                                " has no device use"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace duet
