// One concurrency level of `loom-bench serve`: a closed loop in which `concurrency` workers each
// send their next request as soon as their previous one finished, until every body is sent.
#pragma once

#include <string>
#include <vector>

#include "bench/serve/stream_request.h"
#include "clients/cpp/http_client.h"

namespace loom::bench {

struct LevelRun {
  int concurrency = 0;
  std::vector<RequestRecord> records;  // records[i] is bodies[i]'s
  double wall_s = 0;                   // first send to last completion
};

// Sends every body in `bodies` (streaming completion requests) with `concurrency` threads, each
// with its own client. Blocks until all are done; failures are in the records.
// REQUIRES: concurrency >= 1.
LevelRun run_level(const client::ServerUrl& url, const client::HttpClientOptions& options,
                   int concurrency, const std::vector<std::string>& bodies);

}  // namespace loom::bench
