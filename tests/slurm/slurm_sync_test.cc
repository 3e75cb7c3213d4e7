// SlurmSync + Placeholders against a real Slurm cluster (label: slurm).

#include "bridge/slurm/slurm_sync.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "bridge/slurm/libslurm_client.h"
#include "bridge/slurm/placeholders.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
#include "tests/slurm/slurm_cluster_fixture.h"

namespace duet {
namespace {

using ::duet::testing::CmdResult;
using ::duet::testing::TestSlurmCluster;
using ::duet::testing::WaitFor;

constexpr char kGpu[] = "nvidia-h100-80gb";
constexpr char kTpu[] = "tpu-v5-lite-podslice";

NodeSpec Spec(const std::string& name, int idx, int gpus, int tpus) {
  NodeSpec s;
  s.name = name;
  s.cpus = 8;
  s.memory_mib = 16000;
  s.pool = gpus ? "shared-h100" : "shared-v5e";
  s.zone = "us-central1-a";
  s.labels["duet.dev/slurm-node-addr"] = absl::StrCat("127.0.0.", idx);
  s.labels["cloud.google.com/gce-topology-block"] = "b7";
  if (gpus) s.labels["cloud.google.com/gke-accelerator"] = kGpu;
  if (tpus) s.labels["cloud.google.com/gke-tpu-accelerator"] = kTpu;
  for (int i = 0; i < gpus; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kGpu;
    d.index = i;
    d.model = kGpu;
    s.devices.push_back(d);
  }
  for (int i = 0; i < tpus; ++i) {
    DeviceSpec d;
    d.kind = DeviceKind::kTpu;
    d.index = i;
    d.model = kTpu;
    d.topology.tpu_topology = "2x4";
    s.devices.push_back(d);
  }
  return s;
}

class SlurmSyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = TestSlurmCluster::Get();
    ASSERT_TRUE(cluster_->ok());
    client_ = std::make_unique<LibSlurmClient>();
    SlurmSyncOptions o;
    o.release_grace = absl::ZeroDuration();
    o.pod_exists = [this](const std::string& uid) { return gone_pods_.count(uid) == 0; };
    o.on_drain = [this](const std::string& node, bool drained, const std::string& reason) {
      drain_calls_.push_back(node + (drained ? " drained: " : " resumed: ") + reason);
    };
    sync_ = std::make_unique<SlurmSync>(o, &ledger_, client_.get(), Clock::Real());
    placeholders_ = std::make_unique<Placeholders>(&ledger_, client_.get());
  }

  // Ledger node -> SlurmSync creates it -> its slurmd starts -> IDLE.
  void AddNode(const std::string& name, int idx, int gpus, int tpus = 0) {
    ASSERT_TRUE(ledger_.UpsertNode(Spec(name, idx, gpus, tpus)).ok());
    ASSERT_TRUE(sync_->RunOnce().ok());
    cluster_->StartSlurmd(name, idx, 8, 16000, gpus, kGpu, tpus, kTpu);
    ASSERT_TRUE(cluster_->WaitNodeState(name, "IDLE")) << cluster_->Log("slurmctld.log");
  }

  std::set<uint32_t> LedgerGpus(const std::string& node, const Owner& owner) {
    std::set<uint32_t> out;
    auto h = ledger_.FindHolding(node, owner);
    if (h) {
      for (const HeldDevice& d : h->devices) out.insert(d.index);
    }
    return out;
  }

  // For every live job on `node`, the ledger holds exactly its devices, and
  // every Slurm-side ledger holding on `node` belongs to a live job.
  void ExpectLedgerMatchesSlurm(const std::string& node) {
    auto jobs = client_->ListJobs();
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    std::set<uint32_t> live;
    for (const SlurmJobInfo& j : *jobs) {
      if (!j.live()) continue;
      for (const SlurmJobNodeDevices& d : j.devices) {
        if (d.node != node) continue;
        live.insert(j.job_id);
        auto pod = ParsePlaceholderComment(j.comment);
        Owner owner = pod ? Owner::Placeholder(j.job_id, pod->uid) : Owner::SlurmJob(j.job_id);
        std::set<uint32_t> want(d.gpus.begin(), d.gpus.end());
        EXPECT_EQ(LedgerGpus(node, owner), want) << "job " << j.job_id;
      }
    }
    for (const Holding& h : ledger_.ListHoldings(node)) {
      if (h.owner.kind == OwnerKind::kPod) continue;
      EXPECT_EQ(live.count(h.owner.job_id), 1u) << h.owner.ToString() << " not live in Slurm";
    }
    EXPECT_TRUE(ledger_.CheckInvariants().ok());
  }

