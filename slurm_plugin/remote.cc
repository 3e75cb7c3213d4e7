#include "slurm_plugin/remote.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/reason.h"
#include "common/slurm/slurm_format.h"
#include "common/slurm/slurm_compat.h"
#include "slurm_plugin/bridge_client.h"
#include "slurm_plugin/slurmctld_retry.h"
#include "slurm_plugin/step_devices.h"

namespace duet::spank {
namespace {

// spank_getenv into a string; empty when unset.
std::string GetEnv(spank_t sp, const char* name) {
  char buf[4096];
  if (spank_getenv(sp, name, buf, sizeof(buf)) != ESPANK_SUCCESS) return "";
  return buf;
}

// The Slurm node this slurmstepd serves. slurmstepd puts slurmd's own node
// name into its process environment (SLURMD_NODENAME, from the configuration
// slurmd hands it) before any plugin runs; the step's environment
// (spank_getenv) is the user's, inherited from a batch script or set by hand,
// and names whatever node the user likes. So only the process environment is
// read: a step's holding is always recorded on the node it runs on.
absl::StatusOr<std::string> NodeName() {
  const char* name = ::getenv("SLURMD_NODENAME");
  if (name == nullptr || name[0] == '\0') {
    return absl::InternalError(
        "slurmstepd's environment has no SLURMD_NODENAME: cannot tell which node this step "
        "runs on");
  }
  return std::string(name);
}

bool WantTpuProbe(const PluginConfig& c) {
  switch (c.tpu) {
    case TpuProbe::kYes: return true;
    case TpuProbe::kNo: return false;
    case TpuProbe::kAuto:
      return access("/dev/accel0", F_OK) == 0 || access("/dev/vfio/0", F_OK) == 0;
  }
  return false;
}

// The job's TPU indices on each of its nodes, from its GRES detail
// (slurmctld RPC).
absl::StatusOr<JobTpus> LoadJobTpus(uint32_t job_id) {
  job_info_msg_t* msg = nullptr;
  const std::string what = absl::StrCat("TPU probe of job ", job_id);
  if (RetryWhileSlurmctldUnreachable(what.c_str(), [&] {
        return slurm_compat::LoadJob(&msg, job_id, SHOW_DETAIL);
      }) != SLURM_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("cannot load job ", job_id, " from slurmctld: ",
                                               slurm_strerror(slurm_compat::LastError())));
  }
  JobTpus tpus;
  for (uint32_t i = 0; msg && i < msg->record_count; ++i) {
    const slurm_job_info_t& j = msg->job_array[i];
    if (j.job_id != job_id) continue;
    std::vector<std::string> hosts = slurm_compat::ExpandHostlist(j.nodes);
    for (size_t n = 0; n < hosts.size(); ++n) {
      if (n >= j.gres_detail_cnt || !j.gres_detail_str[n]) continue;
      SlurmJobNodeDevices d;
      absl::Status s = ParseGresDetail(j.gres_detail_str[n], &d);
      if (s.ok()) {
        tpus.emplace(hosts[n], std::move(d.tpus));
      } else {
        tpus.emplace(hosts[n], std::move(s));
      }
    }
  }
  slurm_free_job_info_msg(msg);
  return tpus;
}

bool IsUnreachable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

// Never longer than this, whatever a bridge says (slurm.preemption_wait is
// at most 1 h).
constexpr absl::Duration kMaxEvictionWait = absl::Hours(1);

// Slurm preempted a pod's placeholder for this job, and the bridge is
// evicting the pod (POD_EVICTING): asks again each second until the devices
// are free or the bridge's wait (metadata wait_s, renewed with each answer)
// is over. Returns the last answer.
absl::Status WaitForEvictedPod(BridgeClient& bridge, const RemoteState& st,
                               const StepDevices& devices, absl::Status s) {
  const absl::Time start = absl::Now();
  const std::string step = absl::StrCat(st.job_id, ".", st.step_id);
  bool said = false;
  while (ReasonOf(s) == v1::reason::kPodEvicting) {
    const auto meta = ReasonMetadata(s);
    int64_t wait_s = 0;
    if (auto it = meta.find("wait_s"); it != meta.end()) wait_s = std::atoll(it->second.c_str());
    const absl::Time now = absl::Now();
    const absl::Time deadline = std::min(now + absl::Seconds(wait_s), start + kMaxEvictionWait);
    if (now >= deadline) break;
    if (!said) {
      const auto holder = meta.find("holder");
      slurm_info("duet: step %s on %s waits up to %lld s for pod %s to leave its devices "
                 "(Slurm preempted the pod's placeholder for this job)",
                 step.c_str(), st.node.c_str(), static_cast<long long>(wait_s),
                 holder != meta.end() ? holder->second.c_str() : "?");
      said = true;
    }
    absl::SleepFor(std::min(absl::Seconds(1), deadline - now));
    s = bridge.HoldStep(st.node, st.job_id, st.step_id, devices);
  }
  if (said && s.ok()) {
    slurm_info("duet: step %s on %s got its devices after %.1f s", step.c_str(), st.node.c_str(),
               absl::ToDoubleSeconds(absl::Now() - start));
  } else if (said) {
    s = WithMessage(s, absl::StrCat("waited ", absl::FormatDuration(absl::Trunc(absl::Now() - start,
                                                                                 absl::Seconds(1))),
                                    " for the pod on its devices to be evicted (Slurm preempted "
                                    "its placeholder for this job), and the pod is still there (a "
                                    "PodDisruptionBudget may forbid the eviction; see "
                                    "duet_pod_evictions_total): ",
                                    s.message()));
  }
  return s;
}

}  // namespace

