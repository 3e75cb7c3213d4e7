#include "gtest/gtest.h"
#include "slurm_plugin/plugin_config.h"
#include "slurm_plugin/step_devices.h"

namespace duet::spank {
namespace {

TEST(PluginConfigTest, DefaultsAndOverrides) {
  auto c = ParsePluginArgs(0, nullptr);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->bridge, "unix:///run/duet/bridge.sock");
  EXPECT_EQ(c->on_unreachable, OnUnreachable::kFail);
  EXPECT_EQ(c->timeout_ms, 2000);
  const char* args[] = {"bridge=127.0.0.1:50151", "timeout_ms=500", "on_unreachable=allow",
                        "tpu=no", "disabled"};
  c = ParsePluginArgs(5, args);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bridge, "127.0.0.1:50151");
  EXPECT_EQ(c->timeout_ms, 500);
  EXPECT_EQ(c->on_unreachable, OnUnreachable::kAllow);
  EXPECT_EQ(c->tpu, TpuProbe::kNo);
  EXPECT_TRUE(c->disabled);
}

TEST(PluginConfigTest, RejectsUnknownAndBadValues) {
  for (const char* bad : {"bogus=1", "timeout_ms=0", "timeout_ms=x", "on_unreachable=maybe",
                          "bridge=", "tpu=sometimes"}) {
    const char* args[] = {bad};
    auto c = ParsePluginArgs(1, args);
    EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << bad;
    EXPECT_NE(c.status().message().find(bad), absl::string_view::npos);
  }
}

TEST(StepDevicesTest, GpusFromEnvPrefersSlurmIndices) {
  EXPECT_EQ(*GpusFromEnv("2,3", "", "0,1"), (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(*GpusFromEnv(nullptr, "4-5", "0,1"), (std::vector<uint32_t>{4, 5}));
  EXPECT_EQ(*GpusFromEnv("", "", "1"), (std::vector<uint32_t>{1}));
  EXPECT_TRUE(GpusFromEnv("", "", "")->empty());
  EXPECT_FALSE(GpusFromEnv("", "", "GPU-1234").ok());
}

TEST(StepDevicesTest, DeviceEnv) {
  StepDevices d;
  d.gpus = {0, 3};
  d.tpus = {0, 1, 2, 3};
  auto env = DeviceEnv(d);
  ASSERT_EQ(env.size(), 4u);
  EXPECT_EQ(env[0], (std::pair<std::string, std::string>{"CUDA_VISIBLE_DEVICES", "0,3"}));
  EXPECT_EQ(env[1], (std::pair<std::string, std::string>{"TPU_VISIBLE_CHIPS", "0,1,2,3"}));
  EXPECT_EQ(env[2].second, "2,2,1");
  EXPECT_EQ(env[3].second, "1,1,1");
  EXPECT_EQ(TpuChipBounds(1), "1,1,1");
  EXPECT_EQ(TpuChipBounds(8), "2,4,1");
  EXPECT_TRUE(DeviceEnv(StepDevices{}).empty());
}

}  // namespace
}  // namespace duet::spank
