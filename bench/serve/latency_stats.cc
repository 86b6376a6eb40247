#include "bench/serve/latency_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace loom::bench {

std::optional<double> percentile_of_sorted(std::span<const double> sorted, double q) {
  if (!(q >= 0 && q <= 100) || !std::is_sorted(sorted.begin(), sorted.end())) {
    std::fprintf(stderr, "percentile_of_sorted: q = %g must be in [0, 100] on ascending input\n",
                 q);
    std::abort();
  }
  if (sorted.empty()) return std::nullopt;
  const double h = static_cast<double>(sorted.size() - 1) * q / 100.0;
  const size_t lo = static_cast<size_t>(std::floor(h));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (h - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

std::optional<LatencySummary> summarize(std::vector<double> samples) {
  if (samples.empty()) return std::nullopt;
  std::sort(samples.begin(), samples.end());
  LatencySummary s;
  s.count = static_cast<int64_t>(samples.size());
  double sum = 0;
  for (double v : samples) sum += v;
  s.mean = sum / static_cast<double>(samples.size());
  s.min = samples.front();
  s.max = samples.back();
  s.p50 = *percentile_of_sorted(samples, 50);
  s.p90 = *percentile_of_sorted(samples, 90);
  s.p99 = *percentile_of_sorted(samples, 99);
  return s;
}

}  // namespace loom::bench
