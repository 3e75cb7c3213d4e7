#include "bridge/slurm/slurm_auth_check.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace {

constexpr char kDefaultSlurmConf[] = "/etc/slurm/slurm.conf";
constexpr char kDefaultMungeSocket[] = "/run/munge/munge.socket.2";

// "" when a client can connect to the unix socket at `path` now, else why
// not (strerror of connect's errno).
std::string ConnectError(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return "path longer than a unix socket path may be";
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  // Non-blocking: a listener whose backlog is full answers EAGAIN instead
  // of stalling the caller; it is there all the same.
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return std::strerror(errno);
  std::string err;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 &&
      errno != EAGAIN && errno != EINPROGRESS) {
    err = std::strerror(errno);
  }
  ::close(fd);
  return err;
}

// The first of `paths` that accepts a connection ("" if none); every one
// tried is appended to `tried` with why it did not.
std::string FirstAnswering(const std::vector<std::string>& paths,
                           std::vector<std::string>* tried) {
  for (const std::string& p : paths) {
    const std::string err = ConnectError(p);
    if (err.empty()) return p;
    tried->push_back(absl::StrCat(p, " (", err, ")"));
  }
  return "";
}

// AuthInfo's socket=PATH ("" if none). AuthInfo is a comma-separated list.
std::string MungeSocketFromAuthInfo(const std::string& auth_info) {
  for (absl::string_view opt : absl::StrSplit(auth_info, ',', absl::SkipEmpty())) {
    opt = absl::StripAsciiWhitespace(opt);
    if (absl::StartsWithIgnoreCase(opt, "socket=")) return std::string(opt.substr(7));
  }
  return "";
}

}  // namespace

absl::StatusOr<SlurmAuthConf> ReadSlurmAuthConf(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    const int e = errno;
    const std::string msg = absl::StrCat("cannot read slurm.conf ", path, ": ", std::strerror(e));
    return e == EACCES ? absl::PermissionDeniedError(msg) : absl::NotFoundError(msg);
  }
  SlurmAuthConf conf;
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view l = line;
    if (size_t hash = l.find('#'); hash != absl::string_view::npos) l = l.substr(0, hash);
    l = absl::StripAsciiWhitespace(l);
    const size_t eq = l.find('=');
    if (eq == absl::string_view::npos) continue;
    const absl::string_view key = absl::StripAsciiWhitespace(l.substr(0, eq));
    absl::string_view value = absl::StripAsciiWhitespace(l.substr(eq + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    if (absl::EqualsIgnoreCase(key, "AuthType")) {
      conf.auth_type = std::string(value);
    } else if (absl::EqualsIgnoreCase(key, "ClusterName")) {
      conf.cluster_name = std::string(value);
    } else if (absl::EqualsIgnoreCase(key, "AuthInfo")) {
      conf.auth_info = std::string(value);
    }
  }
  return conf;
}

std::string LibslurmConfPath(const std::string& configured) {
  if (!configured.empty()) return configured;
  const char* env = std::getenv("SLURM_CONF");
  return env != nullptr && *env != '\0' ? env : kDefaultSlurmConf;
}

SlurmAuthEnv SlurmAuthEnv::FromProcess() {
  SlurmAuthEnv env;
  if (const char* s = std::getenv("SLURM_SACK_SOCKET"); s != nullptr) env.sack_socket_env = s;
  return env;
}

const char* SlurmAuthSourceName(SlurmAuthSource s) {
  switch (s) {
    case SlurmAuthSource::kSackSocket: return "sack_socket";
    case SlurmAuthSource::kMungeSocket: return "munge_socket";
    case SlurmAuthSource::kNone: return "none";
    case SlurmAuthSource::kUnchecked: return "unchecked";
  }
  return "unchecked";
}

std::vector<std::string> SackSocketSearchOrder(const std::string& cluster_name,
                                               const SlurmAuthEnv& env) {
  // libslurm tries only $SLURM_SACK_SOCKET when it is set, even if empty.
  if (env.sack_socket_env.has_value()) return {*env.sack_socket_env};
  std::vector<std::string> out;
  if (!cluster_name.empty()) {
    out.push_back(absl::StrCat(env.root, "/run/slurm-", cluster_name, "/sack.socket"));
  }
  for (const char* p : {"/run/slurm/sack.socket", "/run/slurmctld/sack.socket",
                        "/run/slurmdbd/sack.socket"}) {
    out.push_back(absl::StrCat(env.root, p));
  }
  return out;
}

