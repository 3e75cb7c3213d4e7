#include "bridge/slurm/placeholders.h"

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
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

std::optional<std::string> ParseLendComment(const std::string& comment) {
  if (!absl::StartsWith(comment, kLendCommentPrefix)) return std::nullopt;
  std::string node;
  for (absl::string_view kv : absl::StrSplit(comment, ' ', absl::SkipEmpty())) {
    std::pair<std::string, std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    if (p.first == "node") node = p.second;
  }
  if (node.empty()) return std::nullopt;
  return node;
}

std::string LendComment(const std::string& node) {
  return absl::StrCat(kLendCommentPrefix, "node=", node);
}

std::optional<gang::GangKey> ParseGangJobName(const std::string& job_name) {
  absl::string_view text = job_name;
  if (!absl::ConsumePrefix(&text, gang::kGangJobPrefix)) return std::nullopt;
  absl::StatusOr<gang::GangKey> key = gang::GangKey::Parse(std::string(text));
  if (!key.ok()) return std::nullopt;
  return *std::move(key);
}

std::string GangComment(const gang::GangKey& key, uint32_t slots) {
  return absl::StrCat(kGangCommentPrefix, "key=", key.ToString(), " slots=", slots);
}

Placeholders::Placeholders(Ledger* ledger, SlurmClient* slurm, PlaceholderJobOptions job_options)
    : ledger_(ledger), slurm_(slurm), job_options_(std::move(job_options)) {}

SlurmAllocRequest Placeholders::Request(const std::string& node) const {
  SlurmAllocRequest req;
  req.node = node;
  req.partition = job_options_.partition;
  req.qos = job_options_.qos;
  return req;
}

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
  SlurmAllocRequest req = Request(node);
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

absl::StatusOr<Holding> Placeholders::CreateLend(const std::string& node, DeviceKind kind,
                                                 uint32_t count) {
  if (count == 0) return absl::InvalidArgumentError("lend: no devices asked");
  auto view = ledger_->GetNode(node);
  if (!view) return absl::NotFoundError(absl::StrCat("node ", node, " is not in the ledger"));
  if (view->spec.state != NodeState::kReady) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node not usable: ", node, " is ", NodeStateName(view->spec.state), " in the ledger"));
  }
  SlurmAllocRequest req = Request(node);
  req.job_name = absl::StrCat(kLendJobPrefix, node);
  req.comment = LendComment(node);
  (kind == DeviceKind::kGpu ? req.gpus : req.tpus) = count;
  req.cpus = 1;
  req.memory_mib = 1;  // the least Slurm allocates; 0 would be the partition default
  auto alloc = slurm_->AllocatePlaceholder(req);
  if (!alloc.ok()) return alloc.status();

  HoldRequest hold;
  hold.node = node;
  hold.owner = Owner::Lend(alloc->job_id, node);
  for (uint32_t g : alloc->devices.gpus) hold.devices.push_back({DeviceKind::kGpu, g, kWholeDevice});
  for (uint32_t t : alloc->devices.tpus) hold.devices.push_back({DeviceKind::kTpu, t, kWholeDevice});
  absl::StatusOr<HoldResult> held =
      hold.devices.empty() ? absl::InternalError("Slurm gave the lend job no devices")
                           : ledger_->Hold(hold);
  if (!held.ok()) {
    // SlurmSync imports lend jobs by name: a pass that ran between Slurm's
    // answer and this hold may have recorded this very job already, and the
    // webhook may even have admitted a claim on its device since (Rebind
    // Lend -> Claim). Devices all held by this job's lend or by claims on it
    // are this lend, made: cancelling the job would take a claim's device
    // from under it.
    const uint32_t job = alloc->job_id;
    size_t ours = 0;
    const std::vector<Holding> holdings = ledger_->ListHoldings(node);
    for (const HeldDevice& d : hold.devices) {
      for (const Holding& h : holdings) {
        if (h.owner.job_id != job ||
            (h.owner.kind != OwnerKind::kLend && h.owner.kind != OwnerKind::kClaim)) {
          continue;
        }
        if (std::any_of(h.devices.begin(), h.devices.end(), [&d](const HeldDevice& x) {
              return x.kind == d.kind && x.index == d.index;
            })) {
          ++ours;
          break;
        }
      }
    }
    // (A job Slurm gave no devices is no lend at all: cancelled below.)
    if (!hold.devices.empty() && ours == hold.devices.size()) {
      spdlog::info("lend job {} on {}: already recorded (by the Slurm sync, or claimed since)",
                   job, node);
      Holding made;
      made.owner = hold.owner;
      made.node = node;
      made.devices = hold.devices;
      std::sort(made.devices.begin(), made.devices.end(),
                [](const HeldDevice& a, const HeldDevice& b) {
                  return std::tie(a.kind, a.index) < std::tie(b.kind, b.index);
                });
      return made;
    }
    absl::Status k = slurm_->KillJob(alloc->job_id);
    spdlog::warn("lend job {} on {}: ledger refused Slurm's devices ({}); cancel: {}",
                 alloc->job_id, node, held.status().ToString(), k.ToString());
    return absl::Status(held.status().code(),
                        absl::StrCat("lend on ", node, ": ", held.status().message()));
  }
  return held->holding;
}

