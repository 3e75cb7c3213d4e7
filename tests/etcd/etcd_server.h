#pragma once

// A real etcd (Debian's etcd-server, /usr/bin/etcd) for tests: one member on
// free loopback ports with its data in a temporary directory, started and
// killed by the test. Tests skip (GTEST_SKIP) only when the binary is
// missing: `if (!EtcdServer::Available()) GTEST_SKIP() << ...`.
//
// With Options::tls the client port speaks only TLS, with
// --client-cert-auth: certificates are made at Start with the openssl CLI
// in the temporary directory (a CA and the server's and a client's
// certificates from it, and a second CA with a client certificate of its
// own, which etcd must refuse).

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "bridge/etcd/etcd_client.h"

namespace duet {
namespace testing {

class EtcdServer {
 public:
  static constexpr char kBinary[] = "/usr/bin/etcd";
  static bool Available();

  struct Options {
    bool tls = false;  // https:// with --client-cert-auth
  };
  EtcdServer() : EtcdServer(Options{}) {}
  explicit EtcdServer(Options options);
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

  // http://127.0.0.1:<client port>, or https:// with tls.
  std::string endpoint() const;
  // etcd's own output, for a failing test's message.
  std::string Log() const;

  // With tls (valid once Start has made them): the CA of etcd's server and
  // client certificates, and client TLS options (field "journal.etcd.tls")
  // that etcd accepts.
  std::string ca_file() const { return dir_ + "/pki/ca.crt"; }
  etcd::TlsOptions ClientTls() const;
  // A CA etcd does not trust, and a client certificate and key it signed.
  std::string other_ca_file() const { return dir_ + "/pki/other-ca.crt"; }
  std::string other_client_cert() const { return dir_ + "/pki/other-client.crt"; }
  std::string other_client_key() const { return dir_ + "/pki/other-client.key"; }

 private:
  absl::Status MakeCertificates();

  const Options options_;
  std::string dir_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace testing
}  // namespace duet
