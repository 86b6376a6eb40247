// `loom-bench serve`: measures a running OpenAI-compatible server (loom-server or another) under
// closed-loop load at several concurrencies and reports throughput and latency percentiles.
#pragma once

#include "bench/serve/serve_options.h"

namespace loom::bench {

// Probes the server, sends the warm-up requests, runs every level in order, prints the table on
// stdout (progress and errors on stderr) and writes the --json / --markdown / --plot files.
// Returns the process exit status: 0 when every request succeeded, 1 when any failed or the
// server could not be used, 2 for settings the server makes impossible.
int run_serve(ServeOptions options);

}  // namespace loom::bench
