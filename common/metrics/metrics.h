#pragma once

// prometheus-cpp helpers every duet binary with /metrics uses: families
// built at scrape time (by a prometheus::Collectable) or registered once, and
// the exposer, with its exceptions caught here.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/client_metric.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_family.h"
#include "prometheus/metric_type.h"
#include "prometheus/registry.h"

namespace duet {

// An empty family of `type` (Counter or Gauge).
prometheus::MetricFamily NewFamily(std::string name, std::string help,
                                   prometheus::MetricType type);

// Adds one sample with `labels` to `family`: its counter or its gauge value,
// by the family's type.
void AddValue(prometheus::MetricFamily* family,
              std::vector<prometheus::ClientMetric::Label> labels, double value);

// A family kept in `registry`: `builder` (prometheus::BuildCounter(),
// BuildGauge() or BuildHistogram()) named and described. prometheus-cpp
// throws where the name is invalid or taken by another type.
template <typename Builder>
auto& RegisterFamily(Builder builder, prometheus::Registry& registry, const std::string& name,
                     const std::string& help) {
  return builder.Name(name).Help(help).Register(registry);
}

// /metrics served on `listen` ("host:port"; port 0: any) with `threads`
// threads; nothing registered yet. UNAVAILABLE "<what> <listen>: cannot
// serve /metrics: <why>" when it cannot be bound (prometheus-cpp throws).
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(const std::string& what,
                                                                  const std::string& listen,
                                                                  size_t threads = 2);

}  // namespace duet
