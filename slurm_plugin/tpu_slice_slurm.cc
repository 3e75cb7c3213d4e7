// The Slurm side of tpu_slice_env.h: only in duet_spank_client.so, where
// slurmstepd provides libslurm's symbols.

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/slurm/slurm_compat.h"
#include "slurm_plugin/slurmctld_retry.h"
#include "slurm_plugin/tpu_slice_env.h"

namespace duet::spank {

absl::StatusOr<TpuSliceFacts> LoadTpuSliceFacts(uint32_t job_id, const std::string& node) {
  TpuSliceFacts facts;
  node_info_msg_t* nodes = nullptr;
  std::string name = node;
  const std::string what = absl::StrCat("TPU slice of job ", job_id);
  if (RetryWhileSlurmctldUnreachable(what.c_str(), [&] {
        return slurm_load_node_single(&nodes, name.data(), SHOW_ALL);
      }) != SLURM_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("cannot load node ", node, " from slurmctld: ",
                                               slurm_strerror(slurm_compat::LastError())));
  }
  for (uint32_t i = 0; nodes && i < nodes->record_count; ++i) {
    const node_info_t& n = nodes->node_array[i];
    if (n.name == nullptr || node != n.name) continue;
    facts.slice = SliceOfFeatures(n.features_act != nullptr ? n.features_act
                                  : n.features != nullptr   ? n.features
                                                            : "");
  }
  slurm_free_node_info_msg(nodes);
  if (facts.slice.empty()) return facts;  // no slice: the job's nodes are not needed
  job_info_msg_t* jobs = nullptr;
  if (RetryWhileSlurmctldUnreachable(what.c_str(), [&] {
        return slurm_compat::LoadJob(&jobs, job_id, SHOW_ALL);
      }) != SLURM_SUCCESS) {
    return absl::UnavailableError(absl::StrCat("cannot load job ", job_id, " from slurmctld: ",
                                               slurm_strerror(slurm_compat::LastError())));
  }
  for (uint32_t i = 0; jobs && i < jobs->record_count; ++i) {
    const slurm_job_info_t& j = jobs->job_array[i];
    if (j.job_id == job_id) facts.job_nodes = slurm_compat::ExpandHostlist(j.nodes);
  }
  slurm_free_job_info_msg(jobs);
  return facts;
}

absl::Status ExportTpuSliceEnv(spank_t sp, const std::string& node, const TpuSliceFacts& facts) {
  TpuSliceStep step;
  step.node = node;
  step.facts = facts;
  if (spank_get_item(sp, S_JOB_NODEID, &step.node_id) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_NNODES, &step.step_nodes) != ESPANK_SUCCESS) {
    return absl::InternalError("cannot read the step's node id and node count");
  }
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> env = TpuSliceEnv(step);
  if (!env.ok()) return env.status();
  for (const auto& [name, value] : *env) spank_setenv(sp, name.c_str(), value.c_str(), 1);
  return absl::OkStatus();
}

}  // namespace duet::spank
