#include "bridge/api/convert.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/reason.h"
#include "common/status_macros.h"
#include "proto/duet/v1/error_reason.h"
#include "google/protobuf/util/time_util.h"

namespace duet {
namespace {

using ::google::protobuf::util::TimeUtil;

// The ledger's device kinds and node states with the API's, for both ways.
constexpr std::pair<DeviceKind, v1::DeviceKind> kDeviceKinds[] = {
    {DeviceKind::kGpu, v1::DEVICE_KIND_GPU}, {DeviceKind::kTpu, v1::DEVICE_KIND_TPU}};
constexpr std::pair<NodeState, v1::NodeState> kNodeStates[] = {
    {NodeState::kReady, v1::NODE_STATE_READY},
    {NodeState::kCordoned, v1::NODE_STATE_CORDONED},
    {NodeState::kNotReady, v1::NODE_STATE_NOT_READY},
    {NodeState::kGone, v1::NODE_STATE_GONE}};

google::protobuf::Timestamp ToTimestamp(absl::Time t) {
  return TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t));
}

absl::Time FromTimestamp(const google::protobuf::Timestamp& ts) {
  return absl::FromUnixSeconds(ts.seconds()) + absl::Nanoseconds(ts.nanos());
}

void TopologyToProto(const Topology& t, v1::Topology* out) {
  out->set_nvlink_domain(t.nvlink_domain);
  out->set_tpu_host_bounds(t.tpu_host_bounds);
  out->set_tpu_topology(t.tpu_topology);
  for (const auto& s : t.tpu_subslice_shapes) out->add_tpu_subslice_shapes(s);
  out->set_block(t.block);
  out->set_subblock(t.subblock);
  out->set_host(t.host);
}

Topology TopologyFromProto(const v1::Topology& t) {
  Topology out;
  out.nvlink_domain = t.nvlink_domain();
  out.tpu_host_bounds = t.tpu_host_bounds();
  out.tpu_topology = t.tpu_topology();
  out.tpu_subslice_shapes.assign(t.tpu_subslice_shapes().begin(), t.tpu_subslice_shapes().end());
  out.block = t.block();
  out.subblock = t.subblock();
  out.host = t.host();
  return out;
}

void DeviceSpecToProto(const DeviceSpec& d, v1::Device* out) {
  out->set_kind(ToProto(d.kind));
  out->set_index(d.index);
  out->set_id(d.id);
  out->set_model(d.model);
  out->set_capacity_milli(d.capacity_milli);
  TopologyToProto(d.topology, out->mutable_topology());
}

void NodeSpecFieldsToProto(const NodeSpec& spec, v1::Node* out) {
  out->set_name(spec.name);
  out->set_cpus(spec.cpus);
  out->set_memory_mib(spec.memory_mib);
  for (const auto& [k, v] : spec.labels) (*out->mutable_labels())[k] = v;
  out->set_pool(spec.pool);
  out->set_zone(spec.zone);
  out->set_state(ToProto(spec.state));
}

}  // namespace

v1::DeviceKind ToProto(DeviceKind kind) {
  for (const auto& [ours, api] : kDeviceKinds) {
    if (ours == kind) return api;
  }
  return v1::DEVICE_KIND_UNSPECIFIED;
}

absl::StatusOr<DeviceKind> FromProto(v1::DeviceKind kind, const char* field) {
  for (const auto& [ours, api] : kDeviceKinds) {
    if (api == kind) return ours;
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ": must be GPU or TPU"));
}

v1::NodeState ToProto(NodeState state) {
  for (const auto& [ours, api] : kNodeStates) {
    if (ours == state) return api;
  }
  return v1::NODE_STATE_UNSPECIFIED;
}

namespace {
absl::StatusOr<NodeState> NodeStateFromProto(v1::NodeState state) {
  if (state == v1::NODE_STATE_UNSPECIFIED) return NodeState::kReady;
  for (const auto& [ours, api] : kNodeStates) {
    if (api == state) return ours;
  }
  return absl::InvalidArgumentError("node.state: unknown value");
}
}  // namespace

