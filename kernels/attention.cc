// Device dispatch for kernels/attention.h. The varlen ops (cache_write_varlen,
// mla_attention_varlen, gqa_attention_varlen: what the model forward uses) also run on CUDA
// (kernels/cuda/cache_write.h, kernels/cuda/attention.h); the per-sequence ops are CPU only, and a
// CUDA execution of them stops with a message naming the op.
#include "kernels/attention.h"

#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cache_write.h"
#endif

namespace loom {

CacheView CacheView::contiguous(const Tensor& rows) {
  // One page holding every row: page table {0}, shared by every contiguous view.
  static int32_t first_page = 0;
  static const Tensor kFirstPage = Tensor::wrap(&first_page, {1}, DType::kI32);
  CacheView v;
  Shape s;
  s.push_back(1);
  s.push_back(rows.dim(0));
  for (int d = 1; d < rows.ndim(); ++d) s.push_back(rows.dim(d));
  // A zero-row cache still needs a non-empty page dimension for the row arithmetic.
  if (rows.dim(0) == 0) s[1] = 1;
  v.pool = rows.dim(0) == 0 ? Tensor::zeros(s) : rows.reshape(s);
  v.pages = kFirstPage;
  v.length = rows.dim(0);
  return v;
}

void cache_write_rows(const Exec& ex, const CacheView& view, int64_t start, const Tensor& rows) {
  LOOM_ON_EXEC_DEVICE(ex, "cache_write_rows", view.pool, view.pages, rows);
  if (ex.device.is_cpu()) return cpu::cache_write_rows(view, start, rows);
  no_kernel_for(ex, "cache_write_rows");
}

void mla_attention_expanded(const Exec& ex, const Tensor& q, const CacheView& cache_latent,
                            const CacheView& cache_rope, const Tensor& kv_b, const MlaDims& dims,
                            float scale, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "mla_attention_expanded", q, cache_latent.pool, cache_rope.pool, kv_b,
                      out);
  if (ex.device.is_cpu()) {
    const cpu::RowInvariantScope numerics(ex.batch_invariant);
    return cpu::mla_attention_expanded(q, cache_latent, cache_rope, kv_b, dims, scale, out);
  }
  no_kernel_for(ex, "mla_attention_expanded");
}

void mla_attention_absorbed(const Exec& ex, const Tensor& q, const CacheView& cache_latent,
                            const CacheView& cache_rope, const Tensor& kv_b, const MlaDims& dims,
                            float scale, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "mla_attention_absorbed", q, cache_latent.pool, cache_rope.pool, kv_b,
                      out);
  if (ex.device.is_cpu()) {
    const cpu::RowInvariantScope numerics(ex.batch_invariant);
    return cpu::mla_attention_absorbed(q, cache_latent, cache_rope, kv_b, dims, scale, out);
  }
  no_kernel_for(ex, "mla_attention_absorbed");
}

void gqa_attention_forward(const Exec& ex, const Tensor& q, const CacheView& k_cache,
                           const CacheView& v_cache, float scale, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "gqa_attention_forward", q, k_cache.pool, k_cache.pages, v_cache.pool,
                      v_cache.pages, out);
  if (ex.device.is_cpu()) {
    const cpu::RowInvariantScope numerics(ex.batch_invariant);
    return cpu::gqa_attention_forward(q, k_cache, v_cache, scale, out);
  }
  no_kernel_for(ex, "gqa_attention_forward");
}

void cache_write_varlen(const Exec& ex, const Tensor& pool, const Tensor& page_table,
                        const Tensor& cu_seqlens, const Tensor& past_lens, const Tensor& rows) {
  LOOM_ON_EXEC_DEVICE(ex, "cache_write_varlen", pool, page_table, cu_seqlens, past_lens, rows);
  if (ex.device.is_cpu()) {
    LOOM_CHECK(rows.dtype() == DType::kF32,
               "cache_write_varlen: rows %s: the CPU kernels take f32 rows (bf16 rows run on CUDA)",
               rows.describe().c_str());
    return cpu::cache_write_varlen(pool, page_table, cu_seqlens, past_lens, rows);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::cache_write_varlen(ex, pool, page_table, cu_seqlens, past_lens, rows);
#else
  no_kernel_for(ex, "cache_write_varlen");
#endif
}

void mla_attention_varlen(const Exec& ex, const Tensor& q, const Tensor& latent_pool,
                          const Tensor& rope_pool, const Tensor& page_table,
                          const Tensor& cu_seqlens, const Tensor& past_lens, const Tensor& kv_b,
                          const MlaDims& dims, float scale, const Tensor& out,
                          const VarlenHostLens& host) {
  LOOM_ON_EXEC_DEVICE(ex, "mla_attention_varlen", q, latent_pool, rope_pool, page_table, cu_seqlens,
                      past_lens, kv_b, out);
  if (ex.device.is_cpu()) {
    const cpu::RowInvariantScope numerics(ex.batch_invariant);
    return cpu::mla_attention_varlen(q, latent_pool, rope_pool, page_table, cu_seqlens, past_lens,
                                     kv_b, dims, scale, ex.batch_invariant, out);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::mla_attention_varlen(ex, q, latent_pool, rope_pool, page_table, cu_seqlens,
                                    past_lens, kv_b, dims, scale, out, host);
#else
  (void)host;
  no_kernel_for(ex, "mla_attention_varlen");
#endif
}

void gqa_attention_varlen(const Exec& ex, const Tensor& q, const Tensor& k_pool,
                          const Tensor& v_pool, const Tensor& page_table, const Tensor& cu_seqlens,
                          const Tensor& past_lens, float scale, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "gqa_attention_varlen", q, k_pool, v_pool, page_table, cu_seqlens,
                      past_lens, out);
  if (ex.device.is_cpu()) {
    const cpu::RowInvariantScope numerics(ex.batch_invariant);
    return cpu::gqa_attention_varlen(q, k_pool, v_pool, page_table, cu_seqlens, past_lens, scale,
                                     out);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::gqa_attention_varlen(ex, q, k_pool, v_pool, page_table, cu_seqlens, past_lens, scale,
                                    out);
#else
  no_kernel_for(ex, "gqa_attention_varlen");
#endif
}

}  // namespace loom
