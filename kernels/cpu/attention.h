// CPU implementations of kernels/attention.h (same contracts).
#pragma once

#include "core/tensor.h"
#include "kernels/attention.h"

namespace loom::cpu {

void cache_write_rows(const CacheView& view, int64_t start, const Tensor& rows);

void mla_attention_expanded(const Tensor& q, const CacheView& cache_latent,
                            const CacheView& cache_rope, const Tensor& kv_b, const MlaDims& dims,
                            float scale, const Tensor& out);
void mla_attention_absorbed(const Tensor& q, const CacheView& cache_latent,
                            const CacheView& cache_rope, const Tensor& kv_b, const MlaDims& dims,
                            float scale, const Tensor& out);
void gqa_attention_forward(const Tensor& q, const CacheView& k_cache, const CacheView& v_cache,
                           float scale, const Tensor& out);

void cache_write_varlen(const Tensor& pool, const Tensor& page_table, const Tensor& cu_seqlens,
                        const Tensor& past_lens, const Tensor& rows);
void mla_attention_varlen(const Tensor& q, const Tensor& latent_pool, const Tensor& rope_pool,
                          const Tensor& page_table, const Tensor& cu_seqlens,
                          const Tensor& past_lens, const Tensor& kv_b, const MlaDims& dims,
                          float scale, bool batch_invariant, const Tensor& out);
void gqa_attention_varlen(const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                          const Tensor& page_table, const Tensor& cu_seqlens,
                          const Tensor& past_lens, float scale, const Tensor& out);

}  // namespace loom::cpu
