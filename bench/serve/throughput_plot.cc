#include "bench/serve/throughput_plot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace loom::bench {
namespace {

// A gnuplot single-quoted string: the quote itself is doubled, and control characters (a newline
// would end the command and let the rest of a hostile model name run as gnuplot commands) become
// spaces.
std::string quoted(const std::string& s) {
  std::string clean = s;
  for (char& ch : clean) {
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = ' ';
  }
  return absl::StrCat("'", absl::StrReplaceAll(clean, {{"'", "''"}}), "'");
}

// NaN is gnuplot's "missing point", for levels without that statistic.
std::string value(const std::optional<LatencySummary>& s, double LatencySummary::*field) {
  return s ? absl::StrFormat("%.6g", (*s).*field) : "NaN";
}

std::string script(const std::vector<LevelReport>& levels, const std::string& title,
                   const std::string& png_path) {
  using S = LatencySummary;
  std::string data;
  std::vector<std::string> tics;
  int lo = levels.front().concurrency, hi = lo;
  for (const LevelReport& r : levels) {
    absl::StrAppend(&data, r.concurrency, " ", absl::StrFormat("%.6g", r.output_throughput), " ",
                    value(r.ttft_ms, &S::p50), " ", value(r.ttft_ms, &S::p99), " ",
                    value(r.itl_ms, &S::p50), " ", value(r.itl_ms, &S::p99), " ",
                    value(r.tpot_ms, &S::p50), " ", value(r.tpot_ms, &S::p99), "\n");
    tics.push_back(absl::StrCat(r.concurrency));
    lo = std::min(lo, r.concurrency);
    hi = std::max(hi, r.concurrency);
  }
  // A log2 x axis spreads 1..32 evenly; the range pads both ends so one level still plots.
  return absl::StrCat(
      "set terminal pngcairo noenhanced size 1500,480 font 'sans,10'\n", "set output ",
      quoted(png_path), "\n", "$levels << EOD\n", data, "EOD\n", "set multiplot layout 1,3 title ",
      quoted(title), "\n", "set logscale x 2\n",
      absl::StrFormat("set xrange [%g:%g]\n", lo / 1.5, hi * 1.5), "set xtics (",
      absl::StrJoin(tics, ", "), ")\n", "set xlabel 'concurrency (requests in flight)'\n",
      "set grid\nset key top left\nset yrange [0:*]\n",
      "set title 'Output throughput'\nset ylabel 'tokens/s'\n",
      "plot $levels using 1:2 with linespoints lw 2 title 'output tokens/s'\n",
      "set title 'Time to first token'\nset ylabel 'ms'\n",
      "plot $levels using 1:3 with linespoints lw 2 title 'TTFT p50', ",
      "'' using 1:4 with linespoints lw 2 title 'TTFT p99'\n",
      "set title 'Inter-token latency and time per output token'\nset ylabel 'ms'\n",
      "plot $levels using 1:5 with linespoints lw 2 title 'ITL p50', ",
      "'' using 1:6 with linespoints lw 2 title 'ITL p99', ",
      "'' using 1:7 with linespoints lw 2 dt 2 title 'TPOT p50', ",
      "'' using 1:8 with linespoints lw 2 dt 2 title 'TPOT p99'\n",
      "unset multiplot\nset output\n");
}

}  // namespace

absl::Status check_gnuplot() {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "", ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/gnuplot");
    if (access(candidate.c_str(), X_OK) == 0) return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      "--plot needs gnuplot, which is not on PATH (Debian: apt-get install gnuplot-nox)");
}

absl::Status write_plot(const std::vector<LevelReport>& levels, const std::string& title,
                        const std::string& png_path) {
  if (levels.empty()) return absl::InvalidArgumentError("--plot: no levels to plot");
  if (absl::Status s = check_gnuplot(); !s.ok()) return s;
  std::error_code ec;
  std::filesystem::remove(png_path, ec);  // so a stale file cannot pass for gnuplot's output
  FILE* pipe = popen("gnuplot", "w");
  if (pipe == nullptr) return absl::InternalError("--plot: cannot start gnuplot");
  const std::string text = script(levels, title, png_path);
  const bool written = std::fwrite(text.data(), 1, text.size(), pipe) == text.size();
  const int status = pclose(pipe);
  if (!written || status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("--plot: gnuplot failed (exit status ",
                                            WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                                            "; its messages are above)"));
  }
  if (std::filesystem::file_size(png_path, ec) == 0 || ec) {
    return absl::InternalError(absl::StrCat("--plot: gnuplot wrote no image to ", png_path));
  }
  return absl::OkStatus();
}

}  // namespace loom::bench
