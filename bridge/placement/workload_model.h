#pragma once

// The workload learned online: the shapes of the pods and Slurm jobs the
// bridge has seen arrive, with frequencies that decay over time, kept to a
// bounded number of shapes. Fragmentation-aware scoring (Policy::kDuet,
// Policy::kFgd) measures a node against `Current()`, so the scheduler
// extender's prioritize and the Slurm weight feedback both score against
// what the cluster actually runs, not against each pod's own shape.
//
// Arrivals are counted once per key (a pod's UID, a Slurm job's id): the
// extender sees a pending pod on each scheduling attempt and the pod watch
// sees it again once it is bound; both report it, the model counts it once.
// After a restart the model starts empty and is rebuilt from what the pod
// watch's first list and the Slurm sync's first import report (the live pods
// and jobs), observed at that moment.
//
// Decay: an arrival observed at time t weighs 2^((t - now) / half_life) at
// `now` (an infinite half-life keeps every arrival at weight 1). Bound: at
// most `max_tracked` shapes are tracked; a new shape arriving when the table
// is full replaces the lightest tracked one (whose weight is forgotten).
// `Current()` holds the heaviest shapes that together carry at least
// `coverage` of the total weight, at most `max_shapes` of them.
//
// Thread-safety: thread-safe; `Current()` is cheap (a cached snapshot, rebuilt
// at most once per `refresh` after a change).

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bridge/placement/request.h"
#include "bridge/placement/workload.h"

namespace duet::placement {

struct WorkloadModelOptions {
  // How fast old arrivals fade; absl::InfiniteDuration() for no decay.
  absl::Duration half_life = absl::Hours(6);
  // Share (0..1] of the total weight the exported shapes must carry.
  double coverage = 0.95;
  // At most this many shapes are exported (Current()).
  size_t max_shapes = 128;
  // At most this many shapes are tracked (>= max_shapes).
  size_t max_tracked = 1024;
  // Memory is part of a shape rounded up to this many MiB; 0 leaves memory
  // out of shapes (only devices and CPU define a shape).
  uint64_t memory_granularity_mib = 0;
  // The exported snapshot is rebuilt at most this often after a change
  // (zero: on the next Current() after every change).
  absl::Duration refresh = absl::Seconds(1);
  // ... and only when it would differ: other shapes exported, or their
  // weights moved by at least this much from the published snapshot's (total
  // variation distance, 0..1: half the sum of the weights' differences). A
  // snapshot that stays keeps its fragmentation memo warm (Workload::memo);
  // one arrival among N moves the weights by about 1/N. 0: every change.
  double min_change = 0.02;
  // Arrival keys remembered for de-duplication (pod UIDs, job ids); the
  // oldest are forgotten first.
  size_t max_keys = 65536;
  // Until this many arrivals are counted (since the start or Reset), the
  // exported workload is empty and each request is scored against its own
  // shape: a handful of pods is no estimate of a cluster's workload, and
  // fragmentation against it would steer placements by noise (at start-up a
  // single 4-GPU job would keep every 2-GPU pod off the node it half fills).
  uint64_t min_arrivals = 32;
};

// INVALID_ARGUMENT naming the field (as `prefix` + field) when out of range.
absl::Status ValidateWorkloadModelOptions(const WorkloadModelOptions& options,
                                          absl::string_view prefix = "workload.");

// A shape as the model keys it: kind, device count, per-device milli (0 when
// no device), sorted models, CPU and (rounded) memory. Workload::FromPods uses
// the same key with memory left out.
PodRequest ShapeOf(const PodRequest& request, uint64_t memory_granularity_mib = 0);

class WorkloadModel {
 public:
  struct ShapeStat {
    PodRequest shape;
    double weight = 0;  // decayed arrivals, at the time of the call
    double share = 0;   // weight / total weight
  };
  struct Stats {
    size_t tracked = 0;        // shapes in the table
    size_t exported = 0;       // shapes in Current()
    double coverage = 0;       // share of the total weight Current() carries
    double total_weight = 0;   // decayed arrivals, tracked and forgotten
    uint64_t arrivals = 0;     // Observe calls counted (not de-duplicated away)
    uint64_t duplicates = 0;   // Observe calls for a key already counted
    uint64_t evictions = 0;    // shapes dropped to keep the bound
    bool warming_up = false;   // fewer than min_arrivals counted: nothing exported
    std::vector<ShapeStat> shapes;  // the exported shapes, heaviest first
  };

  explicit WorkloadModel(WorkloadModelOptions options = {});

  const WorkloadModelOptions& options() const { return options_; }

  // Counts one arrival of `request`'s shape at `now`. A non-empty `key`
  // already counted (and still remembered) is ignored; false then.
  bool Observe(absl::string_view key, const PodRequest& request, absl::Time now);

  // Forgets every shape and key.
  void Reset();

  // The workload to score against: never null (empty before any arrival).
  std::shared_ptr<const Workload> Current(absl::Time now) const;

  // The table as of `now`; `shapes` lists the exported ones.
  Stats stats(absl::Time now) const;

 private:
  using Key = std::tuple<DeviceKind, uint32_t, uint32_t, std::vector<std::string>, uint64_t,
                         uint64_t>;
  static Key KeyOf(const PodRequest& shape);

  struct Entry {
    PodRequest shape;
    double scaled = 0;  // weight in units of 2^((t - epoch_) / half_life)
  };

  // 2^((now - epoch_) / half_life), rebasing the table when it grows large.
  double ScaleLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes the snapshot of the table now, unless it is within
  // `min_change` of the published one (which then stays).
  void RebuildLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<const Entry*> OrderedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkloadModelOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, Entry> table_ ABSL_GUARDED_BY(mu_);
  // Total scaled weight, including shapes evicted from the table.
  double total_scaled_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time epoch_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time latest_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::flat_hash_set<std::string> keys_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> key_order_ ABSL_GUARDED_BY(mu_);
  uint64_t arrivals_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t arrivals_since_reset_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t duplicates_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  mutable uint64_t built_version_ ABSL_GUARDED_BY(mu_) = ~uint64_t{0};
  mutable absl::Time built_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  mutable double built_coverage_ ABSL_GUARDED_BY(mu_) = 0;
  mutable std::shared_ptr<const Workload> current_ ABSL_GUARDED_BY(mu_);
  // current_'s shapes by key, with their normalised weights, sorted by key.
  mutable std::vector<std::pair<Key, double>> published_ ABSL_GUARDED_BY(mu_);
};

}  // namespace duet::placement
