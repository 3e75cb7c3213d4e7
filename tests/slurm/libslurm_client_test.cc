// LibSlurmClient against a real slurmctld + slurmds (label: slurm).

#include "bridge/slurm/libslurm_client.h"

#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/slurm/slurm_cluster_fixture.h"

namespace duet {
namespace {

using ::duet::testing::CmdResult;
using ::duet::testing::TestSlurmCluster;
using ::duet::testing::WaitFor;

constexpr char kGpuType[] = "nvidia-h100-80gb";
constexpr char kTpuType[] = "tpu-v5-lite-podslice";

class LibSlurmClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = TestSlurmCluster::Get();
    ASSERT_TRUE(cluster_->ok());
    client_ = std::make_unique<LibSlurmClient>();
  }

  // Creates the node through the client and starts its slurmd.
  void AddGpuNode(const std::string& name, int idx, int gpus = 8) {
    SlurmNodeConfig c;
    c.name = name;
    c.addr = absl::StrCat("127.0.0.", idx);
    c.cpus = 8;
    c.real_memory_mib = 16000;
    c.gres = {{"gpu", kGpuType, static_cast<uint32_t>(gpus)}};
    c.features = {"duet", "shared-h100", "us-central1-a", kGpuType};
    std::sort(c.features.begin(), c.features.end());
    ASSERT_TRUE(client_->CreateNode(c).ok());
    cluster_->StartSlurmd(name, idx, 8, 16000, gpus, kGpuType);
    ASSERT_TRUE(cluster_->WaitNodeState(name, "IDLE")) << cluster_->Log("slurmctld.log");
  }

  TestSlurmCluster* cluster_ = nullptr;
  std::unique_ptr<LibSlurmClient> client_;
};

