// Issue 28: every mapping sends each pod to the world it names, whatever the
// pod list's columns. openb_pod_list_multigpu50.csv has no qos column; before
// the fix its pods all fell through to Slurm under `all-k8s`, which printed
// "all -> Kubernetes".
//
// Written against MakeArrivals only (its result is taken as a StatusOr), so
// that the same file also builds against the code before the fix and fails
// there.

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <ostream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/sim/replay.h"
#include "gtest/gtest.h"

namespace duet::sim {

// gtest prints a World by name (found by argument-dependent lookup).
void PrintTo(World w, std::ostream* os) {
  *os << (w == World::kKubernetes ? "Kubernetes" : "Slurm");
}

namespace {

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  std::ofstream(path) << text;
  return path;
}

std::string Nodes() {
  std::string csv = "sn,cpu_milli,memory_mib,gpu,model\n";
  for (int i = 0; i < 16; ++i) absl::StrAppend(&csv, "node-", i, ",64000,262144,4,T4\n");
  return WriteFile("mapping-nodes.csv", csv);
}

// Pods of every QoS of the trace, and some with a blank qos field.
std::string PodsWithQos() {
  std::string csv =
      "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
      "deletion_time,scheduled_time\n";
  const char* qos[] = {"LS", "BE", "Burstable", "Guaranteed", ""};
  for (int i = 0; i < 40; ++i) {
    absl::StrAppend(&csv, "pod-", 100 + i, ",4000,8192,", i % 7 == 0 ? 0 : 1, ",",
                    i % 3 == 0 ? 500 : 1000, ",,", qos[i % 5], ",Running,0,1,0\n");
  }
  return WriteFile("mapping-pods-qos.csv", csv);
}

// The same pods without any blank QoS.
std::string PodsAllQos() {
  std::string csv =
      "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
      "deletion_time,scheduled_time\n";
  const char* qos[] = {"LS", "BE", "Burstable", "Guaranteed"};
  for (int i = 0; i < 40; ++i) {
    absl::StrAppend(&csv, "pod-", 100 + i, ",4000,8192,", i % 7 == 0 ? 0 : 1, ",",
                    i % 3 == 0 ? 500 : 1000, ",,", qos[i % 4], ",Running,0,1,0\n");
  }
  return WriteFile("mapping-pods-allqos.csv", csv);
}

// multigpu50's format: five columns, no gpu_spec, no qos.
std::string PodsWithoutQosColumn() {
  std::string csv = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n";
  for (int i = 0; i < 40; ++i) {
    absl::StrAppend(&csv, "openb-pod-", 1000 + i, ",4000,8192,", i % 5 == 0 ? 2 : 1, ",",
                    i % 3 == 0 ? 300 : 1000, "\n");
  }
  return WriteFile("mapping-pods-noqos.csv", csv);
}

// What each mapping promises, written out here independently of the code:
// nullopt where it names no world (the pod list must then be refused).
std::optional<World> Expected(const std::string& mapping, const std::string& qos) {
  const World k = World::kKubernetes;
  const World s = World::kSlurm;
  if (mapping == "all-k8s") return k;
  if (mapping == "all-slurm") return s;
  if (mapping == "default") {
    if (qos.empty()) return std::nullopt;
    return qos == "LS" || qos == "Guaranteed" ? k : s;
  }
  if (mapping == "k8s=BE+LS") {
    if (qos.empty()) return std::nullopt;
    return qos == "BE" || qos == "LS" ? k : s;
  }
  if (mapping == "k8s=Burstable+none") {
    return qos.empty() || qos == "Burstable" ? k : s;
  }
  ADD_FAILURE() << "no expectation for " << mapping;
  return std::nullopt;
}

TEST(MappingTest, EveryMappingSendsEachPodToTheWorldItNames) {
  const std::string nodes = Nodes();
  const std::vector<std::string> mappings = {"all-k8s", "all-slurm", "default", "k8s=BE+LS",
                                             "k8s=Burstable+none"};
  for (const std::string& pods : {PodsAllQos(), PodsWithQos(), PodsWithoutQosColumn()}) {
    absl::StatusOr<Trace> t = LoadTrace(nodes, pods);
    ASSERT_TRUE(t.ok()) << t.status();
    for (const std::string& name : mappings) {
      SCOPED_TRACE(absl::StrCat(pods, ", mapping ", name));
      absl::StatusOr<Mapping> m = ParseMapping(name);
      ASSERT_TRUE(m.ok()) << m.status();
      // The first pod (in file order) the mapping names no world for.
      const TracePod* homeless = nullptr;
      for (const TracePod& p : t->pods) {
        if (!Expected(name, p.qos).has_value()) {
          homeless = &p;
          break;
        }
      }
      const absl::StatusOr<std::vector<Arrival>> a = MakeArrivals(*t, *m, 5, 1.3);
      if (homeless != nullptr) {
        // Refused, naming the pod, rather than sent anywhere.
        ASSERT_FALSE(a.ok()) << "a pod without a QoS was given a world";
        EXPECT_NE(a.status().message().find(homeless->name), std::string::npos) << a.status();
        EXPECT_NE(a.status().message().find("no QoS"), std::string::npos) << a.status();
        continue;
      }
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_GT(a->size(), t->pods.size());  // inflated with copies
      std::map<World, size_t> per_world;
      for (const Arrival& x : *a) {
        const TracePod& p = t->pods[x.pod];
        ASSERT_EQ(std::optional<World>(x.world), Expected(name, p.qos))
            << p.name << " (qos \"" << p.qos << "\")";
        ++per_world[x.world];
      }
      if (name == "all-k8s") {
        EXPECT_EQ(per_world[World::kKubernetes], a->size());
      }
      if (name == "all-slurm") {
        EXPECT_EQ(per_world[World::kSlurm], a->size());
      }
    }
  }
}

// The mapping changes where pods go, never which pods arrive in what order.
TEST(MappingTest, TheMappingDoesNotChangeTheArrivals) {
  absl::StatusOr<Trace> t = LoadTrace(Nodes(), PodsWithoutQosColumn());
  ASSERT_TRUE(t.ok()) << t.status();
  const absl::StatusOr<std::vector<Arrival>> k = MakeArrivals(*t, *ParseMapping("all-k8s"), 9, 1.3);
  const absl::StatusOr<std::vector<Arrival>> s =
      MakeArrivals(*t, *ParseMapping("all-slurm"), 9, 1.3);
  ASSERT_TRUE(k.ok() && s.ok());
  ASSERT_EQ(k->size(), s->size());
  for (size_t i = 0; i < k->size(); ++i) EXPECT_EQ((*k)[i].pod, (*s)[i].pod) << i;
}

// What a result prints is what the mapping does.
TEST(MappingTest, DescribeSaysWhereAPodWithoutQosGoes) {
  EXPECT_EQ(ParseMapping("all-k8s")->Describe(),
            "all-k8s: all -> Kubernetes (whatever the QoS, none included)");
  EXPECT_EQ(ParseMapping("all-slurm")->Describe(),
            "all-slurm: all -> Slurm (whatever the QoS, none included)");
  EXPECT_EQ(ParseMapping("default")->Describe(),
            "default: LS+Guaranteed -> Kubernetes, every other QoS -> Slurm, no QoS -> refused");
  EXPECT_EQ(ParseMapping("k8s=LS+none")->Describe(),
            "k8s=LS+none: LS -> Kubernetes, every other QoS -> Slurm, no QoS -> Kubernetes");
}

// "k8s=" with no class would send every pod with a QoS to Slurm unasked.
TEST(MappingTest, AnExplicitMappingMustNameAClass) {
  for (const char* text : {"k8s=", "k8s=+", "k8s=++"}) {
    const absl::StatusOr<Mapping> m = ParseMapping(text);
    ASSERT_FALSE(m.ok()) << text;
    EXPECT_NE(m.status().message().find("--mapping"), std::string::npos) << m.status();
  }
  EXPECT_TRUE(ParseMapping("k8s=none").ok());
  EXPECT_TRUE(ParseMapping("k8s=LS").ok());
}

TEST(MappingTest, AClassInTheWrongCaseIsRefusedNotSentToSlurm) {
  absl::StatusOr<Trace> t = LoadTrace(Nodes(), PodsAllQos());
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<Mapping> m = ParseMapping("k8s=ls");
  ASSERT_TRUE(m.ok()) << m.status();
  const absl::StatusOr<std::vector<Arrival>> a = MakeArrivals(*t, *m, 5, 1.3);
  ASSERT_FALSE(a.ok()) << "k8s=ls sent the LS pods to Slurm";
  EXPECT_NE(a.status().message().find("did you mean \"LS\""), std::string::npos) << a.status();
  // A class no pod has in any case is allowed: one mapping may serve several lists.
  EXPECT_TRUE(MakeArrivals(*t, *ParseMapping("k8s=LS+Gold"), 5, 1.3).ok());
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct SimRun {
  int rc = -1;
  std::string out;
  std::string err;
};

// The real duet-sim binary, as an operator runs it.
SimRun DuetSim(const std::string& args, const std::string& tag) {
  const std::string out = absl::StrCat(::testing::TempDir(), "/duet-sim-", tag, ".out");
  const std::string err = absl::StrCat(::testing::TempDir(), "/duet-sim-", tag, ".err");
  const int status =
      std::system(absl::StrCat("'", DUET_SIM_BIN, "' ", args, " >'", out, "' 2>'", err, "'").c_str());
  SimRun r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  r.out = ReadAll(out);
  r.err = ReadAll(err);
  return r;
}

// What duet-sim prints is what its replays did: the mapping line, and each
// policy's count of arrivals the extender and Slurm's first fit decided and of
// the ledger's holdings by pods and by Slurm jobs, for every mapping and pod
// list. The expected counts come from the pod list and Expected() above, not
// from the replay. Before issue 28 the pod list without a qos column printed
// "all -> Kubernetes" under all-k8s while every arrival went to Slurm.
TEST(MappingTest, DuetSimPrintsWhereItsReplaysSentThePods) {
  const std::string nodes = Nodes();
  const std::vector<std::string> mappings = {"all-k8s", "all-slurm", "default", "k8s=BE+LS",
                                             "k8s=Burstable+none"};
  const std::vector<uint64_t> seeds = {5, 6};
  const std::vector<std::string> policies = {"duet", "static"};
  const std::regex routed(
      R"(\n(\S+) .*\n(?:    .*\n)*?    routed \(all seeds\): (\d+) arrivals to Kubernetes \(extender\), )"
      R"((\d+) to Slurm \(first fit\); held at the end: (\d+) by pods, (\d+) by Slurm jobs(?=\n))");
  int case_no = 0;
  for (const std::string& pods : {PodsAllQos(), PodsWithQos(), PodsWithoutQosColumn()}) {
    absl::StatusOr<Trace> t = LoadTrace(nodes, pods);
    ASSERT_TRUE(t.ok()) << t.status();
    std::map<std::string, size_t> per_qos;
    for (const TracePod& p : t->pods) ++per_qos[p.qos.empty() ? "none" : p.qos];
    std::string qos_line = "pod list QoS:";
    for (const auto& [q, n] : per_qos) absl::StrAppend(&qos_line, " ", q, " ", n);
    // Which originals arrive, per seed: the same under every mapping
    // (TheMappingDoesNotChangeTheArrivals).
    std::vector<std::vector<Arrival>> arrivals;
    for (uint64_t seed : seeds) {
      absl::StatusOr<std::vector<Arrival>> a = MakeArrivals(*t, *ParseMapping("all-k8s"), seed, 1.3);
      ASSERT_TRUE(a.ok()) << a.status();
      arrivals.push_back(*std::move(a));
    }
    for (const std::string& name : mappings) {
      SCOPED_TRACE(absl::StrCat(pods, ", mapping ", name));
      const std::string out_dir = absl::StrCat(::testing::TempDir(), "/duet-sim-out-", case_no);
      std::filesystem::remove_all(out_dir);
      const SimRun r = DuetSim(absl::StrCat("--nodes '", nodes, "' --pods '", pods, "' --mapping '",
                                         name, "' --seed 5 --runs 2 --policies duet,static",
                                         " --no-plot --out '", out_dir, "'"),
                            std::to_string(case_no++));
      const TracePod* homeless = nullptr;
      for (const TracePod& p : t->pods) {
        if (!Expected(name, p.qos).has_value()) {
          homeless = &p;
          break;
        }
      }
      if (homeless != nullptr) {
        // Refused at start: exit 2 naming the pod, no result of any kind.
        EXPECT_EQ(r.rc, 2) << r.out << r.err;
        EXPECT_NE(r.err.find(homeless->name), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("no QoS"), std::string::npos) << r.err;
        EXPECT_EQ(r.out.find("routed"), std::string::npos) << r.out;
        EXPECT_FALSE(std::filesystem::exists(out_dir)) << out_dir;
        continue;
      }
      ASSERT_EQ(r.rc, 0) << r.out << r.err;
      EXPECT_NE(r.out.find(qos_line + "\n"), std::string::npos) << r.out;
      // Per policy, over both seeds: arrivals to each world as the mapping
      // promises them.
      uint64_t want_k8s = 0;
      uint64_t want_slurm = 0;
      for (const std::vector<Arrival>& seed_arrivals : arrivals) {
        for (const Arrival& a : seed_arrivals) {
          (Expected(name, t->pods[a.pod].qos) == World::kKubernetes ? want_k8s : want_slurm)++;
        }
      }
      // The mapping line's claim, read as an operator reads it.
      std::string mapping_line;
      for (absl::string_view l : absl::StrSplit(r.out, '\n')) {
        if (absl::ConsumePrefix(&l, "mapping: ")) mapping_line = std::string(l);
      }
      const bool says_all_k8s = mapping_line.find("all -> Kubernetes") != std::string::npos;
      const bool says_all_slurm = mapping_line.find("all -> Slurm") != std::string::npos;
      EXPECT_EQ(says_all_k8s, name == "all-k8s") << mapping_line;
      EXPECT_EQ(says_all_slurm, name == "all-slurm") << mapping_line;

      size_t seen = 0;
      for (std::sregex_iterator m(r.out.begin(), r.out.end(), routed), end; m != end; ++m) {
        SCOPED_TRACE((*m)[1].str());
        EXPECT_EQ((*m)[1].str(), policies[seen]);
        const uint64_t k8s = std::stoull((*m)[2].str());
        const uint64_t slurm = std::stoull((*m)[3].str());
        const uint64_t pod_held = std::stoull((*m)[4].str());
        const uint64_t slurm_held = std::stoull((*m)[5].str());
        EXPECT_EQ(k8s, want_k8s);
        EXPECT_EQ(slurm, want_slurm);
        // The ledger: each world holds devices only if pods went to it.
        EXPECT_EQ(pod_held > 0, want_k8s > 0) << pod_held;
        EXPECT_EQ(slurm_held > 0, want_slurm > 0) << slurm_held;
        EXPECT_LE(pod_held, k8s);
        EXPECT_LE(slurm_held, slurm);
        if (says_all_k8s) {
          EXPECT_EQ(slurm + slurm_held, 0u);
        }
        if (says_all_slurm) {
          EXPECT_EQ(k8s + pod_held, 0u);
        }
        ++seen;
      }
      EXPECT_EQ(seen, policies.size()) << r.out;
    }
  }
}

}  // namespace
}  // namespace duet::sim
