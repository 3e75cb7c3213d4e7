// duetctl: the operator CLI of duet-bridge. See cli.h for the commands.

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "duetctl/cli.h"
#include "duetctl/client.h"

namespace {

// A watch stops cleanly; anything else (a call waiting on --timeout) stops
// now, with the shell's usual code for a signal.
void OnSignal(int sig) {
  if (!duet::ctl::RequestStop()) _exit(128 + sig);
}

}  // namespace

int main(int argc, char** argv) {
  // Ctrl-C ends a --watch cleanly (the stream is cancelled, exit 0); a closed
  // pipe shows up as a failed write instead of killing the process.
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  duet::ctl::CliEnv env;
  env.out = &std::cout;
  env.err = &std::cerr;
  env.out_is_tty = isatty(STDOUT_FILENO) == 1;
  if (const char* server = std::getenv(duet::ctl::kServerEnv)) env.server_env = server;
  return duet::ctl::RunCli(std::vector<std::string>(argv + 1, argv + argc), env);
}
