// The deployment's shape, end to end: every daemon runs as the chart and
// Slinky place it, in a mount namespace of its own (tests/integration/
// pod_ns.sh) holding only what its pod mounts, so that nothing works because
// two daemons happen to share a file system.
//
// - slurmctld: its pod (slurm_cluster.sh init --isolated): its config dir and
//   slurm.key, its state, log and pid dirs; the munged socket under munge.
// - two configless slurmds (Slinky's NodeSet pods): no slurm.conf, no
//   plugstack.conf, no gres.conf on their file system: all of it comes from
//   slurmctld (enable_configless); their own spool, the node's devices,
//   slurm.key (auth/slurm) or munged's socket (munge), spank_duet.so at its
//   path (the image's) and a shared home for the users' files.
// - duet-bridge: its pod (its config, journal, slurm.conf and slurm.key or a
//   copy of munge.key) with its sidecar (sackd, or munged) in the same
//   namespace, no capability, slurm.nodes adopt; gRPC on TCP
//   127.0.0.1:PORT only (no unix socket), which spank_duet in slurmstepd
//   reaches through plugstack.conf's bridge=127.0.0.1:PORT.
//
// The test: the bridge adopts both slurmds' nodes; an srun GPU step and a
// step inside an sbatch job register with the bridge (ListHoldings over
// TCP) on their GPU and see it (CUDA_VISIBLE_DEVICES); and, read through
// /proc/PID/root of each running daemon, no pod sees what another pod holds
// (each check beside a positive control that the same look-up does see the
// pod's own files).
//
// Auth: the cluster's default (auth/slurm where Slurm has it, 23.11+; munge
// on 22.05). Needs root (unshare, mount), slurmctld, slurmd, munged, and
// sackd under auth/slurm. Label: slurm.

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "duet/v1/duet.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/integration/e2e_helpers.h"
#include "tests/slurm/slurm_cluster_fixture.h"

#ifndef DUET_BRIDGE_BIN
#error "DUET_BRIDGE_BIN must name the duet-bridge binary"
#endif
#ifndef DUET_SPANK_SO
#error "DUET_SPANK_SO must name spank_duet.so"
#endif
#ifndef DUET_POD_NS_SH
#error "DUET_POD_NS_SH must name tests/integration/pod_ns.sh"
#endif

namespace duet::testing {
namespace {

namespace fs = std::filesystem;

struct NodeDef {
  const char* name;
  int idx;  // slurmd on 127.0.0.idx
};
constexpr NodeDef kNodes[] = {{"deploy-a", 71}, {"deploy-b", 72}};

// Where a pod has the chart's Slurm files: /etc/slurm when the machine has
// that directory (hidden and refilled in the pod), else under the pod's /run.
// slurm_cluster.sh puts a slurmd pod's slurm.key by the same rule.
std::string PodSlurmDir() {
  return fs::is_directory("/etc/slurm") ? "/etc/slurm" : "/run/pod/etc-slurm";
}

// How slurm_cluster.sh init picks the cluster's auth: $DUET_SLURM_AUTH, else
// auth/slurm where Slurm has it. Known before the cluster exists, for the
// plugstack line init writes.
bool ClusterWillRunAuthSlurm() {
  const char* env = std::getenv("DUET_SLURM_AUTH");
  if (env != nullptr && *env != '\0') return std::string(env) == "slurm";
  return RunCmd("ls /usr/lib/*/slurm-wlm/auth_slurm.so").rc == 0;
}

// Does the running process `pid` see `path` in its mount namespace? Read
// through /proc/PID/root (the path walks the process's own mounts); a link
// counts as itself, never followed from here.
bool Sees(pid_t pid, const std::string& path) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(absl::StrCat("/proc/", pid, "/root", path), ec));
}

pid_t PidFromFile(const std::string& file) {
  std::ifstream in(file);
  pid_t pid = -1;
  in >> pid;
  return pid;
}

// The process of `pid` is alive and runs the program `name` (its binary's
// file name starts with it: Debian's slurmctld is slurmctld-wlm, and a
// reconfigured slurmctld re-executes itself, which can change its comm).
bool Runs(pid_t pid, const std::string& name) {
  std::error_code ec;
  const fs::path exe = fs::read_symlink(absl::StrCat("/proc/", pid, "/exe"), ec);
  return !ec && absl::StartsWith(exe.filename().string(), name);
}

