// SlurmSync + Placeholders against a real Slurm cluster (label: slurm).

#include "bridge/slurm/slurm_sync.h"

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bridge/slurm/libslurm_client.h"
#include "bridge/slurm/placeholders.h"
#include "bridge/slurm/stale_holders.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
#include "tests/slurm/slurm_cluster_fixture.h"
#include "tests/slurm/test_node_spec.h"

namespace duet {
namespace {

using ::duet::testing::CmdResult;
using ::duet::testing::TestSlurmCluster;
using ::duet::testing::WaitFor;

constexpr const char* kGpu = ::duet::testing::kTestGpuModel;
constexpr const char* kTpu = ::duet::testing::kTestTpuModel;

NodeSpec Spec(const std::string& name, int idx, int gpus, int tpus) {
  return ::duet::testing::TestNodeSpec(name, idx, gpus, tpus);
}


class SlurmSyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TestSlurmCluster::Options co;
    co.configless = node_mode_ == SlurmNodeMode::kAdopt;  // one cluster per test process
    cluster_ = TestSlurmCluster::Get(co);
    ASSERT_TRUE(cluster_->ok());
    client_ = std::make_unique<LibSlurmClient>();
    SlurmSyncOptions o;
    o.node_mode = node_mode_;
    o.loads = &loads_;
    o.release_grace = absl::ZeroDuration();
    o.pod_liveness = [this](const std::string& uid) { return Liveness(uid); };
    o.on_placeholder_lost = [this](const PlaceholderLoss& loss) { losses_.push_back(loss); };
    o.on_drain = [this](const std::string& node, bool drained, const std::string& reason) {
      drain_calls_.push_back(node + (drained ? " drained: " : " resumed: ") + reason);
    };
    sync_ = std::make_unique<SlurmSync>(o, &ledger_, client_.get(), Clock::Real());
    placeholders_ = std::make_unique<Placeholders>(&ledger_, client_.get());
    stale_ = std::make_unique<StaleHolders>(
        &ledger_, client_.get(), [this](const std::string& uid) { return Liveness(uid); });
  }

  PodLiveness Liveness(const std::string& uid) const {
    return gone_pods_.count(uid) ? PodLiveness::kGone : PodLiveness::kLive;
  }

  // Waits until Slurm no longer runs `job_id`.
  bool WaitJobOver(uint32_t job_id) {
    return WaitFor([&] {
      auto j = client_->GetJob(job_id);
      return j.ok() && (!j->has_value() || !(*j)->live());
    });
  }

  // Slurm's GPU indices of the live placeholders of `uid` on `node`.
  std::set<uint32_t> SlurmPlaceholderGpus(const std::string& node, const std::string& uid) {
    std::set<uint32_t> out;
    auto jobs = client_->ListJobs();
    EXPECT_TRUE(jobs.ok()) << jobs.status();
    if (!jobs.ok()) return out;
    for (const SlurmJobInfo& j : *jobs) {
      auto pod = ParsePlaceholderComment(j.comment);
      if (!j.live() || !pod || pod->uid != uid) continue;
      for (const SlurmJobNodeDevices& d : j.devices) {
        if (d.node == node) out.insert(d.gpus.begin(), d.gpus.end());
      }
    }
    return out;
  }

