// `loom-bench offline`: the engine itself, with no server, measured the way issue 15 asks: decode
// throughput and time per output token at several batch sizes over a fixed context, prefill
// throughput of long prompts, and time to first token and per output token at long contexts; each
// figure beside its roofline from ceilings measured in the same run (a device copy, a GEMM in the
// model's matrix dtype) and the model's own byte and FLOP counts (bench/offline/roofline.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::bench {

struct OfflineOptions {
  std::string model;           // a model directory, or a config.json with random_weights
  std::string random_weights;  // a seed: random weights (engine/model/random_weights.h)
  std::string device = "cpu";
  std::string weight_dtype = "auto";
  std::string act_dtype = "auto";
  std::string kv_dtype = "auto";  // KV pages: auto (the activations'), f32, bf16 or fp8
  std::vector<int64_t> batches = {1, 8, 64, 256};
  int64_t context = 4096;     // prompt tokens of each decode-run sequence
  int64_t decode_steps = 64;  // tokens timed per sequence after its first
  std::vector<int64_t> prefill = {8192, 32768};
  std::vector<int64_t> long_context = {};  // e.g. 131072, 1000000
  int64_t long_decode_steps = 16;
  int64_t max_num_batched_tokens = 8192;
  bool cuda_graphs = true;      // decode steps as graph replays (EngineOptions::cuda_graphs)
  int64_t cache_budget_mb = 0;  // 0: derived on a GPU, 1024 on the CPU (the server's rule)
  uint64_t seed = 1;            // prompts' token ids
  std::string json;             // write the report here too
  std::string plot;             // a PNG of decode tokens/s against batch beside the roofline
  std::string replot;           // draw `plot` from this --json report instead of running
};

absl::StatusOr<OfflineOptions> offline_options_from_flags();

// Runs everything the options ask for and prints markdown tables; 0 on success.
int run_offline(const OfflineOptions& options);

}  // namespace loom::bench