// duet-bridge's pod: its files on the host (under dir), what the pod sees,
// and its processes (one process group): sidecar + bridge.
class BridgePod {
 public:
  BridgePod(const TestSlurmCluster& cluster, const fs::path& dir, int grpc_port, int metrics_port)
      : cluster_(cluster), dir_(dir), metrics_port_(metrics_port) {
    slurm_dir_ = PodSlurmDir();
    for (const char* d : {"etc-slurm", "config", "journal", "munge"}) {
      fs::create_directories(dir_ / d);
    }
    // slurm.conf as the cluster's ConfigMap carries it: under munge without
    // this cluster's own munged socket (AuthInfo=socket=...): the pod's
    // munged sidecar listens on munge's default.
    std::ifstream in(cluster_.conf());
    std::ofstream conf(dir_ / "etc-slurm" / "slurm.conf");
    for (std::string line; std::getline(in, line);) {
      if (absl::StartsWith(line, "AuthInfo=socket=")) continue;
      conf << line << "\n";
    }
    conf.close();
    if (cluster_.slurm_auth()) {
      fs::copy_file(cluster_.slurm_key(), dir_ / "etc-slurm" / "slurm.key");
      chmod((dir_ / "etc-slurm" / "slurm.key").c_str(), 0440);
    } else {
      fs::copy_file(cluster_.root() + "/munge/munge.key", dir_ / "munge" / "munge.key");
      chmod((dir_ / "munge" / "munge.key").c_str(), 0600);
    }
    std::ofstream inv(dir_ / "config" / "nodes.yaml");
    inv << "nodes:\n";
    for (const NodeDef& n : kNodes) {
      inv << "  - name: " << n.name << "\n"
          << "    cpus: 4\n    memory_mib: 8000\n    zone: us-central1-a\n"
          << "    pool: shared-h100\n"
          << "    labels: {cloud.google.com/gke-accelerator: nvidia-h100-80gb}\n"
          << "    gpus: {count: 2, model: nvidia-h100-80gb}\n";
    }
    inv.close();
    std::ofstream cfg(dir_ / "config" / "bridge.yaml");
    cfg << "grpc: {listen: \"127.0.0.1:" << grpc_port << "\", unix_socket: \"\"}\n"
        << "metrics: {listen: \"127.0.0.1:" << metrics_port_ << "\"}\n"
        << "journal: {dir: /run/pod/journal}\n"
        << "inventory: {source: file, file: /run/pod/config/nodes.yaml, reload_period: 1s}\n"
        << "slurm:\n"
        << "  enabled: true\n"
        << "  nodes: adopt\n"
        << "  conf_path: " << slurm_dir_ << "/slurm.conf\n"
        << "  call_timeout: 3s\n"
        << "  sync_period: 500ms\n"
        << "  release_grace: 1s\n";
    if (cluster_.slurm_auth()) {
      cfg << "  credential: slurm_key\n  key_file: " << slurm_dir_ << "/slurm.key\n";
    } else {
      cfg << "  credential: munge\n";
    }
    cfg << "log_level: info\n";
  }

  ~BridgePod() { Stop(); }

  // pod_ns.sh's arguments up to and including "--": what the chart mounts.
  std::string NamespaceArgs() const {
    std::vector<std::string> a = {
        DUET_POD_NS_SH,
        "--hide /tmp",
        absl::StrCat("--bind ", (dir_ / "config").string(), ":/run/pod/config"),
        absl::StrCat("--bind ", (dir_ / "journal").string(), ":/run/pod/journal"),
    };
    const std::string root_parent = fs::path(cluster_.root()).parent_path().string();
    if (root_parent != "/tmp" && root_parent != "/") {
      a.push_back(absl::StrCat("--hide ", root_parent));
    }
    if (slurm_dir_ == "/etc/slurm") a.push_back("--hide /etc/slurm");
    for (const char* f : {"slurm.conf", "slurm.key"}) {
      if (fs::exists(dir_ / "etc-slurm" / f)) {
        a.push_back(
            absl::StrCat("--bind ", (dir_ / "etc-slurm" / f).string(), ":", slurm_dir_, "/", f));
      }
    }
    if (!cluster_.slurm_auth()) {
      a.push_back(absl::StrCat("--bind ", (dir_ / "munge").string(), ":/run/pod/munge-key"));
    }
    a.push_back("--");
    return absl::StrJoin(a, " ");
  }