  // No live Slurm job other than a placeholder holds any of `gpus` on `node`
  // (per Slurm's own GRES detail).
  ::testing::AssertionResult NoSlurmJobHolds(const std::string& node,
                                             const std::set<uint32_t>& gpus) {
    auto jobs = client_->ListJobs();
    if (!jobs.ok()) return ::testing::AssertionFailure() << jobs.status();
    for (const SlurmJobInfo& j : *jobs) {
      if (!j.live() || ParsePlaceholderComment(j.comment)) continue;
      for (const SlurmJobNodeDevices& d : j.devices) {
        for (uint32_t g : d.gpus) {
          if (d.node == node && gpus.count(g)) {
            return ::testing::AssertionFailure() << "job " << j.job_id << " holds gpu " << g;
          }
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

  // The pod's GPUs in the ledger over all its placeholder holdings on `node`.
  std::set<uint32_t> LedgerPodGpus(const std::string& node, const std::string& uid) {
    std::set<uint32_t> out;
    for (const Holding& h : ledger_.ListHoldings(node)) {
      if (h.owner.kind != OwnerKind::kPlaceholder || h.owner.pod_uid != uid) continue;
      for (const HeldDevice& d : h.devices) out.insert(d.index);
    }
    return out;
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

  SlurmNodeMode node_mode_ = SlurmNodeMode::kCreate;
  SlurmNodeLoads loads_;
  TestSlurmCluster* cluster_ = nullptr;
  Ledger ledger_;
  std::unique_ptr<LibSlurmClient> client_;
  std::unique_ptr<SlurmSync> sync_;
  std::unique_ptr<Placeholders> placeholders_;
  std::unique_ptr<StaleHolders> stale_;
  std::set<std::string> gone_pods_;
  std::vector<PlaceholderLoss> losses_;   // from on_placeholder_lost
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
  // sy-t is one of the 2 hosts of a 2x4 slice (4 chips of 8): it names its
  // slice, the pool (docs/gangs.md 5).
  EXPECT_NE(r.out.find("sy-t|tpu:tpu-v5-lite-podslice:4|block-b7,duet,shared-v5e,"
                       "tpu-slice-shared-v5e,tpu-topology-2x4,tpu-v5-lite-podslice,"
                       "us-central1-a|idle"),
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
  // Unusable for the extender's filter from the pass that drained it, not
  // only from the next pass's read: a node uncordoned in between would pass
  // the filter while Slurm still refuses placeholders on it (errno 2068).
  EXPECT_EQ(loads_.Unusable("sy-c"), "drained in Slurm (duet: cordoned)");
  c.state = NodeState::kReady;
  ASSERT_TRUE(ledger_.UpsertNode(c).ok());
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_TRUE(WaitFor([&] { return cluster_->Cli("sinfo -h -N -n sy-c -o '%t'").out == "idle\n"; }));
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(loads_.Unusable("sy-c"), "") << "usable again once a pass reads it resumed";
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
  absl::StatusOr<SlurmControllerInfo> ctld = client_->Controller();
  ASSERT_TRUE(ctld.ok()) << ctld.status();
  ASSERT_TRUE(WaitFor([&] { return sync_->RunOnce().ok(); }));
  EXPECT_FALSE(sync_->degraded());
  EXPECT_EQ(cluster_->JobState(p1->owner.job_id), "RUNNING");
  EXPECT_EQ(cluster_->JobState(p2->owner.job_id), "RUNNING");
  EXPECT_EQ(cluster_->JobState(job), "RUNNING");
  EXPECT_EQ(ledger_.ListHoldings("sy-g").size(), 3u);
  ExpectLedgerMatchesSlurm("sy-g");
  // Slurm 22.05 refuses new GRES steps on recovered dynamic nodes ("Invalid
  // generic resource") until a reconfigure, which the sync did once; 24.11
  // and later need none (and restart slurmctld to carry one out).
  const uint64_t reconfigures = absl::StartsWith(ctld->version, "22.05.") ? 1 : 0;
  EXPECT_EQ(sync_->stats().reconfigures, reconfigures) << ctld->version;
  CmdResult step = cluster_->Cli("srun -w sy-g --gres=gpu:1 true");
  EXPECT_EQ(step.rc, 0) << step.out;
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(sync_->stats().reconfigures, reconfigures) << "at most once per slurmctld start";
  // And it works again.
  ASSERT_TRUE(placeholders_->Cancel("sy-g", "uid-g2").ok());
  EXPECT_TRUE(WaitFor([&] { return cluster_->JobEnded(p2->owner.job_id); }));
  client_->KillJob(job).IgnoreError();
}

// Gangs (docs/gangs.md 2.5): a gang's one job over two nodes; after a
// bridge restart (a new ledger with the same holdings, as a replayed
// journal gives, and a new sync) the job's slots and its bound member stay
// as they are, nothing is imported as a Slurm job; Cancel then ends it all.
TEST_F(SlurmSyncTest, GangJobsSlotsAndMembersSurviveABridgeRestart) {
  AddNode("sy-m", 49, 4);
  AddNode("sy-n", 50, 4);
  const gang::GangKey key{"ml", gang::GangSource::kPodGroup, "train"};
  gang::GangSpec spec;
  spec.key = key;
  spec.min_member = 4;
  spec.member.count = 1;
  spec.member.cpu_milli = 1000;
  spec.member.memory_mib = 100;
  absl::StatusOr<gang::GangAllocation> a =
      placeholders_->Create(key, spec, {{"sy-m", 2}, {"sy-n", 2}});
  ASSERT_TRUE(a.ok()) << a.status() << cluster_->Log("slurmctld.log");
  ASSERT_EQ(a->slots.size(), 4u);
  CmdResult r = cluster_->Cli(absl::StrCat("scontrol show job ", a->job_id));
  EXPECT_NE(r.out.find("JobName=duet-gang:podgroup/ml/train"), std::string::npos) << r.out;
  const Owner member = Owner::Placeholder(a->job_id, "uid-member-0");
  ASSERT_TRUE(ledger_.Rebind("sy-m", a->slots[0].owner, member).ok());
  ASSERT_TRUE(sync_->RunOnce().ok());
  const std::vector<Holding> before = ledger_.ListHoldings();
  ASSERT_EQ(before.size(), 4u);

  // The restart.
  Ledger ledger;
  ASSERT_TRUE(ledger.UpsertNode(Spec("sy-m", 49, 4, 0)).ok());
  ASSERT_TRUE(ledger.UpsertNode(Spec("sy-n", 50, 4, 0)).ok());
  for (const Holding& h : before) {
    HoldRequest req;
    req.node = h.node;
    req.owner = h.owner;
    req.devices = h.devices;
    ASSERT_TRUE(ledger.Hold(req).ok());
  }
  SlurmSyncOptions o;
  o.release_grace = absl::ZeroDuration();
  o.pod_liveness = [](const std::string&) { return PodLiveness::kLive; };
  SlurmSync sync(o, &ledger, client_.get(), Clock::Real());
  absl::Status pass = sync.RunOnce();
  ASSERT_TRUE(pass.ok()) << pass;
  pass = sync.RunOnce();
  ASSERT_TRUE(pass.ok()) << pass;
  const std::vector<Holding> after = ledger.ListHoldings();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].owner, before[i].owner);
    EXPECT_EQ(after[i].node, before[i].node);
    EXPECT_EQ(after[i].devices, before[i].devices);
  }
  EXPECT_EQ(sync.stats().conflicts, 0u);
  EXPECT_EQ(sync.stats().holdings_imported, 0u);
  EXPECT_FALSE(ledger.FindHolding("sy-m", Owner::SlurmJob(a->job_id)).has_value());
  // Slurm's devices of the job are exactly the ledger's slots and member.
  auto job = client_->GetJob(a->job_id);
  ASSERT_TRUE(job.ok() && job->has_value()) << job.status();
  for (const SlurmJobNodeDevices& d : (*job)->devices) {
    std::set<uint32_t> held;
    for (const Holding& h : ledger.ListHoldings(d.node)) {
      if (h.owner.job_id == a->job_id) {
        for (const HeldDevice& x : h.devices) held.insert(x.index);
      }
    }
    EXPECT_EQ(held, std::set<uint32_t>(d.gpus.begin(), d.gpus.end())) << d.node;
  }

  Placeholders placeholders(&ledger, client_.get());
  // Never another gang's job.
  EXPECT_TRUE(absl::IsFailedPrecondition(placeholders.Cancel(
      gang::GangKey{"ml", gang::GangSource::kPodGroup, "other"}, a->job_id)));
  EXPECT_EQ(ledger.ListHoldings().size(), 4u);
  ASSERT_TRUE(placeholders.Cancel(key, a->job_id).ok());
  EXPECT_TRUE(ledger.ListHoldings().empty());
  EXPECT_TRUE(WaitJobOver(a->job_id));
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

// StaleHolders: a Slurm step refused because the ledger lags Slurm. Released:
// a placeholder whose job was cancelled and whose pod is gone (the gap inside
// Cancel), and the import of a Slurm job Slurm no longer runs. Kept: a live
// placeholder, a live Slurm job, and a placeholder that was scancelled while
// its pod still runs (an admin's action never hands a pod's GPUs to Slurm).
TEST_F(SlurmSyncTest, StaleHoldersReleasesOnlyWhatEndedAndNeverALivePodsDevices) {
  AddNode("sy-m", 43, 8);
  auto live = placeholders_->Create(Owner::Pod("uid-m1", "default", "m1"), "sy-m", 2, 0, 1, 100);
  auto dead = placeholders_->Create(Owner::Pod("uid-m2", "default", "m2"), "sy-m", 2, 0, 1, 100);
  auto scancelled =
      placeholders_->Create(Owner::Pod("uid-m3", "default", "m3"), "sy-m", 2, 0, 1, 100);
  ASSERT_TRUE(live.ok()) << live.status();
  ASSERT_TRUE(dead.ok()) << dead.status();
  ASSERT_TRUE(scancelled.ok()) << scancelled.status();
  gone_pods_.insert("uid-m2");
  ASSERT_EQ(cluster_->Cli(absl::StrCat("scancel ", dead->owner.job_id)).rc, 0);
  ASSERT_EQ(cluster_->Cli(absl::StrCat("scancel ", scancelled->owner.job_id)).rc, 0);
  ASSERT_TRUE(WaitJobOver(dead->owner.job_id));
  ASSERT_TRUE(WaitJobOver(scancelled->owner.job_id));
  // A Slurm job's import that Slurm no longer runs (job ids from 900000 are
  // never reached here), on the last two GPUs.
  HoldRequest stale_job;
  stale_job.node = "sy-m";
  stale_job.owner = Owner::SlurmJob(900001);
  stale_job.devices = {{DeviceKind::kGpu, 6, kWholeDevice}, {DeviceKind::kGpu, 7, kWholeDevice}};
  ASSERT_TRUE(ledger_.Hold(stale_job).ok());

  std::vector<HeldDevice> all;
  for (uint32_t g = 0; g < 8; ++g) all.push_back({DeviceKind::kGpu, g, kWholeDevice});
  const Owner step = Owner::SlurmStep(900100, 0);
  // Only the live placeholder's devices: nothing to release.
  absl::StatusOr<int> n = stale_->ReleaseEnded("sy-m", step, live->devices);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0);
  n = stale_->ReleaseEnded("sy-m", step, all);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 2);  // the gone pod's placeholder and the ended job
  EXPECT_FALSE(ledger_.FindHolding("sy-m", dead->owner).has_value());
  EXPECT_FALSE(ledger_.FindHolding("sy-m", stale_job.owner).has_value());
  EXPECT_TRUE(ledger_.FindHolding("sy-m", live->owner).has_value());
  EXPECT_TRUE(ledger_.FindHolding("sy-m", scancelled->owner).has_value())
      << "a scancelled placeholder of a running pod must keep its devices";
  n = stale_->ReleaseEnded("sy-m", step, all);  // nothing left to release
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0);
  EXPECT_TRUE(placeholders_->Cancel("sy-m", "uid-m1").ok());
  gone_pods_.insert("uid-m3");
  ASSERT_TRUE(sync_->RunOnce().ok());  // the sync releases m3 now that its pod is gone
  EXPECT_FALSE(ledger_.FindHolding("sy-m", scancelled->owner).has_value());
}

// An admin's scancel of a running pod's placeholder: the pod keeps its
// devices in the ledger, and the next pass re-creates the placeholder on
// exactly those devices (fillers take the free GPUs below them first), so
// Slurm cannot give them to a job.
TEST_F(SlurmSyncTest, ScancelledPlaceholderOfARunningPodIsRepairedOnTheSameDevices) {
  AddNode("sy-n", 44, 8);
  auto p1 = placeholders_->Create(Owner::Pod("uid-n1", "default", "n1"), "sy-n", 2, 0, 1, 100);
  auto p2 = placeholders_->Create(Owner::Pod("uid-n2", "default", "n2"), "sy-n", 2, 0, 2, 200);
  ASSERT_TRUE(p1.ok()) << p1.status();
  ASSERT_TRUE(p2.ok()) << p2.status();
  ASSERT_TRUE(sync_->RunOnce().ok());  // the sync sees both placeholders live
  const std::set<uint32_t> p2_gpus = LedgerPodGpus("sy-n", "uid-n2");
  ASSERT_EQ(p2_gpus, (std::set<uint32_t>{2, 3}));
  // n1 ends for real (its GPUs 0-1 become free); n2's placeholder is scancelled.
  gone_pods_.insert("uid-n1");
  ASSERT_TRUE(placeholders_->Cancel("sy-n", "uid-n1").ok());
  ASSERT_EQ(cluster_->Cli(absl::StrCat("scancel ", p2->owner.job_id)).rc, 0);
  ASSERT_TRUE(WaitJobOver(p2->owner.job_id));
  EXPECT_EQ(LedgerPodGpus("sy-n", "uid-n2"), p2_gpus);

  ASSERT_TRUE(WaitFor([&] {
    (void)sync_->RunOnce();
    return SlurmPlaceholderGpus("sy-n", "uid-n2") == p2_gpus;
  })) << cluster_->Cli("squeue -o '%i %j %T %b'").out;
  EXPECT_EQ(LedgerPodGpus("sy-n", "uid-n2"), p2_gpus);
  EXPECT_FALSE(ledger_.FindHolding("sy-n", p2->owner).has_value()) << "the lost job is replaced";
  ASSERT_EQ(losses_.size(), 1u);
  EXPECT_TRUE(losses_[0].repaired) << losses_[0].detail;
  EXPECT_EQ(losses_[0].pod.name, "n2");
  EXPECT_EQ(losses_[0].lost_job_id, p2->owner.job_id);
  EXPECT_EQ(sync_->stats().placeholders_lost_repaired, 1u);
  EXPECT_EQ(sync_->stats().placeholders_fenced, 0u);
  // The fillers are gone; a job asking all 8 GPUs cannot start.
  ASSERT_TRUE(WaitFor([&] {
    return cluster_->Cli("squeue -h -n duet-repair-filler -t running,configuring -o %i")
        .out.empty();
  }));
  const uint32_t job = cluster_->Sbatch("-w sy-n --gres=gpu:8 --wrap 'sleep 30'");
  ASSERT_NE(job, 0u);
  // The scheduler has looked at it and found no room (not merely not yet).
  ASSERT_TRUE(WaitFor([&] {
    return cluster_->Cli(absl::StrCat("squeue -h -j ", job, " -o %r")).out.find("Resources") !=
           std::string::npos;
  })) << cluster_->Cli(absl::StrCat("squeue -j ", job, " -o '%i %T %r'")).out;
  EXPECT_EQ(cluster_->JobState(job), "PENDING");
  cluster_->Cli(absl::StrCat("scancel ", job));
  ExpectLedgerMatchesSlurm("sy-n");
  EXPECT_TRUE(placeholders_->Cancel("sy-n", "uid-n2").ok());
}

// state=down kills every job on the node, the pod's placeholder included.
// Slurm returns the node to service as soon as its slurmd answers
// (ReturnToService=2), so the repair may come at once: at every pass the pod's
// devices stay held in the ledger, no Slurm job ever holds them, and the
// placeholder comes back on exactly them.
TEST_F(SlurmSyncTest, NodeDownKeepsThePodsDevicesAndTheirPlaceholderComesBack) {
  AddNode("sy-o", 45, 8);
  auto job = cluster_->Sbatch("-w sy-o --gres=gpu:2 --wrap 'sleep 60'");
  ASSERT_NE(job, 0u);
  ASSERT_TRUE(cluster_->WaitJobState(job, "RUNNING"));
  auto p = placeholders_->Create(Owner::Pod("uid-o1", "default", "o1"), "sy-o", 2, 0, 1, 100);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(sync_->RunOnce().ok());
  const std::set<uint32_t> gpus = LedgerPodGpus("sy-o", "uid-o1");
  ASSERT_EQ(gpus, (std::set<uint32_t>{2, 3}));

  ASSERT_EQ(cluster_->Cli("scontrol update nodename=sy-o state=down reason=maint").rc, 0);
  ASSERT_TRUE(WaitJobOver(p->owner.job_id));
  ASSERT_TRUE(WaitFor(
      [&] {
        (void)sync_->RunOnce();
        EXPECT_EQ(LedgerPodGpus("sy-o", "uid-o1"), gpus) << "the pod's devices stay held";
        EXPECT_TRUE(NoSlurmJobHolds("sy-o", gpus));
        return SlurmPlaceholderGpus("sy-o", "uid-o1") == gpus;
      },
      absl::Seconds(30)))
      << cluster_->Cli("scontrol show node sy-o").out;
  ASSERT_FALSE(losses_.empty());
  EXPECT_TRUE(losses_.back().repaired) << losses_.back().detail;
  EXPECT_EQ(sync_->stats().placeholder_repairs, 1u);
  EXPECT_EQ(sync_->stats().placeholders_fenced, 0u);
  ExpectLedgerMatchesSlurm("sy-o");
  EXPECT_TRUE(placeholders_->Cancel("sy-o", "uid-o1").ok());
  client_->KillJob(job).IgnoreError();
}

// A placeholder scancelled while an admin keeps the node drained cannot be
// re-made: the pod's devices stay held in the ledger (fenced), the loss is
// reported once with Slurm's reason, and the repair follows the resume.
TEST_F(SlurmSyncTest, LostPlaceholderOnADrainedNodeIsFencedUntilTheNodeResumes) {
  AddNode("sy-q", 47, 8);
  SlurmNodeLoads loads;
  auto p = placeholders_->Create(Owner::Pod("uid-q1", "default", "q1"), "sy-q", 2, 0, 1, 100);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(sync_->RunOnce().ok());
  const std::set<uint32_t> gpus = LedgerPodGpus("sy-q", "uid-q1");
  ASSERT_EQ(gpus.size(), 2u);
  ASSERT_EQ(cluster_->Cli("scontrol update nodename=sy-q state=drain reason=maint").rc, 0);
  ASSERT_EQ(cluster_->Cli(absl::StrCat("scancel ", p->owner.job_id)).rc, 0);
  ASSERT_TRUE(WaitJobOver(p->owner.job_id));

  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(LedgerPodGpus("sy-q", "uid-q1"), gpus) << "the pod's devices stay held";
  ASSERT_EQ(losses_.size(), 1u);
  EXPECT_FALSE(losses_[0].repaired);
  EXPECT_EQ(losses_[0].pod.name, "q1");
  EXPECT_NE(losses_[0].detail.find("drained in Slurm (maint)"), std::string::npos)
      << losses_[0].detail;
  EXPECT_EQ(sync_->stats().placeholders_fenced, 1u);
  EXPECT_EQ(sync_->stats().placeholders_lost_fenced, 1u);
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(losses_.size(), 1u) << "reported once";

  ASSERT_EQ(cluster_->Cli("scontrol update nodename=sy-q state=resume").rc, 0);
  ASSERT_TRUE(WaitFor([&] {
    (void)sync_->RunOnce();
    return SlurmPlaceholderGpus("sy-q", "uid-q1") == gpus;
  })) << cluster_->Cli("scontrol show node sy-q").out;
  EXPECT_EQ(LedgerPodGpus("sy-q", "uid-q1"), gpus);
  ASSERT_EQ(losses_.size(), 2u);
  EXPECT_TRUE(losses_[1].repaired) << losses_[1].detail;
  EXPECT_EQ(sync_->stats().placeholders_fenced, 0u);
  EXPECT_EQ(sync_->stats().placeholder_repairs, 1u);
  ExpectLedgerMatchesSlurm("sy-q");
  EXPECT_TRUE(placeholders_->Cancel("sy-q", "uid-q1").ok());
}

// Jobs back to back on the same GPUs under the default release grace: the
// pass that first sees the second job running still finds the first one's
// import in the ledger (granted seconds ago, within the grace). The first had
// ended by the time the list was read (Slurm gave its GPUs to a running job),
// so it is released and the second imported: no conflict is counted, as
// under pure Slurm load there is none (it was counted 1 here).
TEST_F(SlurmSyncTest, BackToBackJobsOnTheSameGpusWithinTheGraceAreNoConflict) {
  AddNode("sy-r", 48, 8);
  SlurmSyncOptions o;
  o.release_grace = absl::Seconds(60);
  SlurmSync sync(o, &ledger_, client_.get(), Clock::Real());
  const uint32_t first = cluster_->Sbatch("-w sy-r --gres=gpu:8 --wrap 'sleep 2'");
  ASSERT_NE(first, 0u);
  ASSERT_TRUE(cluster_->WaitJobState(first, "RUNNING"));
  ASSERT_TRUE(sync.RunOnce().ok());
  ASSERT_TRUE(ledger_.FindHolding("sy-r", Owner::SlurmJob(first)).has_value());
  const uint32_t second = cluster_->Sbatch("-w sy-r --gres=gpu:8 --wrap 'sleep 30'");
  ASSERT_NE(second, 0u);
  ASSERT_TRUE(cluster_->WaitJobState(second, "RUNNING", absl::Seconds(30)))
      << cluster_->Cli("squeue").out;
  ASSERT_TRUE(sync.RunOnce().ok());
  EXPECT_EQ(sync.stats().conflicts, 0u);
  EXPECT_FALSE(ledger_.FindHolding("sy-r", Owner::SlurmJob(first)).has_value());
  auto held = ledger_.FindHolding("sy-r", Owner::SlurmJob(second));
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->devices.size(), 8u);
  client_->KillJob(second).IgnoreError();
}

