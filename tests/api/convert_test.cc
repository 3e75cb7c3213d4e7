#include "bridge/api/convert.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet {
namespace {

TEST(ConvertTest, OwnersRoundTrip) {
  for (const Owner& o : {Owner::SlurmJob(4), Owner::SlurmStep(4, 0xfffffffb),
                         Owner::Pod("uid-1", "ns", "name"), Owner::Placeholder(9, "uid-1"),
                         Owner::Claim(9, "claim-uid", "ns", "c"), Owner::Lend(9, "node-a"),
                         Owner::GangSlot(9, "lws/ns/lws-a/3", 2)}) {
    v1::Owner p;
    ToProto(o, &p);
    auto back = FromProto(p);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, o);
    EXPECT_EQ(back->pod_name, o.pod_name);
  }
  EXPECT_EQ(FromProto(v1::Owner()).status().code(), absl::StatusCode::kInvalidArgument);
  v1::Owner lend;
  ToProto(Owner::Lend(9, "node-a"), &lend);
  EXPECT_EQ(lend.lend().node(), "node-a");  // the node, not the group's "lend:" uid
  lend.mutable_lend()->clear_node();
  EXPECT_EQ(FromProto(lend).status().code(), absl::StatusCode::kInvalidArgument);
  v1::Owner slot;
  ToProto(Owner::GangSlot(9, "lws/ns/lws-a/3", 2), &slot);
  EXPECT_EQ(slot.gang_slot().job_id(), 9u);
  EXPECT_EQ(slot.gang_slot().gang(), "lws/ns/lws-a/3");  // the key, not "gang:KEY#SLOT"
  EXPECT_EQ(slot.gang_slot().slot(), 2u);
  slot.mutable_gang_slot()->clear_gang();
  EXPECT_EQ(FromProto(slot).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConvertTest, NodeSpecRoundTrip) {
  NodeSpec n;
  n.name = "gke-a";
  n.cpus = 8;
  n.memory_mib = 1024;
  n.labels["k"] = "v";
  n.pool = "p";
  n.zone = "z";
  n.state = NodeState::kCordoned;
  DeviceSpec d;
  d.kind = DeviceKind::kTpu;
  d.index = 3;
  d.id = "0,1,0";
  d.model = "v5e";
  d.topology.tpu_host_bounds = "2x2";
  d.topology.tpu_subslice_shapes = {"1x1", "2x2"};
  n.devices.push_back(d);
  v1::Node p;
  ToProto(n, &p);
  auto back = FromProto(p);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->name, n.name);
  EXPECT_EQ(back->state, n.state);
  EXPECT_EQ(back->labels, n.labels);
  ASSERT_EQ(back->devices.size(), 1u);
  EXPECT_EQ(back->devices[0], d);
}

TEST(ConvertTest, HoldRequestShapeIsChecked) {
  v1::HoldRequest r;
  r.set_node("a");
  EXPECT_EQ(FromProto(r).status().code(), absl::StatusCode::kInvalidArgument);  // no owner
  r.mutable_owner()->mutable_slurm_job()->set_job_id(1);
  EXPECT_EQ(FromProto(r).status().code(), absl::StatusCode::kInvalidArgument);  // no selection
  r.mutable_count()->set_count(2);
  EXPECT_THAT(FromProto(r).status().message(), ::testing::HasSubstr("count.kind"));
  r.mutable_count()->set_kind(v1::DEVICE_KIND_GPU);
  auto ok = FromProto(r);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->count->count, 2u);
  r.mutable_devices();
  EXPECT_THAT(FromProto(r).status().message(), ::testing::HasSubstr("at least one device"));
}

}  // namespace
}  // namespace duet
