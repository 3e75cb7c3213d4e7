#include "bench/sim/replay.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet::sim {
namespace {

// A small trace in the Alibaba format, written to the test's temp dir.
struct Files {
  std::string nodes;
  std::string pods;
};

Files WriteTrace() {
  const std::string dir = ::testing::TempDir();
  Files f{absl::StrCat(dir, "/nodes.csv"), absl::StrCat(dir, "/pods.csv")};
  std::ofstream n(f.nodes);
  n << "sn,cpu_milli,memory_mib,gpu,model\n";
  for (int i = 0; i < 24; ++i) {
    n << "node-" << (i < 10 ? "0" : "") << i << "," << (i % 3 == 0 ? 96000 : 64000)
      << ",262144," << (i % 4 == 0 ? 8 : i % 4 == 1 ? 2 : 4) << "," << (i % 2 ? "T4" : "G2")
      << "\n";
  }
  std::ofstream p(f.pods);
  p << "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
       "deletion_time,scheduled_time\n";
  const char* qos[] = {"LS", "BE", "Burstable", "Guaranteed"};
  for (int i = 0; i < 120; ++i) {
    const int gpus = i % 10 == 0 ? 0 : i % 17 == 0 ? 4 : 1;
    const int milli = gpus == 1 && i % 3 == 0 ? 250 + (i % 5) * 100 : 1000;
    p << "pod-" << 1000 + i << "," << 2000 + (i % 7) * 1000 << ",8192," << gpus << "," << milli
      << "," << (i % 11 == 0 ? "T4" : "") << "," << qos[i % 4] << ",Running,0,1,0\n";
  }
  return f;
}

TEST(TraceTest, ReadsNodesAndSharedPods) {
  const Files f = WriteTrace();
  absl::StatusOr<Trace> t = LoadTrace(f.nodes, f.pods);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->nodes.size(), 24u);
  EXPECT_EQ(t->nodes[0].cpus, 96u);
  EXPECT_EQ(t->nodes[0].devices.size(), 8u);
  EXPECT_EQ(t->nodes[1].devices[0].model, "T4");
  ASSERT_EQ(t->pods.size(), 120u);
  EXPECT_EQ(t->pods[0].request.count, 0u);
  EXPECT_EQ(t->pods[3].request.milli, 550u);  // shared
  EXPECT_TRUE(t->pods[3].request.shared());
  EXPECT_EQ(t->pods[11].request.models, std::vector<std::string>{"T4"});
  EXPECT_EQ(t->pods[1].qos, "BE");
}

// openb_pod_list_multigpu50.csv has neither gpu_spec nor qos: any model, no
// QoS. A required column missing is an error naming it.
TEST(TraceTest, GpuSpecAndQosAreOptionalColumns) {
  const Files f = WriteTrace();
  const std::string pods = absl::StrCat(::testing::TempDir(), "/pods-minimal.csv");
  std::ofstream(pods) << "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                         "openb-pod-0000,12000,16384,1,1000\n"
                         "openb-pod-0001,6000,8192,1,300\n";
  absl::StatusOr<Trace> t = LoadTrace(f.nodes, pods);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->pods.size(), 2u);
  EXPECT_TRUE(t->pods[0].request.models.empty());
  EXPECT_EQ(t->pods[0].qos, "");
  EXPECT_EQ(t->pods[1].request.milli, 300u);

  const std::string bad = absl::StrCat(::testing::TempDir(), "/pods-bad.csv");
  std::ofstream(bad) << "name,cpu_milli,memory_mib,gpu_milli\nx,1,1,1\n";
  absl::StatusOr<Trace> b = LoadTrace(f.nodes, bad);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("no column \"num_gpu\""), std::string::npos)
      << b.status();
}

TEST(TraceTest, MissingFileIsNotFound) {
  EXPECT_TRUE(absl::IsNotFound(LoadTrace("/nonexistent/n.csv", "/nonexistent/p.csv").status()));
}

TEST(ReplayTest, ArrivalsReachTheTargetAndFollowTheMapping) {
  const Files f = WriteTrace();
  absl::StatusOr<Trace> t = LoadTrace(f.nodes, f.pods);
  ASSERT_TRUE(t.ok());
  const Mapping m = *ParseMapping("default");
  const std::vector<Arrival> a = *MakeArrivals(*t, m, 7, 1.3);
  double requested = 0;
  for (const Arrival& x : a) {
    requested += t->pods[x.pod].request.device_milli();
    const std::string& q = t->pods[x.pod].qos;
    EXPECT_EQ(x.world, q == "LS" || q == "Guaranteed" ? World::kKubernetes : World::kSlurm);
  }
  uint64_t capacity = 0;
  for (const NodeSpec& n : t->nodes) capacity += n.devices.size() * kWholeDevice;
  EXPECT_GE(requested, 1.3 * capacity);
  std::vector<uint32_t> order, other;
  for (const Arrival& x : a) order.push_back(x.pod);
  const std::vector<Arrival> b = *MakeArrivals(*t, m, 8, 1.3);
  for (const Arrival& x : b) other.push_back(x.pod);
  EXPECT_NE(order, other) << "another seed should give another order";
}

bool SameRows(const ReplayResult& a, const ReplayResult& b) {
  if (a.rows.size() != b.rows.size()) return false;
  for (size_t i = 0; i < a.rows.size(); ++i) {
    const Row& x = a.rows[i];
    const Row& y = b.rows[i];
    if (x.arrived != y.arrived || x.allocated != y.allocated ||
        x.fragmented_gpus != y.fragmented_gpus || x.pods_failed != y.pods_failed) {
      return false;
    }
  }
  return true;
}

