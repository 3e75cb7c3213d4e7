#pragma once

// The shared node the Slurm-side tests give the ledger: 8 CPUs, 16000 MiB,
// `gpus` H100s (pool shared-h100) or `tpus` v5e chips (pool shared-v5e, of a
// 2x4 slice: with 4 chips, a host of a 2-host slice, docs/gangs.md 5), its
// slurmd's address 127.0.0.`idx` (slurm_cluster.sh), zone us-central1-a,
// topology block b7.

#include <string>

#include "absl/strings/str_cat.h"
#include "bridge/ledger/types.h"

namespace duet::testing {

inline constexpr char kTestGpuModel[] = "nvidia-h100-80gb";
inline constexpr char kTestTpuModel[] = "tpu-v5-lite-podslice";

inline NodeSpec TestNodeSpec(const std::string& name, int idx, int gpus, int tpus = 0) {
  NodeSpec s;
  s.name = name;
  s.cpus = 8;
  s.memory_mib = 16000;
  s.pool = gpus ? "shared-h100" : "shared-v5e";
  s.zone = "us-central1-a";
  s.labels["duet.dev/slurm-node-addr"] = absl::StrCat("127.0.0.", idx);
  s.labels["cloud.google.com/gce-topology-block"] = "b7";
  if (gpus) s.labels["cloud.google.com/gke-accelerator"] = kTestGpuModel;
  if (tpus) s.labels["cloud.google.com/gke-tpu-accelerator"] = kTestTpuModel;
  for (int i = 0; i < gpus; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kGpu;
    d.index = i;
    d.model = kTestGpuModel;
    s.devices.push_back(d);
  }
  for (int i = 0; i < tpus; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kTpu;
    d.index = i;
    d.model = kTestTpuModel;
    d.topology.tpu_topology = "2x4";
    s.devices.push_back(d);
  }
  return s;
}

}  // namespace duet::testing
