// Device dispatch for kernels/attention.h. CPU only in this build: no CUDA kernel yet.
#include "kernels/attention.h"

#include "kernels/cpu/attention.h"

namespace loom {

void mla_attention_expanded(const Tensor& q, const Tensor& cache_latent, const Tensor& cache_rope,
                            const Tensor& kv_b, const MlaDims& dims, float scale,
                            const Tensor& out) {
  if (q.device() == Device::kCpu) {
    return cpu::mla_attention_expanded(q, cache_latent, cache_rope, kv_b, dims, scale, out);
  }
  LOOM_CHECK(false, "mla_attention_expanded: no CUDA kernel in this build yet (%s)",
             q.describe().c_str());
}

void mla_attention_absorbed(const Tensor& q, const Tensor& cache_latent, const Tensor& cache_rope,
                            const Tensor& kv_b, const MlaDims& dims, float scale,
                            const Tensor& out) {
  if (q.device() == Device::kCpu) {
    return cpu::mla_attention_absorbed(q, cache_latent, cache_rope, kv_b, dims, scale, out);
  }
  LOOM_CHECK(false, "mla_attention_absorbed: no CUDA kernel in this build yet (%s)",
             q.describe().c_str());
}

void gqa_attention_forward(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                           float scale, const Tensor& out) {
  if (q.device() == Device::kCpu)
    return cpu::gqa_attention_forward(q, k_cache, v_cache, scale, out);
  LOOM_CHECK(false, "gqa_attention_forward: no CUDA kernel in this build yet (%s)",
             q.describe().c_str());
}

}  // namespace loom
