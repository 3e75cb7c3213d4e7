#pragma once

// The pod watch: invariant I2's Kubernetes half. An Informer on pods keeps,
// per pod UID, its namespace/name, node and phase; holdings in the ledger
// whose owner is a pod (OwnerKind::kPod) or a pod's placeholder
// (OwnerKind::kPlaceholder) are released through a PodReleaser when
//
//   deleted   the pod was deleted (a DELETED frame, a relist that no longer
//             has it, or its name now carries another UID): at once;
//   terminal  the pod reached phase Succeeded or Failed: at once;
//   orphaned  a sweep finds no pod with the holding's UID in the view and the
//             holding was granted more than `grace` ago.
//
// Sweeps run after every complete list (the first and each relist) and every
// `sweep_period`. Nothing is released on a guess: no sweep runs before the
// first complete list, and a periodic sweep is skipped while the informer is
// failing (its view may be stale) until a list, a frame or a bookmark shows
// it current again. A release that fails (e.g. UNAVAILABLE from Slurm) keeps
// the holding; the next sweep (or a retry of the deleted/terminal queue every
// sweep_period) tries again.
//
// Releases run on the pod watch's own thread, never on the informer's, so a
// slow Slurm does not stall the watch.
//
// Thread-safety: thread-safe. Start/Stop from one owner thread; stats() from
// any. `mu_` guards the pod view, the pending releases and
// the stats.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "bridge/ledger/ledger.h"
#include "k8s_adapter/informer.h"
#include "k8s_adapter/kube_client.h"
#include "nlohmann/json.hpp"

namespace duet {
namespace k8s {

// Why a pod's holding was released (the `reason` label of
// duet_pod_releases_total).
enum class PodReleaseReason { kDeleted, kTerminal, kOrphaned };
const char* PodReleaseReasonName(PodReleaseReason reason);

// What the pod watch knows about the pod a release is for. `ns`/`name`/
// `node` may be empty for an orphan (a UID never seen).
struct PodRelease {
  Holding holding;
  PodReleaseReason reason = PodReleaseReason::kDeleted;
  std::string pod_namespace;
  std::string pod_name;
};

// The release action. Implementations: LedgerPodReleaser (ledger only, no
// Slurm) and, in duet-bridge with Slurm, one that cancels the placeholder
// (Placeholders::Cancel) first. Called from the pod watch's thread only.
class PodReleaser {
 public:
  virtual ~PodReleaser() = default;
  // Releases `release.holding`. OK also when it is already gone. Any error
  // keeps the holding in the ledger; the pod watch retries later.
  virtual absl::Status Release(const PodRelease& release) = 0;
};

// Releases the holding in the ledger only (Slurm disabled).
class LedgerPodReleaser final : public PodReleaser {
 public:
  explicit LedgerPodReleaser(Ledger* ledger) : ledger_(ledger) {}
  absl::Status Release(const PodRelease& release) override;

