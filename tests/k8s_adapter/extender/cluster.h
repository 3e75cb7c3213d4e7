#pragma once

// The small cluster the extender tests share, and golden-file helpers.
//
//   gke-a3-highgpu-pool-0  8 H100 free
//   gke-a3-highgpu-pool-1  Slurm job 101 holds GPUs 0-5 (2 free)
//   gke-a3-highgpu-pool-2  cordoned
//   gke-a3-highgpu-pool-3  Slurm job 102 holds GPUs 0-3 (4 free)
//   gke-a3-highgpu-pool-4  pod "other" holds 0-1, Slurm job 103 holds 2 (5 free)
//   gke-a3-highgpu-pool-5  8 L4 (another model)
//   gke-cpu-pool-n2-0      not in the ledger

#include <fstream>
#include <sstream>
#include <string>

#include "bench/common/h100_node.h"
#include "bridge/ledger/ledger.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace duet {
namespace extender {
namespace testing {

inline std::string Testdata(const std::string& name) {
  std::ifstream in(std::string(DUET_EXTENDER_TESTDATA) + "/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline nlohmann::json TestdataJson(const std::string& name) {
  return nlohmann::json::parse(Testdata(name));
}

inline void HoldSlurm(Ledger& ledger, const std::string& node, uint32_t job, uint32_t first, uint32_t n) {
  HoldRequest h;
  h.node = node;
  h.owner = Owner::SlurmJob(job);
  for (uint32_t i = first; i < first + n; ++i) h.devices.push_back({DeviceKind::kGpu, i, kWholeDevice});
  ASSERT_TRUE(ledger.Hold(h).ok());
}

inline void BuildCluster(Ledger& ledger) {
  for (int i = 0; i < 6; ++i) {
    NodeSpec spec = bench::H100Node(i);
    if (i == 2) spec.state = NodeState::kCordoned;
    if (i == 5) {
      for (DeviceSpec& d : spec.devices) d.model = "nvidia-l4";
      spec.labels["cloud.google.com/gke-accelerator"] = "nvidia-l4";
    }
    ASSERT_TRUE(ledger.UpsertNode(spec).ok());
  }
  HoldSlurm(ledger, bench::H100NodeName(1), 101, 0, 6);
  HoldSlurm(ledger, bench::H100NodeName(3), 102, 0, 4);
  HoldRequest pod;
  pod.node = bench::H100NodeName(4);
  pod.owner = Owner::Pod("0d8e2c1a-other", "ml-team", "other");
  pod.devices = {{DeviceKind::kGpu, 0, kWholeDevice}, {DeviceKind::kGpu, 1, kWholeDevice}};
  ASSERT_TRUE(ledger.Hold(pod).ok());
  HoldSlurm(ledger, bench::H100NodeName(4), 103, 2, 1);
}

// Compares `got` with the golden file; DUET_UPDATE_GOLDEN=1 rewrites it.
inline void ExpectGolden(const nlohmann::json& got, const std::string& name) {
  if (std::getenv("DUET_UPDATE_GOLDEN") != nullptr) {
    std::ofstream(std::string(DUET_EXTENDER_TESTDATA) + "/" + name) << got.dump(2) << "\n";
  }
  EXPECT_EQ(got, TestdataJson(name)) << "got: " << got.dump(2);
}

}  // namespace testing
}  // namespace extender
}  // namespace duet
