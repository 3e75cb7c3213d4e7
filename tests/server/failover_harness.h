#pragma once

// Failover under load: two real duet-bridge replicas under leader election
// (against the fake API server), a load driver doing Hold/Release of pod
// holdings on the ledger path (no Slurm, so nothing but the ledger's log
// remembers them), and kill -9 of the leader. Measures the takeover time
// (kill → the first acknowledged Hold on the new leader) and checks, at each
// takeover, that every acknowledged holding not yet released is on the new
// leader with the same devices, and, over the whole run, that no device was
// ever held by two owners.
//
// A holding is "definitely live" from the moment its Hold was acknowledged
// until its Release is first sent. Two definitely-live holdings of the same
// device at one instant are a double grant; a holding definitely live at a
// takeover that the new leader does not show (with the same devices), or
// whose Release finds nothing to release, is lost.
// A call whose outcome is unknown (an error other than a refusal) is never
// counted as live; the driver releases that owner until a leader confirms.
//
// Used by tests/server/failover_test.cc (short) and bench/failover (long).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace duet {
namespace failover {

struct Options {
  // true: both replicas share the ledger's log in etcd (a real etcd is
  // started); false: each has its own local journal (the "before").
  bool etcd = true;
  int kills = 1;
  int workers = 3;
  // Holdings a worker keeps before it releases its oldest.
  int holdings_per_worker = 4;
  // Load between a replica's (re)start and the next kill.
  absl::Duration load_before_kill = absl::Milliseconds(1500);
  absl::Duration lease_duration = absl::Seconds(2);
  absl::Duration renew_deadline = absl::Milliseconds(1500);
  absl::Duration retry_period = absl::Milliseconds(200);
  // Paths (from the build).
  std::string bridge_binary;
  // Where replicas' configs, journals and logs go; "": a temporary directory.
  std::string work_dir;
  // SIGSTOP the leader instead of kill -9, and SIGCONT it once the other
  // replica serves: a deposed leader that is alive (partitioned, paused)
  // and still believes it leads. It must acknowledge nothing and exit.
  bool freeze = false;
  // Share of calls a worker sends to the replica it does not believe is the
  // leader first (a client with a stale view), in percent.
  int stale_client_percent = 25;
  // Progress lines on stderr.
  bool verbose = false;
};

struct Figures {
  std::vector<double> takeover_seconds;  // one per kill
  uint64_t holds_acknowledged = 0;
  uint64_t releases_acknowledged = 0;
  uint64_t refused = 0;            // RESOURCE_EXHAUSTED and the like (no effect)
  uint64_t uncertain = 0;          // calls with an unknown outcome (cleaned up)
  uint64_t live_at_kills = 0;      // definitely-live holdings at the kill instants (sum)
  uint64_t live_checked = 0;       // definitely-live holdings checked at takeovers (those
                                   // above, less ones released since, plus new ones)
  // Definitely-live holdings missing or changed on the new leader at a check,
  // or that the leader had nothing to release for when the driver released
  // them (each counted once).
  uint64_t lost = 0;
  uint64_t double_grants = 0;      // acknowledged grants overlapping on a device
  // With `freeze`: how each deposed leader ended after SIGCONT (its exit
  // status; -1 if it was still running after 20 s).
  std::vector<int> deposed_exits;
  double load_seconds = 0;         // how long the load ran (for throughput)
  std::vector<std::string> findings;  // the first few lost / double grants, for people
};

// Runs the scenario. Errors: the setup could not be done (etcd, the fake API
// server, a replica that does not start or take over in time).
absl::StatusOr<Figures> Run(const Options& options);

// "median 2.31 s, p99 2.60 s, max 2.60 s (n=10)"
std::string Summary(const std::vector<double>& seconds);

}  // namespace failover
}  // namespace duet
