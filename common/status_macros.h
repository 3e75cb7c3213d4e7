#pragma once

// Abseil 20220623 has no status macros; these are the project's only ones.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DUET_CONCAT_INNER_(a, b) a##b
#define DUET_CONCAT_(a, b) DUET_CONCAT_INNER_(a, b)

// Returns `expr` from the enclosing function if it is not OK.
#define DUET_RETURN_IF_ERROR(expr)                   \
  do {                                               \
    ::absl::Status duet_status_ = (expr);            \
    if (!duet_status_.ok()) return duet_status_;     \
  } while (0)

// Evaluates `rexpr` (a StatusOr); on error returns its status, otherwise
// moves the value into `lhs` (which may be a declaration).
#define DUET_ASSIGN_OR_RETURN(lhs, rexpr) \
  DUET_ASSIGN_OR_RETURN_IMPL_(DUET_CONCAT_(duet_statusor_, __LINE__), lhs, rexpr)

#define DUET_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(tmp).value()
