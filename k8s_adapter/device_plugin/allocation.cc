#include "k8s_adapter/device_plugin/allocation.h"

#include <sys/stat.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/slurm/slurm_format.h"
#include "google/protobuf/util/time_util.h"
#include "k8s_adapter/common/pod_request.h"

namespace duet {
namespace node {
namespace {

v1::DeviceKind ProtoKind(DeviceKind kind) {
  return kind == DeviceKind::kGpu ? v1::DEVICE_KIND_GPU : v1::DEVICE_KIND_TPU;
}

bool IsSlurm(const v1::Owner& o) { return o.has_slurm_job() || o.has_slurm_step(); }

// The pod uid a holder belongs to, or "" for Slurm holders.
std::string PodUidOf(const v1::Owner& o) {
  if (o.has_pod()) return o.pod().uid();
  if (o.has_placeholder()) return o.placeholder().pod_uid();
  return "";
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// A count in milli-units as whole units, rounded up (and capped).
uint32_t WholeUnits(int64_t milli) {
  const int64_t units = milli / 1000 + (milli % 1000 > 0 ? 1 : 0);
  return static_cast<uint32_t>(std::min<int64_t>(units, std::numeric_limits<uint32_t>::max()));
}

}  // namespace

const ResourceSpec& ResourceFor(DeviceKind kind) {
  static const ResourceSpec kGpu{DeviceKind::kGpu, "nvidia.com/gpu", "duet-gpu.sock", "gpu-slot-"};
  static const ResourceSpec kTpu{DeviceKind::kTpu, "google.com/tpu", "duet-tpu.sock", "tpu-slot-"};
  return kind == DeviceKind::kGpu ? kGpu : kTpu;
}

std::string SlotId(DeviceKind kind, int slot) {
  return absl::StrCat(ResourceFor(kind).slot_prefix, slot);
}

std::optional<int> ParseSlotId(DeviceKind kind, const std::string& id) {
  const std::string prefix = ResourceFor(kind).slot_prefix;
  if (id.size() <= prefix.size() || id.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  int n = 0;
  if (!absl::SimpleAtoi(id.substr(prefix.size()), &n) || n < 0) return std::nullopt;
  if (SlotId(kind, n) != id) return std::nullopt;  // "gpu-slot-01" is not a slot ID
  return n;
}

int DeviceCount(const v1::Node& node, DeviceKind kind) {
  int n = 0;
  for (const auto& d : node.devices()) n += d.kind() == ProtoKind(kind);
  return n;
}

int SlurmHeldCount(const v1::Node& node, DeviceKind kind) {
  int n = 0;
  for (const auto& d : node.devices()) {
    if (d.kind() != ProtoKind(kind)) continue;
    for (const auto& h : d.holders()) {
      if (IsSlurm(h.owner())) {
        ++n;
        break;
      }
    }
  }
  return n;
}

std::set<std::string> PodUidsHolding(const v1::Node& node) {
  std::set<std::string> out;
  for (const auto& d : node.devices()) {
    for (const auto& h : d.holders()) {
      std::string uid = PodUidOf(h.owner());
      if (!uid.empty()) out.insert(std::move(uid));
    }
  }
  return out;
}

std::set<int> ChooseUnhealthy(int slots, int wanted, const std::set<int>& allocated,
                              const std::set<int>& previous) {
  wanted = std::max(0, std::min(wanted, slots));
  std::set<int> out;
  for (int s : previous) {
    if (static_cast<int>(out.size()) >= wanted) break;
    if (s < slots && !allocated.count(s)) out.insert(s);
  }
  for (int s = slots - 1; s >= 0 && static_cast<int>(out.size()) < wanted; --s) {
    if (!allocated.count(s)) out.insert(s);
  }
  for (int s = slots - 1; s >= 0 && static_cast<int>(out.size()) < wanted; --s) out.insert(s);
  return out;
}

std::vector<std::string> PreferredSlots(DeviceKind kind, const std::vector<std::string>& available,
                                        const std::vector<std::string>& must_include, int size) {
  std::vector<std::string> out;
  std::set<std::string> taken;
  for (const auto& id : must_include) {
    if (static_cast<int>(out.size()) >= size) break;
    if (taken.insert(id).second) out.push_back(id);
  }
  std::vector<std::pair<int, std::string>> rest;
  for (const auto& id : available) {
    if (taken.count(id)) continue;
    auto n = ParseSlotId(kind, id);
    rest.emplace_back(n ? *n : 1 << 30, id);
  }
  std::sort(rest.begin(), rest.end());
  for (const auto& [n, id] : rest) {
    if (static_cast<int>(out.size()) >= size) break;
    if (taken.insert(id).second) out.push_back(id);
  }
  return out;
}

std::vector<PodClaim> ClaimsOf(const std::vector<v1::Holding>& holdings, DeviceKind kind) {
  std::map<std::string, PodClaim> by_uid;
  for (const auto& h : holdings) {
    const std::string uid = PodUidOf(h.owner());
    if (uid.empty()) continue;
    PodClaim& c = by_uid[uid];
    c.uid = uid;
    if (h.owner().has_pod()) {
      c.ns = h.owner().pod().namespace_();
      c.name = h.owner().pod().name();
    } else {
      c.placeholder_job = h.owner().placeholder().job_id();
    }
    const std::string at = google::protobuf::util::TimeUtil::ToString(h.granted_at());
    if (c.granted_at.empty() || at < c.granted_at) c.granted_at = at;
    for (const auto& d : h.devices()) {
      if (d.kind() == ProtoKind(kind)) c.devices.push_back(d.index());
    }
  }
  std::vector<PodClaim> out;
  for (auto& [uid, c] : by_uid) {
    std::sort(c.devices.begin(), c.devices.end());
    c.devices.erase(std::unique(c.devices.begin(), c.devices.end()), c.devices.end());
    if (!c.devices.empty()) out.push_back(std::move(c));
  }
  return out;
}

absl::StatusOr<std::vector<PendingPod>> PendingPodsFromList(const nlohmann::json& list,
                                                            const std::string& node) {
  const nlohmann::json* items = k8s::Field(list, "items");
  if (items == nullptr || !items->is_array()) {
    return absl::InvalidArgumentError("pod list: no items array");
  }
  std::vector<PendingPod> out;
  for (size_t i = 0; i < items->size(); ++i) {
    const nlohmann::json& pod = (*items)[i];
    const std::string where = absl::StrCat("pod list items[", i, "]");
    const nlohmann::json* md = k8s::Field(pod, "metadata");
    const nlohmann::json* spec = k8s::Field(pod, "spec");
    if (md == nullptr || spec == nullptr) continue;
    if (!md->is_object() || !spec->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": metadata or spec is not an object"));
    }
    absl::StatusOr<std::string> node_name = k8s::StringField(*spec, "nodeName", where + ".spec");
    if (!node_name.ok()) return node_name.status();
    if (*node_name != node) continue;
    const nlohmann::json* deleting = k8s::Field(*md, "deletionTimestamp");
    if (deleting != nullptr && !deleting->is_null()) continue;
    const nlohmann::json* status = k8s::Field(pod, "status");
    if (status != nullptr && !status->is_null()) {
      absl::StatusOr<std::string> phase = k8s::StringField(*status, "phase", where + ".status");
      if (!phase.ok()) return phase.status();
      if (!phase->empty() && *phase != "Pending") continue;
    }
    PendingPod p;
    std::pair<const char*, std::string*> fields[] = {
        {"uid", &p.uid}, {"namespace", &p.ns}, {"name", &p.name}, {"creationTimestamp", &p.created}};
    for (auto& [key, value] : fields) {
      absl::StatusOr<std::string> v = k8s::StringField(*md, key, where + ".metadata");
      if (!v.ok()) return v.status();
      *value = std::move(*v);
    }
    if (p.uid.empty()) continue;
    // The same reading of the pod as the scheduler extender's.
    absl::StatusOr<k8s::ResourceList> request = k8s::EffectivePodRequest(pod);
    if (!request.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("pod ", p.ns, "/", p.name, ": ", request.status().message()));
    }
    p.gpus = WholeUnits(k8s::Amount(*request, ResourceFor(DeviceKind::kGpu).resource_name));
    p.tpus = WholeUnits(k8s::Amount(*request, ResourceFor(DeviceKind::kTpu).resource_name));
    if (p.gpus == 0 && p.tpus == 0) continue;
    p.cpus = WholeUnits(k8s::Amount(*request, "cpu"));
    constexpr int64_t kMilliMiB = int64_t{1000} << 20;
    const int64_t mem = k8s::Amount(*request, "memory");
    p.memory_mib = static_cast<uint64_t>(mem / kMilliMiB + (mem % kMilliMiB != 0 ? 1 : 0));
    out.push_back(std::move(p));
  }
  return out;
}

std::map<std::string, std::string> PodUidsByName(const nlohmann::json& list) {
  std::map<std::string, std::string> out;
  const nlohmann::json* items = k8s::Field(list, "items");
  if (items == nullptr || !items->is_array()) return out;
  for (const nlohmann::json& pod : *items) {
    const nlohmann::json* md = k8s::Field(pod, "metadata");
    if (md == nullptr) continue;
    absl::StatusOr<std::string> ns = k8s::StringField(*md, "namespace", "metadata");
    absl::StatusOr<std::string> name = k8s::StringField(*md, "name", "metadata");
    absl::StatusOr<std::string> uid = k8s::StringField(*md, "uid", "metadata");
    if (!ns.ok() || !name.ok() || !uid.ok()) continue;  // not a pod duet can name
    out[absl::StrCat(*ns, "/", *name)] = *uid;
  }
  return out;
}

absl::StatusOr<Match> MatchClaim(const MatchInput& in) {
  std::set<std::string> pending_uids;
  if (in.pending) {
    for (const auto& p : *in.pending) {
      if (p.count(in.kind) > 0) pending_uids.insert(p.uid);
    }
  }
  const PodClaim* best = nullptr;
  std::vector<uint32_t> best_left;
  auto key = [&](const PodClaim& c, size_t left) {
    return std::make_tuple(left != static_cast<size_t>(in.count), c.granted_at, c.uid);
  };
  for (const PodClaim& c : in.claims) {
    if (in.served.count(c.uid)) continue;
    if (in.pending && !pending_uids.count(c.uid)) continue;
    std::vector<uint32_t> left;
    auto it = in.handed_out.find(c.uid);
    for (uint32_t d : c.devices) {
      if (it == in.handed_out.end() ||
          std::find(it->second.begin(), it->second.end(), d) == it->second.end()) {
        left.push_back(d);
      }
    }
    if (left.size() < static_cast<size_t>(in.count)) continue;
    if (best == nullptr || key(c, left.size()) < key(*best, best_left.size())) {
      best = &c;
      best_left = std::move(left);
    }
  }
  if (best == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "no pod being admitted holds ", in.count, " unassigned ", DeviceKindName(in.kind),
        in.count == 1 ? "" : "s", " in the ledger on this node"));
  }
  Match m;
  m.claim = *best;
  m.devices.assign(best_left.begin(), best_left.begin() + in.count);
  return m;
}

