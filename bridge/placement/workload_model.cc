#include "bridge/placement/workload_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace duet::placement {
namespace {

// Scaled weights are rebased once 2^exponent passes 2^kRebaseExponent, far
// from a double's range.
constexpr double kRebaseExponent = 64;

}  // namespace

absl::Status ValidateWorkloadModelOptions(const WorkloadModelOptions& o,
                                          absl::string_view prefix) {
  if (!(o.coverage > 0 && o.coverage <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "coverage: must be in (0, 1], got ",
                                                   o.coverage));
  }
  if (o.half_life <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "half_life: must be positive (or infinite), got ",
                     absl::FormatDuration(o.half_life)));
  }
  if (o.max_shapes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "max_shapes: must be at least 1"));
  }
  if (o.max_tracked < o.max_shapes) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "max_tracked: must be at least ",
                                                   "max_shapes (", o.max_shapes, "), got ",
                                                   o.max_tracked));
  }
  if (o.refresh < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "refresh: must not be negative"));
  }
  if (!(o.min_change >= 0 && o.min_change <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "min_change: must be in [0, 1], got ",
                                                   o.min_change));
  }
  return absl::OkStatus();
}

PodRequest ShapeOf(const PodRequest& request, uint64_t memory_granularity_mib) {
  PodRequest s;
  s.kind = request.kind;
  s.count = request.count;
  s.milli = request.count == 0 ? kWholeDevice : request.milli;
  s.models = request.models;
  std::sort(s.models.begin(), s.models.end());
  s.cpu_milli = request.cpu_milli;
  if (memory_granularity_mib > 0 && request.memory_mib > 0) {
    s.memory_mib = (request.memory_mib + memory_granularity_mib - 1) / memory_granularity_mib *
                   memory_granularity_mib;
  }
  return s;
}

WorkloadModel::WorkloadModel(WorkloadModelOptions options)
    : options_(std::move(options)), current_(std::make_shared<Workload>()) {}

double WorkloadModel::ScaleLocked(absl::Time now) {
  if (options_.half_life == absl::InfiniteDuration()) return 1;
  // Time never runs backwards here: an earlier `now` counts as the latest.
  latest_ = std::max(latest_, now);
  if (epoch_ == absl::InfinitePast()) epoch_ = latest_;
  double exponent = absl::FDivDuration(latest_ - epoch_, options_.half_life);
  if (exponent > kRebaseExponent) {
    const double factor = std::exp2(-exponent);
    for (auto& [key, e] : table_) e.scaled *= factor;
    total_scaled_ *= factor;
    epoch_ = latest_;
    exponent = 0;
  }
  return std::exp2(exponent);
}

WorkloadModel::Key WorkloadModel::KeyOf(const PodRequest& shape) {
  return Key{shape.kind,   shape.count,     shape.count == 0 ? 0 : shape.milli,
             shape.models, shape.cpu_milli, shape.memory_mib};
}

bool WorkloadModel::Observe(absl::string_view key, const PodRequest& request, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!key.empty()) {
    if (!keys_.insert(std::string(key)).second) {
      ++duplicates_;
      return false;
    }
    key_order_.emplace_back(key);
    while (key_order_.size() > options_.max_keys) {
      keys_.erase(key_order_.front());
      key_order_.pop_front();
    }
  }
  const double w = ScaleLocked(now);
  PodRequest shape = ShapeOf(request, options_.memory_granularity_mib);
  Key k = KeyOf(shape);
  auto it = table_.find(k);
  if (it == table_.end()) {
    if (table_.size() >= options_.max_tracked) {
      auto lightest = table_.begin();
      for (auto j = table_.begin(); j != table_.end(); ++j) {
        if (j->second.scaled < lightest->second.scaled) lightest = j;
      }
      table_.erase(lightest);
      ++evictions_;
    }
    it = table_.emplace(std::move(k), Entry{std::move(shape), 0}).first;
  }
  it->second.scaled += w;
  total_scaled_ += w;
  ++arrivals_;
  ++arrivals_since_reset_;
  ++version_;
  return true;
}

