#pragma once

// Slurm-owned Hold and Release requests, and the Binding
// (common/credential/request_digest.h) a credential for them signs, built
// with the plugin's and the bridge's own function: shared by the credential
// tests.

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

// A Hold of GPUs `gpus` by job (or job.step) on `node`, as spank_duet sends it.
inline v1::HoldRequest SlurmHoldRequest(const std::string& node, uint32_t job,
                                        std::optional<uint32_t> step,
                                        const std::vector<uint32_t>& gpus) {
  v1::HoldRequest r;
  r.set_node(node);
  SetSlurmOwner(r.mutable_owner(), job, step);
  for (uint32_t g : gpus) {
    v1::HeldDevice* d = r.mutable_devices()->add_devices();
    d->set_kind(v1::DEVICE_KIND_GPU);
    d->set_index(g);
  }
  return r;
}

// A Release by job (or job.step) on `node`.
inline v1::ReleaseRequest SlurmReleaseRequest(const std::string& node, uint32_t job,
                                              std::optional<uint32_t> step) {
  v1::ReleaseRequest r;
  r.set_node(node);
  SetSlurmOwner(r.mutable_owner(), job, step);
  return r;
}

// What a credential for those calls signs.
inline slurm_munge::Binding HoldBinding(const std::string& node, uint32_t job,
                                        std::optional<uint32_t> step,
                                        std::vector<uint32_t> gpus = {0}) {
  return *slurm_munge::BindingOf(SlurmHoldRequest(node, job, step, gpus));
}
inline slurm_munge::Binding ReleaseBinding(const std::string& node, uint32_t job,
                                           std::optional<uint32_t> step) {
  return *slurm_munge::BindingOf(SlurmReleaseRequest(node, job, step));
}

}  // namespace duet::testing
