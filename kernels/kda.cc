// Device dispatch for kernels/kda.h.
#include "kernels/kda.h"

#include "kernels/cpu/kda.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/kda.h"
#include "kernels/cuda/kda_chunked.h"
#endif

namespace loom {

namespace {
// The CPU kernels are f32 only; bf16 activations run on CUDA.
void check_cpu_f32(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& beta, const Tensor& out) {
  for (const Tensor* t : {&q, &k, &v, &beta, &out})
    LOOM_CHECK(t->dtype() == DType::kF32,
               "%s: q %s k %s v %s beta %s out %s: the CPU kernels take f32 (bf16 activations run "
               "on CUDA)",
               op, q.describe().c_str(), k.describe().c_str(), v.describe().c_str(),
               beta.describe().c_str(), out.describe().c_str());
}
}  // namespace

void kda_recurrent_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& g, const Tensor& beta, float scale, const Tensor& state,
                           const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "kda_recurrent_forward", q, k, v, g, beta, state, out);
  if (ex.device.is_cpu()) {
    check_cpu_f32("kda_recurrent_forward", q, k, v, beta, out);
    return cpu::kda_recurrent_forward(q, k, v, g, beta, scale, state, out);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::kda_recurrent_forward(ex, q, k, v, g, beta, scale, state, out);
#else
  no_kernel_for(ex, "kda_recurrent_forward");
#endif
}

void kda_chunked_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& g, const Tensor& beta, float scale, const Tensor& state,
                         const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "kda_chunked_forward", q, k, v, g, beta, state, out);
  if (ex.device.is_cpu()) return cpu::kda_chunked_forward(q, k, v, g, beta, scale, state, out);
#ifdef LOOM_WITH_CUDA
  return cuda::kda_chunked_forward(ex, q, k, v, g, beta, scale, state, out);
#else
  no_kernel_for(ex, "kda_chunked_forward");
#endif
}

void kda_varlen_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& g, const Tensor& beta, float scale, const Tensor& states,
                        const Tensor& state_slots, const Tensor& cu_seqlens, const Tensor& out,
                        int64_t max_seqlen) {
  LOOM_ON_EXEC_DEVICE(ex, "kda_varlen_forward", q, k, v, g, beta, out);
  LOOM_ON_EXEC_DEVICE(ex, "kda_varlen_forward", states, state_slots, cu_seqlens);
  if (ex.device.is_cpu()) {
    check_cpu_f32("kda_varlen_forward", q, k, v, beta, out);
    // The hint is a promise the CUDA path relies on: hold the caller to it where it is cheap.
    LOOM_CHECK(max_seqlen >= 0, "kda_varlen_forward: max_seqlen %lld < 0",
               static_cast<long long>(max_seqlen));
    if (max_seqlen > 0 && cu_seqlens.dtype() == DType::kI64 && cu_seqlens.ndim() == 1 &&
        cu_seqlens.is_contiguous()) {
      const int64_t* cu = cu_seqlens.data<int64_t>();
      for (int64_t b = 0; b + 1 < cu_seqlens.dim(0); ++b)
        LOOM_CHECK(cu[b + 1] - cu[b] <= max_seqlen,
                   "kda_varlen_forward: sequence %lld has %lld rows, more than max_seqlen %lld",
                   static_cast<long long>(b), static_cast<long long>(cu[b + 1] - cu[b]),
                   static_cast<long long>(max_seqlen));
    }
    return cpu::kda_varlen_forward(q, k, v, g, beta, scale, states, state_slots, cu_seqlens,
                                   ex.batch_invariant, out);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::kda_varlen_forward(ex, q, k, v, g, beta, scale, states, state_slots, cu_seqlens, out,
                                  max_seqlen);
#else
  no_kernel_for(ex, "kda_varlen_forward");
#endif
}

void kda_gate_forward(const Exec& ex, const Tensor& f, const Tensor& A_log, const Tensor& dt_bias,
                      float lower_bound, const Tensor& g) {
  LOOM_ON_EXEC_DEVICE(ex, "kda_gate_forward", f, A_log, dt_bias, g);
  if (ex.device.is_cpu()) return cpu::kda_gate_forward(f, A_log, dt_bias, lower_bound, g);
#ifdef LOOM_WITH_CUDA
  return cuda::kda_gate_forward(ex, f, A_log, dt_bias, lower_bound, g);
#else
  no_kernel_for(ex, "kda_gate_forward");
#endif
}

}  // namespace loom
