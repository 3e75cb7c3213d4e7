// Resident memory of the ledger and of a whole duet-bridge holding a large,
// realistic cluster: by default 10,000 GPU nodes (8 H100s each, GPU UUIDs,
// GKE-style labels and topology) plus 1,000 TPU v5e hosts (4 chips each), and
// 100,000 holdings: on even GPU nodes a Slurm job holds all 8 GPUs and 8 of
// its steps one GPU each (9 holdings); on odd GPU nodes 4 pods hold a whole
// GPU and 7 pods half a GPU on the other 4 (11 holdings).
//
// Each figure is VmRSS (/proc/self/status) after loading minus VmRSS just
// before, measured in a fresh child process so that figures do not mix:
//   ledger        the node specs are parsed from the inventory YAML first (in
//                 the baseline); then a Ledger is filled with them and the
//                 holdings
//   bridge        Bridge::Start recovering that state from a journal snapshot
//                 (written by another child), with the same inventory file
//   bridge-empty  Bridge::Start with the same inventory and an empty journal
// Both "as is" and after malloc_trim(0) (freed heap returned to the system)
// are printed. Exit status 0 unless a step failed.
//
//   ledger_memory [--gpu_nodes=10000] [--tpu_nodes=1000] [--no_bridge]

#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bridge/config/config.h"
#include "bridge/inventory/inventory.h"
#include "bridge/journal/journal.h"
#include "bridge/ledger/ledger.h"
#include "bridge/server/bridge.h"
#include "spdlog/spdlog.h"

namespace duet {
namespace {

namespace fs = std::filesystem;

constexpr double kAimMiB = 256;

// VmRSS in MiB, 0 if unreadable.
double RssMiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtod(line.c_str() + 6, nullptr) / 1024.0;
  }
  return 0;
}

std::string GpuNodeName(int i) { return absl::StrCat("gke-a3-highgpu-pool-", i / 1000, "-", i); }

std::string Uuid(int a, int b) {
  char buf[64];
  snprintf(buf, sizeof(buf), "%08x-%04x-4%03x-9a55-%012x", 0x5f0c3c4e ^ a, b & 0xffff, a & 0xfff,
           a * 16 + b);
  return buf;
}

std::string InventoryYaml(int gpu_nodes, int tpu_nodes) {
  std::string y = "nodes:\n";
  for (int i = 0; i < gpu_nodes; ++i) {
    const std::string pool = absl::StrCat("a3-highgpu-pool-", i / 1000);
    absl::StrAppend(&y, "  - name: ", GpuNodeName(i), "\n    cpus: 208\n    memory_mib: 1843200\n",
                    "    pool: ", pool, "\n    zone: us-central1-", i % 2 == 0 ? "a" : "b", "\n");
    absl::StrAppend(&y, "    labels:\n", "      cloud.google.com/gke-accelerator: nvidia-h100-80gb\n",
                    "      cloud.google.com/gke-nodepool: ", pool, "\n",
                    "      node.kubernetes.io/instance-type: a3-highgpu-8g\n",
                    "      topology.kubernetes.io/zone: us-central1-", i % 2 == 0 ? "a" : "b", "\n",
                    "      kubernetes.io/hostname: ", GpuNodeName(i), "\n",
                    "      nvidia.com/gpu.clique: clique-", i / 18, "\n");
    absl::StrAppend(&y, "    topology: {block: block-", i / 256, ", subblock: subblock-", i / 32,
                    "}\n    gpus:\n      count: 8\n      model: nvidia-h100-80gb\n",
                    "      nvlink_domain: clique-", i / 18, "\n      ids: [");
    for (int g = 0; g < 8; ++g) absl::StrAppend(&y, g == 0 ? "" : ", ", "GPU-", Uuid(i, g));
    y += "]\n";
  }
  for (int i = 0; i < tpu_nodes; ++i) {
    absl::StrAppend(&y, "  - name: gke-tpu-v5e-pool-", i, "\n    cpus: 112\n    memory_mib: 196608\n",
                    "    pool: tpu-v5e-pool\n    zone: us-west4-a\n", "    labels:\n",
                    "      cloud.google.com/gke-tpu-accelerator: tpu-v5-lite-podslice\n",
                    "      cloud.google.com/gke-tpu-topology: 4x4\n",
                    "    tpus: {count: 4, model: tpu-v5-lite-podslice, host_bounds: 2x2x1, "
                    "topology: 4x4, subslice_shapes: [1x1, 2x2]}\n");
  }
  return y;
}

