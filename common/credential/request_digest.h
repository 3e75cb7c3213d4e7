#pragma once

// The Binding (munge_payload.h) of a Slurm-owned Hold or Release, made from
// the gRPC request itself: spank_duet's client from the request it is about
// to send, duet-bridge from the request it received. Both run this same
// code on the same message, so an honest call matches byte for byte and any
// change to node, owner, devices, count or expected generation does not.
//
// Canonical text (the payload carries it after its version; duet/v2 carried
// its SHA-256): the method, then every field in a fixed order; strings are
// length-prefixed so no value can imitate a separator, e.g.
//   Hold node=5:gke-a owner=slurm_step:12.0 devices=1:0:0,1:1:500 generation=0
//   Hold node=5:gke-a owner=slurm_job:12 count=1:2:0:4:a100 generation=7
//   Release node=5:gke-a owner=slurm_step:12.0
// (device kind as its enum number, index, milli; count: kind, count, milli,
// model). Header-only: the client module builds it from source.
//
// Thread-safety: no state.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/credential/munge_payload.h"
#include "duet/v1/duet.pb.h"

namespace duet::slurm_munge {
namespace internal {

inline std::string Sized(const std::string& s) { return absl::StrCat(s.size(), ":", s); }

inline std::string CanonicalOwner(const v1::Owner& o) {
  if (o.has_slurm_step()) {
    return absl::StrCat("slurm_step:", o.slurm_step().job_id(), ".", o.slurm_step().step_id());
  }
  if (o.has_slurm_job()) return absl::StrCat("slurm_job:", o.slurm_job().job_id());
  return "other";
}

// The Binding of a call by a Slurm owner; nullopt for any other owner.
inline std::optional<Binding> SlurmBinding(const char* method, const std::string& node,
                                           const v1::Owner& owner, const std::string& canonical) {
  Binding b;
  b.method = method;
  b.node = node;
  if (owner.has_slurm_step()) {
    b.job_id = owner.slurm_step().job_id();
    b.step_id = owner.slurm_step().step_id();
  } else if (owner.has_slurm_job()) {
    b.job_id = owner.slurm_job().job_id();
  } else {
    return std::nullopt;
  }
  b.request = canonical;
  return b;
}

}  // namespace internal

inline std::string CanonicalRequest(const v1::HoldRequest& r) {
  std::string out = absl::StrCat("Hold node=", internal::Sized(r.node()),
                                 " owner=", internal::CanonicalOwner(r.owner()));
  if (r.has_devices()) {
    absl::StrAppend(&out, " devices=");
    const char* sep = "";
    for (const v1::HeldDevice& d : r.devices().devices()) {
      absl::StrAppend(&out, sep, static_cast<int>(d.kind()), ":", d.index(), ":", d.milli());
      sep = ",";
    }
  } else if (r.has_count()) {
    const v1::DeviceCount& c = r.count();
    absl::StrAppend(&out, " count=", static_cast<int>(c.kind()), ":", c.count(), ":", c.milli(),
                    ":", internal::Sized(c.model()));
  } else {
    absl::StrAppend(&out, " selection=none");
  }
  absl::StrAppend(&out, " generation=", r.expected_generation());
  return out;
}

inline std::string CanonicalRequest(const v1::ReleaseRequest& r) {
  return absl::StrCat("Release node=", internal::Sized(r.node()),
                      " owner=", internal::CanonicalOwner(r.owner()));
}

// What a credential for this request must bind; nullopt when its owner is
// not Slurm's (pods and placeholders carry no Slurm credential).
// (The owner is looked at first: a pod's call builds no text.)
inline std::optional<Binding> BindingOf(const v1::HoldRequest& r) {
  if (!r.owner().has_slurm_step() && !r.owner().has_slurm_job()) return std::nullopt;
  return internal::SlurmBinding("Hold", r.node(), r.owner(), CanonicalRequest(r));
}
inline std::optional<Binding> BindingOf(const v1::ReleaseRequest& r) {
  if (!r.owner().has_slurm_step() && !r.owner().has_slurm_job()) return std::nullopt;
  return internal::SlurmBinding("Release", r.node(), r.owner(), CanonicalRequest(r));
}

}  // namespace duet::slurm_munge
