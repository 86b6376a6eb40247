// Softmax attention over one sequence's cache: multi-head latent attention (MLA) in its expanded
// and absorbed forms, and grouped-query attention (GQA); and their varlen forms, which run a
// layer's whole batch in one call over the paged pools. Causal: query i of a chunk of T queries
// sits at position S - T + i, where S is the number of cached positions including the chunk, and
// attends positions 0 .. S - T + i.
#pragma once

#include "core/tensor.h"
#include "kernels/exec.h"

namespace loom {

// FP8 KV pages (pool dtype kF8E4M3, --kv_dtype fp8): each cached vector (an MLA latent or rope
// key of one position; a GQA key or value of one position and one kv head) is stored as its n
// e4m3fn codes followed by its f32 scale (kKvFp8ScaleBytes bytes), so the pool's last dimension
// is n + 4 bytes and a row copy carries its scales. scale = f32(amax / 448) of the vector (1 for
// an all-zero one; NaN when it holds a non-finite value, so attention sees NaN as it would in an
// f32 cache); code = e4m3(x / scale), the quotient exact, ties to even, saturated to +-448; value
// = f32(code) * scale, an f32 product. The write quantizes (kernels/cpu/kv_fp8.h; the CUDA write
// bit for bit the same, kernels/cuda/kv_fp8.cuh); the CPU's attention reads dequantize a page at
// a time, the CUDA kernels as they load each key tile (kernels/cuda/attention.h).
inline constexpr int64_t kKvFp8ScaleBytes = 4;
// The pool's last dimension for vectors of n values stored in kv_dtype.
inline int64_t kv_pool_last_dim(DType kv_dtype, int64_t n) {
  return kv_dtype == DType::kF8E4M3 && n > 0 ? n + kKvFp8ScaleBytes : n;
}
// The values a vector of a pool holds: its last dimension without the fp8 scale.
inline int64_t kv_pool_vector_dim(const Tensor& pool) {
  const int64_t last = pool.dim(pool.ndim() - 1);
  return pool.dtype() == DType::kF8E4M3 && last > 0 ? last - kKvFp8ScaleBytes : last;
}

// One sequence's view of a cache laid out in fixed-size pages: position j is row j % page_size of
// page pages[j / page_size] of `pool` ([num_pages, page_size, row...]). The serving engine's paged
// pools and a private contiguous cache ([S, row...], one page holding every row) are both views.
struct CacheView {
  Tensor pool;         // [num_pages, page_size, row dims...]
  Tensor pages;        // i32 [>= ceil(length / page_size)] page ids, on the pool's device
  int64_t length = 0;  // visible positions S

