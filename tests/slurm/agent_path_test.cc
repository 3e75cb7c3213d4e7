// spank_duet's agent path, the parts that need no Slurm: plugstack agent=
// (plugin_args.c) and the step's GPU list (agent_path.c), which must read
// Slurm's lists as the gRPC client does (step_devices.h).

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "slurm_plugin/agent_path.h"
#include "slurm_plugin/plugin_args.h"
#include "slurm_plugin/step_devices.h"

// agent_path.c's calls into slurmstepd, never reached by these tests.
extern "C" {
spank_err_t spank_getenv(spank_t, const char*, char*, int) { return ESPANK_ERROR; }
spank_err_t spank_setenv(spank_t, const char*, const char*, int) { return ESPANK_ERROR; }
spank_err_t spank_get_item(spank_t, spank_item_t, ...) { return ESPANK_ERROR; }
void slurm_info(const char*, ...) {}
void slurm_debug(const char*, ...) {}
}

namespace duet::spank {
namespace {

TEST(AgentPathTest, PlugstackAgentIsAUnixSocketPath) {
  duet_spank_args a;
  char err[256];
  const char* none[] = {"tpu=no"};
  ASSERT_EQ(duet_spank_parse_args(1, none, &a, err, sizeof err), 0) << err;
  EXPECT_STREQ(a.agent, "");  // default: every step through bridge=
  const char* ok[] = {"agent=unix:///run/duet/agent.sock"};
  ASSERT_EQ(duet_spank_parse_args(1, ok, &a, err, sizeof err), 0) << err;
  EXPECT_STREQ(a.agent, "unix:///run/duet/agent.sock");
  const std::string too_long = "agent=unix:///" + std::string(107, 'a');
  for (const std::string& bad : {std::string("agent=/run/duet/agent.sock"),
                                std::string("agent=unix://run/agent.sock"),
                                std::string("agent=127.0.0.1:9"), std::string("agent="),
                                too_long}) {
    const char* args[] = {bad.c_str()};
    EXPECT_EQ(duet_spank_parse_args(1, args, &a, err, sizeof err), -1) << bad;
    EXPECT_NE(std::string(err).find("plugstack argument \"agent="), std::string::npos) << err;
  }
}

TEST(AgentPathTest, GpuListsReadAsTheGrpcClientReadsThem) {
  for (const char* list : {"0", "3,1", "0-3", "2,0-1,7", "5,5,4-6", "0-63", ""}) {
    unsigned got[64];
    const int n = duet_agent_parse_gpus(list, got, 64);
    auto want = GpusFromEnv(list, "", "");
    ASSERT_TRUE(want.ok()) << list;
    ASSERT_EQ(n, static_cast<int>(want->size())) << list;
    EXPECT_EQ(std::vector<uint32_t>(got, got + n), *want) << list;
  }
  for (const char* bad : {"NoDevFiles", "GPU-1234", "1-", "3-1", ",", "1,", "-1", "0-64", " 1",
                          "99999999999"}) {
    unsigned got[64];
    EXPECT_EQ(duet_agent_parse_gpus(bad, got, 64), -1) << bad;
  }
}

}  // namespace
}  // namespace duet::spank
