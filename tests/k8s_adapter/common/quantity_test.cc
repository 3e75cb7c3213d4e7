// Kubernetes resource quantities, one table: every suffix form, rounding
// (up, to a whole milli-unit), the int64 bound, and what is not a quantity.

#include "k8s_adapter/common/quantity.h"

#include <cstdint>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace duet {
namespace k8s {
namespace {

using ::testing::HasSubstr;

struct Good {
  const char* in;
  int64_t milli;
};

TEST(ParseQuantityMilliTest, ReadsEveryKubernetesForm) {
  constexpr int64_t kKi = 1024;
  const Good kCases[] = {
      // plain numbers and the four <number> forms
      {"8", 8000},
      {"0", 0},
      {"0.5", 500},
      {"5.", 5000},
      {".5", 500},
      {"+2", 2000},
      {"-2", -2000},
      {"94646121834", int64_t{94646121834} * 1000},
      // decimal SI suffixes (powers of 1000), n and u included
      {"1n", 1},  // 1e-9 rounds up to 1m
      {"1000000n", 1},
      {"1500000u", 1500},
      {"207690m", 207690},
      {"2k", 2000000},
      {"1M", int64_t{1000000000}},
      {"1G", int64_t{1000000000000}},
      {"2T", int64_t{2000000000000000}},
      {"1P", int64_t{1000000000000000000}},
      // binary SI suffixes (powers of 1024)
      {"1Ki", kKi * 1000},
      {"512Mi", 512 * kKi * kKi * 1000},
      {"1.5Gi", int64_t{1610612736} * 1000},
      {"1857318648Ki", int64_t{1857318648} * kKi * 1000},
      {"2Ti", int64_t{2} * kKi * kKi * kKi * kKi * 1000},
      {"1Pi", (int64_t{1} << 50) * 1000},
      // decimal exponents
      {"1e3", 1000000},
      {"1E3", 1000000},
      {"12e-3", 12},
      {"1e+2", 100000},
      {"25e-4", 3},  // 2.5m rounds up
      // rounding: at most 3 decimal places, rounded up
      {"0.1m", 1},
      {"1.0001", 1001},
      {"0.0000000000000000000000000000000000000000001", 1},
      // trailing zeros are not significant digits
      {"1000000000000000000000n", int64_t{1000000000000000}},
  };
  for (const Good& c : kCases) {
    absl::StatusOr<int64_t> got = ParseQuantityMilli(c.in);
    ASSERT_TRUE(got.ok()) << c.in << ": " << got.status();
    EXPECT_EQ(*got, c.milli) << c.in;
  }
}

TEST(ParseQuantityMilliTest, BadInputIsInvalidArgumentQuotingTheInput) {
  const struct {
    const char* in;
    const char* why;
  } kCases[] = {
      {"", "no digits"},
      {"Gi", "no digits"},
      {"-", "no digits"},
      {".", "no digits"},
      {"12Qi", "unknown suffix \"Qi\""},
      {"1 Gi", "unknown suffix"},
      {" 1", "no digits"},
      {"1e", "unknown suffix"},
      {"1e1.5", "unknown suffix"},
      {"1KI", "unknown suffix"},
      {"1mi", "unknown suffix"},
      {"1.2.3", "unknown suffix"},
      {"9Ei", "out of range"},
      {"1.5E", "out of range"},
      {"10000000000000000", "out of range"},
      {"1e400", "out of range"},
      {"1.00000000000000000001", "19 significant digits"},
  };
  for (const auto& c : kCases) {
    absl::StatusOr<int64_t> got = ParseQuantityMilli(c.in);
    ASSERT_FALSE(got.ok()) << "\"" << c.in << "\" read as " << *got;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.in;
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(std::string("\"") + c.in + "\""))
        << c.in;
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(c.why)) << c.in;
  }
}

TEST(ParseQuantityMilliTest, LargestValueFits) {
  // 2^63-1 milli-units is the bound; 9223372036854775.807 is exactly it.
  EXPECT_EQ(*ParseQuantityMilli("9223372036854775.807"), std::numeric_limits<int64_t>::max());
  EXPECT_FALSE(ParseQuantityMilli("9223372036854775.808").ok());
}

}  // namespace
}  // namespace k8s
}  // namespace duet