  // The sidecar and duet-bridge in one pod namespace, output in pod.log.
  bool Start() {
    const std::string sidecar =
        cluster_.slurm_auth()
            ? absl::StrCat(DUET_SLURM_CLUSTER_SH, " sackd ", slurm_dir_, "/slurm.conf")
            : absl::StrCat(DUET_SLURM_CLUSTER_SH, " munged /run/pod/munge-key/munge.key");
    // As the chart's container: no capability left, none to gain.
    const std::string bridge =
        absl::StrCat("exec setpriv --bounding-set=-all --inh-caps=-all --no-new-privs ",
                     DUET_BRIDGE_BIN, " --config /run/pod/config/bridge.yaml");
    const std::string cmd =
        absl::StrCat("exec ", NamespaceArgs(), " sh -c '", sidecar, " & ", bridge, "'");
    const std::string log = (dir_ / "pod.log").string();
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
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

  bool Running() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }

  void Stop() {
    if (pid_ <= 0) return;
    kill(-pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
    kill(-pid_, SIGKILL);  // the sidecar, if it outlived the bridge
    pid_ = -1;
  }

  // duet-bridge's own PID (in the pod's process group), -1 if not running.
  pid_t BridgePid() const {
    if (pid_ <= 0) return -1;
    CmdResult r = RunCmd(absl::StrCat("pgrep -g ", pid_, " -x duet-bridge"), false);
    int pid = -1;
    if (r.rc != 0 || !absl::SimpleAtoi(absl::StripAsciiWhitespace(r.out), &pid)) return -1;
    return pid;
  }

  std::string Metrics() const {
    return RunCmd(absl::StrCat("curl -sf http://127.0.0.1:", metrics_port_, "/metrics"), false).out;
  }
  // The value of the metric line that starts with `series` ("" if none).
  std::string MetricValue(const std::string& series) const {
    for (absl::string_view l : absl::StrSplit(Metrics(), '\n')) {
      if (absl::StartsWith(l, series + " ")) return std::string(l.substr(series.size() + 1));
    }
    return "";
  }
  std::string Log() const { return RunCmd("tail -n 60 " + (dir_ / "pod.log").string()).out; }
  const std::string& slurm_dir() const { return slurm_dir_; }
  const fs::path& dir() const { return dir_; }

 private:
  const TestSlurmCluster& cluster_;
  const fs::path dir_;
  const int metrics_port_;
  std::string slurm_dir_;
  pid_t pid_ = -1;
};

// The test directory (the bridge pod's files, the users' shared home) and
// the cluster; removed at exit when every test passed.
class World {
 public:
  static World* Get() {
    static World* w = new World();
    return w;
  }
  bool ok() const { return ok_; }
  TestSlurmCluster* cluster() const { return cluster_; }
  const fs::path& dir() const { return dir_; }
  fs::path home() const { return dir_ / "home"; }
  int grpc_port() const { return grpc_port_; }
  int metrics_port() const { return metrics_port_; }

 private:
  class Stopper : public ::testing::Environment {
   public:
    explicit Stopper(World* w) : w_(w) {}
    void TearDown() override { w_->Stop(); }

   private:
    World* w_;
  };

  World() {
    char tmpl[] = "/tmp/duet-deploy.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      ADD_FAILURE() << "mkdtemp failed";
      return;
    }
    dir_ = tmpl;
    fs::create_directories(home());
    chmod(home().c_str(), 0755);
    grpc_port_ = FreePort();
    metrics_port_ = FreePort();
    // spank_duet in slurmstepd (inside a slurmd pod) reaches the bridge over
    // TCP; under auth/slurm it signs with the key where the slurmd pod has it.
    std::string args = absl::StrCat("bridge=127.0.0.1:", grpc_port_, " timeout_ms=3000 tpu=no");
    if (ClusterWillRunAuthSlurm()) {
      absl::StrAppend(&args, " auth=slurm_key slurm_key=", PodSlurmDir(), "/slurm.key");
    }
    TestSlurmCluster::Options o;
    o.configless = true;
    o.spank = absl::StrCat(DUET_SPANK_SO, ":", args);
    o.lifetime_s = 300;
    setenv("DUET_SLURM_ISOLATED", "1", 1);  // read by slurm_cluster.sh init only
    cluster_ = TestSlurmCluster::Get(o);    // registers the cluster's Stopper first...
    unsetenv("DUET_SLURM_ISOLATED");
    ::testing::AddGlobalTestEnvironment(new Stopper(this));  // ...so this one runs first
    ok_ = cluster_->ok();
  }

