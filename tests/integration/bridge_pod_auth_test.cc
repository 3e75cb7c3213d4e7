// duet-bridge as its pod runs it, against the real Slurm cluster: in its own
// mount namespace (tests/integration/pod_ns.sh) that holds only what the
// chart mounts into the pod (its config, slurm.conf, slurm.key or munge.key,
// its journal, an empty /run and /tmp), nothing of slurmctld's (its
// /run/slurmctld/sack.socket, the cluster root with munged's socket), as the
// cluster's SlurmUser (root here, as the chart requires for node changes)
// without any capability (the chart drops ALL).
//
// - Without the credential daemon the chart runs beside it (sackd under
//   auth/slurm, munged under munge) libslurm cannot authenticate: the bridge
//   must say so (log and duet_slurm_auth_ready{source="none"} 0), stay
//   degraded and create nothing.
// - With it, in the same namespace as the chart's sidecar shares its socket
//   directory, the bridge creates its Slurm nodes.
//
// Needs root (unshare, mount), slurmctld, and sackd where the cluster runs
// auth/slurm (Slurm 24.11+); 22.05 runs munge.

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/fakes/free_port.h"
#include "tests/slurm/slurm_cluster_fixture.h"

#ifndef DUET_BRIDGE_BIN
#error "DUET_BRIDGE_BIN must name the duet-bridge binary"
#endif
#ifndef DUET_POD_NS_SH
#error "DUET_POD_NS_SH must name tests/integration/pod_ns.sh"
#endif

namespace duet::testing {
namespace {

namespace fs = std::filesystem;
using ::duet::fakes::FreePort;

// One duet-bridge pod: its files on the host (a temp dir), what the pod
// sees, and the pod's processes (one process group).
class BridgePod {
 public:
  BridgePod(TestSlurmCluster* cluster, const std::string& node, int idx, bool with_sidecar)
      : cluster_(cluster), with_sidecar_(with_sidecar) {
    char tmpl[] = "/tmp/duet-pod.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      ADD_FAILURE() << "mkdtemp failed";
      return;
    }
    dir_ = tmpl;
    // Where the pod has its Slurm files: the chart's /etc/slurm when the
    // machine has that directory (hidden and refilled in the namespace).
    slurm_dir_ = fs::is_directory("/etc/slurm") ? "/etc/slurm" : "/run/pod/etc-slurm";
    fs::create_directories(dir_ / "etc-slurm");
    fs::create_directories(dir_ / "config");
    fs::create_directories(dir_ / "journal");
    fs::create_directories(dir_ / "munge");

    // slurm.conf as the cluster's ConfigMap would carry it: under munge,
    // without this test cluster's own munged socket (AuthInfo=socket=...),
    // so libslurm uses munge's default, where the pod's sidecar listens.
    std::ifstream in(cluster_->conf());
    std::ofstream conf(dir_ / "etc-slurm" / "slurm.conf");
    for (std::string line; std::getline(in, line);) {
      if (absl::StartsWith(line, "AuthInfo=socket=")) continue;
      conf << line << "\n";
    }
    conf.close();
    if (cluster_->slurm_auth()) {
      // The chart's Secret mount: mode 0440 (readable by the pod's fsGroup).
      fs::copy_file(cluster_->slurm_key(), dir_ / "etc-slurm" / "slurm.key");
      chmod((dir_ / "etc-slurm" / "slurm.key").c_str(), 0440);
    } else {
      fs::copy_file(cluster_->root() + "/munge/munge.key", dir_ / "munge" / "munge.key");
      chmod((dir_ / "munge" / "munge.key").c_str(), 0600);
    }

    metrics_port_ = FreePort();
    std::ofstream inv(dir_ / "config" / "nodes.yaml");
    inv << "nodes:\n"
        << "  - name: " << node << "\n"
        << "    cpus: 8\n    memory_mib: 16000\n    zone: us-central1-a\n"
        << "    pool: shared-h100\n"
        << "    labels: {duet.dev/slurm-node-addr: 127.0.0." << idx
        << ", cloud.google.com/gke-accelerator: nvidia-h100-80gb}\n"
        << "    gpus: {count: 2, model: nvidia-h100-80gb}\n";
    inv.close();
    std::ofstream cfg(dir_ / "config" / "bridge.yaml");
    cfg << "grpc: {listen: \"127.0.0.1:" << FreePort() << "\", unix_socket: \"\"}\n"
        << "metrics: {listen: \"127.0.0.1:" << metrics_port_ << "\"}\n"
        << "journal: {dir: /run/pod/journal}\n"
        << "inventory: {source: file, file: /run/pod/config/nodes.yaml, reload_period: 1s}\n"
        << "slurm:\n"
        << "  enabled: true\n"
        << "  conf_path: " << slurm_dir_ << "/slurm.conf\n"
        << "  call_timeout: 3s\n"
        << "  sync_period: 500ms\n";
    if (cluster_->slurm_auth()) {
      cfg << "  credential: slurm_key\n  key_file: " << slurm_dir_ << "/slurm.key\n";
    } else {
      cfg << "  credential: munge\n";
    }
    cfg << "log_level: info\n";
    cfg.close();
    ok_ = true;
  }

