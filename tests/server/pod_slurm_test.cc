// Invariant I2 end to end with a real Slurm cluster (label slurm): a pod's
// placeholder job made by Placeholders::Create is cancelled in Slurm and
// released in the ledger when the pod is deleted in the (fake) API server;
// while slurmctld is down the holding is kept, and the release happens once
// it is back.

#include "absl/strings/str_cat.h"
#include "bridge/server/pod_release.h"
#include "bridge/slurm/libslurm_client.h"
#include "bridge/slurm/placeholders.h"
#include "bridge/slurm/slurm_sync.h"
#include "gtest/gtest.h"
#include "k8s_adapter/reconcile/pod_watch.h"
#include "tests/k8s_adapter/fake_server.h"
#include "tests/slurm/slurm_cluster_fixture.h"

namespace duet {
namespace {

using ::duet::testing::TestSlurmCluster;

NodeSpec Spec(const std::string& name, int idx, int gpus) {
  NodeSpec s;
  s.name = name;
  s.cpus = 8;
  s.memory_mib = 16000;
  s.pool = "shared-h100";
  s.labels["duet.dev/slurm-node-addr"] = absl::StrCat("127.0.0.", idx);
  s.labels["cloud.google.com/gke-accelerator"] = "nvidia-h100-80gb";
  for (int i = 0; i < gpus; ++i) {
    DeviceSpec d;
    d.index = i;
    d.model = "nvidia-h100-80gb";
    s.devices.push_back(d);
  }
  return s;
}

nlohmann::json BoundPod(const std::string& name, const std::string& uid, const std::string& node) {
  return {{"kind", "Pod"},
          {"metadata", {{"name", name}, {"namespace", "ml"}, {"uid", uid}}},
          {"spec", {{"nodeName", node}, {"containers", {{{"name", "c"}, {"image", "x"}}}}}},
          {"status", {{"phase", "Running"}}}};
}

TEST(PodSlurmTest, DeletedPodsPlaceholderIsCancelledInSlurmAndKeptWhileSlurmIsDown) {
  TestSlurmCluster* cluster = TestSlurmCluster::Get();
  ASSERT_TRUE(cluster->ok());
  Ledger ledger;
  LibSlurmClient slurm;
  SlurmSyncOptions so;
  so.manage_weights = false;
  SlurmSync sync(so, &ledger, &slurm, Clock::Real());
  ASSERT_TRUE(ledger.UpsertNode(Spec("pl-a", 41, 8)).ok());
  ASSERT_TRUE(sync.RunOnce().ok());
  cluster->StartSlurmd("pl-a", 41, 8, 16000, 8, "nvidia-h100-80gb", 0, "");
  ASSERT_TRUE(cluster->WaitNodeState("pl-a", "IDLE")) << cluster->Log("slurmctld.log");
  Placeholders placeholders(&ledger, &slurm);
  auto p1 = placeholders.Create(Owner::Pod("uid-1", "ml", "train-1"), "pl-a", 2, 0, 1, 100);
  auto p2 = placeholders.Create(Owner::Pod("uid-2", "ml", "train-2"), "pl-a", 2, 0, 1, 100);
  ASSERT_TRUE(p1.ok() && p2.ok()) << p1.status() << p2.status();
  ASSERT_TRUE(cluster->WaitJobState(p1->owner.job_id, "RUNNING"));

  k8s::testing::FakeApiServer fake;
  ASSERT_TRUE(fake.ok());
  fake.Put(BoundPod("train-1", "uid-1", "pl-a"));
  fake.Put(BoundPod("train-2", "uid-2", "pl-a"));
  BridgePodReleaser releaser(&ledger, &placeholders, nullptr);
  k8s::PodWatchOptions po;
  po.sweep_period = absl::Milliseconds(200);
  k8s::PodWatch watch(fake.control(), &ledger, &releaser, po);
  ASSERT_TRUE(watch.Start().ok());

  fake.Delete("Pod", "train-1", "ml");
  ASSERT_TRUE(k8s::testing::WaitFor([&] { return cluster->JobEnded(p1->owner.job_id); }));
  ASSERT_TRUE(k8s::testing::WaitFor(
      [&] { return !ledger.FindHolding("pl-a", p1->owner).has_value(); }));
  EXPECT_EQ(cluster->JobState(p2->owner.job_id), "RUNNING");
  EXPECT_TRUE(ledger.FindHolding("pl-a", p2->owner).has_value());

  // slurmctld down: the pod goes, the placeholder stays (UNAVAILABLE).
  cluster->CtldStop();
  fake.Delete("Pod", "train-2", "ml");
  // Each failed attempt may take the Slurm client's whole deadline (5 s: a
  // newer libslurm keeps retrying the connection), so two take over 10 s.
  ASSERT_TRUE(k8s::testing::WaitFor([&] { return watch.stats().release_failures >= 2; },
                                    absl::Seconds(30)));
  EXPECT_TRUE(ledger.FindHolding("pl-a", p2->owner).has_value());
  ASSERT_TRUE(cluster->CtldStart());
  ASSERT_TRUE(k8s::testing::WaitFor(
      [&] { return !ledger.FindHolding("pl-a", p2->owner).has_value(); }, absl::Seconds(20)));
  EXPECT_TRUE(k8s::testing::WaitFor([&] { return cluster->JobEnded(p2->owner.job_id); }));
  EXPECT_EQ(watch.stats().released_deleted, 2u);
  watch.Stop();
  EXPECT_TRUE(ledger.CheckInvariants().ok());
}

}  // namespace
}  // namespace duet