void WorkloadModel::Reset() {
  absl::MutexLock lock(&mu_);
  table_.clear();
  keys_.clear();
  key_order_.clear();
  total_scaled_ = 0;
  arrivals_since_reset_ = 0;
  epoch_ = absl::InfinitePast();
  ++version_;
}

std::vector<const WorkloadModel::Entry*> WorkloadModel::OrderedLocked() const {
  std::vector<std::pair<const Key*, const Entry*>> order;
  order.reserve(table_.size());
  for (const auto& [key, e] : table_) order.emplace_back(&key, &e);
  // Heaviest first; equal weights go to the smaller shape, so the result does
  // not depend on the hash table's order.
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    if (a.second->scaled != b.second->scaled) return a.second->scaled > b.second->scaled;
    return *a.first < *b.first;
  });
  std::vector<const Entry*> out;
  out.reserve(order.size());
  for (const auto& [key, e] : order) out.push_back(e);
  return out;
}

void WorkloadModel::RebuildLocked(absl::Time now) const {
  std::vector<Workload::Shape> shapes;
  std::vector<std::pair<Key, double>> keyed;
  double covered = 0;
  const bool warming_up = arrivals_since_reset_ < options_.min_arrivals;
  for (const Entry* e : warming_up ? std::vector<const Entry*>() : OrderedLocked()) {
    if (shapes.size() >= options_.max_shapes) break;
    if (covered >= options_.coverage * total_scaled_) break;
    shapes.push_back(Workload::Shape{e->shape, e->scaled});
    keyed.emplace_back(KeyOf(e->shape), e->scaled);
    covered += e->scaled;
  }
  for (auto& kw : keyed) kw.second /= covered;
  std::sort(keyed.begin(), keyed.end());
  built_version_ = version_;
  built_at_ = now;
  // The published shapes are the same set when it stays: this is their share now.
  built_coverage_ = total_scaled_ > 0 ? covered / total_scaled_ : 0;
  if (current_ != nullptr && options_.min_change > 0 && keyed.size() == published_.size()) {
    double moved = 0;
    bool same = true;
    for (size_t i = 0; i < keyed.size() && same; ++i) {
      same = keyed[i].first == published_[i].first;
      moved += std::abs(keyed[i].second - published_[i].second);
    }
    if (same && moved / 2 < options_.min_change) return;
  }
  current_ = std::make_shared<const Workload>(std::move(shapes));
  published_ = std::move(keyed);
}

std::shared_ptr<const Workload> WorkloadModel::Current(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  if (built_version_ != version_ &&
      (built_version_ == ~uint64_t{0} || now - built_at_ >= options_.refresh ||
       now < built_at_)) {
    RebuildLocked(now);
  }
  return current_;
}

WorkloadModel::Stats WorkloadModel::stats(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  if (built_version_ != version_) RebuildLocked(now);
  Stats s;
  s.tracked = table_.size();
  s.exported = current_->shapes().size();
  s.coverage = built_coverage_;
  double decay = 1;
  if (options_.half_life != absl::InfiniteDuration() && epoch_ != absl::InfinitePast()) {
    decay = std::exp2(-absl::FDivDuration(std::max(latest_, now) - epoch_, options_.half_life));
  }
  s.total_weight = total_scaled_ * decay;
  s.arrivals = arrivals_;
  s.duplicates = duplicates_;
  s.evictions = evictions_;
  s.warming_up = arrivals_since_reset_ < options_.min_arrivals;
  for (const Entry* e : OrderedLocked()) {
    if (s.shapes.size() >= s.exported) break;
    s.shapes.push_back(ShapeStat{e->shape, e->scaled * decay,
                                 total_scaled_ > 0 ? e->scaled / total_scaled_ : 0});
  }
  return s;
}

}  // namespace duet::placement
