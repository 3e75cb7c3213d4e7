// duet-bridge: ParseFlags -> LoadConfig -> Validate -> Run.

#include <cstdlib>
#include <iostream>

#include "CLI/CLI.hpp"
#include "bridge/config/config.h"
#include "bridge/server/bridge.h"
#include "common/daemon.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  duet::SkipMutexDeadlockDetection();
  CLI::App app{"duet-bridge: one ledger of who holds which GPU/TPU, for Slurm and Kubernetes"};
  std::string config_file, state_dir = "/tmp/duet-dev";
  bool dev = false, check_only = false, no_fsync = false;
  std::string grpc_listen, unix_socket, metrics_listen, journal_dir, inventory_file, log_level;
  app.add_option("-c,--config", config_file, "YAML config file (see docs/config.md)");
  app.add_flag("--dev", dev,
               "Run on the embedded default: local listeners, the embedded demo inventory, "
               "journal under --state-dir");
  app.add_option("--state-dir", state_dir, "With --dev: where the journal and socket live");
  app.add_option("--grpc-listen", grpc_listen, "Override grpc.listen (host:port; \"\" disables)");
  app.add_option("--unix-socket", unix_socket, "Override grpc.unix_socket");
  app.add_option("--metrics-listen", metrics_listen, "Override metrics.listen (host:port)");
  app.add_option("--journal-dir", journal_dir, "Override journal.dir");
  app.add_option("--inventory-file", inventory_file,
                 "Override inventory.file (and set inventory.source=file)");
  app.add_option("--log-level", log_level, "Override log_level");
  app.add_flag("--no-fsync", no_fsync, "Set journal.fsync=false (throwaway runs only)");
  app.add_flag("--check-config", check_only, "Validate the configuration and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (dev == !config_file.empty()) {
    std::cerr << "duet-bridge: give exactly one of --config FILE and --dev\n";
    return 2;
  }

  duet::Config config;
  if (dev) {
    config = duet::DevConfig(state_dir);
  } else {
    absl::StatusOr<duet::Config> loaded = duet::LoadConfigFile(config_file);
    if (!loaded.ok()) {
      std::cerr << "duet-bridge: " << loaded.status().message() << "\n";
      return 2;
    }
    config = *loaded;
  }
  if (app.count("--grpc-listen")) config.grpc.listen = grpc_listen;
  if (app.count("--unix-socket")) config.grpc.unix_socket = unix_socket;
  if (app.count("--metrics-listen")) config.metrics.listen = metrics_listen;
  if (app.count("--journal-dir")) config.journal.dir = journal_dir;
  if (app.count("--inventory-file")) {
    config.inventory.source = "file";
    config.inventory.file = inventory_file;
  }
  if (app.count("--log-level")) config.log_level = log_level;
  if (no_fsync) config.journal.fsync = false;

  absl::Status valid = duet::ValidateConfig(config);
  if (!valid.ok()) {
    std::cerr << "duet-bridge: invalid configuration: " << valid.message() << "\n";
    return 2;
  }
  if (check_only) {
    std::cout << "configuration OK\n";
    return 0;
  }
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  return duet::Run(config);
}
