// A gang's reservation through the extender at scale (issue 27,
// "Performance"): the filter call of a gang's first member, which reserves
// the whole gang, beside the filter of its later members and of a single
// pod, in one run, on one server, over loopback HTTP.
//
// The cluster: --nodes H100 nodes (bench/common/h100_node.h) in GKE blocks
// of 144 and sub-blocks of 36, an NVLink clique per 18; node i has i % 9
// GPUs held by a Slurm job (in the ledger and in the fake slurmctld), so a
// member of 8 GPUs fits 1 node in 9. The product's pieces: Extender,
// ExtenderServer, GangRegistry with PickGangNodes, bridge/slurm's
// Placeholders as the GangMaker, k8s::GangSource recognising the
// scheduling.x-k8s.io PodGroup (its object read once per gang before the
// timed calls, as the cache holds it for its ttl). Slurm is
// tests/fakes' in-memory slurmctld behind a client that waits a fixed
// --rpc_ms on every call that changes it (AllocateGang, KillJob): the
// stated cost of one RPC to slurmctld.
//
// Per rep, one gang of --members members of --member_gpus GPUs:
//   reserve   member 0's /filter: recognition, candidates over every node,
//             the pick, one AllocateGang, the slot holdings in the ledger
//   gather    members 1..N-1's /filter (the last completes the gang)
//   ready     every member's /filter once complete (passes its slot's node)
//   single    a pod of the same shape without the label, one per member
//             call, interleaved with them
// then the gang is released (untimed): every member gone, Tick.
// Every /filter carries --names NodeNames spread over the cluster (a ready
// member's, its slot's node too).
//
//   extender_gang_bench [--nodes 5000] [--names 500] [--reps 30]
//                       [--members 8] [--member_gpus 8] [--rpc_ms 5]
//
// Prints one JSON line: p50/p99 (microseconds) per kind of call.

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/common/h100_node.h"
#include "bench/common/quantile.h"
#include "bridge/gang/registry.h"
#include "bridge/placement/topology.h"
#include "bridge/slurm/placeholders.h"
#include "k8s_adapter/extender/server.h"
#include "k8s_adapter/gang/gang_source.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "tests/fakes/fake_slurm.h"
#include "tests/k8s_adapter/extender/http_client.h"

namespace duet {
namespace extender {
namespace {

using json = nlohmann::json;
using testing::HttpClient;

constexpr char kGroupLabel[] = "scheduling.x-k8s.io/pod-group";

struct Flags {
  int nodes = 5000;
  int names = 500;
  int reps = 30;
  int members = 8;
  int member_gpus = 8;
  int rpc_ms = 5;
};

// The fake slurmctld, with a fixed time per call that changes it.
class SlowSlurm final : public SlurmClient {
 public:
  SlowSlurm(fakes::FakeSlurmClient* inner, absl::Duration rpc) : inner_(inner), rpc_(rpc) {}
  absl::Status Ping() override { return inner_->Ping(); }
  absl::StatusOr<std::vector<SlurmNodeInfo>> ListNodes() override { return inner_->ListNodes(); }
  absl::StatusOr<std::optional<SlurmNodeInfo>> GetNode(const std::string& name) override {
    return inner_->GetNode(name);
  }
  absl::Status CreateNode(const SlurmNodeConfig& c) override { return inner_->CreateNode(c); }
  absl::Status UpdateNode(const SlurmNodeUpdate& u) override { return inner_->UpdateNode(u); }
  absl::Status DeleteNode(const std::string& name) override { return inner_->DeleteNode(name); }
  absl::StatusOr<SlurmAllocation> AllocatePlaceholder(const SlurmAllocRequest& r) override {
    absl::SleepFor(rpc_);
    return inner_->AllocatePlaceholder(r);
  }
  absl::StatusOr<SlurmGangAllocation> AllocateGang(const SlurmGangRequest& r) override {
    absl::SleepFor(rpc_);
    return inner_->AllocateGang(r);
  }
  absl::Status KillJob(uint32_t job_id) override {
    absl::SleepFor(rpc_);
    return inner_->KillJob(job_id);
  }
  absl::StatusOr<std::vector<SlurmJobInfo>> ListJobs() override { return inner_->ListJobs(); }
  absl::StatusOr<std::optional<SlurmJobInfo>> GetJob(uint32_t job_id) override {
    return inner_->GetJob(job_id);
  }

