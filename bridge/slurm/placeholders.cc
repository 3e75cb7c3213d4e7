#include "bridge/slurm/placeholders.h"

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"

namespace duet {

std::optional<PlaceholderPod> ParsePlaceholderComment(const std::string& comment) {
  if (!absl::StartsWith(comment, kPlaceholderCommentPrefix)) return std::nullopt;
  PlaceholderPod pod;
  for (absl::string_view kv : absl::StrSplit(comment, ' ', absl::SkipEmpty())) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    if (p.first == "uid") pod.uid = p.second;
    if (p.first == "ns") pod.ns = p.second;
    if (p.first == "name") pod.name = p.second;
  }
  if (pod.uid.empty()) return std::nullopt;
  return pod;
}

std::string PlaceholderComment(const Owner& pod) {
  return absl::StrCat(kPlaceholderCommentPrefix, "uid=", pod.pod_uid, " ns=", pod.pod_namespace,
                      " name=", pod.pod_name);
}

Placeholders::Placeholders(Ledger* ledger, SlurmClient* slurm) : ledger_(ledger), slurm_(slurm) {}

absl::StatusOr<Holding> Placeholders::Create(const Owner& pod, const std::string& node,
                                             uint32_t gpus, uint32_t tpus, uint32_t cpus,
                                             uint64_t memory_mib) {
  if (pod.kind != OwnerKind::kPod || pod.pod_uid.empty()) {
    return absl::InvalidArgumentError("placeholder: owner must be a pod with a uid");
  }
  if (gpus == 0 && tpus == 0) return absl::InvalidArgumentError("placeholder: no devices asked");
  auto view = ledger_->GetNode(node);
  if (!view) return absl::NotFoundError(absl::StrCat("node ", node, " is not in the ledger"));
  if (view->spec.state != NodeState::kReady) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node not usable: ", node, " is ", NodeStateName(view->spec.state), " in the ledger"));
  }
  SlurmAllocRequest req;
  req.node = node;
  req.job_name = absl::StrCat(kPlaceholderJobPrefix, pod.pod_namespace, "/", pod.pod_name);
  req.comment = PlaceholderComment(pod);
  req.gpus = gpus;
  req.tpus = tpus;
  req.cpus = cpus;
  req.memory_mib = memory_mib;
  req.spank_env = {absl::StrCat("DUET_POD_UID=", pod.pod_uid),
                   absl::StrCat("DUET_POD=", pod.pod_namespace, "/", pod.pod_name)};
  auto alloc = slurm_->AllocatePlaceholder(req);
  if (!alloc.ok()) return alloc.status();

  HoldRequest hold;
  hold.node = node;
  hold.owner = Owner::Placeholder(alloc->job_id, pod.pod_uid);
  for (uint32_t g : alloc->devices.gpus) hold.devices.push_back({DeviceKind::kGpu, g, kWholeDevice});
  for (uint32_t t : alloc->devices.tpus) hold.devices.push_back({DeviceKind::kTpu, t, kWholeDevice});
  auto held = ledger_->Hold(hold);
  if (!held.ok()) {
    // Slurm and the ledger disagree (e.g. a step registered devices Slurm
    // thinks are free). Do not keep a placeholder the ledger cannot record.
    absl::Status k = slurm_->KillJob(alloc->job_id);
    spdlog::warn("placeholder job {} for pod {} on {}: ledger refused Slurm's devices ({}); "
                 "cancel: {}",
                 alloc->job_id, pod.pod_uid, node, held.status().ToString(), k.ToString());
    return absl::Status(held.status().code(),
                        absl::StrCat("placeholder on ", node, ": ", held.status().message()));
  }
  return held->holding;
}

absl::Status Placeholders::Cancel(const std::string& node, const std::string& pod_uid) {
  for (const Holding& h : ledger_->ListHoldings(node)) {
    if (h.owner.kind != OwnerKind::kPlaceholder || h.owner.pod_uid != pod_uid) continue;
    absl::Status s = slurm_->KillJob(h.owner.job_id);
    if (!s.ok()) return s;
    auto r = ledger_->Release(node, h.owner);
    if (!r.ok()) return r.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Placeholders::ReleaseEnded(const std::string& node,
                                               const std::vector<HeldDevice>& devices) {
  int released = 0;
  for (const Holding& h : ledger_->ListHoldings(node)) {
    if (h.owner.kind != OwnerKind::kPlaceholder) continue;
    const bool overlaps = std::any_of(h.devices.begin(), h.devices.end(), [&](const HeldDevice& d) {
      return std::any_of(devices.begin(), devices.end(), [&](const HeldDevice& w) {
        return w.kind == d.kind && w.index == d.index;
      });
    });
    if (!overlaps) continue;
    absl::StatusOr<std::optional<SlurmJobInfo>> job = slurm_->GetJob(h.owner.job_id);
    if (!job.ok()) return job.status();
    if (job->has_value() && ((*job)->state == SlurmJobState::kRunning ||
                             (*job)->state == SlurmJobState::kSuspended)) {
      continue;  // a live placeholder: the refusal stands
    }
    absl::StatusOr<ReleaseResult> r = ledger_->Release(node, h.owner);
    if (!r.ok()) return r.status();
    if (r->released) {
      ++released;
      spdlog::info("placeholder job {} (pod {}) on {}: ended in Slurm ({}), released in the ledger",
                   h.owner.job_id, h.owner.pod_uid, node,
                   job->has_value() ? "no longer running" : "gone");
    }
  }
  return released;
}

}  // namespace duet
