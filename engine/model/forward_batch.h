// ForwardBatch: the tokens of several sequences flattened into one varlen batch.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model/sequence_cache.h"

namespace loom {

enum class LogitsMode : uint8_t {
  kNone,  // no logits (a prefill chunk that is not the prompt's last)
  kLast,  // the sequence's last new token only (prefill end, decode)
  kAll,   // every new token (conformance, prompt logprobs)
};

struct SequenceInput {
  int64_t num_tokens = 0;          // new tokens, consecutive in ForwardBatch::token_ids
  SequenceCache* cache = nullptr;  // holds the sequence's earlier positions; extended in place
  LogitsMode logits = LogitsMode::kLast;
};

struct ForwardBatch {
  std::vector<int32_t> token_ids;   // sum of seqs[i].num_tokens entries
  std::vector<SequenceInput> seqs;  // in token order
};

}  // namespace loom
