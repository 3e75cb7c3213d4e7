#include "bridge/placement/placement.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "bridge/placement/node_free.h"
#include "bridge/placement/prepared.h"
#include "bridge/placement/topology.h"

namespace duet::placement {
namespace {

using internal::DeviceFree;
using internal::NodeFree;

bool SameModel(const DeviceFree& a, const DeviceFree& b) {
  if (a.model_id != 0 && b.model_id != 0) return a.model_id == b.model_id;
  return *a.model == *b.model;
}

// How much a unit of packing (fraction of the node's devices in use after the
// placement) is worth in duet's score, in fragmented whole devices. Small: it
// breaks ties between nodes whose fragmentation grows alike.
constexpr double kDuetPackWeight = 0.05;
// What a device left idle for want of CPU is worth in duet's score, against
// a device of fragmentation growth (1). A node whose free CPU cannot feed its
// free devices at the workload's CPU per device strands them; the term is the
// growth of those stranded devices, so a CPU-heavy pod goes where CPU is
// plentiful for the devices left, and a node already short of CPU is where
// a GPU-heavy, CPU-light pod helps (bench/sim/RESULTS.md, "duet with a CPU-aware term").
constexpr double kDuetCpuWeight = 0.1;
// What a node's domain packing (DomainPacking, 0..1) is worth, in the same
// units: a fifth of the node's own packing weight, so it mostly decides
// between nodes that are otherwise alike (docs/gangs.md 4).
constexpr double kDuetDomainWeight = 0.01;

// Positions (into NodeFree::devices) of the devices a placement takes.
using Picks = absl::InlinedVector<uint32_t, 8>;

struct Eval {
  Picks picks;
  double raw = 0;
  int score = 0;
};

int Clamp(double v) {
  if (!(v > 0)) return 0;  // also NaN
  if (v > kMaxScore) return kMaxScore;
  return static_cast<int>(std::lround(v));
}

bool CheckFits(const NodeView& view, const NodeFree& node, const PodRequest& request,
               std::string* reason) {
  if (!node.ready) {
    if (reason != nullptr) {
      *reason = absl::StrCat("node ", view.spec.name, ": ", NodeStateName(view.spec.state));
    }
    return false;
  }
  if (node.cpu_free < static_cast<int64_t>(request.cpu_milli)) {
    if (reason != nullptr) {
      *reason = absl::StrCat("node ", view.spec.name, ": ", std::max<int64_t>(node.cpu_free, 0),
                             "m cpu free, ", request.cpu_milli, "m requested");
    }
    return false;
  }
  if (node.mem_free < static_cast<int64_t>(request.memory_mib)) {
    if (reason != nullptr) {
      *reason = absl::StrCat("node ", view.spec.name, ": ", std::max<int64_t>(node.mem_free, 0),
                             " MiB memory free, ", request.memory_mib, " MiB requested");
    }
    return false;
  }
  if (request.count == 0) return true;
  const uint32_t usable = internal::UsableDevices(node, request);
  if (usable >= request.count) return true;
  if (reason != nullptr) {
    uint32_t of_kind = 0;
    for (const DeviceFree& d : node.devices) {
      if (d.kind == request.kind && request.AcceptsModel(*d.model, d.model_id)) ++of_kind;
    }
    *reason = absl::StrCat("node ", view.spec.name, ": ", usable, " of ", of_kind, " ",
                           DeviceKindName(request.kind), " devices",
                           request.models.empty() ? "" : " of an accepted model", " have ",
                           request.milli, "m free, ", request.count, " requested");
  }
  return false;
}

// The same verdict as CheckFits(view, Summarize(view, load), request) without
// building the summary: it reads only the fields it needs, straight from the
// view, and stops at the first `request.count` usable devices. This is the
// hot path of the extender's filter (thousands of nodes per request, most of
// the cost being cache misses on the views' device tables); callers that need
// the failure's reason, or the summary itself, fall back to the full path.
bool QuickFits(const NodeView& view, const NodeLoad& load, const PodRequest& request) {
  if (view.spec.state != NodeState::kReady) return false;
  // As in Summarize: a spec value of 0 means untracked (unlimited).
  if (view.spec.cpus != 0 &&
      int64_t{view.spec.cpus} * 1000 - static_cast<int64_t>(load.cpu_milli) <
          static_cast<int64_t>(request.cpu_milli)) {
    return false;
  }
  if (view.spec.memory_mib != 0 &&
      static_cast<int64_t>(view.spec.memory_mib) - static_cast<int64_t>(load.memory_mib) <
          static_cast<int64_t>(request.memory_mib)) {
    return false;
  }
  if (request.count == 0) return true;
  uint32_t usable = 0;
  for (const DeviceState& d : view.devices) {
    // Kind and free capacity first (no string touched), then the model.
    if (d.spec.kind != request.kind || d.free_milli() < request.milli) continue;
    if (!request.models.empty() && !request.AcceptsModel(d.spec.model, d.spec.model_id)) continue;
    if (++usable >= request.count) return true;
  }
  return false;
}

// Best fit within the node: the fullest devices that still take the share,
// then the lowest index (the order the ledger itself would choose).
Picks PickBestFit(const NodeFree& node, const PodRequest& request) {
  Picks usable;
  for (uint32_t i = 0; i < node.devices.size(); ++i) {
    if (internal::DeviceUsable(node.devices[i], request)) usable.push_back(i);
  }
  // By free milli, equal ones in index order: a stable insertion sort (what
  // std::stable_sort gives, without the temporary buffer it allocates; a
  // node has a handful of devices, and this runs per node per request).
  for (size_t i = 1; i < usable.size(); ++i) {
    const uint32_t x = usable[i];
    size_t j = i;
    for (; j > 0 && node.devices[usable[j - 1]].free > node.devices[x].free; --j) {
      usable[j] = usable[j - 1];
    }
    usable[j] = x;
  }
  usable.resize(request.count);
  std::sort(usable.begin(), usable.end());
  return usable;
}

NodeFree Apply(const NodeFree& node, const PodRequest& request, const Picks& picks) {
  NodeFree after = node;
  for (uint32_t p : picks) after.devices[p].free -= request.milli;
  after.cpu_free -= static_cast<int64_t>(request.cpu_milli);
  after.mem_free -= static_cast<int64_t>(request.memory_mib);
  return after;
}

struct Totals {
  uint64_t free = 0;
  uint64_t capacity = 0;
};
Totals DeviceTotals(const NodeFree& node, DeviceKind kind) {
  Totals t;
  for (const DeviceFree& d : node.devices) {
    if (d.kind != kind) continue;
    t.free += d.free;
    t.capacity += d.capacity;
  }
  return t;
}

// Mean free fraction of devices, CPU and memory (those tracked).
double FreeFraction(const NodeFree& node, DeviceKind kind) {
  double sum = 0;
  int n = 0;
  const Totals t = DeviceTotals(node, kind);
  if (t.capacity > 0) {
    sum += static_cast<double>(t.free) / static_cast<double>(t.capacity);
    ++n;
  }
  if (node.cpu_capacity > 0) {
    sum += static_cast<double>(std::max<int64_t>(node.cpu_free, 0)) / node.cpu_capacity;
    ++n;
  }
  if (node.mem_capacity > 0) {
    sum += static_cast<double>(std::max<int64_t>(node.mem_free, 0)) / node.mem_capacity;
    ++n;
  }
  return n == 0 ? 0 : sum / n;
}

double CpuFreeFraction(const NodeFree& node) {
  if (node.cpu_capacity <= 0) return 0;
  return static_cast<double>(std::max<int64_t>(node.cpu_free, 0)) / node.cpu_capacity;
}

// Fragmented milli, rounded to a millionth of a milli so that equal
// fragmentations computed along different paths compare equal (a tie then
// goes to the node or device seen first, not to rounding noise).
// SplitMix64 (Steele, Lea, Flood 2014): a small, well-mixed generator whose
// whole state is one word.
uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double Frag(const NodeFree& node, const PodRequest& request, const Workload* workload) {
  const double f = workload == nullptr || workload->empty()
                       ? internal::ShapeFragmentation(node, request)
                       : internal::MemoizedWorkloadFragmentation(node, *workload);
  return std::round(f * 1e6) / 1e6;
}

// The FGD paper's node score (its simulator's FGD score plugin):
// floor(100 * sigmoid(-growth)), growth in whole devices, so growths within
// about 0.04 of a device of each other score the same integer and the tie
// is broken as the scheduler breaks ties (bench/sim/RESULTS.md, "Our fgd made
// faithful").
int FgdScore(double growth_devices) {
  return static_cast<int>(std::floor(kMaxScore / (1.0 + std::exp(growth_devices))));
}

// The FGD paper's device choice for a shared pod: the device, in index
// order, whose use gives the highest FgdScore; the first one wins a tie.
// Returns the fragmentation after.
double PickFgdDevice(const NodeFree& node, const PodRequest& request, const Workload* workload,
                     Picks* picks) {
  const double before = Frag(node, request, workload);
  int best_score = -1;
  double best = 0;
  for (uint32_t i = 0; i < node.devices.size(); ++i) {
    if (!internal::DeviceUsable(node.devices[i], request)) continue;
    const double f = Frag(Apply(node, request, Picks{i}), request, workload);
    const int score = FgdScore((f - before) / kWholeDevice);
    if (score > best_score) {
      best_score = score;
      best = f;
      *picks = Picks{i};
    }
  }
  return best;
}

// Devices that `cpu_free` (milli) cannot feed when `device_free` milli of
// devices are free and each device milli needs `cpu_per_milli` CPU milli:
// free devices times the share of the CPU they would need that is missing.
double StrandedDevices(uint64_t device_free, int64_t cpu_free, double cpu_per_milli) {
  if (device_free == 0) return 0;
  const double need = static_cast<double>(device_free) * cpu_per_milli;
  const double have = static_cast<double>(std::max<int64_t>(cpu_free, 0));
  return static_cast<double>(device_free) / kWholeDevice * std::max(0.0, 1 - have / need);
}

// Fragmentation-aware device choice for a shared pod: the device whose use
// makes the node's fragmentation grow least; ties go to the fuller device.
// Returns the fragmentation after.
double PickLeastFragmenting(const NodeFree& node, const PodRequest& request,
                            const Workload* workload, Picks* picks) {
  double best = std::numeric_limits<double>::infinity();
  uint32_t best_free = 0;
  absl::InlinedVector<uint32_t, 8> tried;  // free values already measured
  for (uint32_t i = 0; i < node.devices.size(); ++i) {
    const DeviceFree& d = node.devices[i];
    if (!internal::DeviceUsable(d, request)) continue;
    // Devices with equal free capacity (and model) are interchangeable.
    bool seen = false;
    for (uint32_t j : tried) {
      if (node.devices[j].free == d.free && SameModel(node.devices[j], d)) seen = true;
    }
    if (seen) continue;
    tried.push_back(i);
    const double f = Frag(Apply(node, request, Picks{i}), request, workload);
    if (f < best || (f == best && d.free < best_free)) {
      best = f;
      best_free = d.free;
      *picks = Picks{i};
    }
  }
  return best;
}

Eval EvaluateFree(const NodeFree& node, const PodRequest& request, Policy policy,
                  const Workload* workload) {
  Eval e;
  const bool fragmentation_aware = policy == Policy::kFgd || policy == Policy::kDuet;
  double frag_after = 0;
  if (request.count == 0) {
    // Nothing to pick.
  } else if (policy == Policy::kFgd && request.shared()) {
    frag_after = PickFgdDevice(node, request, workload, &e.picks);
  } else if (fragmentation_aware && request.shared()) {
    frag_after = PickLeastFragmenting(node, request, workload, &e.picks);
  } else {
    e.picks = PickBestFit(node, request);
  }
  const NodeFree after = Apply(node, request, e.picks);
  if (fragmentation_aware && !(request.shared())) frag_after = Frag(after, request, workload);

  switch (policy) {
    case Policy::kLeastAllocated:
      e.raw = FreeFraction(after, request.kind);
      e.score = Clamp(kMaxScore * e.raw);
      break;
    case Policy::kMostAllocated:
      e.raw = 1 - FreeFraction(after, request.kind);
      e.score = Clamp(kMaxScore * e.raw);
      break;
    case Policy::kBestFit: {
      const double free_devices = DeviceTotals(after, request.kind).free / double{kWholeDevice};
      e.raw = -(free_devices + 0.001 * CpuFreeFraction(after));
      // 0 free devices scores 100; eight or more free scores 0.
      e.score = Clamp(kMaxScore * (1 - free_devices / 8));
      break;
    }
    case Policy::kFgd: {
      // Growth of fragmentation, in whole devices (negative when it shrinks),
      // scored as the paper's simulator scores it: an integer, and nodes of
      // equal score tie.
      const double growth = (frag_after - Frag(node, request, workload)) / kWholeDevice;
      e.score = FgdScore(growth);
      e.raw = e.score;
      break;
    }
    case Policy::kDuet: {
      const double growth = (frag_after - Frag(node, request, workload)) / kWholeDevice;
      e.raw = -growth;
      const Totals t = DeviceTotals(after, request.kind);
      const double used = t.capacity == 0 ? 0 : 1 - static_cast<double>(t.free) / t.capacity;
      e.raw += kDuetPackWeight * used;
      const double cpu_per_milli =
          workload == nullptr ? 0 : workload->cpu_per_device_milli(request.kind);
      if (cpu_per_milli > 0 && t.capacity > 0 && node.cpu_capacity > 0) {
        // Before the placement: the picked devices' share and the pod's CPU back.
        const uint64_t free_before = t.free + uint64_t{request.milli} * e.picks.size();
        e.raw -= kDuetCpuWeight *
                 (StrandedDevices(t.free, after.cpu_free, cpu_per_milli) -
                  StrandedDevices(free_before, node.cpu_free, cpu_per_milli));
      }
      // No growth scores 50; growing by eight devices scores 0, shrinking by
      // eight scores 100.
      e.score = Clamp(kMaxScore / 2.0 * (1 + e.raw / 8));
      break;
    }
  }
  return e;
}

std::vector<HeldDevice> ToHeld(const NodeFree& node, const PodRequest& request,
                               const Picks& picks) {
  std::vector<HeldDevice> held;
  held.reserve(picks.size());
  for (uint32_t p : picks) held.push_back({node.devices[p].kind, node.devices[p].index, request.milli});
  std::sort(held.begin(), held.end(), [](const HeldDevice& a, const HeldDevice& b) {
    return std::make_pair(a.kind, a.index) < std::make_pair(b.kind, b.index);
  });
  return held;
}

}  // namespace

absl::Span<const PolicyEntry> RegisteredPolicies() {
  static constexpr PolicyEntry kPolicies[] = {
      {Policy::kDuet, "duet", nullptr},
      {Policy::kLeastAllocated, "spread", "least-allocated"},
      {Policy::kMostAllocated, "most-allocated", nullptr},
      {Policy::kBestFit, "best-fit", nullptr},
      {Policy::kFgd, "fgd", nullptr},
  };
  return kPolicies;
}

std::string PolicyNamesText() {
  std::string out;
  const absl::Span<const PolicyEntry> all = RegisteredPolicies();
  for (size_t i = 0; i < all.size(); ++i) {
    if (i > 0) out += i + 1 == all.size() ? " or " : ", ";
    out += all[i].name;
  }
  return out;
}

const char* PolicyName(Policy policy) {
  for (const PolicyEntry& e : RegisteredPolicies()) {
    if (e.policy == policy) return e.name;
  }
  return "unknown";
}

absl::StatusOr<Policy> ParsePolicy(absl::string_view name) {
  for (const PolicyEntry& e : RegisteredPolicies()) {
    if (name == e.name || (e.alias != nullptr && name == e.alias)) return e.policy;
  }
  std::string names;
  for (const PolicyEntry& e : RegisteredPolicies()) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", e.name);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown policy \"", name, "\"; one of ", names));
}

