#include "bench/serve/level_report.h"

#include <algorithm>
#include <map>
#include <utility>

namespace loom::bench {

LevelReport summarize_level(LevelRun run) {
  LevelReport r;
  r.concurrency = run.concurrency;
  r.requests = static_cast<int64_t>(run.records.size());
  r.wall_s = run.wall_s;
  std::vector<double> ttft, itl, tpot, e2e;
  std::map<std::string, int64_t> errors;
  for (const RequestRecord& rec : run.records) {
    if (!rec.ok) {
      ++r.failed;
      ++errors[rec.error];
      continue;
    }
    ++r.ok;
    r.output_tokens += rec.output_tokens;
    e2e.push_back(rec.e2e_s * 1e3);
    if (!rec.has_text) {
      ++r.no_text;
      continue;
    }
    ttft.push_back(rec.ttft_s * 1e3);
    for (double gap : rec.itl_s) itl.push_back(gap * 1e3);
    if (rec.output_tokens > 1) {
      tpot.push_back((rec.e2e_s - rec.ttft_s) * 1e3 / static_cast<double>(rec.output_tokens - 1));
    }
  }
  if (r.wall_s > 0) {
    r.output_throughput = static_cast<double>(r.output_tokens) / r.wall_s;
    r.request_throughput = static_cast<double>(r.ok) / r.wall_s;
  }
  r.ttft_ms = summarize(std::move(ttft));
  r.itl_ms = summarize(std::move(itl));
  r.tpot_ms = summarize(std::move(tpot));
  r.e2e_ms = summarize(std::move(e2e));
  for (auto& [message, count] : errors) r.errors.push_back({message, count});
  std::stable_sort(r.errors.begin(), r.errors.end(),
                   [](const ErrorCount& a, const ErrorCount& b) { return a.count > b.count; });
  r.records = std::move(run.records);
  return r;
}

}  // namespace loom::bench