  ~BridgePod() {
    Stop();
    if (!dir_.empty() && !HasFailure()) fs::remove_all(dir_);
  }

  // pod_ns.sh's arguments up to and including "--": what the pod mounts.
  std::string NamespaceArgs() const {
    std::vector<std::string> a = {
        DUET_POD_NS_SH,
        "--hide /tmp",
        absl::StrCat("--bind ", (dir_ / "config").string(), ":/run/pod/config"),
        absl::StrCat("--bind ", (dir_ / "journal").string(), ":/run/pod/journal"),
    };
    // The cluster root (munged's socket, the key) when /tmp does not hold it.
    if (!absl::StartsWith(cluster_->root(), "/tmp/")) {
      a.push_back(absl::StrCat("--hide ", cluster_->root()));
    }
    if (slurm_dir_ == "/etc/slurm") a.push_back("--hide /etc/slurm");
    for (const char* f : {"slurm.conf", "slurm.key"}) {
      if (fs::exists(dir_ / "etc-slurm" / f)) {
        a.push_back(
            absl::StrCat("--bind ", (dir_ / "etc-slurm" / f).string(), ":", slurm_dir_, "/", f));
      }
    }
    if (!cluster_->slurm_auth()) {
      a.push_back(absl::StrCat("--bind ", (dir_ / "munge").string(), ":/run/pod/munge-key"));
    }
    a.push_back("--");
    return absl::StrJoin(a, " ");
  }

  // A shell command run in a pod namespace of its own, as the bridge sees
  // the file system (without a sidecar).
  CmdResult RunInPod(const std::string& cmd) const {
    return RunCmd(absl::StrCat("SLURM_CONF=", slurm_dir_, "/slurm.conf ", NamespaceArgs(),
                               " sh -c '", cmd, "'"));
  }

  // Starts the pod: the sidecar (when asked) and duet-bridge, in one mount
  // namespace, their output in pod.log.
  bool Start() {
    const std::string sidecar =
        cluster_->slurm_auth()
            ? absl::StrCat(DUET_SLURM_CLUSTER_SH, " sackd ", slurm_dir_, "/slurm.conf")
            : absl::StrCat(DUET_SLURM_CLUSTER_SH, " munged /run/pod/munge-key/munge.key");
    // As the chart's container: no capability left, none to gain.
    const std::string bridge = absl::StrCat(
        "exec setpriv --bounding-set=-all --inh-caps=-all --no-new-privs ", DUET_BRIDGE_BIN,
        " --config /run/pod/config/bridge.yaml");
    const std::string inner = with_sidecar_ ? absl::StrCat(sidecar, " & ", bridge) : bridge;
    const std::string cmd = absl::StrCat(NamespaceArgs(), " sh -c '", inner, "'");
    const std::string log = (dir_ / "pod.log").string();
    pid_ = fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      setenv("SLURM_CONF", absl::StrCat(slurm_dir_, "/slurm.conf").c_str(), 1);
      unsetenv("SLURM_SACK_SOCKET");
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    setpgid(pid_, pid_);
    return true;
  }

