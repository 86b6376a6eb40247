// Softmax attention over one sequence's cache: multi-head latent attention (MLA) in its expanded
// and absorbed forms, and grouped-query attention (GQA). Causal: query i of a chunk of T queries
// sits at position S - T + i, where S is the number of cached positions including the chunk, and
// attends positions 0 .. S - T + i.
#pragma once

#include "engine/core/tensor.h"

namespace loom {

// MLA. The cache holds, per position, only the normalised latent c ([S, R], R = kv_lora_rank) and
// the (already rotated, if RoPE) shared rope key k_rope ([S, dr]). kv_b is kv_b_proj's weight
// [H * (dn + dv), R]: per head h, rows [h*(dn+dv), h*(dn+dv)+dn) give k_nope, the next dv rows v.
//   q:   [T, H, dn + dr]  ([q_nope | q_rope], rope already applied)
//   out: [T, H, dv]
//   score(i, j) = scale * (q_nope_i . k_nope_j + q_rope_i . k_rope_j)
struct MlaDims {
  int64_t heads;       // H
  int64_t nope_dim;    // dn
  int64_t rope_dim;    // dr
  int64_t v_dim;       // dv
  int64_t latent_dim;  // R
};

// Expanded form (prefill): materialises k_nope and v for all S positions, O(S * H * R * (dn + dv)).
void mla_attention_expanded(const Tensor& q, const Tensor& cache_latent,
                            const Tensor& cache_rope, const Tensor& kv_b, const MlaDims& dims,
                            float scale, const Tensor& out);

// Absorbed form (decode): q_abs_h = W_UK_h^T q_nope_h ([R]); score = q_abs_h . c + q_rope . k_rope;
// o_h = W_UV_h (sum_j p_j c_j). Reads the latent cache once per head; the same function as above.
void mla_attention_absorbed(const Tensor& q, const Tensor& cache_latent,
                            const Tensor& cache_rope, const Tensor& kv_b, const MlaDims& dims,
                            float scale, const Tensor& out);

// GQA over a per-sequence K/V cache. q: [T, Hq, d]; k_cache: [S, Hkv, d]; v_cache: [S, Hkv, dv];
// Hq a multiple of Hkv (query head h reads kv head h / (Hq / Hkv)); out: [T, Hq, dv].
void gqa_attention_forward(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                           float scale, const Tensor& out);

}  // namespace loom