bool Fits(const NodeView& view, const NodeLoad& load, const PodRequest& request,
          std::string* reason) {
  if (QuickFits(view, load, request)) return true;
  // Does not fit: the full check only to word the reason (same verdict).
  if (reason == nullptr) return false;
  return CheckFits(view, internal::Summarize(view, load), request, reason);
}

Scorer::Scorer(Policy policy, const Workload* workload, const DomainUsage* domains)
    : policy_(policy), workload_(workload), domains_(domains) {}

double Scorer::DomainTerm(const NodeView& view) const {
  if (policy_ != Policy::kDuet || domains_ == nullptr) return 0;
  return kDuetDomainWeight * domains_->NodePacking(view.spec.name);
}

std::optional<Placement> Scorer::Evaluate(const NodeView& view, const NodeLoad& load,
                                          const PodRequest& request, std::string* reason) const {
  // Nodes where the request does not fit cost no summary unless the
  // caller wants the reason.
  if (reason == nullptr && !QuickFits(view, load, request)) return std::nullopt;
  const NodeFree node = internal::Summarize(view, load);
  if (!CheckFits(view, node, request, reason)) return std::nullopt;
  Eval e = EvaluateFree(node, request, policy_, workload_);
  Placement p;
  p.devices = ToHeld(node, request, e.picks);
  p.raw = e.raw + DomainTerm(view);
  p.score = e.score;
  return p;
}

