#pragma once

// A real Slurm cluster for one test binary, driven through
// tests/integration/slurm_cluster.sh: munged + slurmctld on private ports
// under a fresh root dir, and one slurmd per node on 127.0.0.N (own UTS
// namespace). Nodes are created in slurmctld by the code under test (or by
// CreateNodeCli), then AddSlurmd starts the node's slurmd.
//
// libslurm reads SLURM_CONF once per process, so a binary has one cluster:
// TestSlurmCluster::Get() starts it on first use, a gtest Environment stops it
// at exit (also after failed assertions); the script's watchdog stops it if
// the binary dies.
//
// Thread-safety: not thread-safe; use from the test thread.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

#ifndef DUET_SLURM_CLUSTER_SH
#error "DUET_SLURM_CLUSTER_SH must name tests/integration/slurm_cluster.sh"
#endif

namespace duet::testing {

// Runs a shell command; returns its exit status and stdout (stderr is kept
// in the output too when `merge_stderr`).
struct CmdResult {
  int rc = -1;
  std::string out;
};

inline CmdResult RunCmd(const std::string& cmd, bool merge_stderr = true) {
  CmdResult r;
  std::string full = merge_stderr ? cmd + " 2>&1" : cmd;
  FILE* p = popen(full.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Polls `pred` every 50 ms until it holds or `timeout` passes.
template <typename Pred>
bool WaitFor(Pred pred, absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return pred();
}

struct TestSlurmClusterOptions {
  // "required SO ARGS" line for plugstack.conf, as "SO:ARGS"; empty: none.
  std::string spank;
  int max_nodes = 64;
  // slurmctld serves configless slurmds (StartConfiglessSlurmd needs it).
  bool configless = false;
  // Seconds after which the script's watchdog stops the cluster (a backstop
  // for a binary that dies without stopping it); long runs (bench/soak) raise it.
  int lifetime_s = 600;
  // Lines appended to slurm.conf (partitions, preemption); a
  // "PartitionName=duet ..." line replaces the default users' partition.
  std::string extra_conf;
  // topology.conf beside slurm.conf (e.g. "BlockName=b1\nBlockSizes=1", with
  // "TopologyPlugin=topology/block" in extra_conf); empty: none.
  std::string topology_conf;
};

class TestSlurmCluster {
 public:
  using Options = TestSlurmClusterOptions;

  // The cluster of this binary, started on first call with `options`.
  static TestSlurmCluster* Get(const Options& options = {}) {
    static TestSlurmCluster* cluster = [&] {
      auto* c = new TestSlurmCluster();
      c->Start(options);
      ::testing::AddGlobalTestEnvironment(new Stopper(c));
      return c;
    }();
    return cluster;
  }

  const std::string& root() const { return root_; }
  std::string conf() const { return root_ + "/etc/slurm.conf"; }

  // How the cluster authenticates (slurm_cluster.sh init --auth): true for
  // auth/slurm with slurm.key (Slurm 23.11+, as Slinky runs it), false for
  // auth/munge. The SPANK plugin and duet-bridge then use the matching
  // credential for Slurm-owned Hold/Release (DESIGN.md §9).
  bool slurm_auth() const {
    return RunCmd(absl::StrCat("grep -qx AuthType=auth/slurm ", conf())).rc == 0;
  }
  std::string munge_socket() const { return root_ + "/munge/munge.socket.2"; }
  std::string slurm_key() const { return root_ + "/etc/slurm.key"; }
  // Plugstack arguments for the plugin's credential (leading space).
  std::string PlugstackAuthArgs() const {
    return slurm_auth() ? absl::StrCat(" auth=slurm_key slurm_key=", slurm_key())
                        : absl::StrCat(" munge_socket=", munge_socket());
  }
  // The bridge's slurm: keys for the same credential (indented two spaces).
  std::string BridgeAuthYaml() const {
    return slurm_auth()
               ? absl::StrCat("  credential: slurm_key\n  key_file: ", slurm_key(), "\n")
               : absl::StrCat("  credential: munge\n  munge_socket: ", munge_socket(), "\n");
  }
  bool ok() const { return ok_; }

  std::string Script(const std::string& args) const {
    return absl::StrCat(DUET_SLURM_CLUSTER_SH, " ", args);
  }

  // A CLI command with this cluster's SLURM_CONF.
  CmdResult Cli(const std::string& cmd) const {
    return RunCmd(absl::StrCat("SLURM_CONF=", conf(), " ", cmd));
  }

  // Starts the slurmd of node `name` on 127.0.0.`idx` with `gpus` GPUs of
  // type `gpu_type` and `tpus` TPUs of `tpu_type` (gres.conf File= lines).
  void StartSlurmd(const std::string& name, int idx, int cpus, int mem_mib, int gpus,
                   const std::string& gpu_type, int tpus = 0,
                   const std::string& tpu_type = "") const {
    std::string gres;
    std::string lines;
    if (gpus > 0) {
      gres = absl::StrCat("gpu:", gpu_type, ":", gpus);
      lines += absl::StrCat(" 'Name=gpu Type=", gpu_type, " File=", root_, "/dev/nvidia[0-",
                            gpus - 1, "]'");
    }
    if (tpus > 0) {
      if (!gres.empty()) gres += ",";
      gres += absl::StrCat("tpu:", tpu_type, ":", tpus);
      lines += absl::StrCat(" 'Name=tpu Type=", tpu_type, " File=", root_, "/dev/accel[0-",
                            tpus - 1, "]'");
    }
    std::string conf = absl::StrCat("CPUs=", cpus, " RealMemory=", mem_mib);
    if (!gres.empty()) conf += " Gres=" + gres;
    CmdResult r = RunCmd(Script(absl::StrCat("slurmd ", root_, " ", name, " ", idx, " '", conf,
                                             "'", lines)));
    EXPECT_EQ(r.rc, 0) << r.out;
  }

  // Starts a slurmd as Slinky's NodeSet pods do: configless (`slurmd -Z
  // --conf-server 127.0.0.1:PORT --conf "CONF"`), registering its own
  // dynamic node `name` (nothing creates it first), on 127.0.0.`idx`.
  // `gres_conf`: gres.conf lines for it (NodeName= is prepended).
  void StartConfiglessSlurmd(const std::string& name, int idx, const std::string& conf,
                             const std::string& gres_conf = "") const {
    std::string cmd = absl::StrCat("slurmd-configless ", root_, " ", name, " ", idx, " '", conf,
                                   "'");
    if (!gres_conf.empty()) absl::StrAppend(&cmd, " '", gres_conf, "'");
    CmdResult r = RunCmd(Script(cmd));
    EXPECT_EQ(r.rc, 0) << r.out;
  }

  // gres.conf's File= for the first `n` fake GPUs of this cluster.
  std::string GpuFiles(int n) const {
    return absl::StrCat(root_, "/dev/nvidia[0-", n - 1, "]");
  }

  void StopSlurmd(const std::string& name) const {
    RunCmd(Script(absl::StrCat("slurmd-stop ", root_, " ", name)));
  }

  // Waits until `scontrol show node` prints State= matching `regex`.
  bool WaitNodeState(const std::string& name, const std::string& regex,
                     absl::Duration timeout = absl::Seconds(20)) const {
    return WaitFor(
        [&] {
          return Cli(absl::StrCat("scontrol --future show node ", name, " | grep -qE 'State=",
                                  regex, "'"))
                     .rc == 0;
        },
        timeout);
  }

  // `sbatch --parsable ARGS`; returns the job id or 0.
  uint32_t Sbatch(const std::string& args) const {
    CmdResult r = Cli(absl::StrCat("sbatch --parsable -o /dev/null ", args));
    uint32_t id = 0;
    if (r.rc != 0 || sscanf(r.out.c_str(), "%u", &id) != 1) {
      ADD_FAILURE() << "sbatch " << args << ": " << r.out;
      return 0;
    }
    return id;
  }

  // The job's state per squeue ("RUNNING", "PENDING", "" when gone).
  std::string JobState(uint32_t job_id) const {
    CmdResult r = Cli(absl::StrCat("squeue -h -j ", job_id, " -o %T"));
    if (r.rc != 0) return "";
    return std::string(absl::StripAsciiWhitespace(r.out));
  }

  // Gone from squeue or in a final state (squeue -j shows those until purge).
  bool JobEnded(uint32_t job_id) const {
    const std::string s = JobState(job_id);
    return s.empty() || s == "COMPLETED" || s == "CANCELLED" || s == "FAILED" ||
           s == "TIMEOUT" || s == "NODE_FAIL" || s == "BOOT_FAIL" || s == "OUT_OF_MEMORY" ||
           s == "PREEMPTED" || s == "DEADLINE";
  }

  // Waits until the job is PENDING for `reason` (squeue's %r): slurmctld has
  // tried to schedule it and decided why it waits. A job that was going to
  // start would not get there.
  bool WaitJobPending(uint32_t job_id, const std::string& reason,
                      absl::Duration timeout = absl::Seconds(20)) const {
    return WaitFor(
        [&] {
          CmdResult r = Cli(absl::StrCat("squeue -h -j ", job_id, " -o '%T/%r'"));
          return r.rc == 0 && absl::StripAsciiWhitespace(r.out) == absl::StrCat("PENDING/", reason);
        },
        timeout);
  }

  bool WaitJobState(uint32_t job_id, const std::string& state,
                    absl::Duration timeout = absl::Seconds(20)) const {
    return WaitFor([&] { return JobState(job_id) == state; }, timeout);
  }

  void CtldStop() const { RunCmd(Script("ctld-stop " + root_)); }
  // SIGKILL: whatever slurmctld had not saved yet (a job just allocated) is lost.
  void CtldKill() const { RunCmd(Script("ctld-kill " + root_)); }
  bool CtldStart() const { return RunCmd(Script("ctld-start " + root_)).rc == 0; }

  void Stop() {
    if (!root_.empty() && !stopped_) {
      RunCmd(Script("stop " + root_));
      stopped_ = true;
    }
  }

  std::string Log(const std::string& file) const {
    return RunCmd("tail -n 40 " + root_ + "/log/" + file).out;
  }

 private:
  class Stopper : public ::testing::Environment {
   public:
    explicit Stopper(TestSlurmCluster* c) : c_(c) {}
    void TearDown() override { c_->Stop(); }

   private:
    TestSlurmCluster* c_;
  };

  void Start(const Options& options) {
    std::string init = absl::StrCat("init --lifetime ", options.lifetime_s, " --max-nodes ",
                                    options.max_nodes);
    if (!options.spank.empty()) absl::StrAppend(&init, " --spank '", options.spank, "'");
    if (options.configless) absl::StrAppend(&init, " --configless");
    if (!options.extra_conf.empty()) {
      char path[] = "/tmp/duet-extra-conf.XXXXXX";
      const int fd = mkstemp(path);
      if (fd < 0 || write(fd, options.extra_conf.data(), options.extra_conf.size()) !=
                        static_cast<ssize_t>(options.extra_conf.size())) {
        ADD_FAILURE() << "cannot write the extra slurm.conf lines";
        return;
      }
      close(fd);
      absl::StrAppend(&init, " --extra-conf \"$(cat ", path, ")\"");
    }
    if (!options.topology_conf.empty()) {
      char path[] = "/tmp/duet-topology-conf.XXXXXX";
      const int fd = mkstemp(path);
      if (fd < 0 || write(fd, options.topology_conf.data(), options.topology_conf.size()) !=
                        static_cast<ssize_t>(options.topology_conf.size())) {
        ADD_FAILURE() << "cannot write topology.conf";
        return;
      }
      close(fd);
      absl::StrAppend(&init, " --topology-conf \"$(cat ", path, ")\"");
    }
    CmdResult r = RunCmd(Script(init), /*merge_stderr=*/false);
    root_ = std::string(absl::StripAsciiWhitespace(r.out));
    if (r.rc != 0 || root_.empty()) {
      ADD_FAILURE() << "slurm_cluster.sh init failed: " << r.out;
      return;
    }
    setenv("SLURM_CONF", conf().c_str(), 1);
    r = RunCmd(Script("start " + root_));
    if (r.rc != 0) {
      ADD_FAILURE() << "slurm_cluster.sh start failed: " << r.out;
      return;
    }
    ok_ = true;
  }

  std::string root_;
  bool ok_ = false;
  bool stopped_ = false;
};

}  // namespace duet::testing
