#pragma once

// The duetctl command line: flags, subcommands and what each prints. main.cc
// only wires the process (argv, environment, tty, signals) to RunCli.
//
//   duetctl [global flags] nodes [NAMES...] [--json] [--watch]
//   duetctl [global flags] holds [--node N] [--json]
//   duetctl [global flags] node NAME [--json]
//   duetctl version
//
// Global flags (also accepted after the subcommand):
//   --server ADDR     gRPC target of duet-bridge; default $DUET_SERVER, else
//                     unix:///run/duet/bridge.sock. A bare absolute path is a
//                     unix socket.
//   --timeout D       deadline per call: 5s, 500ms, 1m, or seconds; default 5s.
//   --ca-file F       use TLS, trusting the CA certificates in F.
//   --cert-file F, --key-file F   client certificate for TLS (both or neither).
//
// Exit codes: 0 success (also a watch ended by Ctrl-C or by the server),
// 1 an RPC failed or a named node does not exist, 2 usage error.

#include <ostream>
#include <string>
#include <vector>

namespace duet::ctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRpcError = 1;
inline constexpr int kExitUsage = 2;

struct CliEnv {
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
  // Whether `out` is a terminal: --watch then clears the screen per update.
  bool out_is_tty = false;
  // The value of $DUET_SERVER, or empty when unset.
  std::string server_env;
};

// Runs one duetctl command. `args` excludes the program name. Returns the exit
// code. Not reentrant for --watch (the stop flag is process-wide).
int RunCli(const std::vector<std::string>& args, const CliEnv& env);

// Asks a running --watch to end cleanly (exit 0). Returns false when no watch
// is running to act on it (main then exits at once). Async-signal-safe.
bool RequestStop();
// Clears a stop request (tests that run several watches in one process).
void ResetStop();

}  // namespace duet::ctl
