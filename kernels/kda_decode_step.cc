// Device dispatch and the composition of kernels/kda_decode_step.h.
#include "kernels/kda_decode_step.h"

#include <optional>

#include "core/workspace.h"
#include "kernels/elementwise.h"
#include "kernels/kda.h"
#include "kernels/norm.h"
#ifdef LOOM_WITH_CUDA
#include "kernels/cuda/kda.h"
#endif

namespace loom {
namespace {

// The separate ops one after another: the reference the fused kernel reproduces, and the path
// wherever it does not apply.
void compose(const Exec& ex, const KdaDecodeStep& s, const Tensor& out) {
  const char* fn = "kda_decode_step";
  LOOM_CHECK(s.qkv.ndim() == 2 && s.states.ndim() == 4 && s.f.ndim() == 2,
             "%s: qkv %s states %s f %s", fn, s.qkv.describe().c_str(), s.states.describe().c_str(),
             s.f.describe().c_str());
  const int64_t B = s.qkv.dim(0), Hv = s.states.dim(1), dk = s.states.dim(2), dv = s.states.dim(3);
  const int64_t ck2 = s.qkv.dim(1) - Hv * dv;
  LOOM_CHECK(dk > 0 && ck2 > 0 && ck2 % (2 * dk) == 0, "%s: qkv %s, states %s", fn,
             s.qkv.describe().c_str(), s.states.describe().c_str());
  const int64_t Hk = ck2 / (2 * dk);
  LOOM_CHECK_SHAPE(out, B, Hv, dv);
  LOOM_CHECK(s.gate.numel() == out.numel(), "%s: gate %s, out %s", fn, s.gate.describe().c_str(),
             out.describe().c_str());
  std::optional<Workspace::Mark> mark;
  if (ex.workspace != nullptr) mark.emplace(*ex.workspace);
  const auto temp = [&](Shape shape, DType dtype) {
    return ex.workspace != nullptr ? ex.workspace->take(shape, dtype)
                                   : Tensor::empty(shape, dtype, ex.device);
  };
  const DType act = s.qkv.dtype();
  const Tensor q = temp({B, Hk, dk}, act), k = temp({B, Hk, dk}, act), v = temp({B, Hv, dv}, act);
  const int64_t gw = s.f.dim(1) / Hv;
  const Tensor g = temp({B, Hv, gw}, DType::kF32);
  kda_decode_prepare(ex, s.qkv, s.conv_weight, s.conv_states, s.state_slots, s.f, s.A_log,
                     s.dt_bias, s.lower_bound, s.qk_eps, s.beta, q, k, v, g);
  kda_varlen_forward(ex, q, k, v, g, s.beta, s.scale, s.states, s.state_slots, s.cu_seqlens, out,
                     /*max_seqlen=*/1);
  const Tensor rows = out.reshape({B * Hv, dv});
  if (s.gate_silu) {
    rmsnorm_forward(ex, rows, s.norm_weight, s.norm_eps, 0.0f, rows);
    mul_silu_inplace(ex, rows, s.gate);
  } else {
    rmsnorm_gated_forward(ex, rows, s.norm_weight, s.norm_eps, s.gate, rows);
  }
}

}  // namespace

bool kda_decode_step_is_fused(const Exec& ex, const KdaDecodeStep& s, const Tensor& out) {
#ifdef LOOM_WITH_CUDA
  return ex.device.is_cuda() && cuda::kda_decode_step_applies(ex, s, out);
#else
  (void)ex;
  (void)s;
  (void)out;
  return false;
#endif
}

void kda_decode_step(const Exec& ex, const KdaDecodeStep& s, const Tensor& out) {
  LOOM_ON_EXEC_DEVICE(ex, "kda_decode_step", s.qkv, s.conv_weight, s.conv_states, s.state_slots,
                      s.f, s.A_log, s.dt_bias, s.beta);
  LOOM_ON_EXEC_DEVICE(ex, "kda_decode_step", s.cu_seqlens, s.states, s.norm_weight, s.gate, out);
#ifdef LOOM_WITH_CUDA
  if (kda_decode_step_is_fused(ex, s, out)) return cuda::kda_decode_step(ex, s, out);
#endif
  compose(ex, s, out);
}

}  // namespace loom