void RemoteInitPostOpt(spank_t sp, const PluginConfig& config, RemoteState* st) {
  if (config.disabled || !WantTpuProbe(config)) return;
  uint32_t job_id = 0;
  if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS) {
    st->job_tpus = absl::InternalError("cannot read the job id");
    return;
  }
  st->job_tpus = LoadJobTpus(job_id);
  if (auto node = NodeName(); node.ok()) st->tpu_slice = LoadTpuSliceFacts(job_id, *node);
}

absl::Status RemoteUserInit(spank_t sp, const PluginConfig& config, RemoteState* st) {
  if (config.disabled) return absl::OkStatus();
  if (GetEnv(sp, "SLURM_DUET_SHOW") == "1") st->show = true;
  if (spank_get_item(sp, S_JOB_ID, &st->job_id) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_STEPID, &st->step_id) != ESPANK_SUCCESS) {
    return absl::InternalError("cannot read the job and step ids");
  }
  const std::string step = absl::StrCat(st->job_id, ".", st->step_id);

  StepDevices devices;
  const std::string step_gpus = GetEnv(sp, "SLURM_STEP_GPUS");
  const std::string job_gpus = GetEnv(sp, "SLURM_JOB_GPUS");
  const std::string cuda = GetEnv(sp, "CUDA_VISIBLE_DEVICES");
  auto gpus = GpusFromEnv(step_gpus.c_str(), job_gpus.c_str(), cuda.c_str());
  if (!gpus.ok()) return gpus.status();
  devices.gpus = *gpus;

  auto node = NodeName();
  if (!node.ok()) return node.status();
  st->node = *node;

  if (WantTpuProbe(config)) {
    if (!st->job_tpus.has_value()) {
      return absl::InternalError("the TPU probe did not run (slurm_spank_init_post_opt)");
    }
    if (!st->job_tpus->ok()) return st->job_tpus->status();
    auto it = (*st->job_tpus)->find(st->node);
    if (it != (*st->job_tpus)->end()) {
      if (!it->second.ok()) return it->second.status();
      devices.tpus = *it->second;
    }
  }
  if (devices.empty() && !st->show) return absl::OkStatus();

  BridgeClient bridge(config.bridge, config.timeout_ms);
  bridge.UseAuth(config.auth, config.munge_socket, config.slurm_key);
  if (!devices.empty()) {
    absl::Status s = bridge.HoldStep(st->node, st->job_id, st->step_id, devices);
    if (ReasonOf(s) == v1::reason::kPodEvicting) s = WaitForEvictedPod(bridge, *st, devices, s);
    if (s.ok()) {
      st->registered = true;
    } else if (IsUnreachable(s) && config.on_unreachable == OnUnreachable::kAllow) {
      slurm_info("duet: step %s on %s runs unregistered: bridge %s unreachable (%s)",
                 step.c_str(), st->node.c_str(), config.bridge.c_str(),
                 std::string(s.message()).c_str());
    } else if (ReasonOf(s) == v1::reason::kNodeNotShared) {
      // The bridge says it does not know this node: not shared with
      // Kubernetes, nothing to fence. Decided on the reason alone: any other
      // NOT_FOUND (a device the ledger does not know on a shared node, or an
      // older bridge that sends no reason) refuses the step.
    } else if (ReasonOf(s) == v1::reason::kDeviceUnknown) {
      const auto meta = ReasonMetadata(s);
      const auto dev = meta.find("device");
      return absl::Status(
          s.code(),
          absl::StrCat("step ", step, " refused on node ", st->node, ": Slurm gave it ",
                       dev != meta.end() ? dev->second : "a device",
                       ", which duet's inventory of this shared node does not list, so it "
                       "cannot be fenced from Kubernetes pods (check the node's gres.conf "
                       "against duet's inventory): ",
                       s.message()));
    } else if (IsUnreachable(s)) {
      return absl::UnavailableError(
          absl::StrCat("step ", step, " on ", st->node, " refused: duet-bridge ", config.bridge,
                       " unreachable (", s.message(), "); plugstack on_unreachable=fail"));
    } else if (const std::string refused = DescribeCredentialRefusal(s); !refused.empty()) {
      // One line on the user's stderr that says which check failed.
      return absl::Status(s.code(),
                          absl::StrCat("step ", step, " refused on node ", st->node, ": ", refused));
    } else {
      return absl::Status(s.code(), absl::StrCat("step ", step, " refused on node ", st->node,
                                                 ": ", s.message()));
    }
  }

  for (const auto& [name, value] : DeviceEnv(devices)) {
    // Slurm's own CUDA_VISIBLE_DEVICES stays (it may be renumbered under a
    // device cgroup); the TPU variables are ours.
    if (name == "CUDA_VISIBLE_DEVICES" && !cuda.empty()) continue;
    spank_setenv(sp, name.c_str(), value.c_str(), 1);
  }
  if (!devices.tpus.empty() && st->tpu_slice.has_value()) {
    // A step on a multi-host TPU slice: TPU_WORKER_ID, TPU_WORKER_HOSTNAMES.
    absl::Status s = st->tpu_slice->ok() ? ExportTpuSliceEnv(sp, st->node, **st->tpu_slice)
                                         : st->tpu_slice->status();
    if (!s.ok()) {
      slurm_info("duet: step %s on %s: %s", step.c_str(), st->node.c_str(),
                 std::string(s.message()).c_str());
    }
  }

  if (st->show) {
    auto holdings = bridge.ListHoldings(st->node);
    const std::string others =
        holdings.ok() ? DescribeOthers(*holdings, st->job_id)
                      : absl::StrCat("unknown (", holdings.status().message(), ")");
    slurm_error("duet: step %s on %s got %s; sharing the node with: %s", step.c_str(),
                st->node.c_str(), DescribeDevices(devices).c_str(), others.c_str());
  }
  return absl::OkStatus();
}