SlurmAuthCheck CheckSlurmAuth(const SlurmAuthConf& conf, const SlurmAuthEnv& env) {
  SlurmAuthCheck c;
  c.auth_type = conf.auth_type.empty() ? "auth/munge" : conf.auth_type;
  if (c.auth_type == "auth/slurm") {
    c.path = FirstAnswering(SackSocketSearchOrder(conf.cluster_name, env), &c.tried);
    c.source = c.path.empty() ? SlurmAuthSource::kNone : SlurmAuthSource::kSackSocket;
  } else if (c.auth_type == "auth/munge") {
    std::string socket = MungeSocketFromAuthInfo(conf.auth_info);
    if (socket.empty()) socket = absl::StrCat(env.root, kDefaultMungeSocket);
    c.path = FirstAnswering({socket}, &c.tried);
    c.source = c.path.empty() ? SlurmAuthSource::kNone : SlurmAuthSource::kMungeSocket;
  } else {
    c.source = SlurmAuthSource::kUnchecked;
    c.note = absl::StrCat("AuthType=", c.auth_type, " is not checked");
  }
  if (c.source != SlurmAuthSource::kNone) c.tried.clear();
  return c;
}

SlurmAuthCheck CheckSlurmAuthForConf(const std::string& conf_path, const SlurmAuthEnv& env) {
  absl::StatusOr<SlurmAuthConf> conf = ReadSlurmAuthConf(conf_path);
  if (!conf.ok()) {
    SlurmAuthCheck c;
    c.source = SlurmAuthSource::kUnchecked;
    c.note = std::string(conf.status().message());
    return c;
  }
  return CheckSlurmAuth(*conf, env);
}

std::string SlurmAuthCheck::Describe() const {
  switch (source) {
    case SlurmAuthSource::kSackSocket:
      return absl::StrCat("AuthType=", auth_type, ": credentials from the sack socket ", path);
    case SlurmAuthSource::kMungeSocket:
      return absl::StrCat("AuthType=", auth_type, ": credentials from munged at ", path);
    case SlurmAuthSource::kUnchecked:
      return absl::StrCat("not checked: ", note);
    case SlurmAuthSource::kNone:
      break;
  }
  const std::string paths = absl::StrJoin(tried, ", ");
  if (auth_type == "auth/slurm") {
    return absl::StrCat(
        "no way to authenticate to slurmctld: AuthType=auth/slurm and no sack socket answers "
        "(tried ",
        paths,
        "); libslurm never reads slurm.key itself, it asks sackd for a token: run sackd beside "
        "duet-bridge with the cluster's slurm.key (the chart's sackd sidecar) so that it "
        "listens on /run/slurm/sack.socket, or set SLURM_SACK_SOCKET to a sackd's socket");
  }
  return absl::StrCat(
      "no way to authenticate to slurmctld: AuthType=", auth_type,
      " and munged does not answer (tried ", paths,
      "): run munged beside duet-bridge with the cluster's munge.key (the chart's munged "
      "sidecar), or name its socket in slurm.conf's AuthInfo=socket=PATH");
}

SlurmAuthCheck SlurmAuthMonitor::CheckLocked(bool* logged) {
  SlurmAuthCheck now = CheckSlurmAuthForConf(conf_path_, env_);
  const bool log = !last_.has_value() || !(now == *last_);
  if (logged != nullptr) *logged = log;
  if (!last_.has_value()) {
    if (now.ready()) {
      spdlog::info("slurm auth: {}", now.Describe());
    } else {
      spdlog::error("slurm auth: {}", now.Describe());
    }
  } else if (log) {
    if (now.ready()) {
      spdlog::info("slurm auth: now {}", now.Describe());
    } else {
      spdlog::error("slurm auth: now {}", now.Describe());
    }
  }
  last_ = now;
  return now;
}

SlurmAuthCheck SlurmAuthMonitor::Check() {
  absl::MutexLock lock(&mu_);
  return CheckLocked(nullptr);
}

void SlurmAuthMonitor::OnPassFailed() {
  absl::MutexLock lock(&mu_);
  bool logged = false;
  SlurmAuthCheck now = CheckLocked(&logged);
  if (now.ready()) return;
  // Said once per failing stretch; a check that has just logged it (the
  // first, or a change) has said it already.
  const bool said = failure_logged_ || logged;
  failure_logged_ = true;
  if (said) return;
  spdlog::error("slurm auth: a Slurm sync pass failed and duet-bridge has {}", now.Describe());
}

void SlurmAuthMonitor::OnPassSucceeded() {
  absl::MutexLock lock(&mu_);
  failure_logged_ = false;
}

SlurmAuthCheck SlurmAuthMonitor::last() {
  absl::MutexLock lock(&mu_);
  if (!last_.has_value()) return CheckLocked(nullptr);
  return *last_;
}

}  // namespace duet