// An admin's drain is reported as unusable (the extender's filter drops the
// node) with Slurm's reason, and Slurm's state is kept for duetctl.
TEST_F(SlurmSyncTest, AdminDrainMakesTheNodeUnusableWithItsReason) {
  AddNode("sy-p", 46, 8);
  SlurmNodeLoads loads;
  loads.Replace(*client_->ListNodes());
  EXPECT_EQ(loads.Unusable("sy-p"), "");
  EXPECT_EQ(loads.State("sy-p").first.rfind("IDLE", 0), 0u) << loads.State("sy-p").first;
  ASSERT_EQ(cluster_->Cli("scontrol update nodename=sy-p state=drain reason=x").rc, 0);
  loads.Replace(*client_->ListNodes());
  EXPECT_EQ(loads.Unusable("sy-p"), "drained in Slurm (x)");
  EXPECT_NE(loads.State("sy-p").first.find("DRAIN"), std::string::npos);
  EXPECT_EQ(loads.State("sy-p").second, "x");
  // Slurm marks a resumed node not responding until its next ping.
  ASSERT_EQ(cluster_->Cli("scontrol update nodename=sy-p state=resume").rc, 0);
  EXPECT_TRUE(WaitFor([&] {
    loads.Replace(*client_->ListNodes());
    return loads.Unusable("sy-p").empty();
  })) << loads.Unusable("sy-p");
}

