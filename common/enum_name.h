#pragma once

// Names of enum values from a table indexed by the value, in place of a
// switch of `case X: return "x";`. Header-only.

#include <cstddef>
#include <cstdint>

namespace duet {

// names[value], or `unknown` where the table has no name for it (past its
// end, negative, or a nullptr slot: a value the enum does not use).
template <typename Enum, size_t N>
constexpr const char* EnumName(Enum value, const char* const (&names)[N],
                               const char* unknown = "unknown") {
  const auto i = static_cast<int64_t>(value);
  if (i < 0 || i >= static_cast<int64_t>(N) || names[i] == nullptr) return unknown;
  return names[i];
}

}  // namespace duet