 private:
  Ledger* const ledger_;
};

struct PodWatchOptions {
  // Pods are listed and watched cluster-wide. Only pods bound to a node can
  // hold devices, so by default unscheduled pods are left out of the view.
  // (A placeholder made at bind time before the pod is bound is protected by
  // `grace`.)
  std::string field_selector = "spec.nodeName!=";
  std::string label_selector;
  // A holding whose pod is not in the view is released only once it is
  // older than this (covers watch lag between a pod's creation and its
  // appearance in the view).
  absl::Duration grace = absl::Seconds(30);
  // Time between periodic sweeps (and retries of failed releases).
  absl::Duration sweep_period = absl::Seconds(30);
  // Told of every pod the watch reads (each add and update; on the
  // informer's thread, must not block). duet-bridge counts it in the learned
  // workload (once per UID). Null: none.
  std::function<void(const nlohmann::json& pod)> on_pod;
  // Tuning of the pod list+watch (path and selectors are filled in).
  InformerOptions informer;
  const Clock* clock = Clock::Real();
};

// What the pod watch's view says about one pod (PodWatch::Lookup).
struct PodSeen {
  enum State {
    kNotSeen,  // not in the view (never bound, not seen yet, or long gone)
    kRunning,  // bound, not Succeeded/Failed (it may be terminating)
    kEnded,    // Succeeded/Failed, or deleted and its release still pending
  };
  State state = kNotSeen;
  bool synced = false;  // the first complete list has been seen
  std::string ns;
  std::string name;
  std::string node;  // spec.nodeName as last seen
};

struct PodWatchStats {
  uint64_t released_deleted = 0;
  uint64_t released_terminal = 0;
  uint64_t released_orphaned = 0;
  // Release attempts that failed (the holding was kept).
  uint64_t release_failures = 0;
  uint64_t sweeps = 0;
  // Periodic sweeps skipped because the view was not known current.
  uint64_t sweeps_skipped = 0;
  size_t pods = 0;  // pods in the view
  InformerStats informer;
};

class PodWatch final : private InformerHandler {
 public:
  // Nothing is owned; all must outlive this object.
  PodWatch(KubeClient* client, Ledger* ledger, PodReleaser* releaser, PodWatchOptions options);
  ~PodWatch() override;
  PodWatch(const PodWatch&) = delete;
  PodWatch& operator=(const PodWatch&) = delete;

  // Lists pods once (the first sweep is then queued), then watches and
  // sweeps on threads of its own. The first list's error otherwise (nothing
  // started).
  absl::Status Start();
  // Idempotent; no release runs after it returns.
  void Stop();

  PodWatchStats stats() const;

  // The view's word on the pod with `uid`. Thread-safe; never blocks on I/O.
  PodSeen Lookup(const std::string& uid) const;

  // Runs one sweep now, on the caller's thread (tests; the worker otherwise).
  // Returns false (and does nothing) when the view is not synced.
  bool SweepNow();

 private:
  struct Pod {
    std::string ns;
    std::string name;
    std::string node;
    bool terminal = false;
  };
  // A deleted or terminal pod whose holdings are still to be released.
  struct Pending {
    std::string uid;
    Pod pod;
    PodReleaseReason reason;
  };

  void OnUpsert(const nlohmann::json& object) override;
  void OnDelete(const std::string& key, const nlohmann::json* last) override;
  void OnSynced() override;

  void Run();
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || sweep_requested_ || pending_requested_;
  }
  // Releases the pending pods' holdings; failures stay pending.
  void ReleasePending();
  // Releases orphaned holdings (and any deleted/terminal ones found).
  void Sweep();
  // Forgets `uid` and queues its release. Requires mu_.
  void Forget(const std::string& uid, PodReleaseReason reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Release(const PodRelease& r);
  // True when the view may be trusted for a periodic sweep.
  bool ViewCurrent() ABSL_LOCKS_EXCLUDED(mu_);

  KubeClient* const client_;
  Ledger* const ledger_;
  PodReleaser* const releaser_;
  const PodWatchOptions options_;
  std::unique_ptr<Informer> informer_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool synced_ ABSL_GUARDED_BY(mu_) = false;
  // Set by OnSynced / a new pending release: the worker has work now.
  bool sweep_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool pending_requested_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, Pod> pods_ ABSL_GUARDED_BY(mu_);  // by UID
  absl::flat_hash_map<std::string, std::string> uid_by_key_ ABSL_GUARDED_BY(mu_);
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
  PodWatchStats stats_ ABSL_GUARDED_BY(mu_);
  // Informer counters seen at the last periodic sweep: a sweep runs only if
  // the informer made progress (list/frame/bookmark/clean watch end) and
  // did not fail since.
  uint64_t last_failures_ ABSL_GUARDED_BY(mu_) = 0;
  bool failing_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t last_progress_ ABSL_GUARDED_BY(mu_) = 0;

  // Serialises sweeps and releases (the worker and SweepNow).
  absl::Mutex run_mu_ ABSL_ACQUIRED_BEFORE(mu_);
};

}  // namespace k8s
}  // namespace duet
