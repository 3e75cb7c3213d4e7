#pragma once

// What the ledger's logs (the local Journal and the etcd-backed EtcdLog) share:
// a Change as a JournalRecord, a record or snapshot applied to a ledger on
// recovery, and a consistent snapshot of a live ledger. Pure functions over
// the ledger's public API; no I/O.

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bridge/ledger/ledger.h"
#include "bridge/ledger/types.h"
#include "duet/internal/journal.pb.h"

namespace duet {

// The record of one ledger change (carries change.seq).
internal::JournalRecord RecordOf(const Change& change);

// Applies one log record to `ledger` through its public methods. An error
// means the ledger refused it: the log does not describe a history the ledger
// could have produced (the caller reports DATA_LOSS).
absl::Status ApplyRecord(const internal::JournalRecord& rec, Ledger* ledger);

// Restores one snapshot chunk (any number of nodes with their holdings) into
// `ledger`. Holdings are added in the order of their generation; a node that
// is not READY (or GONE) is made READY while its holdings are added, then
// given its real state, since the ledger refuses new pod holdings on such
// nodes. Node generations are restored too.
absl::Status RestoreSnapshot(const internal::JournalSnapshot& snap, Ledger* ledger);

// A consistent image of a live ledger at one seq, as one chunk per node (each
// with that node's holdings, every chunk carrying the seq), built without
// stopping the ledger's writers:
//   `image`     Ledger::Snapshot(), taken first: every node view exactly at
//               image.seq (which holdings exist, node specs, generations);
//   `later`     Ledger::ListHoldings(), taken after it (granted_at and the
//               holding's generation, which the views lack);
//   `releases`  every holding the ledger released (with its seq) from before
//               `image` was taken until after `later` was, in seq order.
// For each (node, owner) in the views, the first release after image.seq is
// exactly the holding it had then; with none, `later` still shows it.
// INTERNAL if a holding in the views can be found in neither.
absl::StatusOr<std::vector<internal::JournalSnapshot>> SnapshotChunks(
    const LedgerSnapshot& image, const std::vector<Holding>& later,
    const std::vector<std::pair<uint64_t, Holding>>& releases);

}  // namespace duet
