// The numbers `loom-bench serve` reports for one concurrency level, computed from its records.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/serve/latency_stats.h"
#include "bench/serve/load_level.h"

namespace loom::bench {

struct ErrorCount {
  std::string message;
  int64_t count = 0;
};

struct LevelReport {
  int concurrency = 0;
  int64_t requests = 0;  // sent
  int64_t ok = 0;
  int64_t failed = 0;
  int64_t no_text = 0;  // ok requests that streamed no text (see RequestRecord::has_text)
  double wall_s = 0;
  int64_t output_tokens = 0;      // sum of usage.completion_tokens over ok requests
  double output_throughput = 0;   // output_tokens / wall_s (tokens/s)
  double request_throughput = 0;  // ok / wall_s (requests/s)
  // In milliseconds; nullopt when there is no sample. E2E is over ok requests, the others over
  // ok requests that streamed text (ITL needs two text chunks, TPOT two tokens).
  std::optional<LatencySummary> ttft_ms;
  std::optional<LatencySummary> itl_ms;   // every gap of every request, pooled
  std::optional<LatencySummary> tpot_ms;  // per request: (e2e - ttft) / (output_tokens - 1)
  std::optional<LatencySummary> e2e_ms;
  std::vector<ErrorCount> errors;      // distinct failure messages, most frequent first
  std::vector<RequestRecord> records;  // the raw per-request records, in send order
};

LevelReport summarize_level(LevelRun run);

}  // namespace loom::bench
