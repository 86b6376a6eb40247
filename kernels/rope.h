// Rotary position embeddings: the frequency table (default and YaRN) and its application.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

enum class RopeStyle : uint8_t {
  // Pairs (i, i + rd/2) of the first rd dims, as HF's rotate_half (Llama, Qwen, fla).
  kHalf,
  // Pairs (2i, 2i+1), output de-interleaved: [x0', x2', ..., x1', x3', ...] over the first rd dims
  // (HF apply_rotary_pos_emb_interleave, DeepSeek). Dot products are unchanged by the permutation
  // as long as queries and keys use the same style.
  kInterleaved,
};

// Inverse frequencies (rd/2 entries) and the cos/sin scale ("attention factor"), computed in f32
// exactly as transformers' rope init functions do.
struct RopeTable {
  Tensor inv_freq;  // f32 [rd/2], on the device of the ops that use it (host as built)
  float attention_factor = 1.0f;
  int rotary_dim = 0;
  RopeStyle style = RopeStyle::kHalf;
};

// Default RoPE: inv_freq[i] = 1 / theta^(2i / rd).
RopeTable rope_table_default(double theta, int rotary_dim, RopeStyle style);
// YaRN (transformers _compute_yarn_parameters). attention_factor < 0 means "derive it from factor,
// mscale and mscale_all_dim" as transformers does when the config does not set it.
RopeTable rope_table_yarn(double theta, int rotary_dim, RopeStyle style, double factor,
                          double original_max_position, double beta_fast, double beta_slow,
                          double mscale, double mscale_all_dim, double attention_factor,
                          bool truncate);

// Rotates dims [dim_offset, dim_offset + rotary_dim) of every head in place. x: [T, H, d]
// contiguous, f32 (or bf16 on CUDA: rotated in f32, rounded to nearest even once when stored);
// positions: [T] i64 absolute positions (step data, on ex.device).
void rope_forward(const Exec& ex, const Tensor& x, const Tensor& positions, const RopeTable& table,
                  int64_t dim_offset);

// Backward of rope_forward, in place on the gradient: the forward is y = attention_factor * R x
// with R orthogonal per pair (and, for kInterleaved, a fixed permutation of the rotary dims), so
// dx = attention_factor * R^T dy: the inverse rotation (angle -theta), pairs read where the
// forward wrote them and written where it read them. Dims outside the rotary range pass through.
// YaRN changes only inv_freq and attention_factor, so the same code serves it. dx: [T, H, d] f32
// contiguous, holding dy on entry; positions and table as for rope_forward.
void rope_backward(const Exec& ex, const Tensor& dx, const Tensor& positions,
                   const RopeTable& table, int64_t dim_offset);

}  // namespace loom
