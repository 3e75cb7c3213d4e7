#include "k8s_adapter/common/quantity.h"

#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace duet {
namespace k8s {
namespace {

using uint128 = unsigned __int128;

constexpr uint64_t kMaxMilli = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

struct Suffix {
  const char* name;
  int pow10;  // the multiplier is 10^pow10 * 2^pow2
  int pow2;
};
constexpr Suffix kSuffixes[] = {
    {"", 0, 0},    {"n", -9, 0},  {"u", -6, 0},  {"m", -3, 0},  {"k", 3, 0},   {"M", 6, 0},
    {"G", 9, 0},   {"T", 12, 0},  {"P", 15, 0},  {"E", 18, 0},  {"Ki", 0, 10}, {"Mi", 0, 20},
    {"Gi", 0, 30}, {"Ti", 0, 40}, {"Pi", 0, 50}, {"Ei", 0, 60},
};

bool IsDigit(char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); }

// The suffix's powers; false when `s` is none of the forms.
bool ReadSuffix(absl::string_view s, int64_t* pow10, int* pow2) {
  for (const Suffix& suffix : kSuffixes) {
    if (s == suffix.name) {
      *pow10 = suffix.pow10;
      *pow2 = suffix.pow2;
      return true;
    }
  }
  if (s.size() < 2 || (s[0] != 'e' && s[0] != 'E')) return false;
  size_t i = 1;
  const bool negative = s[i] == '-';
  if (s[i] == '+' || s[i] == '-') ++i;
  if (i == s.size()) return false;
  int64_t exp = 0;
  for (; i < s.size(); ++i) {
    if (!IsDigit(s[i])) return false;
    // Beyond 10^±10000 every non-zero value is out of range or rounds to 1m.
    if (exp < 10000) exp = exp * 10 + (s[i] - '0');
  }
  *pow10 = negative ? -exp : exp;
  *pow2 = 0;
  return true;
}

}  // namespace

absl::StatusOr<int64_t> ParseQuantityMilli(absl::string_view q) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("\"", q, "\": ", why));
  };
  size_t i = 0;
  const bool negative = i < q.size() && q[i] == '-';
  if (i < q.size() && (q[i] == '+' || q[i] == '-')) ++i;
  std::string digits;  // the integer and fraction digits, without the point
  int64_t pow10 = 0;   // value = digits * 10^pow10 * 2^pow2
  size_t n_digits = 0;
  for (; i < q.size() && IsDigit(q[i]); ++i, ++n_digits) digits.push_back(q[i]);
  if (i < q.size() && q[i] == '.') {
    for (++i; i < q.size() && IsDigit(q[i]); ++i, ++n_digits) {
      digits.push_back(q[i]);
      --pow10;
    }
  }
  if (n_digits == 0) return bad("not a quantity (no digits)");
  int64_t suffix10 = 0;
  int pow2 = 0;
  if (!ReadSuffix(q.substr(i), &suffix10, &pow2)) {
    return bad(absl::StrCat("unknown suffix \"", q.substr(i),
                            "\" (want n, u, m, k, M, G, T, P, E, Ki..Ei or an exponent e<n>)"));
  }
  pow10 += suffix10 + 3;  // in milli-units

  // Significant digits only: leading zeros dropped, trailing zeros moved
  // into the exponent.
  const size_t first = digits.find_first_not_of('0');
  if (first == std::string::npos) return 0;
  const size_t last = digits.find_last_not_of('0');
  pow10 += static_cast<int64_t>(digits.size() - 1 - last);
  digits = digits.substr(first, last - first + 1);
  if (digits.size() > 19) return bad("more than 19 significant digits");
  uint64_t mantissa = 0;
  for (char c : digits) mantissa = mantissa * 10 + static_cast<uint64_t>(c - '0');

  uint128 value = static_cast<uint128>(mantissa) << pow2;  // < 2^64 * 2^60
  if (pow10 >= 0) {
    for (int64_t k = 0; k < pow10 && value <= kMaxMilli; ++k) value *= 10;
  } else if (pow10 < -38) {
    value = 1;  // 0 < value < 2^124 / 10^39 < 1: rounds up to 1m
  } else {
    uint128 divisor = 1;
    for (int64_t k = 0; k < -pow10; ++k) divisor *= 10;
    value = value / divisor + (value % divisor != 0 ? 1 : 0);
  }
  if (value > kMaxMilli) return bad("out of range (more than 2^63-1 milli-units)");
  const int64_t milli = static_cast<int64_t>(value);
  return negative ? -milli : milli;
}

}  // namespace k8s
}  // namespace duet