// slurm.nodes: adopt. Every slurmd here is started as Slinky's NodeSet pods
// start it: configless, `-Z`, `--conf-server`, `--conf "Features=... Gres=..."`,
// registering its own dynamic node; the sync never creates one.
class SlurmSyncAdoptTest : public SlurmSyncTest {
 protected:
  SlurmSyncAdoptTest() { node_mode_ = SlurmNodeMode::kAdopt; }

  // A configless slurmd for `name` with `gpus` GPUs of type h100 (the
  // NodeSet's extraConf Gres=, as the operator writes it) and feature slinky.
  void StartNodeSetSlurmd(const std::string& name, int idx, int gpus) {
    cluster_->StartConfiglessSlurmd(
        name, idx,
        absl::StrCat("CPUs=8 RealMemory=16000 Features=slinky Gres=gpu:h100:", gpus),
        absl::StrCat("Name=gpu Type=h100 File=", cluster_->GpuFiles(gpus)));
    ASSERT_TRUE(cluster_->WaitNodeState(name, "IDLE")) << cluster_->Log("slurmctld.log");
  }

  std::string NodeLine(const std::string& name) {
    return cluster_->Cli(absl::StrCat("sinfo -h -N -n ", name, " -o '%t|%E|%G|%f'")).out;
  }
};