// The holdings on GPU node `i` (see the file comment).
std::vector<HoldRequest> NodeHoldings(int i) {
  std::vector<HoldRequest> out;
  auto hold = [&](Owner owner, std::vector<HeldDevice> devices) {
    HoldRequest r;
    r.node = GpuNodeName(i);
    r.owner = std::move(owner);
    r.devices = std::move(devices);
    out.push_back(std::move(r));
  };
  auto gpu = [](uint32_t index, uint32_t milli) { return HeldDevice{DeviceKind::kGpu, index, milli}; };
  if (i % 2 == 0) {
    const uint32_t job = 100000 + static_cast<uint32_t>(i);
    std::vector<HeldDevice> all;
    for (uint32_t g = 0; g < 8; ++g) all.push_back(gpu(g, 0));
    hold(Owner::SlurmJob(job), all);
    for (uint32_t s = 0; s < 8; ++s) hold(Owner::SlurmStep(job, s), {gpu(s, 0)});
  } else {
    auto pod = [&](int k) {
      return Owner::Pod(Uuid(i, 100 + k), absl::StrCat("team-", i % 50),
                        absl::StrCat("trainer-", i, "-", k, "-7f9c8b6d5-x2k4q"));
    };
    for (uint32_t g = 0; g < 4; ++g) hold(pod(static_cast<int>(g)), {gpu(g, 0)});
    const uint32_t halves[7] = {4, 4, 5, 5, 6, 6, 7};
    for (int k = 0; k < 7; ++k) hold(pod(4 + k), {gpu(halves[k], 500)});
  }
  return out;
}

// Fills `ledger` (nodes, then holdings). False on any refusal.
bool Fill(Ledger* ledger, const std::vector<NodeSpec>& specs, int gpu_nodes) {
  for (const NodeSpec& s : specs) {
    absl::StatusOr<uint64_t> up = ledger->UpsertNode(s);
    if (!up.ok()) {
      fprintf(stderr, "upsert %s: %s\n", s.name.c_str(), up.status().ToString().c_str());
      return false;
    }
  }
  for (int i = 0; i < gpu_nodes; ++i) {
    for (const HoldRequest& r : NodeHoldings(i)) {
      absl::StatusOr<HoldResult> held = ledger->Hold(r);
      if (!held.ok()) {
        fprintf(stderr, "hold: %s\n", held.status().ToString().c_str());
        return false;
      }
    }
  }
  return true;
}

