#include "gtest/gtest.h"
#include "common/slurm/slurm_format.h"

namespace duet {
namespace {

TEST(SlurmFormatTest, ParsesAndFormatsGres) {
  auto g = ParseGres("gpu:nvidia-h100-80gb:8,tpu:4");
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0], (SlurmGres{"gpu", "nvidia-h100-80gb", 8}));
  EXPECT_EQ(g[1], (SlurmGres{"tpu", "", 4}));
  EXPECT_EQ(FormatGres(g), "gpu:nvidia-h100-80gb:8,tpu:4");
  // gres_used style, with index lists holding commas.
  g = ParseGres("gpu:h100:2(IDX:0,3),tpu:0");
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].count, 2u);
  EXPECT_EQ(FormatGres({{"gpu", "", 0}}), "");
  EXPECT_TRUE(ParseGres("(null)").empty());
}

TEST(SlurmFormatTest, ParsesGresDetail) {
  SlurmJobNodeDevices d;
  ASSERT_TRUE(ParseGresDetail("gpu:h100:3(IDX:0-1,5),tpu:v5e:2(IDX:2-3)", &d).ok());
  EXPECT_EQ(d.gpus, (std::vector<uint32_t>{0, 1, 5}));
  EXPECT_EQ(d.tpus, (std::vector<uint32_t>{2, 3}));
  SlurmJobNodeDevices e;
  ASSERT_TRUE(ParseGresDetail("gpu:0(IDX:N/A),tpu:4", &e).ok());
  EXPECT_TRUE(e.gpus.empty());
  EXPECT_TRUE(e.tpus.empty());
  SlurmJobNodeDevices bad;
  EXPECT_FALSE(ParseGresDetail("gpu:h100:2(IDX:3-1)", &bad).ok());
  EXPECT_FALSE(ParseGresDetail("gpu:h100:2(IDX:x)", &bad).ok());
}

TEST(SlurmFormatTest, IndexLists) {
  EXPECT_EQ(*ParseIndexList("0-2,5"), (std::vector<uint32_t>{0, 1, 2, 5}));
  EXPECT_EQ(*ParseIndexList(""), std::vector<uint32_t>{});
  EXPECT_FALSE(ParseIndexList("1,,2").ok());
  EXPECT_EQ(FormatIndexList({0, 1, 5}), "0,1,5");
}

// Found by tests/fuzz/slurm_format_fuzz: an index of UINT32_MAX made the range
// loop wrap to 0 and grow the list until memory ran out.
TEST(SlurmFormatTest, IndexListEndingAtUint32MaxTerminates) {
  EXPECT_EQ(*ParseIndexList("4294967295"), (std::vector<uint32_t>{4294967295u}));
  EXPECT_EQ(*ParseIndexList("4294967294-4294967295"),
            (std::vector<uint32_t>{4294967294u, 4294967295u}));
  SlurmJobNodeDevices d;
  ASSERT_TRUE(ParseGresDetail("gpu:h100:1(IDX:4294967295)", &d).ok());
  EXPECT_EQ(d.gpus, (std::vector<uint32_t>{4294967295u}));
}

TEST(SlurmFormatTest, SanitizesFeatures) {
  EXPECT_EQ(SanitizeFeature("us-central1-a"), "us-central1-a");
  EXPECT_EQ(SanitizeFeature("Block/1:x"), "block_1_x");
  EXPECT_EQ(SanitizeFeature(""), "");
}

}  // namespace
}  // namespace duet
