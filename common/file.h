#pragma once

// Reading a whole small file (a PEM, a token, a kubeconfig): the one helper
// every binary uses, so each error names the file and why it failed.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace duet {

// The whole file at `path`. When it cannot be read: a status of `code`
// saying "cannot read <path>: <why>", after "<what>: " when `what` (the
// config field or flag that named the file) is given.
absl::StatusOr<std::string> ReadFileToString(const std::string& path,
                                             absl::StatusCode code = absl::StatusCode::kNotFound,
                                             absl::string_view what = "");

}  // namespace duet
