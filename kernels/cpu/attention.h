// CPU implementations of kernels/attention.h (same contracts).
#pragma once

#include "engine/core/tensor.h"
#include "kernels/attention.h"

namespace loom::cpu {

void mla_attention_expanded(const Tensor& q, const Tensor& cache_latent, const Tensor& cache_rope,
                            const Tensor& kv_b, const MlaDims& dims, float scale,
                            const Tensor& out);
void mla_attention_absorbed(const Tensor& q, const Tensor& cache_latent, const Tensor& cache_rope,
                            const Tensor& kv_b, const MlaDims& dims, float scale,
                            const Tensor& out);
void gqa_attention_forward(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                           float scale, const Tensor& out);

}  // namespace loom::cpu
