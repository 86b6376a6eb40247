// The flags loom-bench's two subcommands share (`serve`: bench/serve/serve_options.cc, `offline`:
// bench/offline/offline_bench.cc), defined once so that either library links without the other.
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, model, "",
          "serve: the model name sent with each request (default: the first model GET /v1/models "
          "lists); offline: the model directory (or config.json with --random_weights).");
ABSL_FLAG(uint64_t, seed, 0, "Seed of the random prompts (the same seed sends the same prompts).");
ABSL_FLAG(std::string, json, "", "Write every number, the settings and the model id to FILE.");
ABSL_FLAG(std::string, plot, "",
          "Write a PNG to FILE with gnuplot (pngcairo); serve: throughput, TTFT and ITL/TPOT "
          "against concurrency; offline: decode tokens/s against batch beside the roofline.");