absl::Status RemoteExit(spank_t sp, const PluginConfig& config, RemoteState* st) {
  if (!st->registered) return absl::OkStatus();
  st->registered = false;
  BridgeClient bridge(config.bridge, config.timeout_ms);
  bridge.UseAuth(config.auth, config.munge_socket, config.slurm_key);
  absl::Status s = bridge.ReleaseStep(st->node, st->job_id, st->step_id);
  if (!s.ok()) {
    // Job import releases it once the job has ended.
    const std::string refused = DescribeCredentialRefusal(s);
    return absl::Status(s.code(), absl::StrCat("release of step ", st->job_id, ".", st->step_id,
                                               " on ", st->node, " failed: ",
                                               refused.empty() ? s.message() : refused));
  }
  if (st->step_id == SLURM_BATCH_SCRIPT) {
    // The batch script has ended, so the job has: what job import recorded
    // for it on this node goes now, not at the next sync pass, so the
    // ledger is current when Slurm starts the next job on these devices.
    s = bridge.ReleaseJob(st->node, st->job_id);
    if (!s.ok()) {
      const std::string refused = DescribeCredentialRefusal(s);
      return absl::Status(s.code(), absl::StrCat("release of job ", st->job_id, " on ", st->node,
                                                 " failed: ",
                                                 refused.empty() ? s.message() : refused));
    }
  }
  return absl::OkStatus();
}

}  // namespace duet::spank