TEST(ReplayTest, ReplayIsDeterministicForASeed) {
  const Files f = WriteTrace();
  absl::StatusOr<Trace> t = LoadTrace(f.nodes, f.pods);
  ASSERT_TRUE(t.ok());
  std::vector<placement::PodRequest> requests;
  for (const TracePod& p : t->pods) requests.push_back(p.request);
  const placement::Workload w = placement::Workload::FromPods(requests);
  const Mapping m = *ParseMapping("default");
  ReplayOptions options;
  options.time_decisions = false;
  for (const char* name : {"duet", "fgd", "best-fit", "spread", "static", "static-duet"}) {
    const PolicySpec spec = *ParsePolicySpec(name);
    absl::StatusOr<ReplayResult> r1 = Replay(*t, *MakeArrivals(*t, m, 42, 1.3), w, spec, options);
    absl::StatusOr<ReplayResult> r2 = Replay(*t, *MakeArrivals(*t, m, 42, 1.3), w, spec, options);
    ASSERT_TRUE(r1.ok()) << name << ": " << r1.status();
    ASSERT_TRUE(r2.ok()) << name << ": " << r2.status();
    ASSERT_EQ(r1->rows.size(), 26u) << name;
    EXPECT_TRUE(SameRows(*r1, *r2)) << name;
    // The cluster is oversubscribed by the end: something failed, nothing
    // was allocated past capacity.
    EXPECT_GT(r1->rows.back().pods_failed, 0u) << name;
    EXPECT_LE(r1->rows.back().allocated, 1.0) << name;
  }
}

TEST(ReplayTest, StaticPartitionSplitsGpusByDemand) {
  const Files f = WriteTrace();
  absl::StatusOr<Trace> t = LoadTrace(f.nodes, f.pods);
  ASSERT_TRUE(t.ok());
  const placement::Workload w;
  ReplayOptions options;
  options.time_decisions = false;
  absl::StatusOr<ReplayResult> r = Replay(*t, *MakeArrivals(*t, *ParseMapping("default"), 1, 1.3),
                                          w, *ParsePolicySpec("static"), options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->kubernetes_gpus, 0u);
  EXPECT_GT(r->slurm_gpus, 0u);
  EXPECT_EQ(r->kubernetes_gpus + r->slurm_gpus, 24u / 4 * (8 + 2 + 4 + 4));
}

// The variants that explain static-duet: static-k8s:spread is static itself
// (the same decisions through the Kubernetes part's own scorer); the parts'
// allocations add up to the whole.
TEST(ReplayTest, StaticVariantsDecomposeThePartition) {
  const Files f = WriteTrace();
  absl::StatusOr<Trace> t = LoadTrace(f.nodes, f.pods);
  ASSERT_TRUE(t.ok());
  std::vector<placement::PodRequest> requests;
  for (const TracePod& p : t->pods) requests.push_back(p.request);
  const placement::Workload w = placement::Workload::FromPods(requests);
  ReplayOptions options;
  options.time_decisions = false;
  const std::vector<Arrival> arrivals = *MakeArrivals(*t, *ParseMapping("default"), 3, 1.3);
  absl::StatusOr<ReplayResult> plain = Replay(*t, arrivals, w, *ParsePolicySpec("static"), options);
  absl::StatusOr<ReplayResult> same =
      Replay(*t, arrivals, w, *ParsePolicySpec("static-k8s:spread"), options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_TRUE(SameRows(*plain, *same));
  for (const char* name : {"static", "static-duet", "static-k8s:duet", "static-duet-slurm",
                           "static-duet-own"}) {
    absl::StatusOr<ReplayResult> r = Replay(*t, arrivals, w, *ParsePolicySpec(name), options);
    ASSERT_TRUE(r.ok()) << name << ": " << r.status();
    EXPECT_NEAR(r->kubernetes_allocated_gpus + r->slurm_allocated_gpus,
                r->rows.back().allocated * (r->kubernetes_gpus + r->slurm_gpus), 1e-6)
        << name;
    EXPECT_LE(r->idle_gpus_cpu_full, r->rows.back().idle_gpus + 1e-9) << name;
  }
  EXPECT_EQ(ParsePolicySpec("static-k8s:best-fit")->kubernetes_policy, placement::Policy::kBestFit);
  EXPECT_FALSE(ParsePolicySpec("static-k8s:bogus").ok());
  EXPECT_TRUE(ParsePolicySpec("static-duet-own")->workload_per_part);
}

TEST(MappingTest, ParsesNamedAndExplicitMappings) {
  EXPECT_EQ(ParseMapping("all-k8s")->WorldOf("BE"), World::kKubernetes);
  EXPECT_EQ(ParseMapping("all-slurm")->WorldOf("LS"), World::kSlurm);
  const Mapping m = *ParseMapping("k8s=BE+LS");
  EXPECT_EQ(m.WorldOf("BE"), World::kKubernetes);
  EXPECT_EQ(m.WorldOf("Burstable"), World::kSlurm);
  EXPECT_FALSE(ParseMapping("bogus").ok());
  EXPECT_FALSE(ParsePolicySpec("bogus").ok());
}

}  // namespace
}  // namespace duet::sim
