#pragma once

// grpc.unix_socket as duet-bridge makes it, the leader (bridge.cc) and the
// standby (leadership.cc) alike. Node-local clients (the SPANK plugin,
// duet-node) authenticate by file permissions alone, so whoever may connect
// to the socket, or replace it, may act as them or answer them:
//
//   UnixSocketListener socket(path, mode);
//   DUET_RETURN_IF_ERROR(socket.Prepare());   // directory made and checked,
//   builder.AddListeningPort(...);            // stale socket removed
//   server = builder.BuildAndStart();         // bind under the narrowed umask
//   DUET_RETURN_IF_ERROR(socket.Finish());    // umask back; chmod to `mode`
//
// Not thread-safe; the umask it narrows is process-wide (files other threads
// create meanwhile are only stricter).

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace duet {

// 0660 -> "0660".
std::string OctalMode(uint32_t mode);

// True when a process accepts connections on the unix socket at `path`.
bool SocketInUse(const std::string& path);

// The socket's directory: whoever may write to it may replace the socket
// with their own. World-writable is refused (FAILED_PRECONDITION) unless
// sticky, as /tmp is; a directory that cannot be read is UNAVAILABLE.
absl::Status CheckSocketDirectory(const std::string& socket);

// Adds `bits` to the process umask while it lives; 0: leaves it alone. (The
// umask is read by setting it, to 0077 for that instant: what other threads
// create meanwhile loses only group and others' bits, never the owner's.)
class NarrowedUmask {
 public:
  explicit NarrowedUmask(mode_t bits);
  ~NarrowedUmask();
  NarrowedUmask(const NarrowedUmask&) = delete;
  NarrowedUmask& operator=(const NarrowedUmask&) = delete;

 private:
  const mode_t bits_;
  const mode_t before_;
};

class UnixSocketListener {
 public:
  // `path` empty: every step is a no-op (no socket configured).
  UnixSocketListener(std::string path, uint32_t mode) : path_(std::move(path)), mode_(mode) {}

  // Narrows the umask (group and others lose write) until Finish, makes the
  // directory, refuses a directory anyone may write (CheckSocketDirectory)
  // and a socket another process serves on (UNAVAILABLE: "another process is
  // serving on it"), and removes a stale socket. Errors name grpc.unix_socket.
  absl::Status Prepare();
  // Restores the umask; with `bound`, gives the socket its mode (an error
  // names the mode and errno). Call after BuildAndStart, whatever it gave.
  absl::Status Finish(bool bound);

 private:
  const std::string path_;
  const uint32_t mode_;
  std::optional<NarrowedUmask> narrowed_;
};

}  // namespace duet
