#pragma once

// prometheus-cpp helpers every duet binary with /metrics uses: families
// built at scrape time (by a prometheus::Collectable) and the exposer, with
// prometheus-cpp's exceptions caught here.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/client_metric.h"
#include "prometheus/exposer.h"
#include "prometheus/metric_family.h"
#include "prometheus/metric_type.h"

namespace duet {

// An empty family of `type` (Counter or Gauge).
prometheus::MetricFamily NewFamily(std::string name, std::string help,
                                   prometheus::MetricType type);

// Adds one sample with `labels` to `family`: its counter or its gauge value,
// by the family's type.
void AddValue(prometheus::MetricFamily* family,
              std::vector<prometheus::ClientMetric::Label> labels, double value);

// /metrics served on `listen` ("host:port"; port 0: any) with `threads`
// threads; nothing registered yet. UNAVAILABLE "<what> <listen>: cannot
// serve /metrics: <why>" when it cannot be bound (prometheus-cpp throws).
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(const std::string& what,
                                                                  const std::string& listen,
                                                                  size_t threads = 2);

}  // namespace duet