TEST(SlurmNameForTest, UpToTheFirstDotOrTheOverride) {
  NodeSpec s;
  s.name = "gke-a3-pool-1a2b";
  EXPECT_EQ(SlurmNameFor(s), "gke-a3-pool-1a2b");
  s.name = "node-7.c.project.internal";
  EXPECT_EQ(SlurmNameFor(s), "node-7");
  s.labels[kSlinkyHostnameOverride] = "slurm-7";
  EXPECT_EQ(SlurmNameFor(s), "slurm-7");
  EXPECT_EQ(*ParseSlurmNodeMode("adopt"), SlurmNodeMode::kAdopt);
  EXPECT_EQ(*ParseSlurmNodeMode("create"), SlurmNodeMode::kCreate);
  EXPECT_FALSE(ParseSlurmNodeMode("slinky").ok());
}

// Before its slurmd registers, a shared node gets nothing: no Slurm node, no
// placeholder, unusable for the extender. Once it registers it is adopted:
// duet's features are added to slurmd's, its weight follows the policy, and
// duet never deletes it, not even when the node leaves the ledger.
TEST_F(SlurmSyncAdoptTest, AdoptMapsTheRegisteredNodeAndNeverCreatesOrDeletes) {
  ASSERT_TRUE(ledger_.UpsertNode(Spec("ad-a", 41, 8, 0)).ok());
  ASSERT_TRUE(sync_->RunOnce().ok());
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_NE(cluster_->Cli("scontrol --future show node ad-a").rc, 0) << "never created";
  EXPECT_EQ(sync_->stats().nodes_created, 0u);
  EXPECT_EQ(sync_->stats().nodes_unregistered, 1u);
  EXPECT_EQ(loads_.Unusable("ad-a"), "no slurmd registered in Slurm");
  EXPECT_EQ(loads_.State("ad-a").first, "UNREGISTERED");
  auto ph = placeholders_->Create(Owner::Pod("uid-a", "default", "a"), "ad-a", 1, 0, 1, 100);
  EXPECT_FALSE(ph.ok()) << "nothing granted on a node with no slurmd";
  EXPECT_TRUE(ledger_.ListHoldings("ad-a").empty());

  StartNodeSetSlurmd("ad-a", 41, 8);
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(sync_->stats().nodes_unregistered, 0u);
  EXPECT_EQ(loads_.Unusable("ad-a"), "");
  // slurmd's feature kept, duet's added, no "duet" marker (that one means
  // "duet may delete it"); slurmd's GRES untouched.
  EXPECT_EQ(NodeLine("ad-a"),
            "idle|none|gpu:h100:8|block-b7,nvidia-h100-80gb,shared-h100,slinky,us-central1-a\n");
  auto node = client_->GetNode("ad-a");
  ASSERT_TRUE(node.ok() && node->has_value());
  EXPECT_EQ((*node)->weight, SlurmWeightFor(*ledger_.GetNode("ad-a"), SlurmSyncOptions{}));
  const SlurmSyncStats before = sync_->stats();
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(sync_->stats().drains + sync_->stats().weight_updates,
            before.drains + before.weight_updates)
      << "a second pass changes nothing";

  // A slurmd node the ledger never had, and a node that leaves the ledger:
  // both slurmd's, left as they are.
  StartNodeSetSlurmd("ad-x", 42, 4);
  ASSERT_TRUE(ledger_.RemoveNode("ad-a").ok());
  ASSERT_EQ(ledger_.GetNode("ad-a"), nullptr);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(NodeLine("ad-x"), "idle|none|gpu:h100:4|slinky\n");
  EXPECT_EQ(cluster_->Cli("sinfo -h -N -n ad-a -o '%t'").out, "idle\n");
  EXPECT_EQ(sync_->stats().nodes_created, 0u);
  EXPECT_EQ(sync_->stats().nodes_deleted, 0u);
  EXPECT_EQ(sync_->stats().nodes_recreated, 0u);
}