  void Stop() {
    if (cluster_ != nullptr) cluster_->Stop();
    std::error_code ec;
    if (!dir_.empty() && ::testing::UnitTest::GetInstance()->Passed()) {
      fs::remove_all(dir_, ec);
      if (cluster_ != nullptr && !cluster_->root().empty()) fs::remove_all(cluster_->root(), ec);
    } else if (!dir_.empty()) {
      std::cerr << "deployment_e2e_test: kept " << dir_ << " and "
                << (cluster_ ? cluster_->root() : "") << " for inspection\n";
    }
  }

  fs::path dir_;
  TestSlurmCluster* cluster_ = nullptr;
  int grpc_port_ = 0;
  int metrics_port_ = 0;
  bool ok_ = false;
};

class DeploymentE2e : public ::testing::Test {
 protected:
  void SetUp() override {
    w_ = World::Get();
    ASSERT_TRUE(w_->ok());
    c_ = w_->cluster();
    ASSERT_TRUE(fs::exists(c_->root() + "/run/isolated"))
        << "slurm_cluster.sh init did not make an isolated cluster";
    ASSERT_EQ(c_->slurm_auth(), ClusterWillRunAuthSlurm());
    if (c_->slurm_auth()) {
      ASSERT_EQ(RunCmd("command -v sackd").rc, 0)
          << "the cluster runs auth/slurm: this test needs sackd (package sackd)";
    }
  }

  // A configless slurmd in its NodeSet pod: 2 GPUs (gres.conf lines reach it
  // through slurmctld), the users' home shared into the pod.
  void StartNodeSetSlurmd(const NodeDef& n) {
    const std::string conf = "CPUs=4 RealMemory=8000 Features=slinky Gres=gpu:h100:2";
    const std::string gres = absl::StrCat("Name=gpu Type=h100 File=", c_->GpuFiles(2));
    CmdResult r =
        RunCmd(absl::StrCat("DUET_POD_SHARE=", w_->home().string(), " ",
                            c_->Script(absl::StrCat("slurmd-configless ", c_->root(), " ", n.name,
                                                    " ", n.idx, " '", conf, "' '", gres, "'"))));
    ASSERT_EQ(r.rc, 0) << r.out;
  }

  pid_t SlurmdPid(const std::string& name) const {
    return PidFromFile(absl::StrCat(c_->root(), "/run/slurmd-", name, ".bgpid"));
  }

  // The node's ActiveFeatures per `scontrol show node`.
  std::set<std::string> ActiveFeatures(const std::string& node) const {
    const std::string show = c_->Cli(absl::StrCat("scontrol show node ", node)).out;
    static const std::regex re(R"(ActiveFeatures=(\S+))");
    std::smatch m;
    if (!std::regex_search(show, m, re)) return {};
    return absl::StrSplit(m[1].str(), ',');
  }

  std::vector<LedgerHolding> Holdings() { return ListLedgerHoldings(stub_.get()); }

  World* w_ = nullptr;
  TestSlurmCluster* c_ = nullptr;
  std::unique_ptr<v1::Ledger::Stub> stub_;
};

