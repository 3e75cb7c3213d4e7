// The long failover run (issue 14): N kill -9s of the leader under
// Hold/Release load, with the ledger's log in etcd ("after") and with
// per-replica local journals ("before"). Prints takeover time percentiles,
// holdings acknowledged, lost and double grants per mode. Figures and the
// exact command: bench/failover/RESULTS.md.
//
//   build/bench/failover/failover_bench --kills 10 [--mode both|etcd|local] [--freeze]

#include <algorithm>
#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/server/failover_harness.h"

int main(int argc, char** argv) {
  CLI::App app("duet failover bench: kill -9 the leader under load");
  int kills = 10;
  int workers = 3;
  std::string mode = "both";
  double load_s = 1.5;
  bool quiet = false;
  bool freeze = false;
  int stale = 25;
  std::string work_dir;
  app.add_option("--kills", kills, "kill -9s of the leader per mode")->check(CLI::Range(1, 1000));
  app.add_option("--workers", workers, "load threads")->check(CLI::Range(1, 64));
  app.add_option("--mode", mode, "etcd, local or both")->check(CLI::IsMember({"etcd", "local", "both"}));
  app.add_option("--load-seconds", load_s, "load between a replica's start and the next kill");
  app.add_flag("--quiet", quiet, "no line per kill");
  app.add_flag("--freeze", freeze,
               "SIGSTOP the leader instead of kill -9, SIGCONT it after the takeover");
  app.add_option("--work-dir", work_dir,
                 "keep the replicas' configs, journals and logs here (default: a temporary "
                 "directory, removed)");
  app.add_option("--stale-percent", stale, "calls sent first to the replica not believed leader")
      ->check(CLI::Range(0, 100));
  CLI11_PARSE(app, argc, argv);

  int code = 0;
  for (const char* m : {"local", "etcd"}) {
    if (mode != "both" && mode != m) continue;
    duet::failover::Options o;
    o.etcd = std::string(m) == "etcd";
    o.kills = kills;
    o.workers = workers;
    o.load_before_kill = absl::Seconds(load_s);
    o.bridge_binary = DUET_BRIDGE_BIN;
    o.verbose = !quiet;
    o.freeze = freeze;
    if (!work_dir.empty()) o.work_dir = absl::StrCat(work_dir, "/", m);
    o.stale_client_percent = stale;
    std::fprintf(stderr, "== %s: %d kills\n", o.etcd ? "log in etcd" : "per-replica journals", kills);
    absl::StatusOr<duet::failover::Figures> f = duet::failover::Run(o);
    if (!f.ok()) {
      std::fprintf(stderr, "%s: %s\n", m, f.status().ToString().c_str());
      code = 1;
      continue;
    }
    std::printf(
        "%-6s kills=%d takeover: %s | holds acknowledged %llu (%.0f/s), releases %llu, refused "
        "%llu, uncertain %llu | live at kills %llu, live checked %llu, lost %llu | double grants "
        "%llu%s\n",
        m, kills, duet::failover::Summary(f->takeover_seconds).c_str(),
        static_cast<unsigned long long>(f->holds_acknowledged),
        static_cast<double>(f->holds_acknowledged) / std::max(f->load_seconds, 1e-9),
        static_cast<unsigned long long>(f->releases_acknowledged),
        static_cast<unsigned long long>(f->refused), static_cast<unsigned long long>(f->uncertain),
        static_cast<unsigned long long>(f->live_at_kills),
        static_cast<unsigned long long>(f->live_checked), static_cast<unsigned long long>(f->lost),
        static_cast<unsigned long long>(f->double_grants),
        freeze ? absl::StrCat(" | deposed exits ", absl::StrJoin(f->deposed_exits, ",")).c_str()
               : "");
    if (!f->findings.empty()) {
      std::printf("  first findings:\n    %s\n", absl::StrJoin(f->findings, "\n    ").c_str());
    }
    std::fflush(stdout);
  }
  return code;
}
