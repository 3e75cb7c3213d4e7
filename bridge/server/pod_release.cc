#include "bridge/server/pod_release.h"

#include "absl/strings/str_cat.h"

namespace duet {

absl::Status BridgePodReleaser::Release(const k8s::PodRelease& r) {
  const Holding& h = r.holding;
  absl::Status s;
  if (h.owner.kind == OwnerKind::kPlaceholder && placeholders_ != nullptr) {
    s = placeholders_->Cancel(h.node, h.owner.pod_uid);
  } else {
    s = ledger_->Release(h.node, h.owner).status();
  }
  if (!s.ok()) return s;
  if (events_ != nullptr && !r.pod_name.empty()) {
    k8s::EventSpec e;
    e.object_kind = "Pod";
    e.object_namespace = r.pod_namespace;
    e.object_name = r.pod_name;
    e.object_uid = h.owner.pod_uid;
    e.type = "Normal";
    e.reason = "DuetReleased";
    e.message = absl::StrCat("duet released ", h.devices.size(), " device(s) on node ", h.node,
                             " held by ", h.owner.ToString(), ": pod ",
                             r.reason == k8s::PodReleaseReason::kOrphaned
                                 ? "not found"
                                 : k8s::PodReleaseReasonName(r.reason));
    events_->Record(e);
  }
  return absl::OkStatus();
}

}  // namespace duet