TEST_F(DeploymentE2e, EachDaemonInItsOwnPodAGpuStepRegistersWithTheBridgeOverTcp) {
  const std::string root = c_->root();
  // spank_duet is pointed at the bridge's TCP address, never a socket file.
  {
    std::ifstream in(root + "/etc/plugstack.conf");
    const std::string plugstack((std::istreambuf_iterator<char>(in)), {});
    ASSERT_TRUE(
        absl::StrContains(plugstack, absl::StrCat(" bridge=127.0.0.1:", w_->grpc_port(), " ")))
        << plugstack;
    ASSERT_FALSE(absl::StrContains(plugstack, "unix")) << plugstack;
  }
  // slurm.conf names no plugstack path: the slurmds get plugstack.conf from
  // slurmctld, beside slurm.conf, as under Slinky.
  ASSERT_NE(RunCmd(absl::StrCat("grep -q '^PlugStackConfig=' ", c_->conf())).rc, 0);

  // The bridge's pod first: its nodes wait for their slurmds.
  BridgePod pod(*c_, w_->dir() / "bridge", w_->grpc_port(), w_->metrics_port());
  ASSERT_TRUE(pod.Start());
  // Serving once /metrics answers (a gRPC channel made earlier would sit in
  // its reconnect backoff); then the ledger over TCP, as spank_duet calls it.
  ASSERT_TRUE(WaitFor([&] { return pod.Running() && !pod.Metrics().empty(); }, absl::Seconds(30)))
      << (pod.Running() ? "duet-bridge's pod runs but does not serve\n" : "the pod exited\n")
      << pod.Log();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", w_->grpc_port()),
                                     grpc::InsecureChannelCredentials());
  ASSERT_TRUE(
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)))
      << pod.Log();
  stub_ = v1::Ledger::NewStub(channel);

  // Slinky's NodeSet pods register their own nodes (feature "slinky"); the
  // bridge adopts them: its inventory's features (the pool "shared-h100",
  // the zone) added to slurmd's, GRES agreeing, nothing unregistered.
  for (const NodeDef& n : kNodes) StartNodeSetSlurmd(n);
  for (const NodeDef& n : kNodes) {
    ASSERT_TRUE(c_->WaitNodeState(n.name, "IDLE", absl::Seconds(30)))
        << c_->Log(absl::StrCat("slurmd-", n.name, ".log")) << c_->Log("slurmctld.log");
  }
  for (const NodeDef& n : kNodes) {
    EXPECT_TRUE(WaitFor(
        [&] {
          const std::set<std::string> f = ActiveFeatures(n.name);
          return f.count("slinky") && f.count("shared-h100") && f.count("us-central1-a");
        },
        absl::Seconds(30)))
        << c_->Cli(absl::StrCat("scontrol show node ", n.name)).out << pod.Log();
  }
  EXPECT_TRUE(WaitFor(
      [&] {
        return pod.MetricValue("duet_slurm_nodes_unregistered") == "0" &&
               pod.MetricValue("duet_slurm_nodes_gres_mismatch") == "0" &&
               pod.MetricValue("duet_slurm_degraded") == "0";
      },
      absl::Seconds(30)))
      << pod.Metrics() << pod.Log();
  const std::string source = c_->slurm_auth() ? "sack_socket" : "munge_socket";
  EXPECT_EQ(pod.MetricValue(absl::StrCat("duet_slurm_auth_ready{source=\"", source, "\"}")), "1")
      << pod.Metrics();

  // Isolation, read in each running daemon's own mount namespace. Each "does
  // not see" stands beside a "sees" of the pod's own file through the same
  // look-up, so it cannot pass because the look-up is wrong.
  const pid_t ctld = PidFromFile(root + "/run/slurmctld.bgpid");
  const pid_t bridge = pod.BridgePid();
  const pid_t slurmd_a = SlurmdPid(kNodes[0].name);
  const pid_t slurmd_b = SlurmdPid(kNodes[1].name);
  for (const auto& [pid, name] : {std::pair<pid_t, std::string>{ctld, "slurmctld"},
                                  {bridge, "duet-bridge"},
                                  {slurmd_a, "slurmd"},
                                  {slurmd_b, "slurmd"}}) {
    ASSERT_TRUE(Runs(pid, name))
        << name << " is not PID " << pid << ": "
        << RunCmd(absl::StrCat("ls -l /proc/", pid, "/exe; cat /proc/", pid, "/comm")).out;
  }
  const std::string bridge_dir = pod.dir().string();
  const std::string spool_a = absl::StrCat(root, "/spool/", kNodes[0].name);
  const std::string spool_b = absl::StrCat(root, "/spool/", kNodes[1].name);
  // The bridge: its config, its slurm.conf; nothing of the cluster root
  // (slurmctld's state and key, the spools, munged's socket), nor
  // slurmctld's sack.socket.
  EXPECT_TRUE(Sees(bridge, "/run/pod/config/bridge.yaml"));
  EXPECT_TRUE(Sees(bridge, pod.slurm_dir() + "/slurm.conf"));
  for (const std::string& p :
       {root + "/state", root + "/etc/slurm.conf", root + "/etc/slurm.key", spool_a, spool_b,
        root + "/munge/munge.socket.2", std::string("/run/slurmctld/sack.socket")}) {
    EXPECT_FALSE(Sees(bridge, p)) << "duet-bridge's pod sees " << p;
  }
  // Each slurmd: its own spool (where its configless copy of the config
  // lands), no slurm.conf or plugstack.conf of its own, nothing of
  // slurmctld's, the other node's or the bridge's.
  for (const auto& [self, other] : {std::pair{slurmd_a, spool_b}, std::pair{slurmd_b, spool_a}}) {
    const std::string own = self == slurmd_a ? spool_a : spool_b;
    EXPECT_TRUE(Sees(self, own));
    for (const std::string& p :
         {other, root + "/etc/slurm.conf", root + "/etc/plugstack.conf", root + "/etc/gres.conf",
          std::string("/etc/slurm/slurm.conf"), root + "/state", bridge_dir,
          std::string("/run/slurmctld/sack.socket")}) {
      EXPECT_FALSE(Sees(self, p)) << "slurmd " << self << "'s pod sees " << p;
    }
  }
  // slurmctld: its config and state; no node's spool, not the bridge's files.
  EXPECT_TRUE(Sees(ctld, root + "/state"));
  EXPECT_TRUE(Sees(ctld, c_->conf()));
  for (const std::string& p : {spool_a, spool_b, bridge_dir, root + "/pods/" + kNodes[0].name}) {
    EXPECT_FALSE(Sees(ctld, p)) << "slurmctld's pod sees " << p;
  }

  // An srun GPU step on deploy-a: registered with the bridge (over TCP, with
  // the step's credential) while it runs, on the GPU it sees.
  const std::string chdir = absl::StrCat("--chdir=", w_->home().string());
  auto run = std::async(std::launch::async, [&] {
    return c_->Cli(absl::StrCat("srun -w ", kNodes[0].name, " ", chdir,
                                " --gres=gpu:1 sh -c 'echo CVD=$CUDA_VISIBLE_DEVICES; sleep 3'"));
  });
  LedgerHolding step;
  const bool step_seen = WaitFor(
      [&] {
        for (const LedgerHolding& h : Holdings()) {
          if (h.kind == "slurm_step" && h.node == kNodes[0].name) {
            step = h;
            return true;
          }
        }
        return false;
      },
      absl::Seconds(30));
  CmdResult r = run.get();
  ASSERT_TRUE(step_seen) << "the srun step never showed in the ledger\n"
                         << r.out << pod.Log() << c_->Log("slurmd-deploy-a.log");
  ASSERT_EQ(r.rc, 0) << r.out;
  ASSERT_EQ(step.devices.size(), 1u);
  ASSERT_EQ(step.devices["gpu"].size(), 1u);
  EXPECT_TRUE(absl::StrContains(r.out, absl::StrCat("CVD=", *step.devices["gpu"].begin(), "\n")))
      << r.out;

  // sbatch with a step inside, on deploy-b: the step registers as
  // slurm_step{job, 0} on one of the job's GPUs, the one it sees (written to
  // the shared home from inside the pod).
  const fs::path out = w_->home() / "step.out";
  const uint32_t job = c_->Sbatch(absl::StrCat(
      "-w ", kNodes[1].name, " ", chdir, " --gres=gpu:2 --wrap 'srun --gres=gpu:1 sh -c \"echo ",
      "step=\\$CUDA_VISIBLE_DEVICES > ", out.string(), "; sleep 3\"'"));
  ASSERT_NE(job, 0u);
  LedgerHolding batch_step;
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const LedgerHolding& h : Holdings()) {
          if (h.kind == "slurm_step" && h.job_id == job && h.step_id == 0) {
            batch_step = h;
            return true;
          }
        }
        return false;
      },
      absl::Seconds(30)))
      << c_->Cli(absl::StrCat("scontrol show job ", job)).out << pod.Log()
      << c_->Log("slurmd-deploy-b.log");
  EXPECT_EQ(batch_step.node, kNodes[1].name);
  ASSERT_EQ(batch_step.devices["gpu"].size(), 1u);
  const uint32_t gpu = *batch_step.devices["gpu"].begin();
  const std::set<uint32_t> job_gpus = SlurmJobDevices(*c_, job)[kNodes[1].name]["gpu"];
  EXPECT_EQ(job_gpus.count(gpu), 1u) << gpu;
  ASSERT_TRUE(WaitFor([&] { return c_->JobEnded(job); }, absl::Seconds(30)));
  std::string text;
  std::getline(std::ifstream(out), text);
  EXPECT_EQ(text, absl::StrCat("step=", gpu));
  // Both jobs over: the steps released themselves, the imports went.
  EXPECT_TRUE(WaitFor([&] { return Holdings().empty(); }, absl::Seconds(20)));
  pod.Stop();
}

}  // namespace
}  // namespace duet::testing
