#pragma once

// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's choice for
// port 0), for a test that must write a port into a server's configuration
// before the server starts. Another process may take it in between; tests
// that can let the server bind port 0 and report it should do that instead.
// Header-only, as tests/fakes/wait.h.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace duet {
namespace fakes {

// 0 if no socket could be bound.
inline int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace fakes
}  // namespace duet
