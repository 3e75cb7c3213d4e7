// SlurmSync's view of Slurm's nodes for the extender (slurm_sync.h):
// SlurmNodeLoads (CPU and memory Slurm jobs hold per node, and why a node
// takes no placeholder), UnusableReason and ReservationReason.

#include "bridge/slurm/slurm_sync.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace duet {


std::string UnusableReason(const SlurmNodeInfo& n) {
  if (n.future) return "";
  const std::string why = n.reason.empty() ? "" : absl::StrCat(" (", n.reason, ")");
  if (n.down) return absl::StrCat("down in Slurm", why);
  if (n.drain) return absl::StrCat("drained in Slurm", why);
  if (n.not_responding) return "not responding in Slurm";
  // Flags under which Slurm starts no new job on an otherwise idle node.
  if (n.reboot) return absl::StrCat("reboot requested in Slurm", why);
  if (n.failing) return absl::StrCat("failing in Slurm", why);
  if (n.powered_down) return absl::StrCat("powered down in Slurm", why);
  if (n.invalid_registration) return absl::StrCat("invalid registration in Slurm", why);
  return "";
}

std::string ReservationReason(const SlurmReservationInfo& r, absl::Time now) {
  if (r.end <= now) return "";
  std::string who;
  if (!r.users.empty()) absl::StrAppend(&who, " for users ", r.users);
  if (!r.accounts.empty()) absl::StrAppend(&who, who.empty() ? " for" : ",", " accounts ",
                                           r.accounts);
  const std::string when = r.start <= now
                               ? absl::StrCat("until ", absl::FormatTime(absl::RFC3339_sec, r.end,
                                                                         absl::UTCTimeZone()))
                               : absl::StrCat("from ", absl::FormatTime(absl::RFC3339_sec, r.start,
                                                                        absl::UTCTimeZone()),
                                              " (a placeholder has no end and would overlap it)");
  return absl::StrCat("reserved in Slurm: reservation ", r.name, r.maint ? " (MAINT)" : "", who,
                      " ", when);
}

void SlurmNodeLoads::Replace(const std::vector<SlurmNodeInfo>& nodes,
                             const std::vector<SlurmReservationInfo>& reservations,
                             absl::Time now) {
  absl::flat_hash_map<std::string, placement::NodeLoad> fresh;
  absl::flat_hash_map<std::string, std::pair<std::string, std::string>> states;
  absl::flat_hash_map<std::string, std::string> unusable;
  fresh.reserve(nodes.size());
  states.reserve(nodes.size());
  for (const SlurmNodeInfo& n : nodes) {
    states[n.name] = {n.state, n.reason};
    std::string why = UnusableReason(n);
    if (!why.empty()) unusable[n.name] = std::move(why);
    if (n.alloc_cpus == 0 && n.alloc_memory_mib == 0) continue;
    fresh[n.name] = placement::NodeLoad{uint64_t{n.alloc_cpus} * 1000, n.alloc_memory_mib};
  }
  // The earliest reservation of each node that is not over; a node state
  // that already refuses placeholders keeps its own reason.
  absl::flat_hash_map<std::string, const SlurmReservationInfo*> first;
  for (const SlurmReservationInfo& r : reservations) {
    if (r.end <= now) continue;
    for (const std::string& node : r.nodes) {
      auto [it, added] = first.emplace(node, &r);
      if (!added && r.start < it->second->start) it->second = &r;
    }
  }
  for (const auto& [node, r] : first) {
    if (!states.contains(node) || unusable.contains(node)) continue;
    unusable[node] = ReservationReason(*r, now);
  }
  absl::MutexLock lock(&mu_);
  loads_.swap(fresh);
  states_.swap(states);
  unusable_.swap(unusable);
  unusable_count_.store(unusable_.size());
}

std::string SlurmNodeLoads::Unusable(const std::string& node) const {
  if (unusable_count_.load(std::memory_order_relaxed) == 0) return "";
  absl::ReaderMutexLock lock(&mu_);
  auto it = unusable_.find(node);
  return it == unusable_.end() ? "" : it->second;
}

std::pair<std::string, std::string> SlurmNodeLoads::State(const std::string& node) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = states_.find(node);
  return it == states_.end() ? std::pair<std::string, std::string>() : it->second;
}

void SlurmNodeLoads::Add(const std::string& node, const placement::NodeLoad& load) {
  absl::MutexLock lock(&mu_);
  placement::NodeLoad& l = loads_[node];
  l.cpu_milli += load.cpu_milli;
  l.memory_mib += load.memory_mib;
}

void SlurmNodeLoads::MarkUnusable(const std::string& node, const std::string& state,
                                  const std::string& why) {
  absl::MutexLock lock(&mu_);
  states_[node] = {state, why};
  unusable_[node] = why;
  unusable_count_.store(unusable_.size());
}

placement::NodeLoad SlurmNodeLoads::Get(const std::string& node) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = loads_.find(node);
  return it == loads_.end() ? placement::NodeLoad{} : it->second;
}

}  // namespace duet