std::optional<double> Scorer::Raw(const NodeView& view, const NodeLoad& load,
                                  const PodRequest& request) const {
  if (!QuickFits(view, load, request)) return std::nullopt;
  const NodeFree node = internal::Summarize(view, load);
  if (!CheckFits(view, node, request, nullptr)) return std::nullopt;
  return EvaluateFree(node, request, policy_, workload_).raw + DomainTerm(view);
}

NodeFree PrepareNode(const NodeView& view) { return internal::Summarize(view, NodeLoad{}); }

std::optional<double> PreparedRaw(const Scorer& scorer, const NodeFree& prepared,
                                  const NodeLoad& load, const PodRequest& request,
                                  double domain_packing) {
  // QuickFits' checks, in its order, on the prepared summary (Summarize's
  // capacities: 0 means untracked).
  if (!prepared.ready) return std::nullopt;
  if (prepared.cpu_capacity != 0 &&
      prepared.cpu_capacity - static_cast<int64_t>(load.cpu_milli) <
          static_cast<int64_t>(request.cpu_milli)) {
    return std::nullopt;
  }
  if (prepared.mem_capacity != 0 &&
      prepared.mem_capacity - static_cast<int64_t>(load.memory_mib) <
          static_cast<int64_t>(request.memory_mib)) {
    return std::nullopt;
  }
  if (request.count > 0) {
    uint32_t usable = 0;
    for (const DeviceFree& d : prepared.devices) {
      if (d.kind != request.kind || d.free < request.milli) continue;
      if (!request.models.empty() && !request.AcceptsModel(*d.model, d.model_id)) continue;
      if (++usable >= request.count) break;
    }
    if (usable < request.count) return std::nullopt;
  }
  // Raw's Summarize(view, load): the prepared summary with the load applied
  // (a copy only when there is a load). CheckFits would now pass: it makes
  // the checks above.
  double raw;
  if (load.cpu_milli == 0 && load.memory_mib == 0) {
    raw = EvaluateFree(prepared, request, scorer.policy(), scorer.workload()).raw;
  } else {
    NodeFree node = prepared;
    if (node.cpu_capacity != 0) node.cpu_free = node.cpu_capacity - static_cast<int64_t>(load.cpu_milli);
    if (node.mem_capacity != 0) node.mem_free = node.mem_capacity - static_cast<int64_t>(load.memory_mib);
    raw = EvaluateFree(node, request, scorer.policy(), scorer.workload()).raw;
  }
  // Raw adds DomainTerm(view), which is 0 unless kDuet with domains.
  const double term = scorer.policy() != Policy::kDuet || scorer.domains() == nullptr
                          ? 0
                          : kDuetDomainWeight * domain_packing;
  return raw + term;
}

