#include "bridge/ledger/types.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/enum_name.h"

namespace duet {

const char* NodeStateName(NodeState state) {
  static constexpr const char* kNames[] = {nullptr, "ready", "cordoned", "not-ready", "gone"};
  return EnumName(state, kNames);
}

bool Topology::operator==(const Topology& o) const {
  return nvlink_domain == o.nvlink_domain && tpu_host_bounds == o.tpu_host_bounds &&
         tpu_topology == o.tpu_topology && tpu_subslice_shapes == o.tpu_subslice_shapes &&
         block == o.block && subblock == o.subblock && host == o.host;
}

namespace {

struct ModelTable {
  absl::Mutex mu;
  absl::flat_hash_map<std::string, uint32_t> ids ABSL_GUARDED_BY(mu);
};

ModelTable& Models() {
  static ModelTable* table = new ModelTable();  // never destroyed
  return *table;
}

}  // namespace

uint32_t InternModel(const std::string& model) {
  ModelTable& t = Models();
  {
    absl::ReaderMutexLock lock(&t.mu);
    auto it = t.ids.find(model);
    if (it != t.ids.end()) return it->second;
  }
  absl::MutexLock lock(&t.mu);
  auto [it, inserted] = t.ids.try_emplace(model, static_cast<uint32_t>(t.ids.size() + 1));
  return it->second;
}

uint32_t FindModelId(const std::string& model) {
  ModelTable& t = Models();
  absl::ReaderMutexLock lock(&t.mu);
  auto it = t.ids.find(model);
  return it == t.ids.end() ? 0 : it->second;
}

bool DeviceSpec::operator==(const DeviceSpec& o) const {
  return kind == o.kind && index == o.index && id == o.id && model == o.model &&
         capacity_milli == o.capacity_milli && topology == o.topology;
}

Owner Owner::SlurmJob(uint32_t job_id) {
  Owner o;
  o.kind = OwnerKind::kSlurmJob;
  o.job_id = job_id;
  return o;
}

Owner Owner::SlurmStep(uint32_t job_id, uint32_t step_id) {
  Owner o;
  o.kind = OwnerKind::kSlurmStep;
  o.job_id = job_id;
  o.step_id = step_id;
  return o;
}

Owner Owner::Pod(std::string uid, std::string ns, std::string name) {
  Owner o;
  o.kind = OwnerKind::kPod;
  o.pod_uid = std::move(uid);
  o.pod_namespace = std::move(ns);
  o.pod_name = std::move(name);
  return o;
}

Owner Owner::Placeholder(uint32_t job_id, std::string pod_uid) {
  Owner o;
  o.kind = OwnerKind::kPlaceholder;
  o.job_id = job_id;
  o.pod_uid = std::move(pod_uid);
  return o;
}

Owner Owner::Claim(uint32_t job_id, std::string claim_uid, std::string ns, std::string name) {
  Owner o;
  o.kind = OwnerKind::kClaim;
  o.job_id = job_id;
  o.pod_uid = std::move(claim_uid);
  o.pod_namespace = std::move(ns);
  o.pod_name = std::move(name);
  return o;
}

Owner Owner::Lend(uint32_t job_id, const std::string& node) {
  Owner o;
  o.kind = OwnerKind::kLend;
  o.job_id = job_id;
  o.pod_uid = absl::StrCat(kLendGroupPrefix, node);
  return o;
}

Owner Owner::GangSlot(uint32_t job_id, const std::string& gang, uint32_t slot) {
  Owner o;
  o.kind = OwnerKind::kGangSlot;
  o.job_id = job_id;
  o.pod_uid = absl::StrCat(kGangSlotGroupPrefix, gang, "#", slot);
  return o;
}

bool ParseGangSlotUid(absl::string_view uid, std::string* gang, uint32_t* slot) {
  if (!absl::ConsumePrefix(&uid, kGangSlotGroupPrefix)) return false;
  const size_t hash = uid.rfind('#');
  if (hash == absl::string_view::npos || hash == 0) return false;
  const absl::string_view digits = uid.substr(hash + 1);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) {
    return false;
  }
  uint32_t n = 0;
  if (!absl::SimpleAtoi(digits, &n)) return false;
  *gang = std::string(uid.substr(0, hash));
  *slot = n;
  return true;
}

bool Owner::SameGroup(const Owner& o) const {
  if (holder_class() != o.holder_class()) return false;
  if (holder_class() == HolderClass::kSlurm) return job_id == o.job_id;
  return pod_uid == o.pod_uid;
}

namespace {
std::string StepName(uint32_t step_id) {
  switch (step_id) {
    case 0xfffffffb:
      return "batch";
    case 0xfffffffc:
      return "extern";
    case 0xfffffffd:
      return "interactive";
    default:
      return absl::StrCat(step_id);
  }
}
}  // namespace

std::string Owner::ToString() const {
  switch (kind) {
    case OwnerKind::kSlurmJob:
      return absl::StrCat("slurm job ", job_id);
    case OwnerKind::kSlurmStep:
      return absl::StrCat("slurm job ", job_id, " step ", StepName(step_id));
    case OwnerKind::kPod:
      if (pod_name.empty()) return absl::StrCat("pod uid ", pod_uid);
      return absl::StrCat("pod ", pod_namespace, "/", pod_name, " (uid ", pod_uid, ")");
    case OwnerKind::kPlaceholder:
      return absl::StrCat("slurm placeholder job ", job_id, " for pod uid ", pod_uid);
    case OwnerKind::kClaim:
      if (pod_name.empty()) return absl::StrCat("claim uid ", pod_uid, " on lend job ", job_id);
      return absl::StrCat("claim ", pod_namespace, "/", pod_name, " (uid ", pod_uid,
                          ") on lend job ", job_id);
    case OwnerKind::kLend: {
      absl::string_view node = pod_uid;
      absl::ConsumePrefix(&node, kLendGroupPrefix);
      return absl::StrCat("lend job ", job_id, " on node ", node);
    }
    case OwnerKind::kGangSlot: {
      std::string gang;
      uint32_t slot = 0;
      if (!ParseGangSlotUid(pod_uid, &gang, &slot)) {
        return absl::StrCat("gang job ", job_id, " slot ", pod_uid);
      }
      return absl::StrCat("gang ", gang, " slot ", slot, " (gang job ", job_id, ")");
    }
  }
  return "unknown owner";
}

}  // namespace duet