 private:
  fakes::FakeSlurmClient* const inner_;
  const absl::Duration rpc_;
};

// The API server as GangSource reads it: every PodGroup exists with
// minMember `members`.
class PodGroups final : public k8s::KubeClient {
 public:
  explicit PodGroups(int members) : members_(members) {}
  absl::StatusOr<std::string> Get(const std::string& path) override {
    if (!absl::StrContains(path, "/podgroups/")) return absl::NotFoundError(path);
    ++reads;
    return json{{"apiVersion", "scheduling.x-k8s.io/v1alpha1"},
                {"kind", "PodGroup"},
                {"spec", {{"minMember", members_}}}}
        .dump();
  }
  absl::StatusOr<std::string> Post(const std::string& p, const std::string&) override {
    return absl::UnimplementedError(p);
  }
  absl::StatusOr<std::string> Put(const std::string& p, const std::string&) override {
    return absl::UnimplementedError(p);
  }
  absl::StatusOr<std::string> Patch(const std::string& p, const std::string&,
                                    k8s::PatchType) override {
    return absl::UnimplementedError(p);
  }
  absl::StatusOr<std::string> Delete(const std::string& p) override {
    return absl::UnimplementedError(p);
  }
  absl::Status Stream(const std::string& p, const k8s::StreamOptions&,
                      const std::function<absl::Status(absl::string_view)>&) override {
    return absl::UnimplementedError(p);
  }
  std::atomic<int> reads{0};