uint32_t Scorer::SlurmWeight(const NodeView& view, const NodeLoad& load) const {
  const NodeFree node = internal::Summarize(view, load);
  if (!node.ready) return kMaxSlurmWeight;
  if (policy_ == Policy::kDuet || policy_ == Policy::kBestFit) {
    // Slurm tries nodes in weight order and takes the first that fits, so
    // ordering by free device milli makes its choice a best fit: the node
    // with the least room that still takes the job. Fully used nodes come
    // first, where CPU-only jobs cost no device capacity.
    // A TPU host (no GPUs) is ordered by its TPU chips the same way.
    Totals t = DeviceTotals(node, DeviceKind::kGpu);
    if (t.capacity == 0) t = DeviceTotals(node, DeviceKind::kTpu);
    return static_cast<uint32_t>(std::min<uint64_t>(1 + t.free, kMaxSlurmWeight));
  }
  double score_sum = 0;
  double weight_sum = 0;
  auto add = [&](const PodRequest& shape, double weight) {
    if (!internal::ShapeFits(node, shape)) return;
    score_sum += weight * EvaluateFree(node, shape, policy_, workload_).score;
    weight_sum += weight;
  };
  if (workload_ != nullptr && !workload_->empty()) {
    for (const Workload::Shape& s : workload_->shapes()) add(s.request, s.weight);
  } else {
    PodRequest one;
    one.count = 1;
    add(one, 1);
  }
  if (weight_sum == 0) return kMaxSlurmWeight;
  const double mean = score_sum / weight_sum;  // 0..kMaxScore
  const double w = 1 + (kMaxScore - mean) / kMaxScore * (kMaxSlurmWeight - 1);
  return static_cast<uint32_t>(std::clamp<double>(std::lround(w), 1, kMaxSlurmWeight));
}