  TestSlurmCluster* cluster_ = nullptr;
  Ledger ledger_;
  std::unique_ptr<LibSlurmClient> client_;
  std::unique_ptr<SlurmSync> sync_;
  std::unique_ptr<Placeholders> placeholders_;
  std::set<std::string> gone_pods_;
  std::vector<std::string> drain_calls_;  // from on_drain (RunOnce's thread)
};

TEST_F(SlurmSyncTest, InventoryNodesAppearWithGresAndFeatures) {
  AddNode("sy-a", 31, 8);
  AddNode("sy-b", 32, 8);
  AddNode("sy-t", 33, 0, 4);
  CmdResult r = cluster_->Cli("sinfo -h -N -o '%N|%G|%f|%t'");
  EXPECT_NE(r.out.find("sy-a|gpu:nvidia-h100-80gb:8|block-b7,duet,nvidia-h100-80gb,shared-h100,"
                       "us-central1-a|idle"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("sy-b|gpu:nvidia-h100-80gb:8|"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sy-t|tpu:tpu-v5-lite-podslice:4|block-b7,duet,shared-v5e,"
                       "tpu-topology-2x4,tpu-v5-lite-podslice,us-central1-a|idle"),
            std::string::npos)
      << r.out;
  r = cluster_->Cli("scontrol show node sy-a");
  EXPECT_NE(r.out.find("CPUTot=8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("RealMemory=16000"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("NodeAddr=127.0.0.31"), std::string::npos) << r.out;
  // A second pass changes nothing.
  const SlurmSyncStats before = sync_->stats();
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(sync_->stats().nodes_created, before.nodes_created);
  EXPECT_EQ(sync_->stats().weight_updates, before.weight_updates);
}

TEST_F(SlurmSyncTest, CordonUncordonRemovalAndAdminDrain) {
  AddNode("sy-c", 34, 8);
  AddNode("sy-d", 35, 8);
  NodeSpec c = Spec("sy-c", 34, 8, 0);
  c.state = NodeState::kCordoned;
  ASSERT_TRUE(ledger_.UpsertNode(c).ok());
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(cluster_->Cli("sinfo -h -N -n sy-c -o '%t|%E'").out, "drain|duet: cordoned\n");
  c.state = NodeState::kReady;
  ASSERT_TRUE(ledger_.UpsertNode(c).ok());
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_TRUE(WaitFor([&] { return cluster_->Cli("sinfo -h -N -n sy-c -o '%t'").out == "idle\n"; }));
  EXPECT_EQ(drain_calls_, (std::vector<std::string>{"sy-c drained: duet: cordoned",
                                                    "sy-c resumed: duet: cordoned"}));

  // An admin's drain survives a ready node in the ledger.
  ASSERT_EQ(cluster_->Cli("scontrol update NodeName=sy-d State=DRAIN Reason=admin-maint").rc, 0);
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(cluster_->Cli("sinfo -h -N -n sy-d -o '%t|%E'").out, "drain|admin-maint\n");
  EXPECT_EQ(drain_calls_.size(), 2u) << "an admin's drain is not duet's to report";

  // Removal: drained while a job runs, deleted once it ends.
  uint32_t job = cluster_->Sbatch("-w sy-c --gres=gpu:1 --wrap 'sleep 60'");
  ASSERT_TRUE(cluster_->WaitJobState(job, "RUNNING"));
  ASSERT_TRUE(sync_->RunOnce().ok());  // imports the job
  ASSERT_TRUE(ledger_.RemoveNode("sy-c").ok());  // GONE: the job's holding remains
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(cluster_->Cli("sinfo -h -N -n sy-c -o '%t|%E'").out,
            "drng|duet: node left the inventory\n")
      << "drained while the job runs";
  ASSERT_TRUE(client_->KillJob(job).ok());
  ASSERT_TRUE(WaitFor([&] {
    sync_->RunOnce().IgnoreError();
    return cluster_->Cli("scontrol show node sy-c").rc != 0;
  }));
  EXPECT_EQ(ledger_.GetNode("sy-c"), nullptr) << "released the job, so the node left the ledger";
  cluster_->StopSlurmd("sy-c");
}

TEST_F(SlurmSyncTest, PlaceholderBlocksGpu8JobAndImportMatchesSlurm) {
  AddNode("sy-e", 36, 8);
  const Owner pod = Owner::Pod("uid-e", "default", "web-e");
  auto ph = placeholders_->Create(pod, "sy-e", 2, 0, 1, 100);
  ASSERT_TRUE(ph.ok()) << ph.status();
  ASSERT_EQ(ph->devices.size(), 2u);
  ASSERT_EQ(ph->owner.kind, OwnerKind::kPlaceholder);
  // Slurm's indices are what the ledger recorded.
  CmdResult r = cluster_->Cli(absl::StrCat("scontrol show job -d ", ph->owner.job_id));
  EXPECT_NE(r.out.find(absl::StrCat("IDX:", ph->devices[0].index, "-", ph->devices[1].index)),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("JobName=duet-pod:default/web-e"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Comment=duet-pod uid=uid-e ns=default name=web-e"), std::string::npos);

  // (gpu:6 first: a pending gpu:8 job ahead of it would hold it back until
  // the next backfill cycle.)
  uint32_t six = cluster_->Sbatch("-w sy-e --gres=gpu:6 --wrap 'sleep 60'");
  ASSERT_TRUE(cluster_->WaitJobState(six, "RUNNING"));
  uint32_t big = cluster_->Sbatch("-w sy-e --gres=gpu:8 --wrap 'sleep 60'");
  ASSERT_TRUE(cluster_->WaitJobState(big, "PENDING"));
  EXPECT_EQ(cluster_->JobState(big), "PENDING");
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(LedgerGpus("sy-e", Owner::SlurmJob(six)).size(), 6u);
  ExpectLedgerMatchesSlurm("sy-e");
  // Full node: the weight went to the bottom of the range.
  auto node = client_->GetNode("sy-e");
  ASSERT_TRUE(node.ok() && node->has_value());
  EXPECT_EQ((*node)->weight, 1u);

  ASSERT_TRUE(client_->KillJob(six).ok());
  ASSERT_TRUE(WaitFor([&] { return cluster_->JobEnded(six); }));
  EXPECT_EQ(cluster_->JobState(big), "PENDING") << "the placeholder still holds 2 GPUs";
  ASSERT_TRUE(placeholders_->Cancel("sy-e", "uid-e").ok());
  EXPECT_FALSE(ledger_.FindHolding("sy-e", ph->owner).has_value());
  ASSERT_TRUE(cluster_->WaitJobState(big, "RUNNING"));
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(LedgerGpus("sy-e", Owner::SlurmJob(big)).size(), 8u);
  EXPECT_FALSE(ledger_.FindHolding("sy-e", Owner::SlurmJob(six)).has_value()) << "ended: released";
  ExpectLedgerMatchesSlurm("sy-e");
  client_->KillJob(big).IgnoreError();
}

TEST_F(SlurmSyncTest, TwoGpu4JobsDisjointInLedgerAndOrphanPlaceholders) {
  AddNode("sy-f", 37, 8);
  uint32_t a = cluster_->Sbatch("-w sy-f --gres=gpu:4 --wrap 'sleep 60'");
  uint32_t b = cluster_->Sbatch("-w sy-f --gres=gpu:4 --wrap 'sleep 60'");
  ASSERT_TRUE(cluster_->WaitJobState(a, "RUNNING"));
  ASSERT_TRUE(cluster_->WaitJobState(b, "RUNNING"));
  ASSERT_TRUE(sync_->RunOnce().ok());
  std::set<uint32_t> ga = LedgerGpus("sy-f", Owner::SlurmJob(a));
  std::set<uint32_t> gb = LedgerGpus("sy-f", Owner::SlurmJob(b));
  EXPECT_EQ(ga.size(), 4u);
  EXPECT_EQ(gb.size(), 4u);
  ga.insert(gb.begin(), gb.end());
  EXPECT_EQ(ga.size(), 8u);
  ASSERT_TRUE(client_->KillJob(a).ok());
  ASSERT_TRUE(client_->KillJob(b).ok());
  ASSERT_TRUE(WaitFor([&] { return cluster_->JobEnded(a) && cluster_->JobEnded(b); }));

  // Placeholders Slurm has but the ledger lost (e.g. a bridge crash between
  // allocate and record): adopted if the pod exists, cancelled if not.
  SlurmAllocRequest req;
  req.node = "sy-f";
  req.gpus = 1;
  req.job_name = "duet-pod:default/live";
  req.comment = "duet-pod uid=uid-live ns=default name=live";
  auto live = client_->AllocatePlaceholder(req);
  req.job_name = "duet-pod:default/dead";
  req.comment = "duet-pod uid=uid-dead ns=default name=dead";
  auto dead = client_->AllocatePlaceholder(req);
  ASSERT_TRUE(live.ok() && dead.ok());
  gone_pods_.insert("uid-dead");
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(LedgerGpus("sy-f", Owner::Placeholder(live->job_id, "uid-live")).size(), 1u);
  EXPECT_FALSE(ledger_.FindHolding("sy-f", Owner::Placeholder(dead->job_id, "uid-dead")));
  EXPECT_TRUE(WaitFor([&] { return cluster_->JobEnded(dead->job_id); }));
  EXPECT_EQ(sync_->stats().placeholders_cancelled, 1u);
  client_->KillJob(live->job_id).IgnoreError();
}

TEST_F(SlurmSyncTest, SlurmctldRestartWithLivePlaceholdersAndJobs) {
  AddNode("sy-g", 38, 8);
  auto p1 = placeholders_->Create(Owner::Pod("uid-g1", "default", "g1"), "sy-g", 2, 0, 1, 100);
  auto p2 = placeholders_->Create(Owner::Pod("uid-g2", "default", "g2"), "sy-g", 1, 0, 1, 100);
  ASSERT_TRUE(p1.ok() && p2.ok());
  uint32_t job = cluster_->Sbatch("-w sy-g --gres=gpu:3 --wrap 'sleep 120'");
  ASSERT_TRUE(cluster_->WaitJobState(job, "RUNNING"));
  ASSERT_TRUE(sync_->RunOnce().ok());
  const auto before = ledger_.ListHoldings("sy-g");
  ASSERT_EQ(before.size(), 3u);

  cluster_->CtldStop();
  absl::Status s = sync_->RunOnce();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_TRUE(sync_->degraded());
  // The ledger keeps serving; nothing released, nothing granted on a guess.
  EXPECT_EQ(ledger_.ListHoldings("sy-g").size(), 3u);
  auto p3 = placeholders_->Create(Owner::Pod("uid-g3", "default", "g3"), "sy-g", 1, 0, 1, 100);
  EXPECT_TRUE(absl::IsUnavailable(p3.status())) << p3.status();
  EXPECT_TRUE(absl::IsUnavailable(placeholders_->Cancel("sy-g", "uid-g2")));
  EXPECT_TRUE(ledger_.FindHolding("sy-g", p2->owner).has_value());

  ASSERT_TRUE(cluster_->CtldStart());
  ASSERT_TRUE(WaitFor([&] { return sync_->RunOnce().ok(); }));
  EXPECT_FALSE(sync_->degraded());
  EXPECT_EQ(cluster_->JobState(p1->owner.job_id), "RUNNING");
  EXPECT_EQ(cluster_->JobState(p2->owner.job_id), "RUNNING");
  EXPECT_EQ(cluster_->JobState(job), "RUNNING");
  EXPECT_EQ(ledger_.ListHoldings("sy-g").size(), 3u);
  ExpectLedgerMatchesSlurm("sy-g");
  // Slurm 22.05 refuses new GRES steps on recovered dynamic nodes ("Invalid
  // generic resource") until a reconfigure, which the sync did once.
  EXPECT_EQ(sync_->stats().reconfigures, 1u);
  CmdResult step = cluster_->Cli("srun -w sy-g --gres=gpu:1 true");
  EXPECT_EQ(step.rc, 0) << step.out;
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(sync_->stats().reconfigures, 1u) << "once per slurmctld start";
  // And it works again.
  ASSERT_TRUE(placeholders_->Cancel("sy-g", "uid-g2").ok());
  EXPECT_TRUE(WaitFor([&] { return cluster_->JobEnded(p2->owner.job_id); }));
  client_->KillJob(job).IgnoreError();
}

// The inventory changes a node's GPU count: Slurm refuses GRES count changes
// on a node with File= devices (F11), so the sync drains it while a job runs
// and deletes and recreates it once empty, logging both.
TEST_F(SlurmSyncTest, GresChangeDrainsThenRecreatesOnceEmpty) {
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256);
  spdlog::default_logger()->sinks().push_back(ring);
  auto logged = [&](const std::string& needle) {
    for (const std::string& line : ring->last_formatted()) {
      if (line.find(needle) != std::string::npos) return true;
    }
    return false;
  };
  AddNode("sy-r", 39, 8);
  uint32_t job = cluster_->Sbatch("-w sy-r --gres=gpu:1 --wrap 'sleep 60'");
  ASSERT_TRUE(cluster_->WaitJobState(job, "RUNNING"));
  ASSERT_TRUE(sync_->RunOnce().ok());

  // The node now has 4 GPUs (its GPU 0, the job's, stays).
  ASSERT_TRUE(ledger_.UpsertNode(Spec("sy-r", 39, 4, 0)).ok());
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(cluster_->Cli("sinfo -h -N -n sy-r -o '%t|%E'").out,
            "drng|duet: GRES changed, recreating once empty\n");
  EXPECT_TRUE(logged("sy-r GRES gpu:nvidia-h100-80gb:8 -> gpu:nvidia-h100-80gb:4: drained"));
  EXPECT_EQ(sync_->stats().nodes_recreated, 0u);
  EXPECT_EQ(cluster_->JobState(job), "RUNNING") << "a drain does not touch the running job";

  // The job ends and the changed machine's slurmd stops (it comes back with
  // its new devices below). Then the node is deleted and recreated with the
  // new GRES, once.
  ASSERT_TRUE(client_->KillJob(job).ok());
  ASSERT_TRUE(WaitFor([&] { return cluster_->JobEnded(job); }));
  cluster_->StopSlurmd("sy-r");
  ASSERT_TRUE(WaitFor([&] {
    sync_->RunOnce().IgnoreError();
    return sync_->stats().nodes_recreated == 1;
  }));
  EXPECT_TRUE(logged("recreated Slurm node sy-r for GRES gpu:nvidia-h100-80gb:8 -> "
                     "gpu:nvidia-h100-80gb:4"));
  CmdResult r = cluster_->Cli("scontrol --future show node sy-r");
  EXPECT_NE(r.out.find("Gres=gpu:nvidia-h100-80gb:4"), std::string::npos) << r.out;

  // Its slurmd starts with 4 GPUs.
  ASSERT_EQ(duet::testing::RunCmd(absl::StrCat("sed -i '/^NodeName=sy-r /d' ", cluster_->root(),
                                               "/etc/gres.conf"))
                .rc,
            0);
  cluster_->StartSlurmd("sy-r", 39, 8, 16000, 4, kGpu);
  ASSERT_TRUE(cluster_->WaitNodeState("sy-r", "IDLE")) << cluster_->Log("slurmctld.log");
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(sync_->stats().nodes_recreated, 1u) << "recreated once, not on every pass";
  EXPECT_TRUE(WaitFor([&] {
    return cluster_->Cli("sinfo -h -N -n sy-r -o '%t|%G'").out == "idle|gpu:nvidia-h100-80gb:4\n";
  })) << cluster_->Cli("sinfo -h -N -n sy-r -o '%t|%G'").out;
  // 4 GPUs fit, 5 do not.
  EXPECT_EQ(cluster_->Cli("srun -w sy-r --gres=gpu:4 true").rc, 0);
  r = cluster_->Cli("srun -w sy-r --immediate=5 --gres=gpu:5 true");
  EXPECT_NE(r.rc, 0) << r.out;
  spdlog::default_logger()->sinks().pop_back();
  cluster_->StopSlurmd("sy-r");
}

// What Slurm's jobs hold in CPU and memory reaches SlurmNodeLoads on each
// pass (the extender's filter subtracts it); a job's end clears it.
TEST_F(SlurmSyncTest, PassesRefreshTheCpuAndMemoryThatSlurmJobsHold) {
  SlurmNodeLoads loads;
  SlurmSyncOptions o;
  o.loads = &loads;
  SlurmSync sync(o, &ledger_, client_.get(), Clock::Real());
  AddNode("sy-l", 40, 8);
  ASSERT_TRUE(sync.RunOnce().ok());
  EXPECT_EQ(loads.Get("sy-l").cpu_milli, 0u);

  const uint32_t job = cluster_->Sbatch("-w sy-l -c 6 --mem=3000 --gres=gpu:1 --wrap 'sleep 60'");
  ASSERT_TRUE(cluster_->WaitJobState(job, "RUNNING"));
  ASSERT_TRUE(sync.RunOnce().ok());
  placement::NodeLoad l = loads.Get("sy-l");
  EXPECT_EQ(l.cpu_milli, 6000u) << cluster_->Cli("scontrol show node sy-l").out;
  EXPECT_EQ(l.memory_mib, 3000u) << cluster_->Cli("scontrol show node sy-l").out;

  // A placeholder made after the pass counts until the next pass reads
  // Slurm again (which then reports only what is really allocated).
  loads.Add("sy-l", placement::NodeLoad{1000, 500});
  EXPECT_EQ(loads.Get("sy-l").cpu_milli, 7000u);
  EXPECT_EQ(loads.Get("sy-l").memory_mib, 3500u);
  ASSERT_TRUE(sync.RunOnce().ok());
  EXPECT_EQ(loads.Get("sy-l").cpu_milli, 6000u);

  cluster_->Cli(absl::StrCat("scancel ", job));
  ASSERT_TRUE(WaitFor([&] {
    if (!sync.RunOnce().ok()) return false;
    return loads.Get("sy-l").cpu_milli == 0 && loads.Get("sy-l").memory_mib == 0;
  })) << cluster_->Cli("scontrol show node sy-l").out;
}

// Placeholders::ReleaseEnded: a placeholder whose Slurm job was cancelled
// behind the ledger's back (the gap inside Cancel) is released for a step
// that asks its devices; a live one is kept.
TEST_F(SlurmSyncTest, ReleaseEndedReleasesOnlyPlaceholdersWhoseJobEnded) {
  AddNode("sy-m", 43, 8);
  auto live = placeholders_->Create(Owner::Pod("uid-m1", "default", "m1"), "sy-m", 2, 0, 1, 100);
  auto dead = placeholders_->Create(Owner::Pod("uid-m2", "default", "m2"), "sy-m", 2, 0, 1, 100);
  ASSERT_TRUE(live.ok()) << live.status();
  ASSERT_TRUE(dead.ok()) << dead.status();
  ASSERT_EQ(cluster_->Cli(absl::StrCat("scancel ", dead->owner.job_id)).rc, 0);
  ASSERT_TRUE(WaitFor([&] {
    auto j = client_->GetJob(dead->owner.job_id);
    return j.ok() && (!j->has_value() || !(*j)->live() || (*j)->state == SlurmJobState::kCompleting);
  }));

  std::vector<HeldDevice> all;
  for (const HeldDevice& d : live->devices) all.push_back(d);
  for (const HeldDevice& d : dead->devices) all.push_back(d);
  // Only the live placeholder's devices: nothing to release.
  absl::StatusOr<int> n = placeholders_->ReleaseEnded("sy-m", live->devices);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0);
  n = placeholders_->ReleaseEnded("sy-m", all);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1);
  EXPECT_FALSE(ledger_.FindHolding("sy-m", dead->owner).has_value());
  EXPECT_TRUE(ledger_.FindHolding("sy-m", live->owner).has_value());
  n = placeholders_->ReleaseEnded("sy-m", all);  // nothing left to release
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0);
  EXPECT_TRUE(placeholders_->Cancel("sy-m", "uid-m1").ok());
}

}  // namespace
}  // namespace duet
