#include "k8s_adapter/reconcile/pod_watch.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/enum_name.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace k8s {
namespace {

bool PodOwned(const Owner& o) {
  return (o.kind == OwnerKind::kPod || o.kind == OwnerKind::kPlaceholder) && !o.pod_uid.empty();
}

std::string PodLabel(const std::string& ns, const std::string& name, const std::string& uid) {
  if (name.empty()) return absl::StrCat("uid ", uid);
  return absl::StrCat(ns, "/", name, " (uid ", uid, ")");
}

}  // namespace

const char* PodReleaseReasonName(PodReleaseReason reason) {
  static constexpr const char* kNames[] = {"deleted", "terminal", "orphaned"};
  return EnumName(reason, kNames);
}

absl::Status LedgerPodReleaser::Release(const PodRelease& release) {
  return ledger_->Release(release.holding.node, release.holding.owner).status();
}

PodWatch::PodWatch(KubeClient* client, Ledger* ledger, PodReleaser* releaser,
                   PodWatchOptions options)
    : client_(client), ledger_(ledger), releaser_(releaser), options_(std::move(options)) {}

PodWatch::~PodWatch() { Stop(); }

absl::Status PodWatch::Start() {
  InformerOptions io = options_.informer;
  io.path = "/api/v1/pods";
  io.field_selector = options_.field_selector;
  io.label_selector = options_.label_selector;
  informer_ = std::make_unique<Informer>(client_, io, static_cast<InformerHandler*>(this));
  absl::Status s = informer_->Start();
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("pod watch: ", s.message()));
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void PodWatch::Stop() {
  // The informer first: no handler call (hence no new work) after it stops.
  if (informer_ != nullptr) informer_->Stop();
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

PodWatchStats PodWatch::stats() const {
  PodWatchStats s;
  {
    absl::MutexLock l(&mu_);
    s = stats_;
    s.pods = pods_.size();
  }
  if (informer_ != nullptr) s.informer = informer_->stats();
  return s;
}

PodSeen PodWatch::Lookup(const std::string& uid) const {
  PodSeen out;
  absl::MutexLock l(&mu_);
  out.synced = synced_;
  if (auto it = pods_.find(uid); it != pods_.end()) {
    out.state = it->second.terminal ? PodSeen::kEnded : PodSeen::kRunning;
    out.ns = it->second.ns;
    out.name = it->second.name;
    out.node = it->second.node;
    return out;
  }
  for (const Pending& p : pending_) {
    if (p.uid != uid) continue;
    out.state = PodSeen::kEnded;
    out.ns = p.pod.ns;
    out.name = p.pod.name;
    out.node = p.pod.node;
  }
  return out;
}

// ---- informer handler (informer's thread, or Start's caller) ----

void PodWatch::OnUpsert(const nlohmann::json& object) {
  std::string uid, ns, name, node, phase;
  try {
    const nlohmann::json& md = object.at("metadata");
    uid = md.value("uid", "");
    ns = md.value("namespace", "");
    name = md.value("name", "");
    if (auto spec = object.find("spec"); spec != object.end() && spec->is_object()) {
      node = spec->value("nodeName", "");
    }
    if (auto st = object.find("status"); st != object.end() && st->is_object()) {
      phase = st->value("phase", "");
    }
  } catch (const nlohmann::json::exception& e) {
    spdlog::warn("pod watch: ignoring a malformed pod: {}", e.what());
    return;
  }
  if (uid.empty() || name.empty()) return;
  if (options_.on_pod) options_.on_pod(object);
  const std::string key = absl::StrCat(ns, "/", name);
  absl::MutexLock l(&mu_);
  auto k = uid_by_key_.find(key);
  if (k != uid_by_key_.end() && k->second != uid) {
    // The name was reused: the pod we knew under it is gone.
    Forget(k->second, PodReleaseReason::kDeleted);
  }
  uid_by_key_[key] = uid;
  Pod& p = pods_[uid];
  const bool was_terminal = p.terminal;
  p.ns = ns;
  p.name = name;
  p.node = node;
  p.terminal = phase == "Succeeded" || phase == "Failed";
  if (p.terminal && !was_terminal) {
    pending_.push_back({uid, p, PodReleaseReason::kTerminal});
    pending_requested_ = true;
  }
}

void PodWatch::OnDelete(const std::string& key, const nlohmann::json* last) {
  absl::MutexLock l(&mu_);
  std::string uid;
  auto k = uid_by_key_.find(key);
  if (k != uid_by_key_.end()) {
    uid = k->second;
    uid_by_key_.erase(k);
  } else if (last != nullptr) {
    uid = last->value("/metadata/uid"_json_pointer, "");
  }
  if (!uid.empty()) Forget(uid, PodReleaseReason::kDeleted);
}

void PodWatch::OnSynced() {
  absl::MutexLock l(&mu_);
  synced_ = true;
  sweep_requested_ = true;
}

void PodWatch::Forget(const std::string& uid, PodReleaseReason reason) {
  Pending p{uid, {}, reason};
  auto it = pods_.find(uid);
  if (it != pods_.end()) {
    p.pod = std::move(it->second);
    pods_.erase(it);
  }
  pending_.push_back(std::move(p));
  pending_requested_ = true;
}

// ---- worker ----

void PodWatch::Run() {
  const Clock* const clock = options_.clock;
  absl::Time next_periodic = clock->Now() + options_.sweep_period;
  while (true) {
    bool sweep = false, pending = false;
    {
      absl::MutexLock l(&mu_);
      clock->AwaitWithDeadline(&mu_, absl::Condition(this, &PodWatch::HasWork), next_periodic);
      if (stopping_) return;
      sweep = sweep_requested_;
      pending = pending_requested_;
      sweep_requested_ = pending_requested_ = false;
    }
    const bool periodic = clock->Now() >= next_periodic;
    if (periodic) next_periodic = clock->Now() + options_.sweep_period;
    if (pending || periodic) ReleasePending();
    if (sweep) {
      // Right after a complete list the view is current.
      Sweep();
    } else if (periodic) {
      if (ViewCurrent()) {
        Sweep();
      } else {
        absl::MutexLock l(&mu_);
        ++stats_.sweeps_skipped;
      }
    }
  }
}

bool PodWatch::ViewCurrent() {
  if (informer_ == nullptr) return false;
  const InformerStats s = informer_->stats();
  const uint64_t progress = s.lists + s.events + s.bookmarks;
  absl::MutexLock l(&mu_);
  if (s.failures != last_failures_) {
    // Failed since the last look: wait for evidence the watch is back.
    failing_ = true;
    last_failures_ = s.failures;
    last_progress_ = progress;
    return false;
  }
  if (failing_ && progress != last_progress_) failing_ = false;
  last_progress_ = progress;
  return !failing_;
}

bool PodWatch::Release(const PodRelease& r) {
  const absl::Status s = releaser_->Release(r);
  const std::string pod = PodLabel(r.pod_namespace, r.pod_name, r.holding.owner.pod_uid);
  absl::MutexLock l(&mu_);
  if (!s.ok()) {
    ++stats_.release_failures;
    spdlog::warn("pod watch: cannot release {} of pod {} on node {} ({}): {}; kept for a retry",
                 r.holding.owner.ToString(), pod, r.holding.node, PodReleaseReasonName(r.reason),
                 std::string(s.ToString()));
    return false;
  }
  switch (r.reason) {
    case PodReleaseReason::kDeleted:
      ++stats_.released_deleted;
      break;
    case PodReleaseReason::kTerminal:
      ++stats_.released_terminal;
      break;
    case PodReleaseReason::kOrphaned:
      ++stats_.released_orphaned;
      break;
  }
  spdlog::info("pod watch: released {} of pod {} on node {} ({} devices): pod {}",
               r.holding.owner.ToString(), pod, r.holding.node, r.holding.devices.size(),
               r.reason == PodReleaseReason::kOrphaned ? "not found in Kubernetes"
                                                       : PodReleaseReasonName(r.reason));
  return true;
}

void PodWatch::ReleasePending() {
  absl::MutexLock run(&run_mu_);
  std::vector<Pending> work;
  {
    absl::MutexLock l(&mu_);
    work.swap(pending_);
  }
  std::vector<Pending> keep;
  for (Pending& p : work) {
    // Only holdings on the pod's node, unless it never had one (cheap: one
    // node's holdings, not the whole ledger).
    bool ok = true;
    for (const Holding& h : ledger_->ListHoldings(p.pod.node)) {
      if (!PodOwned(h.owner) || h.owner.pod_uid != p.uid) continue;
      ok &= Release({h, p.reason, p.pod.ns, p.pod.name});
    }
    if (!ok) keep.push_back(std::move(p));
  }
  if (!keep.empty()) {
    absl::MutexLock l(&mu_);
    for (Pending& p : keep) pending_.push_back(std::move(p));
  }
}

bool PodWatch::SweepNow() {
  {
    absl::MutexLock l(&mu_);
    if (!synced_) return false;
  }
  Sweep();
  return true;
}

void PodWatch::Sweep() {
  absl::MutexLock run(&run_mu_);
  const std::vector<Holding> holdings = ledger_->ListHoldings();
  const absl::Time cutoff = options_.clock->Now() - options_.grace;
  std::vector<PodRelease> work;
  {
    absl::MutexLock l(&mu_);
    if (!synced_) return;
    ++stats_.sweeps;
    for (const Holding& h : holdings) {
      if (!PodOwned(h.owner)) continue;
      auto it = pods_.find(h.owner.pod_uid);
      if (it != pods_.end()) {
        if (it->second.terminal) {
          work.push_back({h, PodReleaseReason::kTerminal, it->second.ns, it->second.name});
        }
        continue;
      }
      if (h.granted_at > cutoff) continue;  // too young to judge
      work.push_back({h, PodReleaseReason::kOrphaned, h.owner.pod_namespace, h.owner.pod_name});
    }
  }
  for (const PodRelease& r : work) {
    if (r.reason == PodReleaseReason::kOrphaned) {
      // The pod may have shown up since the holdings were read.
      absl::MutexLock l(&mu_);
      if (pods_.contains(r.holding.owner.pod_uid)) continue;
    }
    Release(r);
  }
}

}  // namespace k8s
}  // namespace duet
