#include "bridge/server/sync_events.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace duet {

std::function<void(const PlaceholderLoss&)> PlaceholderLossEvents(k8s::EventRecorder* events) {
  return [events](const PlaceholderLoss& loss) {
    std::vector<std::string> devs;
    for (const HeldDevice& d : loss.devices) {
      devs.push_back(absl::StrCat(DeviceKindName(d.kind), " ", d.index));
    }
    const std::string what = absl::StrCat(
        "Slurm placeholder job ", loss.lost_job_id, " of pod ", loss.pod.ns, "/", loss.pod.name,
        " on node ", loss.node, " (", absl::StrJoin(devs, ", "), ") disappeared from Slurm");
    k8s::EventSpec e;
    if (loss.repaired) {
      e.type = "Normal";
      e.reason = "DuetPlaceholderRepaired";
      e.message = absl::StrCat(what, "; re-created as job(s) ",
                               absl::StrJoin(loss.new_job_ids, ","), " on the same devices");
    } else {
      e.type = "Warning";
      e.reason = "DuetPlaceholderLost";
      e.message = absl::StrCat(
          what,
          ": the devices stay held for the pod and Slurm steps on them are refused until "
          "duet re-creates the placeholder (",
          loss.detail, "); delete the pod to give the devices back to Slurm");
    }
    if (!loss.pod.name.empty()) {
      k8s::EventSpec p = e;
      p.object_kind = "Pod";
      p.object_namespace = loss.pod.ns;
      p.object_name = loss.pod.name;
      p.object_uid = loss.pod.uid;
      events->Record(p);
    }
    e.object_kind = "Node";
    e.object_name = loss.node;
    events->Record(e);
  };
}

std::function<void(const std::string&, bool, const std::string&)> NodeDrainEvents(
    k8s::EventRecorder* events) {
  return [events](const std::string& node, bool drained, const std::string& reason) {
    k8s::EventSpec e;
    e.object_kind = "Node";
    e.object_name = node;
    e.type = "Normal";
    if (drained) {
      e.reason = "DuetDrained";
      e.message = absl::StrCat("duet drained Slurm node ", node, " (", reason,
                               "): no new Slurm jobs start on it");
    } else {
      e.reason = "DuetResumed";
      e.message = absl::StrCat("duet resumed Slurm node ", node, " (was: ", reason, ")");
    }
    events->Record(e);
  };
}

}  // namespace duet
