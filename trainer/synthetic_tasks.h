// Built-in synthetic training and evaluation tasks. Each example is a token sequence with a loss
// mask: mask[i] = 1 when predicting tokens[i + 1] from position i counts (the answers only).
//
// - MQAR (multi-query associative recall, Zoology): N key-value pairs, then every key again in a
//   random order, each followed by its value; only the recalled values are scored. Token ids are
//   drawn from two disjoint ranges of the vocabulary, so any model can train on it. The queries
//   follow the pairs directly, or (spread) sit in random two-token slots over the rest of the
//   sequence with padding between them, so that recall spans the whole length.
// - Passkey retrieval: filler text with "The pass key is NNNNN. Remember it." at a chosen depth,
//   then "What is the pass key? The pass key is" and the digits; only the digits are scored. Built
//   with the model's tokenizer so the trained model retrieves passkeys in plain text.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"

namespace loom {

struct Example {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;  // same length as tokens; the last entry is always 0
  // Scored positions and what they must predict (tokens[i + 1] for each i with mask[i] = 1).
  int64_t scored() const;
};

// What a training run does to a drawn example (trainer/train_run.cc):
// - drop_unscored_tail cuts the tokens after the last scored prediction (MQAR's padding). A causal
//   model's predictions at the scored positions do not depend on later tokens, so the run trains
//   on the same objective at less compute. An example with nothing scored is left alone.
// - score_all_tokens (data.loss "all") scores every next-token prediction: language modelling on
//   the whole example (a passkey's filler, MQAR's keys), not only the answers.
void drop_unscored_tail(Example& ex);
void score_all_tokens(Example& ex);

struct MqarOptions {
  int num_pairs = 16;
  // > 0: each example draws its number of pairs uniformly from [min_pairs, num_pairs] (Zoology
  // trains on a mix of pair counts; the easy examples start recall learning); 0 (or num_pairs):
  // num_pairs, drawing nothing.
  int min_pairs = 0;
  int seq_len = 256;  // padded with pad_id after the queries (unscored)
  // false: the queries directly after the pairs. true: the seq_len - 2 num_pairs tokens after the
  // pairs are two-token slots, num_pairs of them (drawn uniformly, kept in order) hold the queries
  // in a random order and the others pad_id.
  bool spread = false;
  int32_t key_begin = 1, num_keys = 128;  // keys: ids [key_begin, key_begin + num_keys)
  int32_t value_begin = 129, num_values = 128;
  int32_t pad_id = 0;

  // InvalidArgument when the pairs do not fit (4 tokens per pair), there are fewer keys than
  // pairs, or the key and value ranges overlap or the pad id is in either.
  absl::Status validate() const;
};
Example make_mqar(const MqarOptions& options, std::mt19937_64& rng);

struct PasskeyOptions {
  int64_t context_tokens = 1024;  // about this many tokens of prompt (filler included)
  double depth = 0.5;             // where the passkey sentence sits, 0 = start, 1 = end
  int digits = 5;
};
// InvalidArgument for a depth outside [0, 1], digits outside [1, 9] or a context too short for
// the sentences themselves.
absl::StatusOr<Example> make_passkey(const Tokenizer& tokenizer, const PasskeyOptions& options,
                                     std::mt19937_64& rng, std::string* passkey = nullptr);

// Passkey examples to train on (data.task passkey, or in a mix): each one's context is drawn
// uniformly from [min_context, the longest whose example still fits seq_len] and its depth
// uniformly from [0, 1], so a model learns to retrieve from every position of every length up to
// the sequence it trains at.
struct PasskeyTrainOptions {
  int64_t min_context = 256;
  int digits = 5;

  // The longest context whose example fits `seq_len` tokens: the answer (a space and the digits)
  // takes at most digits + 1 of them.
  int64_t max_context(int64_t seq_len) const { return seq_len - digits - 1; }
  // InvalidArgument when digits is outside [1, 9] or min_context outside [1, max_context].
  absl::Status validate(int64_t seq_len) const;
};
absl::StatusOr<Example> draw_passkey(const Tokenizer& tokenizer, const PasskeyTrainOptions& options,
                                     int64_t seq_len, std::mt19937_64& rng);

}  // namespace loom
