// Device dispatch for kernels/kda.h.
#include "kernels/kda.h"

#include <cstring>
#include <optional>
#include <vector>

#include "kernels/conv.h"
#include "kernels/cpu/kda.h"
#include "kernels/elementwise.h"
#include "kernels/norm.h"
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

namespace {

// kda_decode_prepare on the host: the separate ops one after another (the reference the CUDA
// kernel reproduces). Padding rows (slot < 0) are left out of the convolution, which takes no
// negative slot: their conv_out rows stay zero, so their q, k and v rows come out zero.
void kda_decode_prepare_cpu(const Exec& ex, const Tensor& qkv, const Tensor& conv_weight,
                            const Tensor& conv_states, const Tensor& state_slots, const Tensor& f,
                            const Tensor& A_log, const Tensor& dt_bias, float lower_bound,
                            float qk_eps, const Tensor& beta, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor& g) {
  const char* fn = "kda_decode_prepare";
  LOOM_CHECK_F32(qkv);
  LOOM_CHECK(q.ndim() == 3 && v.ndim() == 3 && qkv.ndim() == 2, "%s: qkv %s q %s v %s", fn,
             qkv.describe().c_str(), q.describe().c_str(), v.describe().c_str());
  const int64_t B = qkv.dim(0), Hk = q.dim(1), dk = q.dim(2), Hv = v.dim(1), dv = v.dim(2);
  const int64_t ck = Hk * dk, cv = Hv * dv, C = 2 * ck + cv;
  LOOM_CHECK_SHAPE(qkv, B, C);
  LOOM_CHECK_SHAPE(q, B, Hk, dk);
  LOOM_CHECK_SHAPE(k, B, Hk, dk);
  LOOM_CHECK_SHAPE(v, B, Hv, dv);
  LOOM_CHECK(state_slots.dtype() == DType::kI32 && state_slots.is_contiguous() &&
                 state_slots.shape() == Shape({B}),
             "%s: state_slots %s, expected contiguous i32 [%lld]", fn,
             state_slots.describe().c_str(), static_cast<long long>(B));
  LOOM_CHECK(g.numel() == f.numel() && f.ndim() == 2 && f.dim(0) == B, "%s: f %s g %s", fn,
             f.describe().c_str(), g.describe().c_str());

  std::optional<Workspace::Mark> mark;
  if (ex.workspace) mark.emplace(*ex.workspace);
  const auto temp = [&](Shape s, DType dt) {
    return ex.workspace ? ex.workspace->take(s, dt) : Tensor::empty(s, dt);
  };
  // The rows that have a state: all of them but the padding.
  const int32_t* slots = state_slots.data<int32_t>();
  std::vector<int64_t> real;
  for (int64_t b = 0; b < B; ++b)
    if (slots[b] >= 0) real.push_back(b);
  const int64_t n = static_cast<int64_t>(real.size());
  const Tensor conv_out = temp({B, C}, DType::kF32);
  conv_out.fill(0.0f);
  const Tensor cu = temp({n + 1}, DType::kI64);
  for (int64_t b = 0; b <= n; ++b) cu.data<int64_t>()[b] = b;
  if (n == B) {
    causal_conv1d_varlen(ex, qkv, conv_weight, conv_states, state_slots, cu, true, conv_out);
  } else if (n > 0) {
    const Tensor xs = temp({n, C}, DType::kF32), out = temp({n, C}, DType::kF32);
    const Tensor ss = temp({n}, DType::kI32);
    const size_t row = static_cast<size_t>(C) * sizeof(float);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(xs.data<float>() + i * C, qkv.data<float>() + real[i] * C, row);
      ss.data<int32_t>()[i] = slots[real[i]];
    }
    causal_conv1d_varlen(ex, xs, conv_weight, conv_states, ss, cu, true, out);
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(conv_out.data<float>() + real[i] * C, out.data<float>() + i * C, row);
  }
  copy_columns(ex, conv_out, 0, q.reshape({B, ck}));
  copy_columns(ex, conv_out, ck, k.reshape({B, ck}));
  copy_columns(ex, conv_out, 2 * ck, v.reshape({B, cv}));
  l2norm_forward(ex, q, qk_eps, 1.0f, q);
  l2norm_forward(ex, k, qk_eps, 1.0f, k);
  kda_gate_forward(ex, f, A_log, dt_bias, lower_bound, g.reshape(f.shape()));
  sigmoid_inplace(ex, beta);
}

}  // namespace

void kda_decode_prepare(const Exec& ex, const Tensor& qkv, const Tensor& conv_weight,
                        const Tensor& conv_states, const Tensor& state_slots, const Tensor& f,
                        const Tensor& A_log, const Tensor& dt_bias, float lower_bound, float qk_eps,
                        const Tensor& beta, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& g) {
  LOOM_ON_EXEC_DEVICE(ex, "kda_decode_prepare", qkv, conv_weight, conv_states, state_slots, f,
                      A_log, dt_bias, beta);
  LOOM_ON_EXEC_DEVICE(ex, "kda_decode_prepare", q, k, v, g);
  if (ex.device.is_cpu()) {
    return kda_decode_prepare_cpu(ex, qkv, conv_weight, conv_states, state_slots, f, A_log, dt_bias,
                                  lower_bound, qk_eps, beta, q, k, v, g);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::kda_decode_prepare(ex, qkv, conv_weight, conv_states, state_slots, f, A_log, dt_bias,
                                  lower_bound, qk_eps, beta, q, k, v, g);
#else
  no_kernel_for(ex, "kda_decode_prepare");
#endif
}

void rmsnorm_gated_forward(const Exec& ex, const Tensor& x, const Tensor& w, float eps,
                           const Tensor& gate, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "rmsnorm_gated_forward", x, w, gate, out);
  if (ex.device.is_cpu()) {
    LOOM_CHECK(gate.numel() == x.numel(), "rmsnorm_gated_forward: x %s gate %s",
               x.describe().c_str(), gate.describe().c_str());
    rmsnorm_forward(ex, x, w, eps, 0.0f, out);
    return mul_sigmoid_inplace(ex, out, gate);
  }
#ifdef LOOM_WITH_CUDA
  return cuda::rmsnorm_gated_forward(ex, x, w, eps, gate, out);
#else
  no_kernel_for(ex, "rmsnorm_gated_forward");
#endif
}

}  // namespace loom
