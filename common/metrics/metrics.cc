#include "common/metrics/metrics.h"

#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace duet {

prometheus::MetricFamily NewFamily(std::string name, std::string help,
                                   prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

void AddValue(prometheus::MetricFamily* family,
              std::vector<prometheus::ClientMetric::Label> labels, double value) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (family->type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  family->metric.push_back(std::move(m));
}

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(const std::string& what,
                                                                  const std::string& listen,
                                                                  size_t threads) {
  try {
    return std::make_unique<prometheus::Exposer>(listen, threads);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(what, " ", listen, ": cannot serve /metrics: ", e.what()));
  }
}

}  // namespace duet
