#pragma once

// Kubernetes Events for what the Slurm sync did to nodes and placeholders
// (SlurmSyncOptions::on_drain and on_placeholder_lost).

#include <functional>
#include <string>

#include "bridge/slurm/slurm_sync.h"
#include "k8s_adapter/event_recorder.h"

namespace duet {

// For SlurmSyncOptions::on_drain: a Normal Event on the Node ("DuetDrained"
// / "DuetResumed") each time duet drains a node in Slurm or undoes its own
// drain. `events` must outlive the returned function.
// For SlurmSyncOptions::on_placeholder_lost: Events on the pod and its node.
// Repaired: Normal "DuetPlaceholderRepaired". Fenced: Warning
// "DuetPlaceholderLost", which says the devices stay held for the pod (Slurm
// steps on them are refused) and that deleting the pod gives them back.
std::function<void(const PlaceholderLoss&)> PlaceholderLossEvents(k8s::EventRecorder* events);

std::function<void(const std::string&, bool, const std::string&)> NodeDrainEvents(
    k8s::EventRecorder* events);

}  // namespace duet
