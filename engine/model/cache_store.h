// CacheStore: the serving engine's cache memory for many sequences. Attention layers keep their
// rows in pools of fixed-size pages (MLA: the normalised latent and the rope key, nothing else;
// GQA: rotated keys and values); linear-attention layers keep one state per slot (recurrent
// [Hv, dk, dv] f32 and the convolution tail [W-1, C]). The scheduler hands out page and slot ids;
// this class only owns the bytes and what they mean (TurboMind's cache-registry split).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "weights/model_config.h"

namespace loom {

class CacheStore {
 public:
  struct Options {
    int64_t num_pages = 0;   // pages of every attention layer's pool (ids 0 .. num_pages-1)
    int64_t page_size = 64;  // positions per page
    int64_t num_slots = 0;   // linear-state slots (ids 0 .. num_slots-1)
  };

  // Allocates and zeroes every pool. Models without attention (or linear) layers hold no pages
  // (or slots) whatever the options say.
  CacheStore(const ModelConfig& cfg, const Options& options);

  // Bytes one page costs over all attention layers, and one slot over all linear layers: what the
  // engine divides its memory budget by.
  static size_t page_bytes(const ModelConfig& cfg, int64_t page_size);
  static size_t slot_bytes(const ModelConfig& cfg);

  int64_t num_pages() const { return options_.num_pages; }
  int64_t page_size() const { return options_.page_size; }
  int64_t num_slots() const { return options_.num_slots; }
  bool has_attention() const { return has_attention_; }
  bool has_linear() const { return has_linear_; }

  // Layer `layer`'s pool `which` (MLA: 0 latent [P, page, R], 1 rope [P, page, dr]; GQA: 0 key,
  // 1 value [P, page, Hkv, d]). The layer must be an attention layer.
  const Tensor& pool(int layer, int which) const;
  // Slot `slot`'s state of linear layer `layer`.
  Tensor recurrent(int layer, int64_t slot) const;  // [Hv, dk, dv]
  Tensor conv(int layer, int64_t slot) const;       // [W-1, C]
  // Every slot's state of linear layer `layer` (what the varlen kernels index by slot id).
  const Tensor& recurrent_states(int layer) const;  // [num_slots, Hv, dk, dv]
  const Tensor& conv_states(int layer) const;       // [num_slots, W-1, C]

  // Zeroes every linear layer's state in `slot` (a sequence starting fresh).
  void reset_slot(int64_t slot);
  // Copies every linear layer's state from `src` to `dst` (prefix-cache checkpoints).
  void copy_slot(int64_t src, int64_t dst) { copy_slot(*this, src, dst); }
  // The same from slot `src` of `from`, a store of the same model (this one or another).
  void copy_slot(const CacheStore& from, int64_t src, int64_t dst);
  // Copies rows [r0, r1) of page `src` of `from` (a store of the same model) into the same rows
  // of page `dst`, in every attention layer. Both stores' pages must hold r1 rows.
  void copy_page_rows(const CacheStore& from, int64_t src, int64_t dst, int64_t r0, int64_t r1);

 private:
  struct Layer {
    Tensor pools[2];   // attention layers
    Tensor recurrent;  // [num_slots, Hv, dk, dv]
    Tensor conv;       // [num_slots, W-1, C]
  };
  Options options_;
  std::vector<Layer> layers_;
  bool has_attention_ = false, has_linear_ = false;
};

}  // namespace loom