void ToProto(const Owner& owner, v1::Owner* out) {
  switch (owner.kind) {
    case OwnerKind::kSlurmJob:
      out->mutable_slurm_job()->set_job_id(owner.job_id);
      break;
    case OwnerKind::kSlurmStep:
      out->mutable_slurm_step()->set_job_id(owner.job_id);
      out->mutable_slurm_step()->set_step_id(owner.step_id);
      break;
    case OwnerKind::kPod:
      out->mutable_pod()->set_uid(owner.pod_uid);
      out->mutable_pod()->set_namespace_(owner.pod_namespace);
      out->mutable_pod()->set_name(owner.pod_name);
      break;
    case OwnerKind::kPlaceholder:
      out->mutable_placeholder()->set_job_id(owner.job_id);
      out->mutable_placeholder()->set_pod_uid(owner.pod_uid);
      break;
    case OwnerKind::kClaim:
      out->mutable_claim()->set_job_id(owner.job_id);
      out->mutable_claim()->set_uid(owner.pod_uid);
      out->mutable_claim()->set_namespace_(owner.pod_namespace);
      out->mutable_claim()->set_name(owner.pod_name);
      break;
    case OwnerKind::kLend: {
      absl::string_view node = owner.pod_uid;
      absl::ConsumePrefix(&node, kLendGroupPrefix);
      out->mutable_lend()->set_job_id(owner.job_id);
      out->mutable_lend()->set_node(std::string(node));
      break;
    }
    case OwnerKind::kGangSlot: {
      std::string gang;
      uint32_t slot = 0;
      // A malformed slot uid never reaches the ledger (ValidateOwner); the
      // whole uid is shown then rather than nothing.
      if (!ParseGangSlotUid(owner.pod_uid, &gang, &slot)) gang = owner.pod_uid;
      out->mutable_gang_slot()->set_job_id(owner.job_id);
      out->mutable_gang_slot()->set_gang(gang);
      out->mutable_gang_slot()->set_slot(slot);
      break;
    }
  }
}

absl::StatusOr<Owner> FromProto(const v1::Owner& owner) {
  switch (owner.kind_case()) {
    case v1::Owner::kSlurmJob:
      return Owner::SlurmJob(owner.slurm_job().job_id());
    case v1::Owner::kSlurmStep:
      return Owner::SlurmStep(owner.slurm_step().job_id(), owner.slurm_step().step_id());
    case v1::Owner::kPod:
      return Owner::Pod(owner.pod().uid(), owner.pod().namespace_(), owner.pod().name());
    case v1::Owner::kPlaceholder:
      return Owner::Placeholder(owner.placeholder().job_id(), owner.placeholder().pod_uid());
    case v1::Owner::kClaim:
      return Owner::Claim(owner.claim().job_id(), owner.claim().uid(), owner.claim().namespace_(),
                          owner.claim().name());
    case v1::Owner::kLend:
      if (owner.lend().node().empty()) {
        return absl::InvalidArgumentError("owner.lend.node: must be set");
      }
      return Owner::Lend(owner.lend().job_id(), owner.lend().node());
    case v1::Owner::kGangSlot:
      if (owner.gang_slot().gang().empty()) {
        return absl::InvalidArgumentError("owner.gang_slot.gang: must be set");
      }
      return Owner::GangSlot(owner.gang_slot().job_id(), owner.gang_slot().gang(),
                             owner.gang_slot().slot());
    case v1::Owner::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "owner: must be one of slurm_job, slurm_step, pod, placeholder, claim, lend, gang_slot");
}

void ToProto(const Holding& holding, v1::Holding* out) { ToProto(holding, nullptr, out); }

void ToProto(const Holding& holding, const NodeView* view, v1::Holding* out) {
  ToProto(holding.owner, out->mutable_owner());
  out->set_node(holding.node);
  for (const HeldDevice& d : holding.devices) {
    v1::HeldDevice* hd = out->add_devices();
    hd->set_kind(ToProto(d.kind));
    hd->set_index(d.index);
    hd->set_milli(d.milli);
    if (view != nullptr) {
      for (const DeviceState& ds : view->devices) {
        if (ds.spec.kind == d.kind && ds.spec.index == d.index) hd->set_id(ds.spec.id);
      }
    }
  }
  *out->mutable_granted_at() = ToTimestamp(holding.granted_at);
  out->set_generation(holding.generation);
}