TEST_F(SlurmSyncAdoptTest, AdoptCordonDrainsAndUncordonResumes) {
  ASSERT_TRUE(ledger_.UpsertNode(Spec("ad-c", 43, 8, 0)).ok());
  StartNodeSetSlurmd("ad-c", 43, 8);
  ASSERT_TRUE(sync_->RunOnce().ok());
  NodeSpec c = Spec("ad-c", 43, 8, 0);
  c.state = NodeState::kCordoned;
  ASSERT_TRUE(ledger_.UpsertNode(c).ok());
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(cluster_->Cli("sinfo -h -N -n ad-c -o '%t|%E'").out, "drain|duet: cordoned\n");
  c.state = NodeState::kReady;
  ASSERT_TRUE(ledger_.UpsertNode(c).ok());
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_TRUE(WaitFor([&] { return cluster_->Cli("sinfo -h -N -n ad-c -o '%t'").out == "idle\n"; }))
      << cluster_->Cli("sinfo -h -N -n ad-c -o '%t|%E'").out;
  EXPECT_EQ(drain_calls_, (std::vector<std::string>{"ad-c drained: duet: cordoned",
                                                    "ad-c resumed: duet: cordoned"}));
  // An admin's drain is kept.
  ASSERT_EQ(cluster_->Cli("scontrol update NodeName=ad-c State=DRAIN Reason=admin-maint").rc, 0);
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(cluster_->Cli("sinfo -h -N -n ad-c -o '%t|%E'").out, "drain|admin-maint\n");
  EXPECT_EQ(sync_->stats().nodes_created + sync_->stats().nodes_deleted, 0u);
}

