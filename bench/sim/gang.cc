#include "bench/sim/gang.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/sim/replay.h"
#include "bench/sim/rng.h"

namespace duet::sim {
namespace {

// The gang stream's own seed: independent of MakeArrivals' shuffle.
constexpr uint64_t kGangSeedMix = 0x6A09E667F3BCC909ull;

uint64_t CapacityMilli(const Trace& trace) {
  uint64_t c = 0;
  for (const NodeSpec& n : trace.nodes) {
    for (const DeviceSpec& d : n.devices) c += d.capacity_milli;
  }
  return c;
}

}  // namespace

absl::StatusOr<GangMix> ParseGangMix(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  if (parts.size() < 2 || parts.size() > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gangs: \"", text, "\" is not SHARE,MIN-MAX[,GAP] (e.g. 0.5,2-8)"));
  }
  GangMix mix;
  if (!absl::SimpleAtod(parts[0], &mix.share) || !(mix.share > 0 && mix.share <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gangs: share \"", parts[0], "\" must be a number in (0, 1]"));
  }
  const std::vector<absl::string_view> range = absl::StrSplit(parts[1], '-');
  if (range.size() != 2 || !absl::SimpleAtoi(range[0], &mix.min_size) ||
      !absl::SimpleAtoi(range[1], &mix.max_size) || mix.min_size < 2 ||
      mix.max_size < mix.min_size || mix.max_size > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gangs: sizes \"", parts[1], "\" must be MIN-MAX with 2 <= MIN <= MAX <= 64"));
  }
  if (parts.size() == 3 && (!absl::SimpleAtoi(parts[2], &mix.gap) || mix.gap < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gangs: gap \"", parts[2], "\" must be a whole number >= 1"));
  }
  return mix;
}

std::vector<Arrival> AddGangs(const Trace& trace, const std::vector<Arrival>& base,
                              const GangMix& mix, uint64_t seed, double max_arrival) {
  Rng rng(seed ^ kGangSeedMix);
  const double limit = max_arrival * static_cast<double>(CapacityMilli(trace));
  std::vector<Arrival> out;
  double requested = 0;
  // Members still to come: (due output position, gang id, member) -> arrival.
  std::map<std::pair<size_t, std::pair<uint32_t, uint32_t>>, Arrival> pending;
  uint32_t gangs = 0;
  auto emit = [&](const Arrival& a) {
    out.push_back(a);
    requested += static_cast<double>(trace.pods[a.pod].request.device_milli());
  };
  size_t next = 0;
  while (!pending.empty() || (next < base.size() && requested < limit)) {
    if (!pending.empty() &&
        (pending.begin()->first.first <= out.size() || next >= base.size() || requested >= limit)) {
      emit(pending.begin()->second);
      pending.erase(pending.begin());
      continue;
    }
    Arrival a = base[next++];
    const placement::PodRequest& req = trace.pods[a.pod].request;
    const bool eligible = a.world == World::kKubernetes && req.count >= 2 && !req.shared();
    // The draw is made for eligible arrivals only, so a share's gangs are a
    // subset of a larger share's for the same seed.
    if (eligible && rng.Unit() < mix.share) {
      const uint32_t size =
          mix.min_size + static_cast<uint32_t>(rng.Below(mix.max_size - mix.min_size + 1));
      a.gang = ++gangs;
      a.gang_size = size;
      const size_t start = out.size();
      for (uint32_t m = 1; m < size; ++m) {
        Arrival member = a;
        member.member = m;
        pending.emplace(std::make_pair(start + size_t{m} * mix.gap, std::make_pair(a.gang, m)),
                        member);
      }
    }
    emit(a);
  }
  return out;
}

absl::StatusOr<SimTopology> ParseSimTopology(absl::string_view text) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  SimTopology t;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &t.clique) ||
      !absl::SimpleAtoi(parts[1], &t.subblock) || !absl::SimpleAtoi(parts[2], &t.block) ||
      t.clique < 1 || t.subblock % t.clique != 0 || t.subblock < t.clique || t.block < t.subblock ||
      t.block % t.subblock != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--topology: \"", text,
                                                   "\" is not CLIQUE,SUBBLOCK,BLOCK in nodes, each "
                                                   ">= 1 and dividing the next (e.g. 4,16,64)"));
  }
  return t;
}

placement::NodeTopology TopologyOfIndex(const SimTopology& topology, uint32_t index,
                                        const std::string& name) {
  placement::NodeTopology t;
  t.block = absl::StrCat("b", index / topology.block);
  t.subblock = absl::StrCat(t.block, "/s", index / topology.subblock);
  t.clique = absl::StrCat("c", index / topology.clique);
  t.host = name;
  return t;
}

placement::DomainLevel LevelOf(const SimTopology& topology, const std::vector<uint32_t>& indices) {
  using placement::DomainLevel;
  auto same = [&](uint32_t size) {
    return std::all_of(indices.begin(), indices.end(),
                       [&](uint32_t i) { return i / size == indices.front() / size; });
  };
  if (same(1)) return DomainLevel::kNode;
  if (same(topology.clique)) return DomainLevel::kClique;
  if (same(topology.subblock)) return DomainLevel::kSubblock;
  if (same(topology.block)) return DomainLevel::kBlock;
  return DomainLevel::kPool;
}

}  // namespace duet::sim
