#pragma once

// Whether duet-bridge's libslurm has a way to authenticate to slurmctld at
// all, found from the same slurm.conf libslurm reads, before and beside the
// sync passes that would otherwise only fail with Slurm's
// "failed to connect to any sack sockets" or a munge error.
//
// Where a libslurm *client* (duet-bridge, scontrol) gets its credential:
// - AuthType=auth/slurm (Slurm 23.11+; Slinky, the GKE add-on): never from
//   slurm.key (only Slurm's daemons read it). It asks a sack socket for a
//   token (Slurm's src/common/sack_api.c, 24.11 to 26.05): only
//   $SLURM_SACK_SOCKET when that is set (no fallback), else
//   /run/slurm-<ClusterName>/sack.socket, /run/slurm/sack.socket,
//   /run/slurmctld/sack.socket, /run/slurmdbd/sack.socket, the first that
//   accepts a connection. `sackd` serves one (a sidecar in a pod).
// - AuthType=auth/munge (also Slurm's default): munged's socket,
//   AuthInfo's socket=PATH or libmunge's default /run/munge/munge.socket.2.
// Any other AuthType is not checked ("unchecked").
//
// A source counts only if a connect() to it succeeds now; a socket file
// with no listener behind it (a sackd that died) does not.
//
// Thread-safety: the free functions are thread-safe; SlurmAuthMonitor is
// thread-safe.

#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace duet {

// The slurm.conf lines that decide where libslurm gets its credential.
struct SlurmAuthConf {
  std::string auth_type;     // as written, e.g. "auth/slurm"; "" = Slurm's default (auth/munge)
  std::string cluster_name;  // ClusterName
  std::string auth_info;     // AuthInfo, e.g. "socket=/run/munge/munge.socket.2"
};

// Reads AuthType, ClusterName and AuthInfo from the slurm.conf at `path`.
// Keys are case-insensitive, '#' starts a comment, a later line wins, quotes
// around a value are dropped; Include lines are not followed. NOT_FOUND /
// PERMISSION_DENIED (with the path) when the file cannot be read.
absl::StatusOr<SlurmAuthConf> ReadSlurmAuthConf(const std::string& path);

// The slurm.conf libslurm reads for `configured` (slurm.conf_path): itself
// when set, else $SLURM_CONF, else Slurm's default /etc/slurm/slurm.conf.
std::string LibslurmConfPath(const std::string& configured);

// Where to look. FromProcess() for the real thing; tests put the fixed
// paths under a temporary `root`.
struct SlurmAuthEnv {
  // $SLURM_SACK_SOCKET (nullopt: unset).
  std::optional<std::string> sack_socket_env;
  // Prefix of the fixed /run/... paths ("" = the real ones).
  std::string root;

  static SlurmAuthEnv FromProcess();
};

enum class SlurmAuthSource {
  kSackSocket,   // auth/slurm: a sack socket accepts connections
  kMungeSocket,  // auth/munge: munged's socket accepts connections
  kNone,         // the AuthType needs a socket and none answers
  kUnchecked,    // another AuthType, or slurm.conf unreadable: no claim
};

// "sack_socket", "munge_socket", "none", "unchecked" (the metric's label).
const char* SlurmAuthSourceName(SlurmAuthSource s);

struct SlurmAuthCheck {
  SlurmAuthSource source = SlurmAuthSource::kUnchecked;
  std::string auth_type;  // effective, e.g. "auth/munge" when slurm.conf names none
  std::string path;       // the socket that answered (sack_socket, munge_socket)
  // Every path tried, in libslurm's order, with why it did not answer, e.g.
  // "/run/slurm/sack.socket (No such file or directory)".
  std::vector<std::string> tried;
  std::string note;  // kUnchecked: why

  // False only for kNone.
  bool ready() const { return source != SlurmAuthSource::kNone; }
  // One line for the log: what was found, or, for kNone, what was tried and
  // what to do about it.
  std::string Describe() const;
  bool operator==(const SlurmAuthCheck& o) const {
    return source == o.source && auth_type == o.auth_type && path == o.path && tried == o.tried &&
           note == o.note;
  }
};

// The sack sockets libslurm tries for `cluster_name`, in its order (only
// the env's when that is set).
std::vector<std::string> SackSocketSearchOrder(const std::string& cluster_name,
                                               const SlurmAuthEnv& env);

// The check for `conf`, connecting to each candidate in order.
SlurmAuthCheck CheckSlurmAuth(const SlurmAuthConf& conf, const SlurmAuthEnv& env);

// The check for the slurm.conf at `conf_path` (kUnchecked when unreadable).
SlurmAuthCheck CheckSlurmAuthForConf(const std::string& conf_path, const SlurmAuthEnv& env);

// Runs the check for duet-bridge and says so in its log:
// - Check(): checks now; the first call logs the result (error level when
//   there is no credential source), later calls log only a change (error
//   when it becomes none, info when a source appears).
// - OnPassFailed(): a Slurm sync pass failed; checks and, when there is no
//   source, logs at error level why (once until a pass succeeds or the
//   result changes).
// - OnPassSucceeded(): re-arms OnPassFailed's log.
class SlurmAuthMonitor {
 public:
  SlurmAuthMonitor(std::string conf_path, SlurmAuthEnv env)
      : conf_path_(std::move(conf_path)), env_(std::move(env)) {}

  SlurmAuthCheck Check();
  void OnPassFailed();
  void OnPassSucceeded();
  // The last result (Check() first if there is none yet).
  SlurmAuthCheck last();

 private:
  // Checks and logs the first result or a change (then *logged = true).
  SlurmAuthCheck CheckLocked(bool* logged) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string conf_path_;
  const SlurmAuthEnv env_;
  absl::Mutex mu_;
  std::optional<SlurmAuthCheck> last_ ABSL_GUARDED_BY(mu_);
  bool failure_logged_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace duet
