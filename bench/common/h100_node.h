#pragma once

// The node the in-process benchmarks fill their ledgers with: a GKE A3 node
// with 8 H100s, GPU UUIDs, an NVLink domain per 18 nodes, and the usual GKE
// labels, so copies and comparisons cost what they cost in production.

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "bridge/ledger/types.h"

namespace duet::bench {

inline constexpr int kH100sPerNode = 8;

// Node `i` of the benchmark cluster. Names are "gke-a3-highgpu-pool-<i>".
inline std::string H100NodeName(int i) { return absl::StrCat("gke-a3-highgpu-pool-", i); }

inline NodeSpec H100Node(int i) {
  NodeSpec spec;
  spec.name = H100NodeName(i);
  spec.cpus = 208;
  spec.memory_mib = 1843200;
  spec.pool = "a3-highgpu";
  spec.zone = "us-central1-a";
  spec.labels["cloud.google.com/gke-accelerator"] = "nvidia-h100-80gb";
  spec.labels["cloud.google.com/gke-nodepool"] = "a3-highgpu";
  for (int g = 0; g < kH100sPerNode; ++g) {
    DeviceSpec d;
    d.index = static_cast<uint32_t>(g);
    d.id = absl::StrCat("GPU-", i, "-", g, "-0b5e6a2c-4f1d-11ee-be56-0242ac120002");
    d.model = "nvidia-h100-80gb";
    d.topology.nvlink_domain = absl::StrCat("clique-", i / 18);
    spec.devices.push_back(std::move(d));
  }
  return spec;
}

}  // namespace duet::bench