  static CacheView contiguous(const Tensor& rows);  // rows: [S, row...]; pages -> {0}
  int64_t page_size() const { return pool.dim(1); }
  // Elements of a position's row in the pool (for fp8 pools: bytes, scales included).
  int64_t row_elems() const { return pool.numel() / (pool.dim(0) * pool.dim(1)); }
  // Values of a position's row (row_elems() without the fp8 scales).
  int64_t row_values() const {
    const int64_t last = pool.dim(pool.ndim() - 1);
    return last == 0 ? 0 : row_elems() / last * kv_pool_vector_dim(pool);
  }
  // Start of position j's row in the pool's element type T (float for f32 pools, uint16_t for
  // bf16 ones, uint8_t for fp8 ones; host caches only; no bounds check beyond LOOM_CHECKs at kernel
  // entry).
  template <typename T = float>
  T* row(int64_t j) const {
    return pool.data<T>() +
           (static_cast<int64_t>(page_ids()[j / page_size()]) * page_size() + j % page_size()) *
               row_elems();
  }
  const int32_t* page_ids() const { return pages.data<int32_t>(); }
};

// Writes rows[i] to position start + i of `view` (its page table must cover those positions).
// rows: [n, row...] f32; the pool f32, bf16 (rounded to nearest even) or fp8 (quantized per
// vector, see kKvFp8ScaleBytes; host only).
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

// Varlen forms: the whole batch of a layer in one call. Sequence b is rows [cu_seqlens[b],
// cu_seqlens[b + 1]) of the new rows, queries and outputs; it had past_lens[b] positions cached
// before them, and its positions live in the pages of row b of page_table (the CacheView of
// sequence b is {pool, page_table[b], past_lens[b] + its rows}). Each sequence gets exactly what
// the per-sequence op above gives it.
//   page_table: i32 [B, P]; cu_seqlens: i64 [B + 1], 0 first, N last, non-decreasing;
//   past_lens: i64 [B].

// cache_write_rows for every sequence: its rows go to positions past_lens[b] onwards. pool:
// [num_pages, page_size, row...] f32 or bf16 (an f32 value rounded to nearest even, bit for bit
// the same on every backend), or fp8 (rows of vectors of n + 4 bytes, see kKvFp8ScaleBytes;
// quantized bit for bit the same on every backend); rows: [N, row...] f32, or bf16 on a GPU
// (stored as they are, widened exactly into an f32 pool, or quantized). No page may be written by
// two sequences. The attention ops below read any of these pool dtypes.
void cache_write_varlen(const Exec& ex, const Tensor& pool, const Tensor& page_table,
                        const Tensor& cu_seqlens, const Tensor& past_lens, const Tensor& rows);

// The MLA form mla_attention_varlen takes for T queries over S cached positions: the one with
// fewer multiply-adds. Expanded builds K/V once (S*H*R*(dn+dv)) then attends (T*S*H*(dn+dr+dv));
// absorbed maps each query into latent space and back (T*H*R*(dn+dv)) and attends over the latent
// (T*S*H*(2R+dr)). Batch-invariant numerics always take the absorbed form, as decode does: the two
// forms round differently, so a prefill and a recompute of the same tokens must not switch.
enum class MlaForm : uint8_t { kExpanded, kAbsorbed };
// Inline: the CUDA backend (kernels/cuda/attention.cc) makes the same choice.
inline MlaForm mla_attention_form(int64_t t, int64_t s, const MlaDims& dims, bool batch_invariant) {
  const int64_t h = dims.heads, dn = dims.nope_dim, dr = dims.rope_dim, dv = dims.v_dim,
                r = dims.latent_dim;
  const double expanded =
      static_cast<double>(s) * h * r * (dn + dv) + static_cast<double>(t) * s * h * (dn + dr + dv);
  const double absorbed =
      static_cast<double>(t) * h * r * (dn + dv) + static_cast<double>(t) * s * h * (2 * r + dr);
  return absorbed <= expanded || batch_invariant ? MlaForm::kAbsorbed : MlaForm::kExpanded;
}

// The host's copies of a varlen call's cu_seqlens and past_lens, where the caller has them (the
// model's step layout packs them on the host). A GPU call reads neither tensor back, so without
// them it cannot tell a prefill chunk from decode rows: it then takes the absorbed form for every
// sequence. They must equal the tensors (the host call reads the tensors themselves).
struct VarlenHostLens {
  const int64_t* cu_seqlens = nullptr;  // [B + 1]
  const int64_t* past_lens = nullptr;   // [B]
  bool known() const { return cu_seqlens != nullptr && past_lens != nullptr; }
};

// MLA for every sequence, in the form mla_attention_form(its rows, its S, dims,
// ex.batch_invariant) picks. latent_pool: [num_pages, page_size, R]; rope_pool: [num_pages,
// page_size, dr]; q: [N, H, dn + dr]; out: [N, H, dv]. On a GPU the expanded form needs `host`
// (and the shapes kernels/cuda/attention.h names); elsewhere the absorbed form computes the same
// function.
void mla_attention_varlen(const Exec& ex, const Tensor& q, const Tensor& latent_pool,
                          const Tensor& rope_pool, const Tensor& page_table,
                          const Tensor& cu_seqlens, const Tensor& past_lens, const Tensor& kv_b,
                          const MlaDims& dims, float scale, const Tensor& out,
                          const VarlenHostLens& host = {});

// GQA for every sequence. k_pool: [num_pages, page_size, Hkv, d]; v_pool: [num_pages, page_size,
// Hkv, dv]; q: [N, Hq, d]; out: [N, Hq, dv].
void gqa_attention_varlen(const Exec& ex, const Tensor& q, const Tensor& k_pool,
                          const Tensor& v_pool, const Tensor& page_table, const Tensor& cu_seqlens,
                          const Tensor& past_lens, float scale, const Tensor& out);

}  // namespace loom