TEST_F(LibSlurmClientTest, CreatedNodeShowsGresAndFeaturesInScontrol) {
  AddGpuNode("cl-a", 11);
  CmdResult r = cluster_->Cli("scontrol show node cl-a");
  EXPECT_NE(r.out.find("Gres=gpu:nvidia-h100-80gb:8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("AvailableFeatures=duet,nvidia-h100-80gb,shared-h100,us-central1-a"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("NodeAddr=127.0.0.11"), std::string::npos) << r.out;
  r = cluster_->Cli("sinfo -h -N -n cl-a -o '%N %G %t'");
  EXPECT_EQ(r.out, "cl-a gpu:nvidia-h100-80gb:8 idle\n");

  auto node = client_->GetNode("cl-a");
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE(node->has_value());
  EXPECT_EQ((*node)->cpus, 8u);
  EXPECT_EQ((*node)->real_memory_mib, 16000u);
  ASSERT_EQ((*node)->gres.size(), 1u);
  EXPECT_EQ((*node)->gres[0], (SlurmGres{"gpu", kGpuType, 8}));
  EXPECT_FALSE((*node)->drain);

  SlurmNodeConfig dup;
  dup.name = "cl-a";
  EXPECT_TRUE(absl::IsAlreadyExists(client_->CreateNode(dup)));

  auto missing = client_->GetNode("no-such-node");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(missing->has_value());
}

TEST_F(LibSlurmClientTest, PingChecksTheControllerReleaseAgainstTheBuild) {
  auto version = client_->ControllerVersion();
  ASSERT_TRUE(version.ok()) << version.status();
  const std::optional<SlurmRelease> ctld = ParseSlurmRelease(*version);
  ASSERT_TRUE(ctld.has_value()) << *version;
  // The test cluster runs the Slurm duet was built against.
  EXPECT_EQ(*ctld, BuiltSlurmRelease()) << *version;
  EXPECT_TRUE(client_->Ping().ok());
}

TEST_F(LibSlurmClientTest, DrainResumeWeightAndDelete) {
  AddGpuNode("cl-b", 12);
  SlurmNodeUpdate u;
  u.name = "cl-b";
  u.drain_reason = "duet: cordoned";
  u.weight = 42;
  ASSERT_TRUE(client_->UpdateNode(u).ok());
  CmdResult r = cluster_->Cli("sinfo -h -N -n cl-b -o '%t|%E'");
  EXPECT_EQ(r.out, "drain|duet: cordoned\n");
  auto node = client_->GetNode("cl-b");
  ASSERT_TRUE(node.ok() && node->has_value());
  EXPECT_TRUE((*node)->drain);
  EXPECT_EQ((*node)->reason, "duet: cordoned");
  EXPECT_EQ((*node)->weight, 42u);

  u = {};
  u.name = "cl-b";
  u.drain_reason = "";
  ASSERT_TRUE(client_->UpdateNode(u).ok());
  EXPECT_TRUE(cluster_->WaitNodeState("cl-b", "IDLE(\\+DYNAMIC_NORM)? "));

  // A busy node cannot be deleted; an idle one can.
  uint32_t job = cluster_->Sbatch("-w cl-b --gres=gpu:1 --wrap 'sleep 60'");
  ASSERT_TRUE(cluster_->WaitJobState(job, "RUNNING"));
  EXPECT_TRUE(absl::IsFailedPrecondition(client_->DeleteNode("cl-b")));
  ASSERT_TRUE(client_->KillJob(job).ok());
  ASSERT_TRUE(WaitFor([&] { return client_->DeleteNode("cl-b").ok(); }));
  node = client_->GetNode("cl-b");
  ASSERT_TRUE(node.ok());
  EXPECT_FALSE(node->has_value());
  EXPECT_NE(cluster_->Cli("scontrol show node cl-b").rc, 0);
  EXPECT_TRUE(absl::IsNotFound(client_->DeleteNode("cl-b")));
  cluster_->StopSlurmd("cl-b");
}

// Gangs (docs/gangs.md 3): one immediate job over exactly the nodes asked,
// the same GRES on each, each node's indices read back.
TEST_F(LibSlurmClientTest, GangOverTwoNodesIsOneJobWithEachNodesDevices) {
  AddGpuNode("cl-g1", 17, 4);
  AddGpuNode("cl-g2", 18, 4);
  SlurmGangRequest req;
  req.nodes = {"cl-g2", "cl-g1"};
  req.job_name = "duet-gang:podgroup/ml/train";
  req.comment = "duet-gang key=podgroup/ml/train slots=2";
  req.gpus_per_node = 2;
  req.cpus_per_node = 2;
  req.memory_mib_per_node = 100;
  // More GPUs per node than a node has: refused, and no job stays.
  SlurmGangRequest big = req;
  big.gpus_per_node = 5;
  absl::StatusOr<SlurmGangAllocation> refused = client_->AllocateGang(big);
  EXPECT_FALSE(refused.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status()) ||
              absl::IsFailedPrecondition(refused.status()))
      << refused.status();
  auto jobs = client_->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  for (const SlurmJobInfo& j : *jobs) {
    EXPECT_FALSE(j.name == req.job_name && j.live()) << "job " << j.job_id << " stayed";
  }
  EXPECT_TRUE(absl::IsInvalidArgument(client_->AllocateGang(SlurmGangRequest{}).status()));
  SlurmGangRequest twice = req;
  twice.nodes = {"cl-g1", "cl-g1"};
  EXPECT_TRUE(absl::IsInvalidArgument(client_->AllocateGang(twice).status()));

  absl::StatusOr<SlurmGangAllocation> a = client_->AllocateGang(req);
  ASSERT_TRUE(a.ok()) << a.status() << cluster_->Log("slurmctld.log");
  ASSERT_EQ(a->nodes.size(), 2u);
  EXPECT_EQ(a->nodes[0].node, "cl-g2");  // the request's order
  EXPECT_EQ(a->nodes[1].node, "cl-g1");
  for (const SlurmJobNodeDevices& d : a->nodes) {
    EXPECT_EQ(d.gpus.size(), 2u) << d.node;
    EXPECT_TRUE(d.tpus.empty());
  }
  // The job as Slurm lists it: both nodes, the same devices.
  auto job = client_->GetJob(a->job_id);
  ASSERT_TRUE(job.ok() && job->has_value()) << job.status();
  EXPECT_TRUE((*job)->live());
  EXPECT_EQ((*job)->name, req.job_name);
  EXPECT_EQ((*job)->comment, req.comment);
  jobs = client_->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  bool listed = false;
  for (const SlurmJobInfo& j : *jobs) {
    if (j.job_id != a->job_id) continue;
    listed = true;
    ASSERT_EQ(j.devices.size(), 2u);
    for (const SlurmJobNodeDevices& d : j.devices) {
      const SlurmJobNodeDevices& mine = d.node == "cl-g1" ? a->nodes[1] : a->nodes[0];
      EXPECT_EQ(d.node, mine.node);
      EXPECT_EQ(d.gpus, mine.gpus) << d.node;
    }
  }
  EXPECT_TRUE(listed);
  CmdResult r = cluster_->Cli(absl::StrCat("scontrol show job ", a->job_id));
  EXPECT_NE(r.out.find("NumNodes=2"), std::string::npos) << r.out;
  // The rest of each node is free for others; a second gang takes it.
  absl::StatusOr<SlurmGangAllocation> b = client_->AllocateGang(req);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(b->nodes[0].gpus, a->nodes[0].gpus);
  // And now neither node has room.
  EXPECT_FALSE(client_->AllocateGang(req).ok());
  ASSERT_TRUE(client_->KillJob(a->job_id).ok());
  ASSERT_TRUE(client_->KillJob(b->job_id).ok());
}

TEST_F(LibSlurmClientTest, PlaceholderIsGrantedWhileSlurmJobsPend) {
  // Found by the soak (bench/soak): with any job pending in the partition,
  // every immediate placeholder was refused, "insufficient priority", on any
  // node, so no pod could be bound beside a Slurm queue.
  AddGpuNode("cl-p", 15);
  AddGpuNode("cl-q", 16);
  uint32_t running = cluster_->Sbatch("-w cl-p --gres=gpu:4 --wrap 'sleep 60'");
  ASSERT_TRUE(cluster_->WaitJobState(running, "RUNNING"));
  uint32_t pending = cluster_->Sbatch("-w cl-p --gres=gpu:8 --wrap 'sleep 60'");
  ASSERT_TRUE(cluster_->WaitJobState(pending, "PENDING"));
  SlurmAllocRequest req;
  req.job_name = "duet-pod:default/beside-queue";
  req.comment = "duet-pod uid=u-q ns=default name=beside-queue";
  req.gpus = 2;
  req.cpus = 1;
  req.memory_mib = 100;
  // On the idle node, and on the free half of the node the pending job waits for.
  for (const char* node : {"cl-q", "cl-p"}) {
    req.node = node;
    auto ph = client_->AllocatePlaceholder(req);
    ASSERT_TRUE(ph.ok()) << node << ": " << ph.status();
    EXPECT_EQ(ph->devices.gpus.size(), 2u);
    EXPECT_EQ(cluster_->JobState(pending), "PENDING");
    ASSERT_TRUE(client_->KillJob(ph->job_id).ok());
  }
  // A full node still refuses: RESOURCE_EXHAUSTED, not a grant.
  req.node = "cl-p";
  req.gpus = 5;
  auto full = client_->AllocatePlaceholder(req);
  EXPECT_TRUE(absl::IsResourceExhausted(full.status())) << full.status();
  client_->KillJob(pending).IgnoreError();
  client_->KillJob(running).IgnoreError();
}

TEST_F(LibSlurmClientTest, PlaceholderReadsBackIndicesAndBlocksJobs) {
  AddGpuNode("cl-c", 13);
  SlurmAllocRequest req;
  req.node = "cl-c";
  req.job_name = "duet-pod:default/web-1";
  req.comment = "duet-pod uid=u-1 ns=default name=web-1";
  req.gpus = 2;
  req.cpus = 1;
  req.memory_mib = 100;
  auto ph = client_->AllocatePlaceholder(req);
  ASSERT_TRUE(ph.ok()) << ph.status();
  EXPECT_EQ(ph->devices.node, "cl-c");
  ASSERT_EQ(ph->devices.gpus.size(), 2u);

  // Slurm's own view agrees with what was read back.
  CmdResult r = cluster_->Cli(absl::StrCat("scontrol show job -d ", ph->job_id));
  EXPECT_NE(r.out.find(absl::StrCat("IDX:", ph->devices.gpus[0], "-", ph->devices.gpus[1])),
            std::string::npos)
      << r.out;

  // A gpu:8 job pends; a gpu:6 job runs on the other six.
  // (gpu:6 first: a pending gpu:8 job ahead of it would hold it back until
  // the next backfill cycle.)
  uint32_t six = cluster_->Sbatch("-w cl-c --gres=gpu:6 --wrap 'sleep 60'");
  ASSERT_TRUE(cluster_->WaitJobState(six, "RUNNING"));
  uint32_t big = cluster_->Sbatch("-w cl-c --gres=gpu:8 --wrap 'sleep 60'");
  ASSERT_TRUE(cluster_->WaitJobState(big, "PENDING"));
  EXPECT_EQ(cluster_->JobState(big), "PENDING");
  auto six_info = client_->GetJob(six);
  ASSERT_TRUE(six_info.ok() && six_info->has_value());
  ASSERT_EQ((*six_info)->devices.size(), 1u);
  std::set<uint32_t> all((*six_info)->devices[0].gpus.begin(), (*six_info)->devices[0].gpus.end());
  EXPECT_EQ(all.size(), 6u);
  for (uint32_t g : ph->devices.gpus) EXPECT_EQ(all.count(g), 0u) << "GPU " << g << " in both";

  // No room: RESOURCE_EXHAUSTED.
  req.gpus = 1;
  auto full = client_->AllocatePlaceholder(req);
  EXPECT_TRUE(absl::IsResourceExhausted(full.status())) << full.status();

  // The placeholder is in the job list with its name, comment and devices.
  auto jobs = client_->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  auto it = std::find_if(jobs->begin(), jobs->end(),
                         [&](const SlurmJobInfo& j) { return j.job_id == ph->job_id; });
  ASSERT_NE(it, jobs->end());
  EXPECT_EQ(it->name, req.job_name);
  EXPECT_EQ(it->comment, req.comment);
  EXPECT_TRUE(it->live());
  ASSERT_EQ(it->devices.size(), 1u);
  EXPECT_EQ(it->devices[0].gpus, ph->devices.gpus);

  // Cancelling the placeholder and the gpu:6 job lets the gpu:8 job start.
  ASSERT_TRUE(client_->KillJob(ph->job_id).ok());
  EXPECT_TRUE(client_->KillJob(ph->job_id).ok()) << "a second cancel is OK";
  ASSERT_TRUE(client_->KillJob(six).ok());
  EXPECT_TRUE(cluster_->WaitJobState(big, "RUNNING"));
  ASSERT_TRUE(client_->KillJob(big).ok());
}

TEST_F(LibSlurmClientTest, TwoGpu4JobsGetDisjointDevices) {
  AddGpuNode("cl-d", 14);
  uint32_t a = cluster_->Sbatch("-w cl-d --gres=gpu:4 --wrap 'sleep 60'");
  uint32_t b = cluster_->Sbatch("-w cl-d --gres=gpu:4 --wrap 'sleep 60'");
  ASSERT_TRUE(cluster_->WaitJobState(a, "RUNNING"));
  ASSERT_TRUE(cluster_->WaitJobState(b, "RUNNING"));
  auto ja = client_->GetJob(a);
  auto jb = client_->GetJob(b);
  ASSERT_TRUE(ja.ok() && ja->has_value() && jb.ok() && jb->has_value());
  ASSERT_EQ((*ja)->devices.size(), 1u);
  ASSERT_EQ((*jb)->devices.size(), 1u);
  std::set<uint32_t> s((*ja)->devices[0].gpus.begin(), (*ja)->devices[0].gpus.end());
  s.insert((*jb)->devices[0].gpus.begin(), (*jb)->devices[0].gpus.end());
  EXPECT_EQ(s.size(), 8u);
  client_->KillJob(a).IgnoreError();
  client_->KillJob(b).IgnoreError();
}

TEST_F(LibSlurmClientTest, TpuNodePlaceholder) {
  SlurmNodeConfig c;
  c.name = "cl-t";
  c.addr = "127.0.0.15";
  c.cpus = 8;
  c.real_memory_mib = 16000;
  c.gres = {{"tpu", kTpuType, 4}};
  c.features = {"duet"};
  ASSERT_TRUE(client_->CreateNode(c).ok());
  cluster_->StartSlurmd("cl-t", 15, 8, 16000, 0, "", 4, kTpuType);
  ASSERT_TRUE(cluster_->WaitNodeState("cl-t", "IDLE"));
  SlurmAllocRequest req;
  req.node = "cl-t";
  req.job_name = "duet-pod:default/tpu-1";
  req.tpus = 2;
  auto ph = client_->AllocatePlaceholder(req);
  ASSERT_TRUE(ph.ok()) << ph.status();
  EXPECT_EQ(ph->devices.tpus.size(), 2u);
  EXPECT_TRUE(ph->devices.gpus.empty());
  // Asking more than the node has is "no room" too.
  req.tpus = 8;
  EXPECT_TRUE(absl::IsResourceExhausted(client_->AllocatePlaceholder(req).status()));
  ASSERT_TRUE(client_->KillJob(ph->job_id).ok());
}

TEST_F(LibSlurmClientTest, DrainedNodeIsNotUsable) {
  AddGpuNode("cl-e", 16);
  SlurmNodeUpdate u;
  u.name = "cl-e";
  u.drain_reason = "admin: maintenance";
  ASSERT_TRUE(client_->UpdateNode(u).ok());
  SlurmAllocRequest req;
  req.node = "cl-e";
  req.job_name = "duet-pod:default/x";
  req.gpus = 1;
  auto ph = client_->AllocatePlaceholder(req);
  EXPECT_TRUE(absl::IsFailedPrecondition(ph.status()) || absl::IsResourceExhausted(ph.status()))
      << ph.status();
  EXPECT_NE(ph.status().message().find("cl-e"), absl::string_view::npos);
}

TEST_F(LibSlurmClientTest, UnreachableSlurmIsUnavailableWithinDeadline) {
  // slurm_init reads one conf per process: stop the real controller.
  cluster_->CtldStop();
  LibSlurmClientOptions o;
  o.call_timeout = absl::Seconds(2);
  LibSlurmClient c(o);
  const absl::Time start = absl::Now();
  absl::Status s = c.Ping();
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_LE(took, absl::Milliseconds(2500));
  auto jobs = c.ListJobs();
  EXPECT_TRUE(absl::IsUnavailable(jobs.status())) << jobs.status();
  ASSERT_TRUE(cluster_->CtldStart());
  EXPECT_TRUE(WaitFor([&] { return c.Ping().ok(); }));
}

}  // namespace
}  // namespace duet
