#pragma once

// What the pod watch does to release a pod's holding in duet-bridge: the
// Slurm placeholder first, then the ledger; an Event on the pod.

#include "absl/status/status.h"
#include "bridge/ledger/ledger.h"
#include "bridge/slurm/placeholders.h"
#include "k8s_adapter/event_recorder.h"
#include "k8s_adapter/reconcile/pod_watch.h"

namespace duet {

// Releases one pod holding. A placeholder goes through Placeholders::Cancel
// when `placeholders` is set (Slurm enabled: the job is cancelled first;
// UNAVAILABLE keeps the holding); everything else is released in the ledger.
// On success a Normal "DuetReleased" Event is recorded on the pod when
// `events` is set. None is owned; `placeholders` and `events` may be null.
class BridgePodReleaser final : public k8s::PodReleaser {
 public:
  BridgePodReleaser(Ledger* ledger, Placeholders* placeholders, k8s::EventRecorder* events)
      : ledger_(ledger), placeholders_(placeholders), events_(events) {}
  absl::Status Release(const k8s::PodRelease& release) override;

 private:
  Ledger* const ledger_;
  Placeholders* const placeholders_;
  k8s::EventRecorder* const events_;
};

}  // namespace duet
