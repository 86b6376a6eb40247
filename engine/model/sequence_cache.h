// SequenceCache: everything one sequence carries from one forward call to the next.
//
// Per layer, by mixer type:
//   KDA / GDN: recurrent state [Hv, dk, dv] f32 and convolution tail [W-1, conv_channels] f32
//              (the last W-1 inputs of the short convolution, oldest first);
//   MLA:       latent cache rows [capacity, kv_lora_rank] (normalised c) and rope-key rows
//              [capacity, qk_rope_head_dim] (rotated when the model uses RoPE);
//   GQA:       key rows [capacity, Hkv, d] (rotated) and value rows [capacity, Hkv, dv].
// Rows [0, num_tokens()) are valid. This is the contiguous per-sequence layout; the serving
// engine's paged pools (scheduler/) present the same per-layer views.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "weights/model_config.h"

namespace loom {

struct LayerCache {
  Tensor recurrent;  // KDA/GDN
  Tensor conv;       // KDA/GDN
  Tensor latent;     // MLA: [capacity, R]
  Tensor rope;       // MLA: [capacity, dr]
  Tensor key;        // GQA: [capacity, Hkv, d] (rotated)
  Tensor value;      // GQA: [capacity, Hkv, dv]
};

class SequenceCache {
 public:
  explicit SequenceCache(const ModelConfig& cfg);

  // Positions already processed (the next token's position).
  int64_t num_tokens() const { return num_tokens_; }
  LayerCache& layer(int i) { return layers_[i]; }
  // Makes room for `n` more positions in every attention layer (amortised doubling).
  void reserve(int64_t n);
  // Called by the model once all layers have consumed `n` new tokens.
  void advance(int64_t n) { num_tokens_ += n; }
  // Bytes held (for accounting and tests).
  size_t nbytes() const;

 private:
  std::vector<LayerCache> layers_;
  std::vector<MixerType> mixers_;
  int64_t num_tokens_ = 0;
  int64_t capacity_ = 0;
};

}  // namespace loom