int Score(const NodeView& view, const NodeLoad& load, const PodRequest& request,
          const Scorer& scorer) {
  std::optional<Placement> p = scorer.Evaluate(view, load, request);
  return p.has_value() ? p->score : 0;
}

uint32_t SlurmWeight(const NodeView& view, const NodeLoad& load, const Scorer& scorer) {
  return scorer.SlurmWeight(view, load);
}

std::optional<NodeChoice> SelectNode(absl::Span<const std::shared_ptr<const NodeView>> nodes,
                                     absl::Span<const NodeLoad> loads, const PodRequest& request,
                                     const Scorer& scorer, const std::vector<uint32_t>* only,
                                     uint64_t* tie_state) {
  std::optional<NodeChoice> best;
  NodeFree best_node;
  Picks best_picks;
  uint64_t ties = 0;  // nodes seen with the best raw score so far
  auto consider = [&](size_t i) {
    if (nodes[i] == nullptr) return;
    NodeFree node = internal::Summarize(*nodes[i], loads[i]);
    if (!CheckFits(*nodes[i], node, request, nullptr)) return;
    Eval e = EvaluateFree(node, request, scorer.policy(), scorer.workload());
    e.raw += scorer.DomainTerm(*nodes[i]);
    if (best.has_value() && e.raw < best->placement.raw) return;
    if (best.has_value() && e.raw == best->placement.raw) {
      // Reservoir sampling: the k-th tied node replaces the choice with
      // probability 1/k.
      if (tie_state == nullptr || SplitMix64(tie_state) % ++ties != 0) return;
    } else {
      ties = 1;
    }
    best = NodeChoice{i, Placement{{}, e.raw, e.score}};
    best_node = std::move(node);
    best_picks = std::move(e.picks);
  };
  if (only != nullptr) {
    for (uint32_t i : *only) {
      if (i < nodes.size()) consider(i);
    }
  } else {
    for (size_t i = 0; i < nodes.size(); ++i) consider(i);
  }
  if (best.has_value()) best->placement.devices = ToHeld(best_node, request, best_picks);
  return best;
}

}  // namespace duet::placement
