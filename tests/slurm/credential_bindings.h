#pragma once

// The Binding (common/credential/request_digest.h) a Slurm-owned Hold or
// Release signs, built from the request itself with the plugin's and the
// bridge's own function: shared by the munge and slurm.key credential tests.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/credential/request_digest.h"
#include "duet/v1/duet.pb.h"

namespace duet::testing {

inline void SetSlurmOwner(v1::Owner* owner, uint32_t job, std::optional<uint32_t> step) {
  if (step) {
    owner->mutable_slurm_step()->set_job_id(job);
    owner->mutable_slurm_step()->set_step_id(*step);
  } else {
    owner->mutable_slurm_job()->set_job_id(job);
  }
}

// A Hold of `gpus` by job (or job.step) on `node`.
inline slurm_munge::Binding HoldBinding(const std::string& node, uint32_t job,
                                        std::optional<uint32_t> step,
                                        std::vector<uint32_t> gpus = {0}) {
  v1::HoldRequest r;
  r.set_node(node);
  SetSlurmOwner(r.mutable_owner(), job, step);
  for (uint32_t g : gpus) {
    v1::HeldDevice* d = r.mutable_devices()->add_devices();
    d->set_kind(v1::DEVICE_KIND_GPU);
    d->set_index(g);
  }
  return *slurm_munge::BindingOf(r);
}

// A Release by job (or job.step) on `node`.
inline slurm_munge::Binding ReleaseBinding(const std::string& node, uint32_t job,
                                           std::optional<uint32_t> step) {
  v1::ReleaseRequest r;
  r.set_node(node);
  SetSlurmOwner(r.mutable_owner(), job, step);
  return *slurm_munge::BindingOf(r);
}

}  // namespace duet::testing
