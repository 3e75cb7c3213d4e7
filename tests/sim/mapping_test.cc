// Issue 28: every mapping sends each pod to the world it names, whatever the
// pod list's columns. openb_pod_list_multigpu50.csv has no qos column; before
// the fix its pods all fell through to Slurm under `all-k8s`, which printed
// "all -> Kubernetes".
//
// Written against MakeArrivals only (its result is taken as a StatusOr), so
// that the same file also builds against the code before the fix and fails
// there.

#include <fstream>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
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

}  // namespace
}  // namespace duet::sim