  void Stop() {
    if (pid_ <= 0) return;
    kill(-pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
    kill(-pid_, SIGKILL);  // the sidecar, if it outlived the bridge
    pid_ = -1;
  }

  std::string Metrics() const {
    return RunCmd(absl::StrCat("curl -sf http://127.0.0.1:", metrics_port_, "/metrics"),
                  /*merge_stderr=*/false)
        .out;
  }
  // The value of the metric line that starts with `series` ("" if none).
  std::string MetricValue(const std::string& series) const {
    for (absl::string_view l : absl::StrSplit(Metrics(), '\n')) {
      if (absl::StartsWith(l, series + " ")) return std::string(l.substr(series.size() + 1));
    }
    return "";
  }
  std::string Log() const { return RunCmd("cat " + (dir_ / "pod.log").string()).out; }
  bool ok() const { return ok_; }

 private:
  static bool HasFailure() { return ::testing::Test::HasFailure(); }

  TestSlurmCluster* cluster_;
  const bool with_sidecar_;
  fs::path dir_;
  std::string slurm_dir_;
  int metrics_port_ = 0;
  pid_t pid_ = -1;
  bool ok_ = false;
};

class BridgePodAuth : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = TestSlurmCluster::Get();
    ASSERT_TRUE(cluster_->ok());
    if (cluster_->slurm_auth()) {
      ASSERT_EQ(RunCmd("command -v sackd").rc, 0)
          << "the cluster runs auth/slurm: this test needs sackd (package sackd)";
    }
  }
  bool NodeInSlurm(const std::string& name) const {
    return cluster_->Cli("scontrol --future show node " + name).rc == 0;
  }
  std::string SidecarName() const { return cluster_->slurm_auth() ? "sackd" : "munged"; }

  TestSlurmCluster* cluster_ = nullptr;
};

TEST_F(BridgePodAuth, WithoutItsSidecarTheBridgeSaysItCannotAuthenticateAndCreatesNothing) {
  BridgePod pod(cluster_, "gke-podauth-a", 61, /*with_sidecar=*/false);
  ASSERT_TRUE(pod.ok());
  // The namespace holds nothing of slurmctld's: Slurm's own CLI cannot
  // authenticate from there either (it can from outside).
  ASSERT_EQ(cluster_->Cli("scontrol ping").rc, 0);
  CmdResult inside = pod.RunInPod("scontrol ping");
  ASSERT_NE(inside.rc, 0) << "the pod namespace still reaches a credential source:\n"
                          << inside.out;

  ASSERT_TRUE(pod.Start());
  const std::string none = "duet_slurm_auth_ready{source=\"none\"}";
  EXPECT_TRUE(WaitFor([&] { return pod.MetricValue(none) == "0"; }, absl::Seconds(30)))
      << pod.Metrics() << "\n" << pod.Log();
  // Past at least one failed pass: degraded, and nothing made in Slurm.
  EXPECT_TRUE(WaitFor(
      [&] {
        const std::string f = pod.MetricValue("duet_slurm_sync_failed_passes_total");
        return !f.empty() && f != "0" && pod.MetricValue("duet_slurm_degraded") == "1";
      },
      absl::Seconds(30)))
      << pod.Metrics();
  EXPECT_FALSE(NodeInSlurm("gke-podauth-a"));
  // Said plainly in the log: the reason, the paths tried, what to run.
  const std::string log = pod.Log();
  EXPECT_TRUE(absl::StrContains(log, "no way to authenticate to slurmctld")) << log;
  EXPECT_TRUE(absl::StrContains(log, "a Slurm sync pass failed and duet-bridge has no way"))
      << log;
  EXPECT_TRUE(absl::StrContains(log, SidecarName())) << log;
  if (cluster_->slurm_auth()) {
    EXPECT_TRUE(absl::StrContains(log, "/run/slurmctld/sack.socket (No such file")) << log;
    EXPECT_TRUE(absl::StrContains(log, "/run/slurm-duettest/sack.socket")) << log;
  } else {
    EXPECT_TRUE(absl::StrContains(log, "/run/munge/munge.socket.2 (No such file")) << log;
  }
}

TEST_F(BridgePodAuth, WithItsSidecarTheBridgeCreatesItsSlurmNodes) {
  BridgePod pod(cluster_, "gke-podauth-b", 62, /*with_sidecar=*/true);
  ASSERT_TRUE(pod.ok());
  ASSERT_TRUE(pod.Start());
  EXPECT_TRUE(WaitFor([&] { return NodeInSlurm("gke-podauth-b"); }, absl::Seconds(60)))
      << pod.Log();
  const std::string source = cluster_->slurm_auth() ? "sack_socket" : "munge_socket";
  EXPECT_TRUE(WaitFor(
      [&] {
        return pod.MetricValue(absl::StrCat("duet_slurm_auth_ready{source=\"", source, "\"}")) ==
                   "1" &&
               pod.MetricValue("duet_slurm_degraded") == "0";
      },
      absl::Seconds(30)))
      << pod.Metrics() << "\n" << pod.Log();
  pod.Stop();
}

}  // namespace
}  // namespace duet::testing
