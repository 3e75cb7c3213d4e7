#pragma once

// Streaming readers for the Alibaba GPU trace (cluster-trace-gpu-v2023,
// "openb") CSV files: one row at a time into the product's own types, with
// columns found by header name.

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "bridge/ledger/types.h"
#include "bridge/placement/request.h"

namespace duet::sim {

struct TracePod {
  std::string name;
  placement::PodRequest request;
  // LS, BE, Burstable or Guaranteed.
  std::string qos;
};

// Node list (`sn,cpu_milli,memory_mib,gpu,model`): calls `fn` with one
// NodeSpec per row (cpus = cpu_milli / 1000, GPUs 0..gpu-1 of `model`, each
// kWholeDevice). Stops at the first error, from the file or from `fn`.
absl::Status ReadNodes(const std::string& path,
                       const std::function<absl::Status(NodeSpec)>& fn);

// Pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,...`):
// calls `fn` with one pod per row. A pod with num_gpu == 1 and gpu_milli <
// 1000 shares one GPU; otherwise it takes num_gpu whole GPUs. gpu_spec lists
// accepted models separated by '|'.
absl::Status ReadPods(const std::string& path, const std::function<absl::Status(TracePod)>& fn);

}  // namespace duet::sim