// slurmd registered 4 GPUs where Kubernetes has 8: drained with a reason
// naming both, counted, never recreated; resumed once they agree.
TEST_F(SlurmSyncAdoptTest, AdoptGresMismatchDrainsWithAReasonAndNeverRecreates) {
  ASSERT_TRUE(ledger_.UpsertNode(Spec("ad-g", 44, 8, 0)).ok());
  StartNodeSetSlurmd("ad-g", 44, 4);
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(cluster_->Cli("sinfo -h -N -n ad-g -o '%t|%E|%G'").out,
            "drain|duet: GRES mismatch: slurmd registered gpu:4,tpu:0, Kubernetes node has "
            "gpu:8,tpu:0|gpu:h100:4\n");
  EXPECT_EQ(sync_->stats().nodes_gres_mismatch, 1u);
  EXPECT_EQ(sync_->stats().gres_mismatch_drains, 1u);
  auto ph = placeholders_->Create(Owner::Pod("uid-g", "default", "g"), "ad-g", 1, 0, 1, 100);
  EXPECT_FALSE(ph.ok()) << "no placeholder on a drained node";
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(sync_->stats().gres_mismatch_drains, 1u) << "drained once";
  EXPECT_EQ(sync_->stats().nodes_recreated + sync_->stats().nodes_deleted +
                sync_->stats().nodes_created,
            0u);
  // The inventory now says 4 (e.g. a GPU taken out of service): resumed.
  ASSERT_TRUE(ledger_.UpsertNode(Spec("ad-g", 44, 4, 0)).ok());
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_TRUE(WaitFor([&] { return cluster_->Cli("sinfo -h -N -n ad-g -o '%t'").out == "idle\n"; }))
      << cluster_->Cli("sinfo -h -N -n ad-g -o '%t|%E'").out;
  EXPECT_EQ(sync_->stats().nodes_gres_mismatch, 0u);
}

