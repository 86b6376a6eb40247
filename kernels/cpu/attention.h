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

}  // namespace loom::cpu
