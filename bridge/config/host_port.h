#pragma once

// The check of a "host:port" listen address, shared by the config's
// validation and the structs of settings it embeds (ExtenderSettings).
// Header-only, in the core's config folder.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace duet {

// OK when `addr` is empty (the listener is off) or "host:port" with a port
// 0..65535 after the last colon (so "[::1]:80" passes); else
// INVALID_ARGUMENT naming `field`.
inline absl::Status CheckHostPort(absl::string_view field, const std::string& addr) {
  if (addr.empty()) return absl::OkStatus();
  const size_t colon = addr.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(addr.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": \"", addr, "\" must be host:port, e.g. 127.0.0.1:50151"));
  }
  return absl::OkStatus();
}

}  // namespace duet