absl::Status Placeholders::CancelLend(const std::string& node, uint32_t job_id) {
  // A claim holds what the job lent: cancelling would hand Slurm a device
  // Kubernetes uses.
  for (const Holding& h : ledger_->ListHoldings(node)) {
    if (h.owner.kind == OwnerKind::kClaim && h.owner.job_id == job_id) {
      return absl::FailedPreconditionError(absl::StrCat(
          "lend job ", job_id, " on ", node, ": its devices are allocated to ", h.owner.ToString()));
    }
  }
  DUET_RETURN_IF_ERROR(slurm_->KillJob(job_id));
  return ledger_->Release(node, Owner::Lend(job_id, node)).status();
}

absl::StatusOr<gang::GangAllocation> Placeholders::Create(const gang::GangKey& key,
                                                         const gang::GangSpec& spec,
                                                         const std::vector<gang::GangNode>& nodes) {
  const std::string gang = key.ToString();
  auto refuse = [&gang](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("gang ", gang, ": ", why));
  };
  const placement::PodRequest& member = spec.member;
  if (member.count == 0) return refuse("a member asks no device");
  if (member.milli != kWholeDevice) return refuse("a member asks a share of a device");
  if (member.kind != DeviceKind::kGpu && member.kind != DeviceKind::kTpu) {
    return refuse("a member asks neither GPUs nor TPUs");
  }
  if (nodes.empty()) return refuse("no nodes");
  const uint32_t per_node = nodes.front().members;
  uint64_t slots = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const gang::GangNode& n = nodes[i];
    if (n.members == 0 || n.members != per_node) {
      // One Slurm job asks the same GRES on every node (docs/gangs.md 3).
      return refuse(absl::StrCat("every node must get the same number of members (", nodes[0].node,
                                 " gets ", per_node, ", ", n.node, " gets ", n.members, ")"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (nodes[j].node == n.node) return refuse(absl::StrCat("node ", n.node, " is listed twice"));
    }
    slots += n.members;
  }
  if (slots != spec.min_member) {
    return refuse(absl::StrCat(slots, " slots placed for ", spec.min_member, " members"));
  }
  for (const gang::GangNode& n : nodes) {
    auto view = ledger_->GetNode(n.node);
    if (!view) return absl::NotFoundError(absl::StrCat("node ", n.node, " is not in the ledger"));
    if (view->spec.state != NodeState::kReady) {
      return absl::FailedPreconditionError(absl::StrCat(
          "node not usable: ", n.node, " is ", NodeStateName(view->spec.state), " in the ledger"));
    }
  }

  SlurmGangRequest req;
  for (const gang::GangNode& n : nodes) req.nodes.push_back(n.node);
  req.job_name = absl::StrCat(gang::kGangJobPrefix, gang);
  req.comment = GangComment(key, static_cast<uint32_t>(slots));
  (member.kind == DeviceKind::kGpu ? req.gpus_per_node : req.tpus_per_node) =
      per_node * member.count;
  req.cpus_per_node = static_cast<uint32_t>(
      std::max<uint64_t>(1, (uint64_t{per_node} * member.cpu_milli + 999) / 1000));
  req.memory_mib_per_node = uint64_t{per_node} * member.memory_mib;
  req.spank_env = {absl::StrCat("DUET_GANG=", gang)};
  req.partition = job_options_.partition;
  req.qos = job_options_.qos;
  absl::StatusOr<SlurmGangAllocation> alloc = slurm_->AllocateGang(req);
  if (!alloc.ok()) return alloc.status();

  gang::GangAllocation out;
  out.job_id = alloc->job_id;
  // Undoes everything: the slots recorded so far, then the job.
  auto roll_back = [&](const absl::Status& why) {
    for (const Holding& h : out.slots) (void)ledger_->Release(h.node, h.owner);
    absl::Status k = slurm_->KillJob(alloc->job_id);
    spdlog::warn("gang job {} of {}: {}; slots released, cancel: {}", alloc->job_id, gang,
                 why.ToString(), k.ToString());
    return absl::Status(why.code(), absl::StrCat("gang ", gang, ": ", why.message()));
  };
  uint32_t slot = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const SlurmJobNodeDevices* got = nullptr;
    for (const SlurmJobNodeDevices& d : alloc->nodes) {
      if (d.node == nodes[i].node) got = &d;
    }
    std::vector<uint32_t> indices;
    if (got != nullptr) indices = member.kind == DeviceKind::kGpu ? got->gpus : got->tpus;
    std::sort(indices.begin(), indices.end());
    if (indices.size() != uint64_t{per_node} * member.count) {
      return roll_back(absl::InternalError(absl::StrCat(
          "Slurm gave job ", alloc->job_id, " ", DeviceKindName(member.kind), " [",
          FormatIndexList(indices), "] on ", nodes[i].node, ", asked ", per_node * member.count)));
    }
    for (uint32_t m = 0; m < per_node; ++m, ++slot) {
      HoldRequest hold;
      hold.node = nodes[i].node;
      hold.owner = Owner::GangSlot(alloc->job_id, gang, slot);
      for (uint32_t k = 0; k < member.count; ++k) {
        hold.devices.push_back({member.kind, indices[m * member.count + k], kWholeDevice});
      }
      absl::StatusOr<HoldResult> held = ledger_->Hold(hold);
      if (!held.ok()) {
        // Slurm and the ledger disagree (e.g. a step registered devices
        // Slurm thinks are free): no slot the ledger cannot record.
        return roll_back(absl::Status(
            held.status().code(), absl::StrCat("slot ", slot, " on ", nodes[i].node, ": ",
                                               held.status().message())));
      }
      out.seq = std::max(out.seq, held->seq);
      out.slots.push_back(held->holding);
    }
  }
  return out;
}

