// SamplingParams: how one request turns logits into tokens, and when it stops.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace loom {

struct SamplingParams {
  // Distribution shaping, applied in this order: logit bias, penalties, temperature, top-k,
  // top-p, min-p.
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the token's logit (OpenAI's)
  float temperature = 1.0f;         // 0: greedy (argmax; ties go to the lower token id)
  int top_k = 0;                    // 0: off
  float top_p = 1.0f;               // nucleus; 1: off
  float min_p = 0.0f;               // keep tokens with p >= min_p * p_max; 0: off
  float repetition_penalty = 1.0f;  // over prompt and output tokens (divide positive logits)
  float presence_penalty = 0.0f;    // over output tokens: -= presence * [count > 0]
  float frequency_penalty = 0.0f;   // over output tokens: -= frequency * count
  std::optional<uint64_t> seed;     // same seed, same logits -> same tokens, whatever the batch

  // Stopping.
  int max_tokens = 16;                  // generated tokens, at least 1
  int min_tokens = 0;                   // EOS and stop tokens are masked until this many
  bool ignore_eos = false;              // keep going past EOS
  std::vector<int32_t> stop_token_ids;  // in addition to the model's EOS
  std::vector<std::string> stop;        // stop strings (matched on detokenized text)

  // Output.
  int logprobs = -1;  // -1: none; 0: the chosen token's logprob; k > 0: also the top k
  int n = 1;          // independent samples sharing one prefill

  // InvalidArgument naming the field ("temperature = 3: expected [0, 2]") when out of range
  // (vocab_size bounds top_k and token ids). The one definition of the ranges: the engine checks it
  // on submit, and both API frontends (server/openai_request.cc, server/grpc_convert.cc) answer
  // with it, so HTTP and gRPC accept exactly the same values.
  absl::Status validate(int vocab_size) const;
  // The part of validate() that needs neither the vocabulary nor max_tokens (the distribution
  // shaping and penalty ranges), for parsers that check fields before those are known.
  absl::Status validate_ranges() const;
};

// Upper bounds enforced by validate(): they keep one request from monopolising a step's work.
inline constexpr float kMaxTemperature = 2.0f;  // OpenAI's range; beyond it output is noise
inline constexpr int kMaxLogprobs = 20;
inline constexpr int kMaxN = 16;
inline constexpr int kMaxStopStrings = 16;
inline constexpr int kMaxStopStringBytes = 256;
inline constexpr int kMaxLogitBias = 1024;           // entries (OpenAI allows 300)
inline constexpr float kMaxLogitBiasValue = 100.0f;  // |bias| (OpenAI's range: -100 to 100)

}  // namespace loom
