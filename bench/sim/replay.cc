#include "bench/sim/replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "bench/common/quantile.h"
#include "bench/sim/rng.h"
#include "bench/sim/score_memo.h"
#include "bridge/ledger/ledger.h"
#include "bridge/placement/workload_model.h"

namespace duet::sim {
namespace {

using placement::NodeLoad;
using placement::Policy;
using placement::PodRequest;
using placement::Scorer;

uint64_t GpuCapacityMilli(const std::vector<NodeSpec>& nodes) {
  uint64_t c = 0;
  for (const NodeSpec& n : nodes) {
    for (const DeviceSpec& d : n.devices) c += d.capacity_milli;
  }
  return c;
}

uint64_t GpuCount(const NodeSpec& n) { return n.devices.size(); }

// Splits nodes between the worlds in proportion to their GPU demand in the
// original trace, model by model so each part gets its share of every model.
// Returns the world of each node.
std::vector<World> Partition(const Trace& trace, const std::vector<Arrival>& arrivals) {
  double k8s_demand = 0;
  double total = 0;
  // Demand of the originals (each pod's world is the same in every copy).
  std::vector<int> world_of(trace.pods.size(), -1);
  for (const Arrival& a : arrivals) world_of[a.pod] = static_cast<int>(a.world);
  for (size_t i = 0; i < trace.pods.size(); ++i) {
    if (world_of[i] < 0) continue;
    const double m = static_cast<double>(trace.pods[i].request.device_milli());
    total += m;
    if (world_of[i] == static_cast<int>(World::kKubernetes)) k8s_demand += m;
  }
  const double k8s_share = total == 0 ? 1 : k8s_demand / total;

  std::vector<World> out(trace.nodes.size(), World::kKubernetes);
  std::vector<size_t> order(trace.nodes.size());
  std::iota(order.begin(), order.end(), 0);
  auto model = [&](size_t i) {
    return trace.nodes[i].devices.empty() ? std::string() : trace.nodes[i].devices[0].model;
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return model(a) < model(b); });
  size_t start = 0;
  while (start < order.size()) {
    size_t end = start;
    double group = 0;
    while (end < order.size() && model(order[end]) == model(order[start])) {
      group += GpuCount(trace.nodes[order[end]]);
      ++end;
    }
    const double k8s_target = group * k8s_share;
    double k8s = 0;
    for (size_t j = start; j < end; ++j) {
      const double g = GpuCount(trace.nodes[order[j]]);
      // Give the node to Kubernetes while that keeps it closest to its target.
      const bool to_k8s = std::abs(k8s + g - k8s_target) <= std::abs(k8s - k8s_target) &&
                          (k8s_share > 0);
      out[order[j]] = to_k8s ? World::kKubernetes : World::kSlurm;
      if (to_k8s) k8s += g;
    }
    start = end;
  }
  return out;
}

}  // namespace

std::optional<World> Mapping::WorldOf(absl::string_view qos) const {
  if (every_pod.has_value()) return every_pod;
  if (qos.empty()) return no_qos;
  return std::find(kubernetes_qos.begin(), kubernetes_qos.end(), qos) != kubernetes_qos.end()
             ? World::kKubernetes
             : World::kSlurm;
}

std::string Mapping::Describe() const {
  if (every_pod.has_value()) {
    return absl::StrCat(name, ": all -> ",
                        *every_pod == World::kKubernetes ? "Kubernetes" : "Slurm",
                        " (whatever the QoS, none included)");
  }
  return absl::StrCat(name, ": ", absl::StrJoin(kubernetes_qos, "+"),
                      " -> Kubernetes, every other QoS -> Slurm, no QoS -> ",
                      !no_qos.has_value()                 ? "refused"
                      : *no_qos == World::kKubernetes ? "Kubernetes"
                                                          : "Slurm");
}

