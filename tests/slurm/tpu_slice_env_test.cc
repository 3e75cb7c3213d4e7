// TPU_WORKER_ID / TPU_WORKER_HOSTNAMES for a Slurm step on a multi-host TPU
// slice (slurm_plugin/tpu_slice_env.h, docs/gangs.md 5): pure, no Slurm.

#include "slurm_plugin/tpu_slice_env.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet::spank {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TpuSliceStep Step(const std::string& node, uint32_t id, uint32_t nodes) {
  TpuSliceStep s;
  s.node = node;
  s.node_id = id;
  s.step_nodes = nodes;
  s.facts.slice = "v5e-a";
  s.facts.job_nodes = {"tpu-a-0", "tpu-a-1", "tpu-a-2", "tpu-a-3"};
  return s;
}

TEST(TpuSliceEnvTest, EachHostOfAStepOverTheWholeJobGetsItsWorkerIdAndAllHosts) {
  for (uint32_t i = 0; i < 4; ++i) {
    auto env = TpuSliceEnv(Step("tpu-a-" + std::to_string(i), i, 4));
    ASSERT_TRUE(env.ok()) << env.status();
    EXPECT_THAT(*env, ElementsAre(Pair("TPU_WORKER_ID", std::to_string(i)),
                                  Pair("TPU_WORKER_HOSTNAMES", "tpu-a-0,tpu-a-1,tpu-a-2,tpu-a-3")));
  }
}

TEST(TpuSliceEnvTest, NothingOffASliceOnOneNodeOrOnPartOfTheJob) {
  TpuSliceStep off = Step("tpu-a-0", 0, 4);
  off.facts.slice = "";
  EXPECT_TRUE(TpuSliceEnv(off)->empty());
  EXPECT_TRUE(TpuSliceEnv(Step("tpu-a-0", 0, 1))->empty());  // the batch step
  EXPECT_TRUE(TpuSliceEnv(Step("tpu-a-1", 1, 2))->empty());  // 2 of the job's 4 nodes
}

TEST(TpuSliceEnvTest, FactsThatContradictEachOtherSetNothingAndSayWhy) {
  auto env = TpuSliceEnv(Step("tpu-a-1", 2, 4));
  EXPECT_TRUE(absl::IsInvalidArgument(env.status()));
  EXPECT_THAT(env.status().message(), HasSubstr("the step's node 2 is tpu-a-2"));
  EXPECT_THAT(env.status().message(), HasSubstr("not tpu-a-1"));
  TpuSliceStep beyond = Step("tpu-a-0", 0, 4);
  beyond.node_id = 7;
  beyond.facts.job_nodes.resize(4);
  EXPECT_TRUE(absl::IsInvalidArgument(TpuSliceEnv(beyond).status()));
}

TEST(TpuSliceEnvTest, TheSliceFromTheNodesFeatures) {
  EXPECT_EQ(SliceOfFeatures("duet,tpu-v5-lite-podslice,tpu-slice-v5e-a,tpu-topology-2x4"), "v5e-a");
  EXPECT_EQ(SliceOfFeatures("tpu-slice-b"), "b");
  EXPECT_EQ(SliceOfFeatures("duet,tpu-topology-2x4"), "");
  EXPECT_EQ(SliceOfFeatures("tpu-slice-"), "");
  EXPECT_EQ(SliceOfFeatures(""), "");
}

}  // namespace
}  // namespace duet::spank
