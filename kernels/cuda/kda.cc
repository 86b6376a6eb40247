// Host side of the CUDA KDA kernels (checks as in kernels/cpu/kda.cc).
#include "kernels/cuda/kda.h"

#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/cuda/device.h"
#include "kernels/cuda/kda_checks.h"
#include "kernels/cuda/kda_chunked_launch.h"

namespace loom::cuda {

void kda_recurrent_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& g, const Tensor& beta, float scale, const Tensor& state,
                           const Tensor& out) {
  const char* fn = "kda_recurrent_forward";
  LOOM_CHECK_CUDA_ARG(fn, q);
  LOOM_CHECK_CUDA_ARG(fn, k);
  LOOM_CHECK_CUDA_ARG(fn, v);
  LOOM_CHECK_CUDA_ARG(fn, g);
  LOOM_CHECK_CUDA_ARG(fn, beta);
  LOOM_CHECK_CUDA_ARG(fn, state);
  LOOM_CHECK_CUDA_ARG(fn, out);
  check_kda_activations(fn, q, k, v, beta, out);
  const DType act = q.dtype();
  LOOM_CHECK_F32(g);
  LOOM_CHECK_F32(state);
  LOOM_CHECK(q.ndim() == 3 && v.ndim() == 3, "%s: q %s v %s", fn, q.describe().c_str(),
             v.describe().c_str());
  const int64_t T = q.dim(0), Hk = q.dim(1), dk = q.dim(2), Hv = v.dim(1), dv = v.dim(2);
  LOOM_CHECK(Hk > 0 && Hv % Hk == 0, "%s: Hv %lld is not a multiple of Hk %lld", fn,
             static_cast<long long>(Hv), static_cast<long long>(Hk));
  LOOM_CHECK_SHAPE(k, T, Hk, dk);
  LOOM_CHECK_SHAPE(v, T, Hv, dv);
  LOOM_CHECK(g.ndim() == 3 && g.dim(0) == T && g.dim(1) == Hv && (g.dim(2) == dk || g.dim(2) == 1),
             "%s: g %s, expected [%lld, %lld, %lld or 1]", fn, g.describe().c_str(),
             static_cast<long long>(T), static_cast<long long>(Hv), static_cast<long long>(dk));
  LOOM_CHECK_SHAPE(beta, T, Hv);
  LOOM_CHECK_SHAPE(state, Hv, dk, dv);
  LOOM_CHECK_SHAPE(out, T, Hv, dv);
  LOOM_CHECK(dk <= 256, "%s: dk %lld > 256 is not supported by the CUDA kernel", fn,
             static_cast<long long>(dk));
  const bool scalar_g = g.dim(2) == 1 && dk != 1;
  if (act == DType::kF32) {
    launch::kda_recurrent(stream_of(ex), q.data<float>(), k.data<float>(), v.data<float>(),
                          g.data<float>(), beta.data<float>(), scale, state.data<float>(),
                          out.data<float>(), T, Hk, Hv, dk, dv, scalar_g);
    return;
  }
  // bf16 activations: the varlen recurrence (kernels/cuda/kda_chunked.cu: this kernel's arithmetic
  // with bf16 loads and stores) over one sequence, the state as a pool of one slot.
  if (T == 0 || dv == 0) return;
  launch::KdaVarlenArgs a;
  a.q = q.raw();
  a.k = k.raw();
  a.v = v.raw();
  a.g = g.data<float>();
  a.beta = beta.raw();
  a.out = out.raw();
  a.pool = state.data<float>();
  a.scale = scale;
  a.B = 1;
  a.N = T;
  a.num_slots = 1;
  a.Hk = static_cast<int>(Hk);
  a.Hv = static_cast<int>(Hv);
  a.dk = static_cast<int>(dk);
  a.dv = static_cast<int>(dv);
  a.scalar_g = scalar_g;
  a.bf16 = true;
  a.beta_bf16 = beta.dtype() == DType::kBF16;
  // Its cu_seqlens {0, T} and slot 0, uploaded for the call.
  const cudaStream_t stream = stream_of(ex);
  struct {
    int64_t cu[2];
    int32_t slot[2];
  } host{{0, T}, {0, 0}};
  Scratch meta(sizeof(host), stream);
  meta.upload(&host, sizeof(host));
  a.cu = static_cast<const int64_t*>(meta.get());
  a.slots = reinterpret_cast<const int32_t*>(static_cast<const char*>(meta.get()) +
                                             offsetof(decltype(host), slot));
  launch::kda_recurrent_varlen(stream, a, std::numeric_limits<int64_t>::max());
}

void kda_gate_forward(const Exec& ex, const Tensor& f, const Tensor& A_log, const Tensor& dt_bias,
                      float lower_bound, const Tensor& g) {
  LOOM_CHECK_CUDA_ARG("kda_gate_forward", f);
  LOOM_CHECK_CUDA_ARG("kda_gate_forward", A_log);
  LOOM_CHECK_CUDA_ARG("kda_gate_forward", g);
  LOOM_CHECK_ACT(f);
  LOOM_CHECK_F32(A_log);
  LOOM_CHECK_F32(g);
  LOOM_CHECK(f.ndim() == 2, "kda_gate_forward: f %s, expected [T, H * dk] or [T, H]",
             f.describe().c_str());
  LOOM_CHECK(g.shape() == f.shape(), "kda_gate_forward: f %s g %s", f.describe().c_str(),
             g.describe().c_str());
  LOOM_CHECK(lower_bound <= 0.0f, "kda_gate_forward: lower_bound %g > 0", lower_bound);
  const int64_t T = f.dim(0), width = f.dim(1), H = A_log.numel();
  LOOM_CHECK(H > 0 && width % H == 0, "kda_gate_forward: f %s with A_log %s", f.describe().c_str(),
             A_log.describe().c_str());
  const float* bias = nullptr;
  if (dt_bias.defined()) {
    LOOM_CHECK_CUDA_ARG("kda_gate_forward", dt_bias);
    LOOM_CHECK_F32(dt_bias);
    LOOM_CHECK(dt_bias.numel() == width, "kda_gate_forward: dt_bias %s, f %s",
               dt_bias.describe().c_str(), f.describe().c_str());
    bias = dt_bias.data<float>();
  }
  launch::kda_gate(stream_of(ex), f.raw(), f.dtype() == DType::kBF16, A_log.data<float>(), bias,
                   lower_bound, g.data<float>(), T, width, H);
}

}  // namespace loom::cuda
