// The PNG of a `loom-bench serve` run, drawn by gnuplot (pngcairo terminal): output throughput,
// TTFT p50/p99 and ITL/TPOT p50/p99, each against concurrency.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/serve/level_report.h"

namespace loom::bench {

// OK when a `gnuplot` executable is on PATH; checked before a run so that a long benchmark does
// not end without its plot.
absl::Status check_gnuplot();

// Pipes a script with the data inline to `gnuplot` and checks that it wrote `png_path`.
absl::Status write_plot(const std::vector<LevelReport>& levels, const std::string& title,
                        const std::string& png_path);

}  // namespace loom::bench