// Placeholders and job import work on an adopted node as on a created one.
TEST_F(SlurmSyncAdoptTest, AdoptPlaceholderAndJobImportOnAnAdoptedNode) {
  ASSERT_TRUE(ledger_.UpsertNode(Spec("ad-p", 45, 8, 0)).ok());
  StartNodeSetSlurmd("ad-p", 45, 8);
  ASSERT_TRUE(sync_->RunOnce().ok());
  const Owner pod = Owner::Pod("uid-p", "default", "web-p");
  auto ph = placeholders_->Create(pod, "ad-p", 2, 0, 1, 100);
  ASSERT_TRUE(ph.ok()) << ph.status();
  ASSERT_EQ(ph->devices.size(), 2u);
  CmdResult r = cluster_->Cli(absl::StrCat("scontrol show job -d ", ph->owner.job_id));
  EXPECT_NE(r.out.find(absl::StrCat("IDX:", ph->devices[0].index, "-", ph->devices[1].index)),
            std::string::npos)
      << r.out;
  uint32_t six = cluster_->Sbatch("-w ad-p --gres=gpu:6 --wrap 'sleep 60'");
  ASSERT_TRUE(cluster_->WaitJobState(six, "RUNNING"));
  uint32_t more = cluster_->Sbatch("-w ad-p --gres=gpu:1 --wrap 'sleep 60'");
  ASSERT_TRUE(cluster_->WaitJobState(more, "PENDING"));
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(LedgerGpus("ad-p", Owner::SlurmJob(six)).size(), 6u);
  ExpectLedgerMatchesSlurm("ad-p");
  ASSERT_TRUE(placeholders_->Cancel("ad-p", "uid-p").ok());
  ASSERT_TRUE(cluster_->WaitJobState(more, "RUNNING")) << "the placeholder's GPUs went back";
  ASSERT_TRUE(sync_->RunOnce().ok());
  ExpectLedgerMatchesSlurm("ad-p");
  client_->KillJob(six).IgnoreError();
  client_->KillJob(more).IgnoreError();
}

// A Kubernetes node whose slurmd registers under another name (a dotted
// node name, Slinky's hostname-override) is not adopted: reported, unusable,
// and the Slurm node of that name is left alone.
TEST_F(SlurmSyncAdoptTest, AdoptReportsANodeWhoseSlurmNameDiffers) {
  NodeSpec s = Spec("ad-m.c.project.internal", 46, 8, 0);
  ASSERT_TRUE(ledger_.UpsertNode(s).ok());
  StartNodeSetSlurmd("ad-m", 46, 8);
  ASSERT_TRUE(sync_->RunOnce().ok());
  EXPECT_EQ(sync_->stats().nodes_unmapped, 1u);
  EXPECT_EQ(loads_.State("ad-m.c.project.internal").first, "UNMAPPED");
  EXPECT_NE(loads_.Unusable("ad-m.c.project.internal").find("registers it as ad-m"),
            std::string::npos);
  EXPECT_EQ(NodeLine("ad-m"), "idle|none|gpu:h100:8|slinky\n") << "left alone";
  EXPECT_EQ(sync_->stats().nodes_created, 0u);
}

}  // namespace
}  // namespace duet