absl::StatusOr<Mapping> ParseMapping(absl::string_view text) {
  Mapping m;
  m.name = std::string(text);
  if (text == "default") {
    m.kubernetes_qos = {"LS", "Guaranteed"};
  } else if (text == "all-k8s") {
    m.every_pod = World::kKubernetes;
  } else if (text == "all-slurm") {
    m.every_pod = World::kSlurm;
  } else if (absl::ConsumePrefix(&text, "k8s=")) {
    for (absl::string_view q : absl::StrSplit(text, '+', absl::SkipEmpty())) {
      if (q == "none") {
        m.no_qos = World::kKubernetes;
      } else {
        m.kubernetes_qos.emplace_back(q);
      }
    }
    // "k8s=" alone would quietly send every pod with a QoS to Slurm.
    if (m.kubernetes_qos.empty() && !m.no_qos.has_value()) {
      return absl::InvalidArgumentError(
          "--mapping: k8s= names no QoS class (k8s=QOS[+QOS...], none for pods without one)");
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--mapping: \"", text, "\" is not default, all-k8s, all-slurm or k8s=QOS[+QOS...]"));
  }
  return m;
}

const char* GangPolicyName(GangPolicy policy) {
  switch (policy) {
    case GangPolicy::kPerPod:
      return "per-pod";
    case GangPolicy::kAllOrNothing:
      return "duet";
    case GangPolicy::kAllOrNothingFlat:
      return "duet-flat";
  }
  return "unknown";
}

absl::StatusOr<GangPolicy> ParseGangPolicy(absl::string_view name) {
  for (GangPolicy p :
       {GangPolicy::kPerPod, GangPolicy::kAllOrNothing, GangPolicy::kAllOrNothingFlat}) {
    if (name == GangPolicyName(p)) return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("gang policy \"", name, "\" is not per-pod, duet or duet-flat"));
}

absl::StatusOr<PolicySpec> ParsePolicySpec(absl::string_view name) {
  PolicySpec spec;
  spec.name = std::string(name);
  if (name == "static") {
    spec.policy = Policy::kLeastAllocated;
    spec.static_partition = true;
    return spec;
  }
  if (name == "static-duet" || name == "static-duet-own") {
    spec.policy = Policy::kDuet;
    spec.static_partition = true;
    spec.static_slurm_weights = true;
    spec.workload_per_part = name == "static-duet-own";
    return spec;
  }
  if (absl::string_view k8s = name; absl::ConsumePrefix(&k8s, "static-k8s:")) {
    absl::StatusOr<Policy> p = placement::ParsePolicy(k8s);
    if (!p.ok()) return p.status();
    spec.policy = Policy::kLeastAllocated;
    spec.kubernetes_policy = *p;
    spec.static_partition = true;
    return spec;
  }
  if (name == "static-duet-slurm") {
    spec.policy = Policy::kDuet;
    spec.kubernetes_policy = Policy::kLeastAllocated;
    spec.static_partition = true;
    spec.static_slurm_weights = true;
    return spec;
  }
  absl::StatusOr<Policy> p = placement::ParsePolicy(name);
  if (!p.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(p.status().message(),
                                                   ", static, static-duet, static-k8s:POLICY, static-duet-slurm, static-duet-own"));
  }
  spec.policy = *p;
  return spec;
}

absl::StatusOr<Trace> LoadTrace(const std::string& nodes_path, const std::string& pods_path,
                                size_t node_stride) {
  Trace t;
  size_t row = 0;
  absl::Status s = ReadNodes(nodes_path, [&](NodeSpec spec) {
    if (node_stride <= 1 || row++ % node_stride == 0) t.nodes.push_back(std::move(spec));
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  s = ReadPods(pods_path, [&](TracePod pod) {
    t.pods.push_back(std::move(pod));
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  if (t.nodes.empty()) return absl::InvalidArgumentError(absl::StrCat(nodes_path, ": no nodes"));
  if (t.pods.empty()) return absl::InvalidArgumentError(absl::StrCat(pods_path, ": no pods"));
  return t;
}

absl::StatusOr<std::vector<Arrival>> MakeArrivals(const Trace& trace, const Mapping& mapping,
                                                  uint64_t seed, double max_arrival) {
  // Every original's world, before any arrival: copies share their original's.
  std::vector<World> world_of(trace.pods.size());
  for (size_t i = 0; i < trace.pods.size(); ++i) {
    const std::optional<World> w = mapping.WorldOf(trace.pods[i].qos);
    if (!w.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pod ", trace.pods[i].name,
          " has no QoS (a blank qos field, or the pod list has no qos column); mapping ",
          mapping.Describe(), ". Use all-k8s, all-slurm, or k8s=QOS+...+none"));
    }
    world_of[i] = *w;
  }
  // A class k8s=... names that no pod has, but that one has in another case
  // (k8s=ls for LS), is a typo: every pod it meant would quietly go to Slurm.
  // A class no pod has in any case is allowed (one mapping may serve several
  // pod lists).
  std::set<std::string> classes;
  for (const TracePod& p : trace.pods) {
    if (!p.qos.empty()) classes.insert(p.qos);
  }
  for (const std::string& q : mapping.kubernetes_qos) {
    if (classes.count(q) != 0) continue;
    for (const std::string& c : classes) {
      if (absl::EqualsIgnoreCase(c, q)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--mapping ", mapping.name, ": no pod has QoS \"", q, "\"; did you mean \"", c,
            "\"? (QoS names are case-sensitive; the list's classes: ",
            absl::StrJoin(classes, ", "), ")"));
      }
    }
  }
  std::vector<uint32_t> order(trace.pods.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return trace.pods[a].name < trace.pods[b].name; });
  Rng rng(seed);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.Below(i)]);

  const double limit = max_arrival * static_cast<double>(GpuCapacityMilli(trace.nodes));
  std::vector<Arrival> out;
  double requested = 0;
  auto add = [&](uint32_t pod) {
    out.push_back({pod, world_of[pod]});
    requested += static_cast<double>(trace.pods[pod].request.device_milli());
  };
  for (uint32_t pod : order) {
    if (requested >= limit) break;
    add(pod);
  }
  while (requested < limit) add(order[rng.Below(order.size())]);
  return out;
}

