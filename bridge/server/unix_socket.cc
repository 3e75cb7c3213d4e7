#include "bridge/server/unix_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace duet {

std::string OctalMode(uint32_t mode) {
  char text[16];
  std::snprintf(text, sizeof text, "%04o", mode);
  return text;
}

bool SocketInUse(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool in_use = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return in_use;
}

absl::Status CheckSocketDirectory(const std::string& socket) {
  std::string dir = std::filesystem::path(socket).parent_path().string();
  if (dir.empty()) dir = ".";
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return absl::UnavailableError(absl::StrCat("grpc.unix_socket ", socket, ": directory ", dir,
                                               ": ", std::strerror(errno)));
  }
  if ((st.st_mode & S_IWOTH) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "grpc.unix_socket ", socket, ": its directory ", dir, " (mode ",
        OctalMode(st.st_mode & 07777), ") is writable by every user without the sticky bit: "
        "anyone could replace the socket; use a directory only duet-bridge's user may write "
        "(e.g. 0755)"));
  }
  return absl::OkStatus();
}

NarrowedUmask::NarrowedUmask(mode_t bits)
    : bits_(bits), before_(bits != 0 ? ::umask(0077) : 0) {
  if (bits_ != 0) ::umask(before_ | bits_);
}

NarrowedUmask::~NarrowedUmask() {
  if (bits_ != 0) ::umask(before_);
}

absl::Status UnixSocketListener::Prepare() {
  if (path_.empty()) return absl::OkStatus();
  // bind() makes the socket 0777 & ~umask, and connecting needs only write
  // permission on it; create_directories makes its directory 0777 & ~umask.
  // Under a umask that lets group or others write (0 under some service
  // managers) anyone could call in before the chmod in Finish, or replace
  // the socket.
  narrowed_.emplace(0022);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ec);
  if (absl::Status s = CheckSocketDirectory(path_); !s.ok()) return s;
  if (SocketInUse(path_)) {
    return absl::UnavailableError(
        absl::StrCat("grpc.unix_socket ", path_, ": another process is serving on it"));
  }
  ::unlink(path_.c_str());  // a stale socket from a previous run
  return absl::OkStatus();
}

absl::Status UnixSocketListener::Finish(bool bound) {
  narrowed_.reset();
  if (path_.empty() || !bound) return absl::OkStatus();
  if (::chmod(path_.c_str(), static_cast<mode_t>(mode_)) != 0) {
    return absl::UnavailableError(absl::StrCat("grpc.unix_socket ", path_, ": chmod ",
                                               OctalMode(mode_), ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace duet
