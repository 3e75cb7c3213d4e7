#include "bridge/journal/records.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "bridge/api/convert.h"
#include "common/status_macros.h"

namespace duet {
namespace {

struct NodeOwnerKey {
  std::string node;
  Owner owner;
  bool operator==(const NodeOwnerKey& o) const { return node == o.node && owner == o.owner; }
  template <typename H>
  friend H AbslHashValue(H h, const NodeOwnerKey& k) {
    return H::combine(std::move(h), k.node, k.owner);
  }
};

}  // namespace

internal::JournalRecord RecordOf(const Change& change) {
  internal::JournalRecord rec;
  rec.set_seq(change.seq);
  switch (change.type) {
    case Change::Type::kUpsertNode:
      ToProto(*change.spec, rec.mutable_upsert_node());
      break;
    case Change::Type::kRemoveNode:
      rec.set_remove_node(*change.node);
      break;
    case Change::Type::kHold:
      ToProto(*change.holding, rec.mutable_hold());
      break;
    case Change::Type::kRelease:
      rec.mutable_release()->set_node(change.holding->node);
      ToProto(change.holding->owner, rec.mutable_release()->mutable_owner());
      break;
  }
  return rec;
}

absl::Status ApplyRecord(const internal::JournalRecord& rec, Ledger* ledger) {
  switch (rec.change_case()) {
    case internal::JournalRecord::kUpsertNode: {
      DUET_ASSIGN_OR_RETURN(NodeSpec spec, FromProto(rec.upsert_node()));
      return ledger->UpsertNode(spec).status();
    }
    case internal::JournalRecord::kRemoveNode:
      return ledger->RemoveNode(rec.remove_node()).status();
    case internal::JournalRecord::kHold: {
      DUET_ASSIGN_OR_RETURN(Holding h, FromProto(rec.hold()));
      HoldRequest req;
      req.node = h.node;
      req.owner = h.owner;
      req.devices = h.devices;
      req.granted_at = h.granted_at;
      DUET_ASSIGN_OR_RETURN(HoldResult r, ledger->Hold(req));
      if (!r.created) {
        return absl::AlreadyExistsError(
            absl::StrCat(h.owner.ToString(), " already holds these devices on node ", h.node));
      }
      return absl::OkStatus();
    }
    case internal::JournalRecord::kRelease: {
      DUET_ASSIGN_OR_RETURN(Owner owner, FromProto(rec.release().owner()));
      DUET_ASSIGN_OR_RETURN(ReleaseResult r, ledger->Release(rec.release().node(), owner));
      if (!r.released) {
        return absl::NotFoundError(absl::StrCat(owner.ToString(), " holds nothing on node ",
                                                rec.release().node()));
      }
      return absl::OkStatus();
    }
    case internal::JournalRecord::CHANGE_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("record carries no change");
}

absl::Status RestoreSnapshot(const internal::JournalSnapshot& snap, Ledger* ledger) {
  absl::flat_hash_map<std::string, std::vector<const v1::Holding*>> by_node;
  by_node.reserve(static_cast<size_t>(snap.nodes_size()));
  for (const v1::Holding& h : snap.holdings()) by_node[h.node()].push_back(&h);
  size_t restored = 0;
  for (int i = 0; i < snap.nodes_size(); ++i) {
    const v1::Node& pn = snap.nodes(i);
    auto where = [&](const absl::Status& s) {
      return absl::Status(s.code(),
                          absl::StrCat("node[", i, "] ", pn.name(), ": ", s.message()));
    };
    absl::StatusOr<NodeSpec> spec = FromProto(pn);
    if (!spec.ok()) return where(spec.status());
    std::vector<const v1::Holding*> holdings;
    if (auto it = by_node.find(spec->name); it != by_node.end()) holdings = std::move(it->second);
    NodeSpec initial = *spec;
    if (initial.state == NodeState::kGone || (!holdings.empty() && initial.state != NodeState::kReady)) {
      initial.state = NodeState::kReady;
    }
    if (absl::Status s = ledger->UpsertNode(initial).status(); !s.ok()) return where(s);
    std::sort(holdings.begin(), holdings.end(), [](const v1::Holding* a, const v1::Holding* b) {
      return a->generation() < b->generation();
    });
    for (const v1::Holding* ph : holdings) {
      absl::StatusOr<Holding> h = FromProto(*ph);
      if (!h.ok()) return where(h.status());
      HoldRequest req;
      req.node = h->node;
      req.owner = h->owner;
      req.devices = h->devices;
      req.granted_at = h->granted_at;
      absl::StatusOr<HoldResult> r = ledger->Hold(req);
      if (!r.ok()) return where(r.status());
      if (!r->created) return where(absl::AlreadyExistsError("holding listed twice"));
      ++restored;
    }
    if (spec->state == NodeState::kGone) {
      if (absl::Status s = ledger->RemoveNode(spec->name).status(); !s.ok()) return where(s);
    } else if (initial.state != spec->state) {
      if (absl::Status s = ledger->UpsertNode(*spec).status(); !s.ok()) return where(s);
    }
    // Generations never go backwards across a restart, so a client's stale
    // expected_generation cannot match again.
    if (absl::Status s = ledger->RestoreGeneration(spec->name, pn.generation()); !s.ok()) {
      return where(s);
    }
  }
  if (restored != static_cast<size_t>(snap.holdings_size())) {
    return absl::InvalidArgumentError(absl::StrCat(snap.holdings_size() - restored,
                                                   " holdings name nodes the snapshot lacks"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<internal::JournalSnapshot>> SnapshotChunks(
    const LedgerSnapshot& image, const std::vector<Holding>& later,
    const std::vector<std::pair<uint64_t, Holding>>& releases) {
  const uint64_t seq = image.seq;
  absl::flat_hash_map<NodeOwnerKey, const Holding*> held_at_seq;
  held_at_seq.reserve(later.size());
  // Releases are in seq order; the first one after S wins.
  for (const auto& [rseq, h] : releases) {
    if (rseq > seq) held_at_seq.emplace(NodeOwnerKey{h.node, h.owner}, &h);
  }
  for (const Holding& h : later) held_at_seq.emplace(NodeOwnerKey{h.node, h.owner}, &h);

  std::vector<internal::JournalSnapshot> chunks;
  chunks.reserve(image.nodes.size());
  std::vector<const Owner*> owners;
  for (const auto& view : image.nodes) {
    internal::JournalSnapshot& chunk = chunks.emplace_back();
    chunk.set_seq(seq);
    NodeSpec spec = view->spec;
    spec.devices.reserve(view->devices.size());
    owners.clear();
    for (const DeviceState& d : view->devices) {
      spec.devices.push_back(d.spec);
      for (const DeviceUse& u : d.uses) {
        if (std::find(owners.begin(), owners.end(), u.owner.get()) == owners.end()) {
          owners.push_back(u.owner.get());
        }
      }
    }
    v1::Node* node = chunk.add_nodes();
    ToProto(spec, node);
    node->set_generation(view->generation);
    for (const Owner* owner : owners) {
      auto it = held_at_seq.find(NodeOwnerKey{spec.name, *owner});
      if (it == held_at_seq.end()) {
        return absl::InternalError(absl::StrCat("journal snapshot at seq ", seq, ": holding of ",
                                                owner->ToString(), " on node ", spec.name,
                                                " not found"));
      }
      ToProto(*it->second, chunk.add_holdings());
    }
  }
  return chunks;
}

}  // namespace duet
