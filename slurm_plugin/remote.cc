#include "slurm_plugin/remote.h"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bridge/common/reason.h"
#include "bridge/slurm/slurm_client.h"
#include "slurm_plugin/bridge_client.h"
#include "slurm_plugin/step_devices.h"

extern "C" {
#include <slurm/slurm.h>
}

namespace duet::spank {
namespace {

// spank_getenv into a string; empty when unset.
std::string GetEnv(spank_t sp, const char* name) {
  char buf[4096];
  if (spank_getenv(sp, name, buf, sizeof(buf)) != ESPANK_SUCCESS) return "";
  return buf;
}

std::vector<std::string> ExpandHosts(const std::string& expr) {
  std::vector<std::string> out;
  if (expr.empty()) return out;
  hostlist_t hl = slurm_hostlist_create(expr.c_str());
  if (hl == nullptr) return out;
  while (char* h = slurm_hostlist_shift(hl)) {
    out.emplace_back(h);
    free(h);
  }
  slurm_hostlist_destroy(hl);
  return out;
}

// This node's name: SLURMD_NODENAME is only set from task_init on, so take
// entry S_JOB_NODEID of the step's node list.
absl::StatusOr<std::string> NodeName(spank_t sp) {
  std::string name = GetEnv(sp, "SLURMD_NODENAME");
  if (!name.empty()) return name;
  uint32_t node_id = 0;
  if (spank_get_item(sp, S_JOB_NODEID, &node_id) != ESPANK_SUCCESS) {
    return absl::InternalError("cannot read S_JOB_NODEID");
  }
  std::string list = GetEnv(sp, "SLURM_STEP_NODELIST");
  if (list.empty()) list = GetEnv(sp, "SLURM_JOB_NODELIST");
  std::vector<std::string> hosts = ExpandHosts(list);
  if (node_id >= hosts.size()) {
    return absl::InternalError(absl::StrCat("node ", node_id, " not in node list \"", list, "\""));
  }
  return hosts[node_id];
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

// The job's TPU indices on `node` from its GRES detail (slurmctld RPC).
absl::StatusOr<std::vector<uint32_t>> JobTpus(uint32_t job_id, const std::string& node) {
  job_info_msg_t* msg = nullptr;
  if (slurm_load_job(&msg, job_id, SHOW_DETAIL) != SLURM_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("cannot load job ", job_id, " from slurmctld: ",
                                               slurm_strerror(slurm_get_errno())));
  }
  std::vector<uint32_t> tpus;
  absl::Status status;
  for (uint32_t i = 0; msg && i < msg->record_count; ++i) {
    const slurm_job_info_t& j = msg->job_array[i];
    if (j.job_id != job_id) continue;
    std::vector<std::string> hosts = ExpandHosts(j.nodes ? j.nodes : "");
    for (size_t n = 0; n < hosts.size(); ++n) {
      if (hosts[n] != node || n >= j.gres_detail_cnt || !j.gres_detail_str[n]) continue;
      SlurmJobNodeDevices d;
      status = ParseGresDetail(j.gres_detail_str[n], &d);
      tpus = d.tpus;
    }
  }
  slurm_free_job_info_msg(msg);
  if (!status.ok()) return status;
  return tpus;
}

bool IsUnreachable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

}  // namespace

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

  auto node = NodeName(sp);
  if (!node.ok()) return node.status();
  st->node = *node;

  if (WantTpuProbe(config)) {
    auto tpus = JobTpus(st->job_id, st->node);
    if (!tpus.ok()) return tpus.status();
    devices.tpus = *tpus;
  }
  if (devices.empty() && !st->show) return absl::OkStatus();

  BridgeClient bridge(config.bridge, config.timeout_ms);
  if (config.munge) bridge.UseMunge(config.munge_socket);
  if (!devices.empty()) {
    absl::Status s = bridge.HoldStep(st->node, st->job_id, st->step_id, devices);
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
  if (config.munge) bridge.UseMunge(config.munge_socket);
  absl::Status s = bridge.ReleaseStep(st->node, st->job_id, st->step_id);
  if (!s.ok()) {
    // Job import releases it once the job has ended.
    return absl::Status(s.code(), absl::StrCat("release of step ", st->job_id, ".", st->step_id,
                                               " on ", st->node, " failed: ", s.message()));
  }
  if (st->step_id == SLURM_BATCH_SCRIPT) {
    // The batch script has ended, so the job has: what job import recorded
    // for it on this node goes now, not at the next sync pass, so the
    // ledger is current when Slurm starts the next job on these devices.
    s = bridge.ReleaseJob(st->node, st->job_id);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("release of job ", st->job_id, " on ", st->node,
                                                 " failed: ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace duet::spank