 private:
  const int members_;
};

class NoApi final : public PodApi {
 public:
  absl::StatusOr<json> GetPod(const std::string&, const std::string&) override {
    return absl::UnimplementedError("benchmark");
  }
  absl::Status Bind(const std::string&, const std::string&, const std::string&, const std::string&) override {
    return absl::UnimplementedError("benchmark");
  }
};

json Pod(const std::string& name, int gpus, const std::string& group) {
  json pod = {{"metadata", {{"name", name}, {"namespace", "ml"}, {"uid", "uid-" + name}}},
              {"spec",
               {{"schedulerName", "duet"},
                {"containers",
                 json::array({{{"name", "c"},
                               {"image", "i"},
                               {"resources",
                                {{"limits", {{"nvidia.com/gpu", std::to_string(gpus)}}},
                                 {"requests", {{"cpu", "8"}, {"memory", "64Gi"}}}}}}})}}}};
  if (!group.empty()) pod["metadata"]["labels"][kGroupLabel] = group;
  return pod;
}

json Summary(const std::vector<double>& v) {
  return {{"n", v.size()},
          {"p50", bench::Quantile(v, 0.5)},
          {"p99", bench::Quantile(v, 0.99)},
          {"max", bench::Quantile(v, 1.0)}};
}

int Run(const Flags& f) {
  spdlog::set_level(spdlog::level::err);
  Ledger ledger;
  fakes::FakeSlurmClient fake(bench::kH100sPerNode);
  for (int i = 0; i < f.nodes; ++i) {
    NodeSpec spec = bench::H100Node(i);
    spec.labels["cloud.google.com/gce-topology-block"] = absl::StrCat("block-", i / 144);
    spec.labels["cloud.google.com/gce-topology-subblock"] = absl::StrCat("sub-", i / 36);
    spec.labels["cloud.google.com/gce-topology-host"] = absl::StrCat("host-", i);
    if (!ledger.UpsertNode(spec).ok()) return 1;
    const uint32_t held = static_cast<uint32_t>(i % 9);
    if (held == 0) continue;
    HoldRequest h;
    h.node = spec.name;
    h.owner = Owner::SlurmJob(static_cast<uint32_t>(100000 + i));
    for (uint32_t g = 0; g < held; ++g) h.devices.push_back({DeviceKind::kGpu, g, kWholeDevice});
    if (!ledger.Hold(h).ok()) return 1;
    fake.Use(spec.name, 0, held);
  }
  SlowSlurm slurm(&fake, absl::Milliseconds(f.rpc_ms));
  Placeholders placeholders(&ledger, &slurm);
  gang::GangRegistryOptions go;
  go.planner = [](const std::vector<placement::GangCandidate>& c, uint32_t members,
                  std::string* reason) { return placement::PickGangNodes(c, members, reason); };
  // As duet-bridge does (bridge/server/bridge.cc).
  go.topology = [](const NodeView& v) { return placement::TopologyOf(v); };
  go.slot_owner = [](uint32_t job, const gang::GangKey& key, uint32_t slot) {
    return Owner::GangSlot(job, key.ToString(), slot);
  };
  go.idle_release = absl::ZeroDuration();
  gang::GangRegistry registry(&ledger, &placeholders, std::move(go));
  PodGroups kube(f.members);
  k8s::GangSource source(&kube);
  NoApi api;
  ExtenderOptions eo;
  eo.gangs = &registry;
  eo.gang_of = [&source](const json& pod) { return source.Recognise(pod); };
  Extender extender(&ledger, &placeholders, &api, eo);
  ServerOptions so;
  so.threads = 2;
  auto server = ExtenderServer::Start(&extender, so);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  HttpClient c((*server)->port());

  const int n = std::min(f.names, f.nodes);
  json names = json::array();
  for (int k = 0; k < n; ++k) {
    names.push_back(bench::H100NodeName(static_cast<int>(static_cast<int64_t>(k) * f.nodes / n)));
  }
  // `extra`, when set and not among the names, is added to them.
  auto body = [&](const json& pod, const std::string& extra = "") {
    json list = names;
    if (!extra.empty() && std::find(list.begin(), list.end(), extra) == list.end()) {
      list.push_back(extra);
    }
    return json{{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", std::move(list)}}.dump();
  };
  // One /filter; its time in microseconds, or < 0 on an error. `passed`
  // gets how many names passed.
  auto filter = [&](const std::string& b, size_t* passed) {
    const absl::Time t = absl::Now();
    auto r = c.Post("/duet/filter", b);
    const double us = absl::ToDoubleMicroseconds(absl::Now() - t);
    if (!r.ok() || r->status != 200) return -1.0;
    const json out = json::parse(r->body);
    *passed = out.contains("NodeNames") && out["NodeNames"].is_array() ? out["NodeNames"].size() : 0;
    return us;
  };
  const std::string single = body(Pod("single", f.member_gpus, ""));
  std::vector<double> reserve, gather, ready, singles;
  size_t passed = 0;
  for (int i = 0; i < 5; ++i) {
    if (filter(single, &passed) < 0) return 1;  // warm-up
  }
  const size_t single_passed = passed;
  for (int rep = 0; rep < f.reps; ++rep) {
    const std::string group = absl::StrCat("train-", rep);
    std::vector<std::string> bodies;
    std::vector<json> pods;
    for (int m = 0; m < f.members; ++m) {
      pods.push_back(Pod(absl::StrCat(group, "-", m), f.member_gpus, group));
      bodies.push_back(body(pods.back()));
    }
    // The PodGroup read once, as GangSource's cache holds it after the
    // first member of a gang is seen (the API server's round trip is not
    // what is measured).
    if (!source.Recognise(pods[0]).ok()) return 1;
    for (int m = 0; m < f.members; ++m) {
      double us = filter(bodies[m], &passed);
      if (us < 0) return 1;
      (m == 0 ? reserve : gather).push_back(us);
      if (m == 0 && registry.stats().reservations != static_cast<uint64_t>(rep + 1)) {
        std::fprintf(stderr, "rep %d: the gang was not reserved\n", rep);
        return 1;
      }
      us = filter(single, &passed);
      if (us < 0) return 1;
      singles.push_back(us);
    }
    for (int m = 0; m < f.members; ++m) {
      // The slot's node among the names (kube-scheduler's sample of the
      // cluster may miss it; the member then fails every node).
      const std::optional<std::string> node =
          registry.NodeOf(pods[m]["metadata"]["uid"].get<std::string>());
      if (!node.has_value()) return 1;
      const std::string b = body(pods[m], *node);
      const double us = filter(b, &passed);
      if (us < 0) return 1;
      if (passed != 1) {
        std::fprintf(stderr, "rep %d member %d: %zu nodes passed once complete, not 1\n", rep, m,
                     passed);
        return 1;
      }
      ready.push_back(us);
      const double s = filter(single, &passed);
      if (s < 0) return 1;
      singles.push_back(s);
    }
    // Released, untimed: every member gone, then the idle gang cancelled.
    for (const json& p : pods) {
      if (!registry.OnMemberGone(p["metadata"]["uid"].get<std::string>()).ok()) return 1;
    }
    registry.Tick();
    if (registry.stats().complete != 0 || registry.stats().gathering != 0) {
      std::fprintf(stderr, "rep %d: the gang was not released\n", rep);
      return 1;
    }
  }
  (*server)->Stop();
  std::printf("%s\n", json{{"nodes", f.nodes},
                           {"names", n},
                           {"members", f.members},
                           {"member_gpus", f.member_gpus},
                           {"rpc_ms", f.rpc_ms},
                           {"reps", f.reps},
                           {"single_passed", single_passed},
                           {"podgroup_reads", kube.reads.load()},
                           {"reserve_us", Summary(reserve)},
                           {"gather_us", Summary(gather)},
                           {"ready_us", Summary(ready)},
                           {"single_us", Summary(singles)}}
                           .dump()
                           .c_str());
  return 0;
}

}  // namespace
}  // namespace extender
}  // namespace duet

int main(int argc, char** argv) {
  duet::extender::Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    int* target = nullptr;
    if (k == "--nodes") target = &f.nodes;
    if (k == "--names") target = &f.names;
    if (k == "--reps") target = &f.reps;
    if (k == "--members") target = &f.members;
    if (k == "--member_gpus") target = &f.member_gpus;
    if (k == "--rpc_ms") target = &f.rpc_ms;
    if (target == nullptr || !absl::SimpleAtoi(v, target) || *target < 0) {
      std::fprintf(stderr, "bad flag %s %s\n", k.c_str(), v.c_str());
      return 2;
    }
  }
  if (f.nodes < 1 || f.names < 1 || f.reps < 1 || f.members < 1 || f.member_gpus < 1 ||
      f.member_gpus > duet::bench::kH100sPerNode) {
    std::fprintf(stderr, "bad flags\n");
    return 2;
  }
  return duet::extender::Run(f);
}
