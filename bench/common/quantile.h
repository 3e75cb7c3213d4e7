#pragma once

// The summaries every benchmark reports. A quantile is a measured sample, no
// interpolation: of n samples, the one at rank floor(q * n) in ascending
// order (the last for q = 1), so p99 of 100 samples is the largest. A median
// of runs is the usual one: the middle run, or the mean of the two middle
// runs of an even count.

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace duet::bench {

// The q-quantile (0 <= q <= 1) of `samples`; 0 when there are none.
inline double Quantile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  const size_t n = samples.size();
  const size_t rank = std::min(n - 1, static_cast<size_t>(q * static_cast<double>(n)));
  std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(rank),
                   samples.end());
  return samples[rank];
}

// The median of `samples`; 0 when there are none.
inline double Median(std::vector<double> samples) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const size_t m = samples.size() / 2;
  return samples.size() % 2 == 1 ? samples[m] : (samples[m - 1] + samples[m]) / 2;
}

}  // namespace duet::bench
