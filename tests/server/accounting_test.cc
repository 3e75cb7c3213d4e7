// Owner-group accounting (bridge/ledger/usage.h) is one definition: the
// duet_devices gauge and duetctl's `nodes` counts agree on a ledger with
// whole and fractional holdings, nested owners and a device whose capacity
// is not 1000 milli.

#include <map>
#include <string>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bridge/api/convert.h"
#include "bridge/ledger/ledger.h"
#include "bridge/ledger/usage.h"
#include "bridge/server/metrics.h"
#include "duetctl/render.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet {
namespace {

NodeSpec Node() {
  NodeSpec n;
  n.name = "gke-a";
  n.cpus = 64;
  n.memory_mib = 1 << 20;
  for (uint32_t i = 0; i < 4; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kGpu;
    d.index = i;
    d.id = "GPU-" + std::to_string(i);
    d.model = "h100";
    n.devices.push_back(d);
  }
  // A device whose whole is 500 milli (a half-size slice).
  DeviceSpec half;
  half.kind = DeviceKind::kGpu;
  half.index = 4;
  half.id = "GPU-4";
  half.model = "h100-half";
  half.capacity_milli = 500;
  n.devices.push_back(half);
  return n;
}

void Hold(Ledger* ledger, const Owner& owner, uint32_t index, uint32_t milli) {
  HoldRequest r;
  r.node = "gke-a";
  r.owner = owner;
  r.devices.push_back({DeviceKind::kGpu, index, milli});
  absl::StatusOr<HoldResult> h = ledger->Hold(r);
  ASSERT_TRUE(h.ok()) << owner.ToString() << ": " << h.status();
}

// duet_devices{node,kind,model,holder} -> value, from the text exposition.
std::map<std::tuple<std::string, std::string, std::string>, double> DeviceGauges(
    const std::string& text) {
  std::map<std::tuple<std::string, std::string, std::string>, double> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, "duet_devices{")) continue;
    const size_t close = line.find("} ");
    std::map<std::string, std::string> labels;
    for (absl::string_view kv : absl::StrSplit(line.substr(0, close), ',')) {
      std::pair<std::string, std::string> p = absl::StrSplit(kv, '=');
      labels[p.first] = std::string(absl::StripSuffix(absl::StripPrefix(p.second, "\""), "\""));
    }
    double v = 0;
    EXPECT_TRUE(absl::SimpleAtod(line.substr(close + 2), &v)) << line;
    out[{labels["model"], labels["holder"], labels["node"]}] = v;
  }
  return out;
}

TEST(AccountingTest, MetricsAndDuetctlCountDevicesTheSameWay) {
  Ledger ledger;
  ASSERT_TRUE(ledger.UpsertNode(Node()).ok());
  // gpu 0: job 7 and its step 0, whole: one group, 1 device.
  Hold(&ledger, Owner::SlurmJob(7), 0, 1000);
  Hold(&ledger, Owner::SlurmStep(7, 0), 0, 1000);
  // gpu 1: pod a at 250 and its placeholder at 500 (one group: 0.5), pod b
  // at 250: 0.75 for pods.
  Hold(&ledger, Owner::Pod("uid-a", "default", "a"), 1, 250);
  Hold(&ledger, Owner::Placeholder(9, "uid-a"), 1, 500);
  Hold(&ledger, Owner::Pod("uid-b", "default", "b"), 1, 250);
  // gpu 2: job 8 at 300.
  Hold(&ledger, Owner::SlurmJob(8), 2, 300);
  // gpu 4 (capacity 500): pod c at 250 is half of that device.
  Hold(&ledger, Owner::Pod("uid-c", "default", "c"), 4, 250);
  ASSERT_TRUE(ledger.CheckInvariants().ok());

  Metrics metrics(&ledger);
  const auto gauges = DeviceGauges(metrics.Render());

  v1::ListNodesResponse nodes;
  for (const auto& view : ledger.Snapshot().nodes) ToProto(*view, nodes.add_nodes());
  const std::vector<ctl::ModelTally> rows = ctl::TallyNodes(nodes.nodes());
  ASSERT_EQ(rows.size(), 2u);

  struct Want {
    const char* model;
    double total, slurm, pods, free;
  };
  for (const Want& w : {Want{"h100", 4, 1.3, 0.75, 1.95}, Want{"h100-half", 1, 0, 0.5, 0.5}}) {
    SCOPED_TRACE(w.model);
    const ctl::ModelTally* row = nullptr;
    for (const ctl::ModelTally& t : rows) {
      if (t.model == w.model) row = &t;
    }
    ASSERT_NE(row, nullptr);
    // duetctl, in milli-devices.
    EXPECT_EQ(row->total, static_cast<int64_t>(w.total * 1000 + 0.5));
    EXPECT_EQ(row->slurm, static_cast<int64_t>(w.slurm * 1000 + 0.5));
    EXPECT_EQ(row->pods, static_cast<int64_t>(w.pods * 1000 + 0.5));
    EXPECT_EQ(row->free, static_cast<int64_t>(w.free * 1000 + 0.5));
    // The gauge, in devices: the same numbers.
    EXPECT_DOUBLE_EQ(gauges.at({w.model, "slurm", "gke-a"}), row->slurm / 1000.0);
    EXPECT_DOUBLE_EQ(gauges.at({w.model, "pod", "gke-a"}), row->pods / 1000.0);
    EXPECT_DOUBLE_EQ(gauges.at({w.model, "free", "gke-a"}), row->free / 1000.0);
  }
}

TEST(AccountingTest, GroupsCountTheirLargestShareOnce) {
  auto use = [](Owner o, uint32_t milli) {
    return DeviceUse{std::make_shared<const Owner>(std::move(o)), milli};
  };
  const std::vector<DeviceUse> uses = {use(Owner::Pod("u1"), 200), use(Owner::SlurmJob(3), 100),
                                       use(Owner::Placeholder(5, "u1"), 400),
                                       use(Owner::SlurmStep(3, 1), 300)};
  EXPECT_EQ(GroupedUse(uses), 700u);
  const ClassUse c = UseByClass(uses, 1000);
  EXPECT_EQ(c.slurm_milli, 300u);
  EXPECT_EQ(c.pod_milli, 400u);
  EXPECT_EQ(c.free_milli(), 300u);
  // Over a 500-milli device the same use is clamped (Slurm first) and counts
  // as shares of that device.
  const ClassUse small = UseByClass(uses, 500);
  EXPECT_EQ(small.slurm_milli, 300u);
  EXPECT_EQ(small.pod_milli, 200u);
  EXPECT_EQ(small.free_milli(), 0u);
  EXPECT_EQ(MilliDevices(250, 500), 500);
  EXPECT_EQ(MilliDevices(250, 0), 250);
  EXPECT_DOUBLE_EQ(Devices(250, 500), 0.5);
}

}  // namespace
}  // namespace duet
