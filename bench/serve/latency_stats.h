// Summary statistics of latency samples for `loom-bench serve`.
//
// Percentile definition (numpy's default, `method="linear"`, Hyndman & Fan type 7): sort the n
// samples x[0] <= ... <= x[n-1]; the q-th percentile (q in [0, 100]) sits at fractional rank
// h = (n - 1) * q / 100 and is x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)]).
// So p0 is the minimum, p100 the maximum, p50 of an even count the mean of the two middle values,
// and every percentile of a single sample is that sample. An empty sample set has no statistics:
// the functions return nullopt and reports print "-" (JSON null).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace loom::bench {

// The q-th percentile of `sorted` (ascending) by the definition above; nullopt when empty.
// REQUIRES: `sorted` is ascending and 0 <= q <= 100 (aborts otherwise: a caller bug).
std::optional<double> percentile_of_sorted(std::span<const double> sorted, double q);

struct LatencySummary {
  int64_t count = 0;
  double mean = 0;
  double min = 0;
  double max = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
};

// Mean, extremes and the p50/p90/p99 of `samples` (any order); nullopt when there are none.
std::optional<LatencySummary> summarize(std::vector<double> samples);

}  // namespace loom::bench
