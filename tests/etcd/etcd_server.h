#pragma once

// A real etcd (Debian's etcd-server, /usr/bin/etcd) for tests: one member on
// free loopback ports with its data in a temporary directory, started and
// killed by the test. Tests skip (GTEST_SKIP) only when the binary is
// missing: `if (!EtcdServer::Available()) GTEST_SKIP() << ...`.

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace duet {
namespace testing {

class EtcdServer {
 public:
  static constexpr char kBinary[] = "/usr/bin/etcd";
  static bool Available();

  EtcdServer();
  // Kills etcd (if running) and removes its directory.
  ~EtcdServer();
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  // Starts etcd (again, on the same ports and data) and waits until it
  // answers a range request, up to `timeout`.
  absl::Status Start(absl::Duration timeout = absl::Seconds(20));
  // kill -9 and reap.
  void Kill();
  bool running() const { return pid_ > 0; }

  // http://127.0.0.1:<client port>
  std::string endpoint() const;
  // etcd's own output, for a failing test's message.
  std::string Log() const;

 private:
  std::string dir_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace testing
}  // namespace duet