std::optional<PendingPod> PickBypassPod(DeviceKind kind, int count,
                                        const std::vector<PendingPod>& pending,
                                        const std::vector<v1::Holding>& holdings) {
  std::set<std::string> holding_uids;
  for (const auto& h : holdings) holding_uids.insert(PodUidOf(h.owner()));
  const PendingPod* best = nullptr;
  auto key = [&](const PendingPod& p) {
    return std::make_tuple(p.count(kind) != static_cast<uint32_t>(count), p.created, p.uid);
  };
  for (const auto& p : pending) {
    if (p.count(kind) < static_cast<uint32_t>(count) || holding_uids.count(p.uid)) continue;
    if (best == nullptr || key(p) < key(*best)) best = &p;
  }
  if (best == nullptr) return std::nullopt;
  return *best;
}

absl::StatusOr<v1beta1::ContainerAllocateResponse> ContainerResponse(
    DeviceKind kind, const std::vector<uint32_t>& devices, const std::string& device_dir) {
  v1beta1::ContainerAllocateResponse r;
  auto add = [&](const std::string& name, bool required) -> absl::Status {
    const std::string host = absl::StrCat(device_dir, "/", name);
    if (!Exists(host)) {
      if (!required) return absl::OkStatus();
      return absl::FailedPreconditionError(
          absl::StrCat("device node ", host, " does not exist on this host"));
    }
    auto* d = r.add_devices();
    d->set_host_path(host);
    d->set_container_path(absl::StrCat("/dev/", name));
    d->set_permissions("rw");
    return absl::OkStatus();
  };
  if (kind == DeviceKind::kGpu) {
    for (uint32_t i : devices) {
      if (auto s = add(absl::StrCat("nvidia", i), true); !s.ok()) return s;
    }
    for (const char* ctl : {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}) {
      if (auto s = add(ctl, false); !s.ok()) return s;
    }
    std::vector<std::string> ordinals;
    for (size_t i = 0; i < devices.size(); ++i) ordinals.push_back(std::to_string(i));
    (*r.mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = FormatIndexList(devices);
    (*r.mutable_envs())["CUDA_VISIBLE_DEVICES"] = absl::StrJoin(ordinals, ",");
  } else {
    for (uint32_t i : devices) {
      if (auto s = add(absl::StrCat("accel", i), true); !s.ok()) return s;
    }
    HostDevices tpus;
    tpus.tpus = devices;
    for (const auto& [k, v] : DeviceEnv(tpus)) (*r.mutable_envs())[k] = v;
  }
  return r;
}

}  // namespace node
}  // namespace duet
