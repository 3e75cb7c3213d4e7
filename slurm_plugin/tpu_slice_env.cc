#include "slurm_plugin/tpu_slice_env.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace duet::spank {

std::string SliceOfFeatures(const std::string& features) {
  for (absl::string_view f : absl::StrSplit(features, ',', absl::SkipEmpty())) {
    f = absl::StripAsciiWhitespace(f);
    if (absl::ConsumePrefix(&f, kTpuSliceFeaturePrefix) && !f.empty()) return std::string(f);
  }
  return "";
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> TpuSliceEnv(
    const TpuSliceStep& step) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::vector<std::string>& hosts = step.facts.job_nodes;
  if (step.facts.slice.empty() || step.step_nodes < 2 || step.step_nodes != hosts.size()) {
    return out;
  }
  if (step.node_id >= hosts.size() || hosts[step.node_id] != step.node) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TPU slice ", step.facts.slice, ": the step's node ", step.node_id, " is ",
        step.node_id < hosts.size() ? hosts[step.node_id] : "beyond the job's nodes",
        " in the job's node list (", absl::StrJoin(hosts, ","), "), not ", step.node,
        "; TPU_WORKER_ID and TPU_WORKER_HOSTNAMES not set"));
  }
  out.emplace_back("TPU_WORKER_ID", absl::StrCat(step.node_id));
  out.emplace_back("TPU_WORKER_HOSTNAMES", absl::StrJoin(hosts, ","));
  return out;
}

}  // namespace duet::spank