// Runs `body` in a child process; true if it exited 0.
bool InChild(const std::function<bool()>& body) {
  fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    const bool ok = body();
    fflush(stdout);
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

void Report(const char* what, double before, const std::string& detail) {
  const double as_is = RssMiB() - before;
  malloc_trim(0);
  const double trimmed = RssMiB() - before;
  printf("%-13s +%7.1f MiB RSS (%.1f after malloc_trim; baseline %.1f MiB)  %s  aim <= %.0f MiB: %s\n",
         what, as_is, trimmed, before, detail.c_str(), kAimMiB, as_is <= kAimMiB ? "met" : "MISSED");
}

bool MeasureLedger(const std::string& yaml, int gpu_nodes) {
  const absl::Time parse_start = absl::Now();
  absl::StatusOr<std::vector<NodeSpec>> specs = ParseInventory(yaml);
  const double parse_secs = absl::ToDoubleSeconds(absl::Now() - parse_start);
  if (!specs.ok()) {
    fprintf(stderr, "inventory: %s\n", specs.status().ToString().c_str());
    return false;
  }
  malloc_trim(0);
  const double before = RssMiB();
  auto ledger = std::make_unique<Ledger>();
  const absl::Time start = absl::Now();
  if (!Fill(ledger.get(), *specs, gpu_nodes)) return false;
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  Report("ledger", before,
         absl::StrCat(ledger->node_count(), " nodes, ", ledger->holding_count(), " holdings (filled in ",
                      static_cast<int>(secs * 1000), " ms; inventory YAML of ", yaml.size() >> 10,
                      " KiB parsed in ", static_cast<int>(parse_secs * 1000), " ms)"));
  return ledger->CheckInvariants().ok();
}

bool WriteJournal(const std::string& yaml, int gpu_nodes, const std::string& dir) {
  absl::StatusOr<std::vector<NodeSpec>> specs = ParseInventory(yaml);
  if (!specs.ok()) return false;
  Ledger ledger;
  Journal::Options o;
  o.dir = dir;
  o.fsync = false;
  o.snapshot_every = 0;
  absl::StatusOr<std::unique_ptr<Journal>> journal = Journal::Open(o, &ledger);
  if (!journal.ok()) {
    fprintf(stderr, "journal: %s\n", journal.status().ToString().c_str());
    return false;
  }
  if (!Fill(&ledger, *specs, gpu_nodes)) return false;
  return (*journal)->WriteSnapshot().ok() && (*journal)->Flush().ok();
}

bool MeasureBridge(const char* what, const fs::path& inventory, const fs::path& journal_dir) {
  Config config;
  config.grpc.listen = "127.0.0.1:0";
  config.metrics.listen = "";
  config.journal.dir = journal_dir.string();
  config.inventory.source = "file";
  config.inventory.file = inventory.string();
  config.inventory.reload_period = absl::Hours(1);
  if (!ValidateConfig(config).ok()) return false;
  const double before = RssMiB();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Bridge>> bridge = Bridge::Start(config);
  if (!bridge.ok()) {
    fprintf(stderr, "bridge: %s\n", bridge.status().ToString().c_str());
    return false;
  }
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  Ledger* ledger = (*bridge)->ledger();
  Report(what, before,
         absl::StrCat(ledger->node_count(), " nodes, ", ledger->holding_count(),
                      " holdings (started in ", static_cast<int>(secs * 1000), " ms)"));
  (*bridge)->Shutdown();
  return true;
}

int Main(int argc, char** argv) {
  CLI::App app{"Resident memory of a large ledger and of a recovered duet-bridge"};
  int gpu_nodes = 10000;
  int tpu_nodes = 1000;
  bool no_bridge = false;
  app.add_option("--gpu_nodes", gpu_nodes, "GPU nodes (8 GPUs; 10 holdings per node on average)");
  app.add_option("--tpu_nodes", tpu_nodes, "TPU v5e hosts (4 chips, no holdings)");
  app.add_flag("--no_bridge", no_bridge, "measure the ledger only");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);

  const fs::path dir =
      fs::temp_directory_path() / absl::StrCat("duet_ledger_memory.", getpid());
  fs::create_directories(dir);
  const std::string yaml = InventoryYaml(gpu_nodes, tpu_nodes);
  std::ofstream(dir / "nodes.yaml") << yaml;
  printf("%d GPU nodes x 8 H100, %d TPU hosts x 4 v5e; holdings: 9 per even GPU node (Slurm job + "
         "8 steps), 11 per odd (4 whole-GPU pods + 7 half-GPU pods)\n",
         gpu_nodes, tpu_nodes);

  bool ok = InChild([&] { return MeasureLedger(yaml, gpu_nodes); });
  if (ok && !no_bridge) {
    ok = InChild([&] { return WriteJournal(yaml, gpu_nodes, (dir / "journal").string()); }) &&
         InChild([&] { return MeasureBridge("bridge", dir / "nodes.yaml", dir / "journal"); }) &&
         InChild([&] {
           return MeasureBridge("bridge-empty", dir / "nodes.yaml", dir / "journal-empty");
         });
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (!ok) fprintf(stderr, "ledger_memory: a step failed\n");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace duet

int main(int argc, char** argv) { return duet::Main(argc, argv); }