absl::StatusOr<ReplayResult> Replay(const Trace& trace, const std::vector<Arrival>& arrivals,
                                    const placement::Workload& workload, const PolicySpec& spec,
                                    const ReplayOptions& options) {
  const auto wall_start = std::chrono::steady_clock::now();
  ReplayResult result;
  result.policy = spec.name;

  Ledger ledger;
  const size_t n = trace.nodes.size();
  std::vector<std::shared_ptr<const NodeView>> views(n);
  std::vector<NodeLoad> loads(n);
  std::vector<uint64_t> gpu_milli(n, 0);  // GPU milli placed on each node
  for (size_t i = 0; i < n; ++i) {
    absl::StatusOr<uint64_t> seq = ledger.UpsertNode(trace.nodes[i]);
    if (!seq.ok()) return seq.status();
    views[i] = ledger.GetNode(trace.nodes[i].name);
  }
  const double capacity = static_cast<double>(GpuCapacityMilli(trace.nodes));

  // The workload the policy scores against: the oracle, or the model learned
  // from the arrivals so far (replaced in `scorer` after every arrival).
  // With spec.workload_per_part, `model` learns the Slurm world's arrivals
  // and `k8s_model` the Kubernetes world's.
  std::optional<placement::WorkloadModel> model;
  std::optional<placement::WorkloadModel> k8s_model;
  std::shared_ptr<const placement::Workload> learned;
  std::shared_ptr<const placement::Workload> k8s_learned;
  if (options.online_workload) {
    placement::WorkloadModelOptions mo;
    mo.half_life = options.half_life_arrivals > 0
                       ? absl::Seconds(options.half_life_arrivals)
                       : absl::InfiniteDuration();
    mo.coverage = options.coverage;
    mo.max_shapes = options.max_shapes;
    mo.max_tracked = std::max<size_t>(mo.max_tracked, options.max_shapes);
    mo.refresh = absl::ZeroDuration();
    mo.min_change = options.min_change;
    if (absl::Status s = placement::ValidateWorkloadModelOptions(mo); !s.ok()) return s;
    model.emplace(mo);
    learned = model->Current(absl::UnixEpoch());
    if (spec.workload_per_part) {
      k8s_model.emplace(mo);
      k8s_learned = k8s_model->Current(absl::UnixEpoch());
    }
  }
  const placement::Policy k8s_policy = spec.kubernetes_policy.value_or(spec.policy);
  // `scorer` places Slurm jobs and sets the Slurm weights; `k8s_scorer` places pods.
  Scorer scorer(spec.policy, options.online_workload ? learned.get() : &workload);
  Scorer k8s_scorer(k8s_policy, options.online_workload ? (k8s_model ? k8s_learned : learned).get()
                                                      : &workload);
  // Kubernetes candidates: every node, or its part of a static partition.
  std::optional<std::vector<uint32_t>> k8s_nodes;
  std::vector<World> part(n, World::kKubernetes);
  if (spec.static_partition) {
    part = Partition(trace, arrivals);
    k8s_nodes.emplace();
    for (uint32_t i = 0; i < n; ++i) {
      if (part[i] == World::kKubernetes) {
        k8s_nodes->push_back(i);
        result.kubernetes_gpus += GpuCount(trace.nodes[i]);
      } else {
        result.slurm_gpus += GpuCount(trace.nodes[i]);
      }
    }
  }
  // Slurm's view: (weight, node) in the order Slurm tries nodes. A stock
  // partition has equal weights, so node order decides.
  const bool slurm_weighted = !spec.static_partition || spec.static_slurm_weights;
  std::vector<uint32_t> weight(n, 1);
  std::set<std::pair<uint32_t, uint32_t>> slurm_order;
  for (uint32_t i = 0; i < n; ++i) {
    if (spec.static_partition && part[i] != World::kSlurm) continue;
    if (slurm_weighted) weight[i] = scorer.SlurmWeight(*views[i], loads[i]);
    slurm_order.insert({weight[i], i});
  }

  uint64_t tie_state = options.tie_seed;
  // Kubernetes decisions through the score memo: each pod's request numbered
  // by its distinct shape (copies of a pod share their original's).
  std::optional<ScoreMemo> memo;
  std::vector<uint32_t> shape_of(trace.pods.size(), 0);
  if (options.score_memo) {
    using ShapeKey = std::tuple<DeviceKind, uint32_t, uint32_t, std::vector<std::string>,
                                std::vector<uint32_t>, uint64_t, uint64_t>;
    std::map<ShapeKey, uint32_t> shapes;
    for (size_t p = 0; p < trace.pods.size(); ++p) {
      const PodRequest& r = trace.pods[p].request;
      const ShapeKey key{r.kind,      r.count,     r.milli,     r.models,
                         r.model_ids, r.cpu_milli, r.memory_mib};
      shape_of[p] = shapes.emplace(key, static_cast<uint32_t>(shapes.size())).first->second;
    }
    // 16 bytes per (node, shape): a pod list of very many distinct requests
    // on a large cluster replays without the memo rather than take > 256 MiB.
    if (n * shapes.size() <= (size_t{1} << 24)) memo.emplace(n, shapes.size());
  }
  // The extender's choice for arrival `a` (SelectNode, or the memo's answer to it).
  auto select = [&](size_t a) -> absl::StatusOr<std::optional<placement::NodeChoice>> {
    const PodRequest& req = trace.pods[arrivals[a].pod].request;
    const std::vector<uint32_t>* only = k8s_nodes.has_value() ? &*k8s_nodes : nullptr;
    uint64_t* ties = options.random_ties ? &tie_state : nullptr;
    if (!memo.has_value()) return placement::SelectNode(views, loads, req, k8s_scorer, only, ties);
    std::shared_ptr<const placement::Workload> owner;
    if (options.online_workload) owner = k8s_model.has_value() ? k8s_learned : learned;
    return memo->Select(views, loads, req, shape_of[arrivals[a].pod], k8s_scorer, std::move(owner),
                        only, ties, options.check_score_memo);
  };
  std::vector<double> decision_us;
  decision_us.reserve(arrivals.size());
  double requested = 0;
  double allocated = 0;
  uint64_t failed = 0;
  uint64_t gpu_failed = 0;
  size_t next_step = 1;
  const auto steps = static_cast<size_t>(std::floor(options.max_arrival / options.step + 1e-9));
  uint32_t job_id = 0;

  // Holds `p` on node i for `owner` and books it (loads, allocation, the
  // node's Slurm weight). INTERNAL if the ledger refuses.
  auto commit = [&](size_t i, const Owner& owner, const placement::Placement& p,
                    const PodRequest& req, const std::string& what) -> absl::Status {
    if (!p.devices.empty()) {
      HoldRequest hold;
      hold.node = trace.nodes[i].name;
      hold.owner = owner;
      hold.devices = p.devices;
      absl::StatusOr<HoldResult> held = ledger.Hold(hold);
      if (!held.ok()) {
        return absl::InternalError(absl::StrCat("ledger refused ", what, " on ", hold.node, ": ",
                                                held.status().message()));
      }
      views[i] = ledger.GetNode(hold.node);
    }
    loads[i].Add(req);
    if (memo.has_value()) memo->NodeChanged(i);
    gpu_milli[i] += req.device_milli();
    allocated += static_cast<double>(req.device_milli());
    if (slurm_weighted && slurm_order.count({weight[i], static_cast<uint32_t>(i)}) > 0) {
      slurm_order.erase({weight[i], static_cast<uint32_t>(i)});
      weight[i] = scorer.SlurmWeight(*views[i], loads[i]);
      slurm_order.insert({weight[i], static_cast<uint32_t>(i)});
    }
    return absl::OkStatus();
  };

  // Gangs, by id - 1.
  struct Gang {
    uint32_t size = 0;
    size_t first = 0;     // arrival index of member 0
    uint32_t placed = 0;  // members placed
    uint64_t held_milli = 0;
    // Each hold for the gang: (arrival index, device milli).
    std::vector<std::pair<size_t, uint64_t>> holds;
    std::vector<uint32_t> nodes;  // per member placed (per-pod) or per slot (duet)
    // duet: the reservation (one job; a slot per member, in PickGangNodes' node order).
    bool reserved = false;
    std::vector<Owner> slots;
    std::optional<size_t> done;  // arrival index at which the last member was placed
  };
  std::vector<Gang> gangs;
  std::map<std::string, uint32_t> node_index;
  for (const Arrival& arr : arrivals) {
    if (arr.gang > gangs.size()) gangs.resize(arr.gang);
  }
  if (!gangs.empty()) {
    for (uint32_t i = 0; i < n; ++i) node_index[trace.nodes[i].name] = i;
  }
  // duet: reserves gang `id` whole (every slot held) or not at all.
  auto reserve = [&](uint32_t id, Gang& g, const PodRequest& req, size_t a) -> absl::Status {
    std::vector<placement::GangCandidate> candidates;
    auto consider = [&](uint32_t i) {
      if (trace.nodes[i].devices.empty() || !placement::Fits(*views[i], loads[i], req)) return;
      // Members that fit, by the library's own device choice on a copy.
      NodeView copy = *views[i];
      NodeLoad load = loads[i];
      uint32_t fits = 0;
      while (fits < g.size) {
        std::optional<placement::Placement> p = k8s_scorer.Evaluate(copy, load, req);
        if (!p.has_value()) break;
        for (const HeldDevice& d : p->devices) {
          for (DeviceState& ds : copy.devices) {
            if (ds.spec.kind == d.kind && ds.spec.index == d.index) ds.used_milli += d.milli;
          }
        }
        load.Add(req);
        ++fits;
      }
      if (fits == 0) return;
      placement::GangCandidate c;
      c.node = trace.nodes[i].name;
      c.pool = trace.nodes[i].devices[0].model;
      if (spec.gang == GangPolicy::kAllOrNothing) {
        c.topology = TopologyOfIndex(options.topology, i, c.node);
      }
      c.fits = fits;
      for (const DeviceState& ds : views[i]->devices) {
        if (ds.spec.kind == req.kind) c.free_milli += ds.free_milli();
      }
      c.member_milli = req.device_milli();
      candidates.push_back(std::move(c));
    };
    if (k8s_nodes.has_value()) {
      for (uint32_t i : *k8s_nodes) consider(i);
    } else {
      for (uint32_t i = 0; i < n; ++i) consider(i);
    }
    std::optional<placement::GangPick> pick = placement::PickGangNodes(candidates, g.size);
    if (!pick.has_value()) return absl::OkStatus();
    const uint32_t job = ++job_id;
    for (const std::string& name : pick->nodes) {
      const uint32_t i = node_index.at(name);
      for (uint32_t m = 0; m < pick->per_node; ++m) {
        const std::string what = absl::StrCat("gang ", id, " slot ", g.slots.size());
        std::optional<placement::Placement> p = k8s_scorer.Evaluate(*views[i], loads[i], req);
        if (!p.has_value()) {
          return absl::InternalError(
              absl::StrCat(what, ": PickGangNodes chose ", name, ", where it no longer fits"));
        }
        const Owner owner = Owner::Placeholder(job, absl::StrCat("gang:", id, "#", g.slots.size()));
        if (absl::Status st = commit(i, owner, *p, req, what); !st.ok()) return st;
        g.slots.push_back(owner);
        g.nodes.push_back(i);
        g.held_milli += req.device_milli();
        g.holds.emplace_back(a, req.device_milli());
      }
    }
    if (g.slots.size() != g.size) {
      return absl::InternalError(absl::StrCat("gang ", id, ": PickGangNodes gave ", g.slots.size(),
                                              " slots for ", g.size, " members"));
    }
    g.reserved = true;
    return absl::OkStatus();
  };

  auto record = [&](double target, uint64_t arrived_pods) {
    Row r;
    r.arrived_target = target;
    r.arrived = requested / capacity;
    r.allocated = allocated / capacity;
    r.idle_gpus = (capacity - allocated) / kWholeDevice;
    double frag = 0;
    for (size_t i = 0; i < n; ++i) frag += placement::Fragmentation(*views[i], loads[i], workload);
    r.fragmented_gpus = frag / kWholeDevice;
    r.pods_arrived = arrived_pods;
    r.pods_failed = failed;
    r.gpu_pods_failed = gpu_failed;
    result.rows.push_back(r);
  };

  for (size_t a = 0; a < arrivals.size(); ++a) {
    const TracePod& pod = trace.pods[arrivals[a].pod];
    const PodRequest& req = pod.request;
    const World world = arrivals[a].world;
    requested += static_cast<double>(req.device_milli());
    if (model.has_value()) {
      const absl::Time now = absl::UnixEpoch() + absl::Seconds(a);
      if (k8s_model.has_value() && world == World::kKubernetes) {
        k8s_model->Observe("", req, now);
        k8s_learned = k8s_model->Current(now);
      } else {
        model->Observe("", req, now);
        learned = model->Current(now);
      }
      scorer = Scorer(spec.policy, learned.get());
      k8s_scorer = Scorer(k8s_policy, (k8s_model ? k8s_learned : learned).get());
      if (slurm_weighted && options.weight_refresh > 0 && a % options.weight_refresh == 0) {
        slurm_order.clear();
        for (uint32_t i = 0; i < n; ++i) {
          if (spec.static_partition && part[i] != World::kSlurm) continue;
          weight[i] = scorer.SlurmWeight(*views[i], loads[i]);
          slurm_order.insert({weight[i], i});
        }
      }
    }

    const auto t0 = options.time_decisions ? std::chrono::steady_clock::now()
                                           : std::chrono::steady_clock::time_point();
    std::optional<placement::NodeChoice> choice;
    const uint32_t gang_id = arrivals[a].gang;
    bool member_placed = false;
    if (gang_id != 0) {
      // A gang member: a Kubernetes pod, placed by the gang policy.
      ++result.kubernetes_arrivals;
      Gang& g = gangs[gang_id - 1];
      if (arrivals[a].member == 0) {
        g.size = arrivals[a].gang_size;
        g.first = a;
      }
      const Owner member = Owner::Pod(absl::StrCat("uid-", a), "trace", pod.name);
      if (spec.gang == GangPolicy::kPerPod) {
        absl::StatusOr<std::optional<placement::NodeChoice>> selected = select(a);
        if (!selected.ok()) return selected.status();
        choice = std::move(*selected);
        if (choice.has_value()) {
          if (absl::Status st = commit(choice->node, member, choice->placement, req, pod.name);
              !st.ok()) {
            return st;
          }
          g.nodes.push_back(static_cast<uint32_t>(choice->node));
          g.held_milli += req.device_milli();
          g.holds.emplace_back(a, req.device_milli());
          member_placed = true;
        }
      } else {
        if (!g.reserved) {
          if (absl::Status st = reserve(gang_id, g, req, a); !st.ok()) return st;
        }
        if (g.reserved) {
          // The member takes the lowest free slot: its devices become the pod's.
          const uint32_t i = g.nodes[g.placed];
          absl::StatusOr<HoldResult> moved =
              ledger.Rebind(trace.nodes[i].name, g.slots[g.placed], member);
          if (!moved.ok()) {
            return absl::InternalError(absl::StrCat("ledger refused gang ", gang_id, " member ",
                                                    arrivals[a].member, ": ",
                                                    moved.status().message()));
          }
          views[i] = ledger.GetNode(trace.nodes[i].name);
          if (memo.has_value()) memo->NodeChanged(i);
          member_placed = true;
        }
      }
      if (member_placed && ++g.placed == g.size) g.done = a;
    } else if (world == World::kKubernetes) {
      ++result.kubernetes_arrivals;
      absl::StatusOr<std::optional<placement::NodeChoice>> selected = select(a);
      if (!selected.ok()) return selected.status();
      choice = std::move(*selected);
    } else {
      ++result.slurm_arrivals;
      for (const auto& [w, i] : slurm_order) {
        if (!placement::Fits(*views[i], loads[i], req)) continue;
        std::optional<placement::Placement> p = scorer.Evaluate(*views[i], loads[i], req);
        if (!p.has_value()) continue;
        choice = placement::NodeChoice{i, std::move(*p)};
        break;
      }
    }
    if (options.time_decisions) {
      decision_us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }

    if (gang_id != 0) {
      if (!member_placed) {
        ++failed;
        ++gpu_failed;
      }
    } else if (!choice.has_value()) {
      ++failed;
      if (req.count > 0) ++gpu_failed;
    } else {
      // A Slurm job's id is taken only when the ledger is asked to hold (a
      // CPU-only job holds nothing), as before gangs.
      const bool holds = !choice->placement.devices.empty();
      const Owner owner = world == World::kSlurm
                              ? Owner::SlurmJob(holds ? ++job_id : job_id)
                              : Owner::Pod(absl::StrCat("uid-", a), "trace", pod.name);
      if (absl::Status st = commit(choice->node, owner, choice->placement, req, pod.name);
          !st.ok()) {
        return st;
      }
    }
    while (next_step <= steps && requested >= next_step * options.step * capacity - 1e-6) {
      record(next_step * options.step, a + 1);
      ++next_step;
    }
  }

  absl::Status invariants = ledger.CheckInvariants();
  if (!invariants.ok()) return invariants;
  // Counted from the ledger, not from `arrivals`: what was actually held.
  for (const Holding& h : ledger.ListHoldings()) {
    ++(h.owner.holder_class() == HolderClass::kSlurm ? result.slurm_holdings
                                                     : result.pod_holdings);
  }

  if (options.keep_holdings) result.holdings = ledger.ListHoldings();
  // Gangs at the end.
  std::vector<double> waits;
  for (const Gang& g : gangs) {
    if (g.size == 0) continue;  // never arrived (not in this stream)
    GangStats& gs = result.gangs;
    ++gs.gangs;
    gs.members += g.size;
    const size_t until = g.done.value_or(arrivals.size());
    for (const auto& [at, milli] : g.holds) {
      gs.idle_gpu_arrivals +=
          static_cast<double>(milli) / kWholeDevice * static_cast<double>(until - at);
    }
    gs.members_placed += g.placed;
    if (g.done.has_value()) {
      ++gs.placed;
      waits.push_back(static_cast<double>(*g.done - g.first));
      ++gs.placed_at_level[static_cast<size_t>(LevelOf(options.topology, g.nodes))];
    } else if (g.held_milli > 0) {
      ++gs.waiting;
      gs.idle_held_gpus += static_cast<double>(g.held_milli) / kWholeDevice;
    } else {
      ++gs.never_placed;
    }
  }
  if (!waits.empty()) {
    result.gangs.mean_wait =
        std::accumulate(waits.begin(), waits.end(), 0.0) / static_cast<double>(waits.size());
    result.gangs.p99_wait = bench::Quantile(waits, 0.99);
  }

  result.decisions = decision_us.size();
  if (memo.has_value()) {
    result.score_memo_lookups = memo->lookups();
    result.score_memo_hits = memo->hits();
    result.score_memo_fits = memo->fits();
    result.score_memo_epochs = memo->epochs();
  }
  if (!decision_us.empty()) {
    result.median_decision_us = bench::Median(decision_us);
    result.p99_decision_us = bench::Quantile(decision_us, 0.99);
  }
  for (size_t i = 0; i < n; ++i) {
    const double used = static_cast<double>(gpu_milli[i]) / kWholeDevice;
    (part[i] == World::kSlurm ? result.slurm_allocated_gpus : result.kubernetes_allocated_gpus) += used;
    const uint64_t cpu_milli = uint64_t{trace.nodes[i].cpus} * 1000;
    if (cpu_milli > 0 && loads[i].cpu_milli * 10 >= cpu_milli * 9) {
      result.idle_gpus_cpu_full += static_cast<double>(GpuCount(trace.nodes[i])) - used;
    }
  }
  result.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return result;
}

}  // namespace duet::sim
