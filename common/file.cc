#include "common/file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace duet {

absl::StatusOr<std::string> ReadFileToString(const std::string& path, absl::StatusCode code,
                                             absl::string_view what) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  if (in) out << in.rdbuf();
  if (!in || in.bad()) {
    const int err = errno;
    return absl::Status(code, absl::StrCat(what, what.empty() ? "" : ": ", "cannot read ", path,
                                           ": ", err != 0 ? std::strerror(err) : "read error"));
  }
  return out.str();
}

}  // namespace duet
