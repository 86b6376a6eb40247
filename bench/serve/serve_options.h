// Settings of `loom-bench serve`, read once from the command-line flags (defined in the .cc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace loom::bench {

struct ServeOptions {
  std::string url;      // http://host:port[/base]
  std::string api_key;  // sent as a bearer token when set
  std::string model;    // sent as `model`; empty: the first model /v1/models lists
  std::vector<int> concurrency;
  int requests = 0;  // per level; 0: max(4 * concurrency, 16)
  int input_len = 128;
  int output_len = 64;
  int vocab_lo = 0;  // prompt token ids are drawn uniformly from [vocab_lo, vocab_hi)
  int vocab_hi = 0;  // 0: the server's tokenizer vocabulary size, loom_vocab_size of GET /v1/models
  uint64_t seed = 0;
  int warmup = 2;
  // Ask for each token's logprob, so that every token streams a chunk even where it decodes to no
  // text (a model vocabulary larger than its tokenizer's: random weights, fixtures).
  bool logprobs = false;
  double timeout_s = 600;
  std::string json_path;
  std::string markdown_path;
  std::string plot_path;
};

// The request count of a level of `concurrency` workers.
int requests_for_level(const ServeOptions& options, int concurrency);

// "1,2,4" -> {1, 2, 4}: positive integers at most 4096, no duplicates.
absl::StatusOr<std::vector<int>> parse_concurrency_list(std::string_view text);

// Reads and checks the flags; the error names the flag.
absl::StatusOr<ServeOptions> serve_options_from_flags();

}  // namespace loom::bench
