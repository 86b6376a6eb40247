// Device dispatch for kernels/attention.h. CPU only: the CUDA MLA/GQA kernels are issue 13's; a
// CUDA tensor here stops with a message naming the op.
#include "kernels/attention.h"

#include "kernels/cpu/attention.h"

namespace loom {

CacheView CacheView::contiguous(const Tensor& rows) {
  static const int32_t kFirstPage = 0;
  CacheView v;
  Shape s;
  s.push_back(1);
  s.push_back(rows.dim(0));
  for (int d = 1; d < rows.ndim(); ++d) s.push_back(rows.dim(d));
  // A zero-row cache still needs a non-empty page dimension for the row arithmetic.
  if (rows.dim(0) == 0) s[1] = 1;
  v.pool = rows.dim(0) == 0 ? Tensor::zeros(s) : rows.reshape(s);
  v.pages = &kFirstPage;
  v.length = rows.dim(0);
  return v;
}

void cache_write_rows(const CacheView& view, int64_t start, const Tensor& rows) {
  if (view.pool.device() == Device::kCpu) return cpu::cache_write_rows(view, start, rows);
  LOOM_CHECK(false, "cache_write_rows: no CUDA kernel in this build yet");
}

void mla_attention_expanded(const Tensor& q, const CacheView& cache_latent,
                            const CacheView& cache_rope, const Tensor& kv_b, const MlaDims& dims,
                            float scale, const Tensor& out) {
  if (q.device() == Device::kCpu) {
    return cpu::mla_attention_expanded(q, cache_latent, cache_rope, kv_b, dims, scale, out);
  }
  LOOM_CHECK(false, "mla_attention_expanded: no CUDA kernel in this build yet (%s)",
             q.describe().c_str());
}

void mla_attention_absorbed(const Tensor& q, const CacheView& cache_latent,
                            const CacheView& cache_rope, const Tensor& kv_b, const MlaDims& dims,
                            float scale, const Tensor& out) {
  if (q.device() == Device::kCpu) {
    return cpu::mla_attention_absorbed(q, cache_latent, cache_rope, kv_b, dims, scale, out);
  }
  LOOM_CHECK(false, "mla_attention_absorbed: no CUDA kernel in this build yet (%s)",
             q.describe().c_str());
}

void gqa_attention_forward(const Tensor& q, const CacheView& k_cache, const CacheView& v_cache,
                           float scale, const Tensor& out) {
  if (q.device() == Device::kCpu)
    return cpu::gqa_attention_forward(q, k_cache, v_cache, scale, out);
  LOOM_CHECK(false, "gqa_attention_forward: no CUDA kernel in this build yet (%s)",
             q.describe().c_str());
}

}  // namespace loom
