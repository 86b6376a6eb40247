// Softmax attention over one sequence's cache: multi-head latent attention (MLA) in its expanded
// and absorbed forms, and grouped-query attention (GQA). Causal: query i of a chunk of T queries
// sits at position S - T + i, where S is the number of cached positions including the chunk, and
// attends positions 0 .. S - T + i.
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

// One sequence's view of a cache laid out in fixed-size pages: position j is row j % page_size of
// page pages[j / page_size] of `pool` ([num_pages, page_size, row...]). The serving engine's paged
// pools and a private contiguous cache ([S, row...], one page holding every row) are both views.
struct CacheView {
  Tensor pool;         // [num_pages, page_size, row dims...]
  Tensor pages;        // i32 [>= ceil(length / page_size)] page ids, on the pool's device
  int64_t length = 0;  // visible positions S

  static CacheView contiguous(const Tensor& rows);  // rows: [S, row...]; pages -> {0}
  int64_t page_size() const { return pool.dim(1); }
  int64_t row_elems() const { return pool.numel() / (pool.dim(0) * pool.dim(1)); }
  // Start of position j's row (host caches only; no bounds check beyond LOOM_CHECKs at kernel
  // entry).
  float* row(int64_t j) const {
    return pool.data<float>() +
           (static_cast<int64_t>(page_ids()[j / page_size()]) * page_size() + j % page_size()) *
               row_elems();
  }
  const int32_t* page_ids() const { return pages.data<int32_t>(); }
};

// Writes rows[i] to position start + i of `view` (its page table must cover those positions).
// rows: [n, row...] f32.
void cache_write_rows(const Exec& ex, const CacheView& view, int64_t start, const Tensor& rows);

// MLA. The cache holds, per position, only the normalised latent c (rows of R = kv_lora_rank) and
// the (already rotated, if RoPE) shared rope key k_rope (rows of dr). kv_b is kv_b_proj's weight
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
void mla_attention_expanded(const Exec& ex, const Tensor& q, const CacheView& cache_latent,
                            const CacheView& cache_rope, const Tensor& kv_b, const MlaDims& dims,
                            float scale, const Tensor& out);

// Absorbed form (decode): q_abs_h = W_UK_h^T q_nope_h ([R]); score = q_abs_h . c + q_rope . k_rope;
// o_h = W_UV_h (sum_j p_j c_j). Reads the latent cache once per head; the same function as above.
void mla_attention_absorbed(const Exec& ex, const Tensor& q, const CacheView& cache_latent,
                            const CacheView& cache_rope, const Tensor& kv_b, const MlaDims& dims,
                            float scale, const Tensor& out);

// GQA over a per-sequence K/V cache. q: [T, Hq, d]; k_cache rows [Hkv, d]; v_cache rows [Hkv, dv];
// Hq a multiple of Hkv (query head h reads kv head h / (Hq / Hkv)); out: [T, Hq, dv].
void gqa_attention_forward(const Exec& ex, const Tensor& q, const CacheView& k_cache,
                           const CacheView& v_cache, float scale, const Tensor& out);

}  // namespace loom
