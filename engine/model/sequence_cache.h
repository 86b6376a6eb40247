// SequenceCache: everything one sequence carries from one forward call to the next, for tools and
// tests that run sequences without a serving engine.
//
// It is a CacheStore of its own with one state slot (0) and, for models with attention layers, one
// page (0) holding positions [0, capacity()): per layer the same states and cached rows as the
// engine's store (CacheStore documents them). Model::forward runs it through the one store path
// the engine uses, so layers and kernels never see a private cache. Rows [0, num_tokens()) are
// valid.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/model/cache_store.h"
#include "weights/model_config.h"

namespace loom {

class SequenceCache {
 public:
  // On `device` (the model's): f32 pages, convolution tails in `act_dtype` (the model's).
  explicit SequenceCache(const ModelConfig& cfg, Device device = Device::kCpu,
                         DType act_dtype = DType::kF32);

  // Positions already processed (the next token's position).
  int64_t num_tokens() const { return num_tokens_; }
  // Positions page 0 holds (0 until the first reserve, and for models without attention layers).
  int64_t capacity() const { return capacity_; }
  // Slot 0 and page 0 (the model writes through them).
  CacheStore& store() { return store_; }
  const CacheStore& store() const { return store_; }

  // Makes room for `n` more positions (amortised doubling: a longer page, the rows copied over).
  void reserve(int64_t n);
  // Called by the model once all layers have consumed `n` new tokens.
  void advance(int64_t n) { num_tokens_ += n; }
  // Bytes held (for accounting and tests).
  size_t nbytes() const;

 private:
  ModelConfig cfg_;  // to build the longer store in reserve()
  CacheStore store_;
  int64_t num_tokens_ = 0;
  int64_t capacity_ = 0;
};

}  // namespace loom
