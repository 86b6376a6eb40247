// Host side of the batched KDA decode kernel (checks as in kernels/cuda/kda.cc).
#include "kernels/cuda/kda_decode.h"

#include "kernels/cuda/device.h"
#include "kernels/cuda/kda_checks.h"
#include "kernels/cuda/kda_chunked_launch.h"

namespace loom::cuda {

void kda_decode_batched(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& g, const Tensor& beta, float scale, const Tensor& state_pool,
                        const Tensor& state_slots, const Tensor& out) {
  const char* fn = "kda_decode_batched";
  LOOM_CHECK_CUDA_ARG(fn, q);
  LOOM_CHECK_CUDA_ARG(fn, k);
  LOOM_CHECK_CUDA_ARG(fn, v);
  LOOM_CHECK_CUDA_ARG(fn, g);
  LOOM_CHECK_CUDA_ARG(fn, beta);
  LOOM_CHECK_CUDA_ARG(fn, state_pool);
  LOOM_CHECK_CUDA_ARG(fn, state_slots);
  LOOM_CHECK_CUDA_ARG(fn, out);
  check_kda_activations(fn, q, k, v, beta, out);
  const DType act = q.dtype();
  LOOM_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous() && g.is_contiguous() &&
                 beta.is_contiguous() && out.is_contiguous() && state_pool.is_contiguous(),
             "%s: every tensor must be contiguous", fn);
  LOOM_CHECK_F32(g);
  LOOM_CHECK_F32(state_pool);
  LOOM_CHECK(state_slots.dtype() == DType::kI32 && state_slots.is_contiguous(),
             "%s: state_slots %s, expected contiguous i32", fn, state_slots.describe().c_str());
  LOOM_CHECK(q.ndim() == 3 && v.ndim() == 3 && state_pool.ndim() == 4,
             "%s: q %s v %s state_pool %s", fn, q.describe().c_str(), v.describe().c_str(),
             state_pool.describe().c_str());
  const int64_t B = q.dim(0), Hk = q.dim(1), dk = q.dim(2), Hv = v.dim(1), dv = v.dim(2);
  const int64_t num_slots = state_pool.dim(0);
  LOOM_CHECK(Hk > 0 && Hv % Hk == 0, "%s: Hv %lld is not a multiple of Hk %lld", fn,
             static_cast<long long>(Hv), static_cast<long long>(Hk));
  LOOM_CHECK_SHAPE(k, B, Hk, dk);
  LOOM_CHECK_SHAPE(v, B, Hv, dv);
  LOOM_CHECK(g.ndim() == 3 && g.dim(0) == B && g.dim(1) == Hv && (g.dim(2) == dk || g.dim(2) == 1),
             "%s: g %s, expected [%lld, %lld, %lld or 1]", fn, g.describe().c_str(),
             static_cast<long long>(B), static_cast<long long>(Hv), static_cast<long long>(dk));
  LOOM_CHECK_SHAPE(beta, B, Hv);
  LOOM_CHECK_SHAPE(state_pool, num_slots, Hv, dk, dv);
  LOOM_CHECK_SHAPE(state_slots, B);
  LOOM_CHECK_SHAPE(out, B, Hv, dv);
  LOOM_CHECK(dk <= 256 && Hv <= 65535, "%s: dk %lld > 256 or Hv %lld > 65535 is not supported", fn,
             static_cast<long long>(dk), static_cast<long long>(Hv));
  const bool scalar_g = g.dim(2) == 1 && dk != 1;
  if (act == DType::kBF16) {
    launch::kda_decode_batched_bf16(stream_of(ex), q.raw(), k.raw(), v.raw(), g.data<float>(),
                                    beta.raw(), beta.dtype() == DType::kBF16, scale,
                                    state_pool.data<float>(), state_slots.data<int32_t>(),
                                    out.raw(), B, num_slots, Hk, Hv, dk, dv, scalar_g);
    return;
  }
  launch::kda_decode_batched(stream_of(ex), q.data<float>(), k.data<float>(), v.data<float>(),
                             g.data<float>(), beta.data<float>(), scale, state_pool.data<float>(),
                             state_slots.data<int32_t>(), out.data<float>(), B, num_slots, Hk, Hv,
                             dk, dv, scalar_g);
}

}  // namespace loom::cuda