absl::Status Placeholders::Cancel(const gang::GangKey& key, uint32_t job_id) {
  if (job_id == 0) return absl::InvalidArgumentError("gang cancel: job id 0");
  const std::string name = absl::StrCat(gang::kGangJobPrefix, key.ToString());
  DUET_ASSIGN_OR_RETURN(std::optional<SlurmJobInfo> job, slurm_->GetJob(job_id));
  if (job.has_value() && job->live() && job->name != name) {
    // Never end someone else's job on a wrong id.
    return absl::FailedPreconditionError(absl::StrCat(
        "gang cancel: Slurm job ", job_id, " is \"", job->name, "\", not ", name));
  }
  DUET_RETURN_IF_ERROR(slurm_->KillJob(job_id));
  for (const Holding& h : ledger_->ListHoldings()) {
    if (h.owner.job_id != job_id) continue;
    if (h.owner.kind != OwnerKind::kGangSlot && h.owner.kind != OwnerKind::kPlaceholder) continue;
    DUET_RETURN_IF_ERROR(ledger_->Release(h.node, h.owner).status());
  }
  return absl::OkStatus();
}

namespace {

// The device indices of `kind` in `devices`, sorted.
std::vector<uint32_t> IndicesOf(const std::vector<HeldDevice>& devices, DeviceKind kind) {
  std::vector<uint32_t> out;
  for (const HeldDevice& d : devices) {
    if (d.kind == kind) out.push_back(d.index);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

absl::StatusOr<std::vector<Holding>> Placeholders::Repair(const Holding& lost,
                                                          const PlaceholderPod& pod, uint32_t cpus,
                                                          uint64_t memory_mib) {
  if (lost.owner.kind != OwnerKind::kPlaceholder) {
    return absl::InvalidArgumentError("repair: not a placeholder holding");
  }
  auto view = ledger_->GetNode(lost.node);
  if (!view) return absl::NotFoundError(absl::StrCat("node ", lost.node, " is not in the ledger"));
  const Owner group = Owner::Pod(lost.owner.pod_uid);

  struct Made {
    uint32_t job_id;
    bool piece;
    std::vector<HeldDevice> devices;
  };
  std::vector<Made> made;
  auto cancel_all = [&](const absl::Status& why) {
    for (const Made& m : made) (void)slurm_->KillJob(m.job_id);
    return why;
  };

  bool first_piece = true;
  for (DeviceKind kind : {DeviceKind::kGpu, DeviceKind::kTpu}) {
    const std::vector<uint32_t> want = IndicesOf(lost.devices, kind);
    if (want.empty()) continue;
    // Devices of this kind that Slurm should see free: nobody outside the
    // pod's group holds them in the ledger. Only those up to the pod's last.
    std::vector<std::pair<uint32_t, bool>> order;  // index, wanted
    for (const DeviceState& d : view->devices) {
      if (d.spec.kind != kind || d.spec.index > want.back()) continue;
      const bool others = std::any_of(d.uses.begin(), d.uses.end(), [&](const DeviceUse& u) {
        return !u.owner->SameGroup(group);
      });
      const bool wanted = std::binary_search(want.begin(), want.end(), d.spec.index);
      if (others && wanted) {
        return absl::FailedPreconditionError(
            absl::StrCat("repair: ", DeviceKindName(kind), " ", d.spec.index, " on ", lost.node,
                         " is also held by another owner in the ledger"));
      }
      if (!others) order.emplace_back(d.spec.index, wanted);
    }
    std::sort(order.begin(), order.end());
    // Runs of wanted / unwanted devices, in index order: each becomes one job.
    for (size_t i = 0; i < order.size();) {
      size_t j = i;
      std::vector<uint32_t> run;
      while (j < order.size() && order[j].second == order[i].second)
        run.push_back(order[j++].first);
      const bool piece = order[i].second;
      i = j;
      SlurmAllocRequest req = Request(lost.node);
      req.job_name =
          piece ? absl::StrCat(kPlaceholderJobPrefix, pod.ns, "/", pod.name) : "duet-repair-filler";
      req.comment =
          piece ? PlaceholderComment(Owner::Pod(pod.uid, pod.ns, pod.name)) : "duet-repair-filler";
      (kind == DeviceKind::kGpu ? req.gpus : req.tpus) = static_cast<uint32_t>(run.size());
      req.cpus = piece && first_piece ? std::max<uint32_t>(1, cpus) : 1;
      req.memory_mib = piece && first_piece ? memory_mib : 0;
      if (piece) {
        req.spank_env = {absl::StrCat("DUET_POD_UID=", pod.uid),
                         absl::StrCat("DUET_POD=", pod.ns, "/", pod.name)};
      }
      absl::StatusOr<SlurmAllocation> alloc = slurm_->AllocatePlaceholder(req);
      if (!alloc.ok()) return cancel_all(alloc.status());
      const std::vector<uint32_t>& got =
          kind == DeviceKind::kGpu ? alloc->devices.gpus : alloc->devices.tpus;
      const std::vector<uint32_t>& other =
          kind == DeviceKind::kGpu ? alloc->devices.tpus : alloc->devices.gpus;
      Made m{alloc->job_id, piece, {}};
      for (uint32_t x : run) m.devices.push_back({kind, x, kWholeDevice});
      made.push_back(m);
      if (got != run || !other.empty()) {
        return cancel_all(absl::FailedPreconditionError(
            absl::StrCat("repair: Slurm gave job ", alloc->job_id, " ", DeviceKindName(kind), " ",
                         FormatIndexList(got), " on ", lost.node, ", not ", FormatIndexList(run))));
      }
      if (piece) first_piece = false;
    }
  }
  // Record the new pieces, then drop the lost one: the pod's group holds the
  // devices throughout. slurmctld may reuse the lost job's id (it lost the
  // job, e.g. in a crash, and numbers from its saved state): a piece with
  // that id *is* the lost owner, whose holding is already there and must
  // neither be released nor rolled back.
  std::vector<Holding> out;
  std::vector<Holding> created;
  bool reused = false;
  for (const Made& m : made) {
    if (!m.piece) continue;
    HoldRequest hold;
    hold.node = lost.node;
    hold.owner = Owner::Placeholder(m.job_id, lost.owner.pod_uid);
    hold.devices = m.devices;
    absl::StatusOr<HoldResult> held = ledger_->Hold(hold);
    if (!held.ok()) {
      for (const Holding& h : created) (void)ledger_->Release(h.node, h.owner);
      return cancel_all(held.status());
    }
    if (hold.owner == lost.owner) {
      reused = true;
    } else if (held->created) {
      created.push_back(held->holding);
    }
    out.push_back(held->holding);
  }
  for (const Made& m : made) {
    if (!m.piece) (void)slurm_->KillJob(m.job_id);
  }
  if (reused) {
    spdlog::warn("placeholder repair on {}: Slurm reused job id {} of the lost placeholder of pod "
                 "{}; its ledger holding stays as it is",
                 lost.node, lost.owner.job_id, lost.owner.pod_uid);
  } else {
    (void)ledger_->Release(lost.node, lost.owner);
  }
  return out;
}

}  // namespace duet