absl::StatusOr<Holding> FromProto(const v1::Holding& holding) {
  Holding out;
  DUET_ASSIGN_OR_RETURN(out.owner, FromProto(holding.owner()));
  out.node = holding.node();
  for (const v1::HeldDevice& d : holding.devices()) {
    HeldDevice hd;
    DUET_ASSIGN_OR_RETURN(hd.kind, FromProto(d.kind(), "holding.devices.kind"));
    hd.index = d.index();
    hd.milli = d.milli() == 0 ? kWholeDevice : d.milli();
    out.devices.push_back(hd);
  }
  out.granted_at = FromTimestamp(holding.granted_at());
  out.generation = holding.generation();
  return out;
}

void ToProto(const NodeSpec& spec, v1::Node* out) {
  NodeSpecFieldsToProto(spec, out);
  for (const DeviceSpec& d : spec.devices) DeviceSpecToProto(d, out->add_devices());
}

absl::StatusOr<NodeSpec> FromProto(const v1::Node& node) {
  NodeSpec out;
  out.name = node.name();
  out.cpus = node.cpus();
  out.memory_mib = node.memory_mib();
  out.labels.insert(node.labels().begin(), node.labels().end());
  out.pool = node.pool();
  out.zone = node.zone();
  DUET_ASSIGN_OR_RETURN(out.state, NodeStateFromProto(node.state()));
  for (const v1::Device& d : node.devices()) {
    DeviceSpec ds;
    DUET_ASSIGN_OR_RETURN(ds.kind, FromProto(d.kind(), "node.devices.kind"));
    ds.index = d.index();
    ds.id = d.id();
    ds.model = d.model();
    ds.capacity_milli = d.capacity_milli() == 0 ? kWholeDevice : d.capacity_milli();
    ds.topology = TopologyFromProto(d.topology());
    out.devices.push_back(std::move(ds));
  }
  return out;
}

void ToProto(const NodeView& view, v1::Node* out) {
  NodeSpecFieldsToProto(view.spec, out);
  out->set_generation(view.generation);
  for (const DeviceState& d : view.devices) {
    v1::Device* pd = out->add_devices();
    DeviceSpecToProto(d.spec, pd);
    pd->set_used_milli(d.used_milli);
    for (const DeviceUse& u : d.uses) {
      v1::DeviceHolder* h = pd->add_holders();
      ToProto(*u.owner, h->mutable_owner());
      h->set_milli(u.milli);
    }
  }
}

absl::StatusOr<HoldRequest> FromProto(const v1::HoldRequest& request) {
  HoldRequest out;
  out.node = request.node();
  if (!request.has_owner()) return absl::InvalidArgumentError("owner: must be set");
  DUET_ASSIGN_OR_RETURN(out.owner, FromProto(request.owner()));
  out.expected_generation = request.expected_generation();
  switch (request.selection_case()) {
    case v1::HoldRequest::kDevices:
      if (request.devices().devices().empty()) {
        return absl::InvalidArgumentError("devices: must list at least one device");
      }
      for (const v1::HeldDevice& d : request.devices().devices()) {
        HeldDevice hd;
        DUET_ASSIGN_OR_RETURN(hd.kind, FromProto(d.kind(), "devices.kind"));
        hd.index = d.index();
        hd.milli = d.milli();
        out.devices.push_back(hd);
      }
      break;
    case v1::HoldRequest::kCount: {
      CountSelector sel;
      DUET_ASSIGN_OR_RETURN(sel.kind, FromProto(request.count().kind(), "count.kind"));
      sel.count = request.count().count();
      sel.milli = request.count().milli();
      sel.model = request.count().model();
      out.count = sel;
      break;
    }
    case v1::HoldRequest::SELECTION_NOT_SET:
      return absl::InvalidArgumentError("one of devices and count must be set");
  }
  return out;
}

}  // namespace duet
