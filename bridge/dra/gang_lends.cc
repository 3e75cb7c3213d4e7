#include "bridge/dra/gang_lends.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bridge/dra/lender.h"

namespace duet {
namespace dra {

GangLends::GangLends(gang::GangRegistry* registry, const Clock* clock, absl::Duration member_ttl)
    : registry_(registry),
      clock_(clock != nullptr ? clock : Clock::Real()),
      member_ttl_(member_ttl) {}

gang::Admission GangLends::Lend(const gang::GangSpec& spec, const gang::MemberRef& member) {
  {
    absl::MutexLock lock(&mu_);
    members_[member.uid] = Member{spec.key, clock_->Now()};
  }
  return registry_->Admit(spec, member);
}

AdmissionVerdict GangLends::Admit(const Owner& slot, const std::vector<std::string>& pods) const {
  absl::StatusOr<std::pair<gang::GangKey, uint32_t>> parsed = gang::ParseSlotUid(slot.pod_uid);
  if (!parsed.ok()) {
    return {false, kReasonGangMembersOnly,
            absl::StrCat(slot.ToString(), " is no gang slot duet knows: ",
                         parsed.status().message())};
  }
  const gang::GangKey& key = parsed->first;
  const std::string gang = key.ToString();
  if (pods.empty()) {
    return {false, kReasonGangMembersOnly,
            absl::StrCat("the device is lent to gang ", gang,
                         " only; the claim names no pod (status.reservedFor, ownerReferences)")};
  }
  bool member = false;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& uid : pods) {
      auto it = members_.find(uid);
      member = member || (it != members_.end() && it->second.key == key);
    }
  }
  if (!member) {
    return {false, kReasonGangMembersOnly,
            absl::StrCat("the device is lent to gang ", gang, " only; the claim's pods (uid ",
                         absl::StrJoin(pods, ", "), ") are not its members")};
  }
  std::optional<gang::GangInfo> info = registry_->Find(key);
  if (!info.has_value() || info->job_id != slot.job_id) {
    return {false, kReasonGangMembersOnly,
            absl::StrCat("gang ", gang, " holds no Slurm job ", slot.job_id, " now")};
  }
  if (info->state != gang::GangState::kComplete) {
    return {false, kReasonGangWaiting,
            absl::StrCat("gang ", gang, ": ", info->members, "/", info->slots,
                         " members are pending; no member gets its devices before all do")};
  }
  return {true, "", ""};
}

bool GangLends::InUse(const Ledger& ledger, uint32_t job_id, const std::vector<std::string>& nodes) {
  for (const std::shared_ptr<const NodeView>& view : ledger.GetNodes(nodes)) {
    if (view == nullptr) continue;
    for (const DeviceState& d : view->devices) {
      for (const DeviceUse& u : d.uses) {
        if (u.owner->kind == OwnerKind::kClaim && u.owner->job_id == job_id) return true;
      }
    }
  }
  return false;
}

std::optional<gang::GangKey> GangLends::MemberOf(const std::string& pod_uid) const {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(pod_uid);
  if (it == members_.end()) return std::nullopt;
  return it->second.key;
}

void GangLends::Prune() {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  for (auto it = members_.begin(); it != members_.end();) {
    it = now - it->second.seen > member_ttl_ ? members_.erase(it) : std::next(it);
  }
}

}  // namespace dra
}  // namespace duet
