// Host side of the fused kernels around the KDA recurrence: argument checks, then the launch
// (kernels/cuda/kda_fused_launch.h). Each also works out which reduction the separate norm kernel
// would take for the same rows (launch::norm_order), which the fused kernel then replays.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cuda/device.h"
#include "kernels/cuda/kda.h"
#include "kernels/cuda/kda_chunked_launch.h"
#include "kernels/cuda/kda_fused_launch.h"

namespace loom::cuda {
namespace {

bool is_bf16(const Tensor& t) { return t.dtype() == DType::kBF16; }
bool aligned16(const Tensor& t) { return (reinterpret_cast<uintptr_t>(t.raw()) & 15u) == 0; }
// The elements of norm.cu's 16-byte units for these operand types (bf16_io.cuh's kVecWidth).
int vec_width(bool any_bf16) { return any_bf16 ? 8 : 4; }

// LOOM_KDA_FUSED_DECODE=0 sends kda_decode_step to its composition (the A/B switch for benchmarks).
bool fused_decode_from_env() {
  static const bool on = [] {
    const char* v = std::getenv("LOOM_KDA_FUSED_DECODE");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

// kda_decode_step's dimensions: Hv, dk, dv from the state pool, Hk from qkv's width. Hk = 0 when
// they do not fit together.
struct StepDims {
  int64_t B = 0, Hk = 0, Hv = 0, dk = 0, dv = 0;
};
StepDims step_dims(const KdaDecodeStep& s) {
  StepDims d;
  if (!s.qkv.defined() || !s.states.defined() || s.qkv.ndim() != 2 || s.states.ndim() != 4)
    return d;
  d.B = s.qkv.dim(0);
  d.Hv = s.states.dim(1);
  d.dk = s.states.dim(2);
  d.dv = s.states.dim(3);
  const int64_t ck2 = s.qkv.dim(1) - d.Hv * d.dv;
  if (d.dk > 0 && ck2 > 0 && ck2 % (2 * d.dk) == 0) d.Hk = ck2 / (2 * d.dk);
  return d;
}

// The launch arguments of kda_decode_step (every pointer; the orders the separate ops would take
// over workspace tensors, which are 16-byte aligned).
launch::KdaDecodeStepArgs step_args(const KdaDecodeStep& s, const StepDims& d, const Tensor& out) {
  launch::KdaDecodeStepArgs a;
  launch::KdaDecodePrepArgs& p = a.prep;
  p.qkv = s.qkv.raw();
  p.conv_w = s.conv_weight.data<float>();
  p.conv_pool = s.conv_states.raw();
  p.slots = s.state_slots.data<int32_t>();
  p.f = s.f.raw();
  p.A_log = s.A_log.data<float>();
  p.dt_bias = s.dt_bias.defined() ? s.dt_bias.data<float>() : nullptr;
  p.beta = s.beta.raw();
  p.lower_bound = s.lower_bound;
  p.qk_eps = s.qk_eps;
  p.qk_scale = 1.0f;
  p.B = d.B;
  p.num_slots = s.conv_states.dim(0);
  p.gate_width = s.f.dim(1);
  p.Hk = static_cast<int>(d.Hk);
  p.Hv = static_cast<int>(d.Hv);
  p.dk = static_cast<int>(d.dk);
  p.dv = static_cast<int>(d.dv);
  p.W = static_cast<int>(s.conv_weight.dim(1));
  p.act_bf16 = is_bf16(s.qkv);
  p.pool_bf16 = is_bf16(s.conv_states);
  p.f_bf16 = is_bf16(s.f);
  p.beta_bf16 = is_bf16(s.beta);
  p.q_order = launch::norm_order(d.dk, true, vec_width(p.act_bf16));
  p.k_order = p.q_order;
  a.state_pool = s.states.data<float>();
  a.state_slots = s.states.dim(0);
  a.scale = s.scale;
  a.norm_w = s.norm_weight.data<float>();
  a.norm_eps = s.norm_eps;
  // rmsnorm_gated_forward / rmsnorm_forward over out's rows in place.
  a.norm_order =
      launch::norm_order(d.dv, aligned16(out) && aligned16(s.norm_weight), vec_width(p.act_bf16));
  a.gate = s.gate.raw();
  a.gate_silu = s.gate_silu;
  a.out = out.raw();
  a.layout = launch::kda_decode_auto_layout(d.B, d.Hv, d.dv);
  return a;
}

}  // namespace

bool kda_decode_step_applies(const Exec& ex, const KdaDecodeStep& s, const Tensor& out) {
  if (!ex.device.is_cuda() || ex.batch_invariant || !fused_decode_from_env()) return false;
  const StepDims d = step_dims(s);
  if (d.Hk == 0 || d.B == 0 || d.B * d.Hk > launch::kda_decode_step_wave_blocks() ||
      d.Hv % d.Hk != 0 || d.dk > launch::kKdaDecodePrepMaxDk || d.dv % 4 != 0 || d.Hv > INT32_MAX ||
      d.dv > INT32_MAX)
    return false;
  const DType act = s.qkv.dtype();
  if ((act != DType::kF32 && act != DType::kBF16) || s.conv_states.dtype() != act ||
      s.gate.dtype() != act || out.dtype() != act || s.states.dtype() != DType::kF32)
    return false;
  for (const Tensor* t : {&s.qkv, &s.conv_states, &s.states, &s.gate, &out, &s.norm_weight})
    if (!t->defined() || !t->is_contiguous()) return false;
  if (!aligned16(s.states) || !aligned16(out) || out.shape() != Shape({d.B, d.Hv, d.dv}) ||
      s.gate.numel() != out.numel() || !s.f.defined() || s.f.ndim() != 2 ||
      (s.f.dim(1) != d.Hv * d.dk && s.f.dim(1) != d.Hv) || s.conv_weight.ndim() != 2)
    return false;
  launch::KdaDecodeStepArgs a;  // what the shared memory depends on
  a.prep.Hk = static_cast<int>(d.Hk);
  a.prep.Hv = static_cast<int>(d.Hv);
  a.prep.dk = static_cast<int>(d.dk);
  a.prep.dv = static_cast<int>(d.dv);
  a.prep.gate_width = s.f.dim(1);
  a.prep.act_bf16 = act == DType::kBF16;
  a.layout = launch::kda_decode_auto_layout(d.B, d.Hv, d.dv);
  return launch::kda_decode_step_smem(a) <= launch::kda_decode_step_smem_limit();
}

void kda_decode_step(const Exec& ex, const KdaDecodeStep& s, const Tensor& out) {
  const char* fn = "kda_decode_step";
  LOOM_CHECK(kda_decode_step_applies(ex, s, out),
             "%s: qkv %s states %s gate %s out %s: not a shape or layout the fused kernel takes",
             fn, s.qkv.describe().c_str(), s.states.describe().c_str(), s.gate.describe().c_str(),
             out.describe().c_str());
  for (const Tensor* t : {&s.qkv, &s.conv_weight, &s.conv_states, &s.state_slots, &s.f, &s.A_log,
                          &s.beta, &s.states, &s.norm_weight, &s.gate, &out})
    LOOM_CHECK_CUDA_ARG(fn, *t);
  LOOM_CHECK_ACT(s.f);
  LOOM_CHECK_ACT(s.beta);
  LOOM_CHECK_F32(s.conv_weight);
  LOOM_CHECK_F32(s.A_log);
  LOOM_CHECK_F32(s.norm_weight);
  const StepDims d = step_dims(s);
  const int64_t C = s.qkv.dim(1), W = s.conv_weight.dim(1), width = s.f.dim(1);
  LOOM_CHECK_SHAPE(s.conv_weight, C, W);
  LOOM_CHECK(W >= 1 && W <= INT32_MAX, "%s: conv width %lld", fn, static_cast<long long>(W));
  LOOM_CHECK_SHAPE(s.conv_states, s.conv_states.dim(0), W - 1, C);
  LOOM_CHECK(s.state_slots.dtype() == DType::kI32 && s.state_slots.is_contiguous() &&
                 s.state_slots.shape() == Shape({d.B}),
             "%s: state_slots %s, expected contiguous i32 [%lld]", fn,
             s.state_slots.describe().c_str(), static_cast<long long>(d.B));
  LOOM_CHECK(s.f.dim(0) == d.B && s.f.is_contiguous() && s.beta.is_contiguous(), "%s: f %s beta %s",
             fn, s.f.describe().c_str(), s.beta.describe().c_str());
  LOOM_CHECK(s.A_log.numel() == d.Hv, "%s: A_log %s, expected %lld heads", fn,
             s.A_log.describe().c_str(), static_cast<long long>(d.Hv));
  LOOM_CHECK_SHAPE(s.beta, d.B, d.Hv);
  LOOM_CHECK(s.norm_weight.numel() == d.dv, "%s: norm_weight %s, dv %lld", fn,
             s.norm_weight.describe().c_str(), static_cast<long long>(d.dv));
  LOOM_CHECK(s.lower_bound <= 0.0f, "%s: lower_bound %g > 0", fn, s.lower_bound);
  if (s.dt_bias.defined()) {
    LOOM_CHECK_CUDA_ARG(fn, s.dt_bias);
    LOOM_CHECK_F32(s.dt_bias);
    LOOM_CHECK(s.dt_bias.numel() == width, "%s: dt_bias %s, f %s", fn, s.dt_bias.describe().c_str(),
               s.f.describe().c_str());
  }
  // Blocks read other rows' and heads' inputs while others write out and the states.
  for (const Tensor* in : {&s.qkv, &s.conv_states, &s.f, &s.beta, &s.gate, &s.states})
    LOOM_CHECK(!overlaps(out, *in), "%s: out %s overlaps an input %s", fn, out.describe().c_str(),
               in->describe().c_str());
  launch::kda_decode_step(stream_of(ex), step_args(s, d, out));
}

void kda_decode_prepare(const Exec& ex, const Tensor& qkv, const Tensor& conv_weight,
                        const Tensor& conv_states, const Tensor& state_slots, const Tensor& f,
                        const Tensor& A_log, const Tensor& dt_bias, float lower_bound, float qk_eps,
                        const Tensor& beta, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& g) {
  const char* fn = "kda_decode_prepare";
  LOOM_CHECK_CUDA_ARG(fn, qkv);
  LOOM_CHECK_CUDA_ARG(fn, conv_weight);
  LOOM_CHECK_CUDA_ARG(fn, conv_states);
  LOOM_CHECK_CUDA_ARG(fn, state_slots);
  LOOM_CHECK_CUDA_ARG(fn, f);
  LOOM_CHECK_CUDA_ARG(fn, A_log);
  LOOM_CHECK_CUDA_ARG(fn, beta);
  LOOM_CHECK_CUDA_ARG(fn, q);
  LOOM_CHECK_CUDA_ARG(fn, k);
  LOOM_CHECK_CUDA_ARG(fn, v);
  LOOM_CHECK_CUDA_ARG(fn, g);
  LOOM_CHECK_ACT(qkv);
  LOOM_CHECK_ACT(conv_states);
  LOOM_CHECK_ACT(f);
  LOOM_CHECK_ACT(beta);
  LOOM_CHECK_F32(conv_weight);
  LOOM_CHECK_F32(A_log);
  LOOM_CHECK_F32(g);
  const DType act = qkv.dtype();
  LOOM_CHECK(q.dtype() == act && k.dtype() == act && v.dtype() == act && q.is_contiguous() &&
                 k.is_contiguous() && v.is_contiguous(),
             "%s: qkv %s q %s k %s v %s: q, k and v contiguous, of qkv's dtype", fn,
             qkv.describe().c_str(), q.describe().c_str(), k.describe().c_str(),
             v.describe().c_str());
  LOOM_CHECK(qkv.ndim() == 2 && q.ndim() == 3 && v.ndim() == 3 && conv_weight.ndim() == 2 &&
                 conv_states.ndim() == 3 && f.ndim() == 2,
             "%s: qkv %s q %s v %s conv_weight %s conv_states %s f %s", fn, qkv.describe().c_str(),
             q.describe().c_str(), v.describe().c_str(), conv_weight.describe().c_str(),
             conv_states.describe().c_str(), f.describe().c_str());
  const int64_t B = qkv.dim(0), Hk = q.dim(1), dk = q.dim(2), Hv = v.dim(1), dv = v.dim(2);
  const int64_t C = 2 * Hk * dk + Hv * dv, W = conv_weight.dim(1), width = f.dim(1);
  LOOM_CHECK(Hk > 0 && Hv > 0 && W >= 1 && dk <= launch::kKdaDecodePrepMaxDk && Hv <= INT32_MAX &&
                 dv <= INT32_MAX && W <= INT32_MAX,
             "%s: Hk %lld Hv %lld dk %lld (at most %d) W %lld", fn, static_cast<long long>(Hk),
             static_cast<long long>(Hv), static_cast<long long>(dk), launch::kKdaDecodePrepMaxDk,
             static_cast<long long>(W));
  LOOM_CHECK_SHAPE(qkv, B, C);
  LOOM_CHECK_SHAPE(k, B, Hk, dk);
  LOOM_CHECK_SHAPE(conv_weight, C, W);
  LOOM_CHECK_SHAPE(conv_states, conv_states.dim(0), W - 1, C);
  LOOM_CHECK(state_slots.dtype() == DType::kI32 && state_slots.is_contiguous() &&
                 state_slots.shape() == Shape({B}),
             "%s: state_slots %s, expected contiguous i32 [%lld]", fn,
             state_slots.describe().c_str(), static_cast<long long>(B));
  LOOM_CHECK(f.dim(0) == B && (width == Hv * dk || width == Hv) && g.numel() == B * width,
             "%s: f %s g %s, expected [%lld, %lld or %lld] and its numel", fn, f.describe().c_str(),
             g.describe().c_str(), static_cast<long long>(B), static_cast<long long>(Hv * dk),
             static_cast<long long>(Hv));
  LOOM_CHECK(A_log.numel() == Hv, "%s: A_log %s, expected %lld heads", fn, A_log.describe().c_str(),
             static_cast<long long>(Hv));
  LOOM_CHECK_SHAPE(beta, B, Hv);
  LOOM_CHECK(lower_bound <= 0.0f, "%s: lower_bound %g > 0", fn, lower_bound);
  const float* bias = nullptr;
  if (dt_bias.defined()) {
    LOOM_CHECK_CUDA_ARG(fn, dt_bias);
    LOOM_CHECK_F32(dt_bias);
    LOOM_CHECK(dt_bias.numel() == width, "%s: dt_bias %s, f %s", fn, dt_bias.describe().c_str(),
               f.describe().c_str());
    bias = dt_bias.data<float>();
  }
  // Warps read other heads' qkv channels and states while others write q, k, v, g, beta.
  for (const Tensor* out : {&q, &k, &v})
    LOOM_CHECK(!overlaps(*out, qkv) && !overlaps(*out, conv_states) && !overlaps(*out, f) &&
                   !overlaps(*out, beta),
               "%s: output %s overlaps an input", fn, out->describe().c_str());

  launch::KdaDecodePrepArgs a;
  a.qkv = qkv.raw();
  a.conv_w = conv_weight.data<float>();
  a.conv_pool = conv_states.raw();
  a.slots = state_slots.data<int32_t>();
  a.f = f.raw();
  a.A_log = A_log.data<float>();
  a.dt_bias = bias;
  a.beta = beta.raw();
  a.q = q.raw();
  a.k = k.raw();
  a.v = v.raw();
  a.g = g.data<float>();
  a.lower_bound = lower_bound;
  a.qk_eps = qk_eps;
  a.qk_scale = 1.0f;
  a.B = B;
  a.num_slots = conv_states.dim(0);
  a.gate_width = width;
  a.Hk = static_cast<int>(Hk);
  a.Hv = static_cast<int>(Hv);
  a.dk = static_cast<int>(dk);
  a.dv = static_cast<int>(dv);
  a.W = static_cast<int>(W);
  // l2norm_forward(q, q): x and out are q, so q's own alignment picks the unit width.
  a.q_order = launch::norm_order(dk, aligned16(q), vec_width(is_bf16(q)));
  a.k_order = launch::norm_order(dk, aligned16(k), vec_width(is_bf16(k)));
  a.act_bf16 = is_bf16(qkv);
  a.pool_bf16 = is_bf16(conv_states);
  a.f_bf16 = is_bf16(f);
  a.beta_bf16 = is_bf16(beta);
  launch::kda_decode_prepare(stream_of(ex), a);
}

void rmsnorm_gated_forward(const Exec& ex, const Tensor& x, const Tensor& w, float eps,
                           const Tensor& gate, const Tensor& out) {
  const char* fn = "rmsnorm_gated_forward";
  LOOM_CHECK_CUDA_ARG(fn, x);
  LOOM_CHECK_CUDA_ARG(fn, w);
  LOOM_CHECK_CUDA_ARG(fn, gate);
  LOOM_CHECK_CUDA_ARG(fn, out);
  LOOM_CHECK_ACT(x);
  LOOM_CHECK_ACT(gate);
  LOOM_CHECK_ACT(out);
  LOOM_CHECK_F32(w);
  LOOM_CHECK(x.ndim() >= 1, "%s: x %s", fn, x.describe().c_str());
  const int64_t d = x.dim(-1);
  LOOM_CHECK(w.numel() == d && out.shape() == x.shape() && gate.numel() == x.numel(),
             "%s: x %s w %s gate %s out %s", fn, x.describe().c_str(), w.describe().c_str(),
             gate.describe().c_str(), out.describe().c_str());
  LOOM_CHECK_ALIAS_SAME_TYPE(fn, out, x);
  LOOM_CHECK(!overlaps(gate, out), "%s: gate %s overlaps out %s", fn, gate.describe().c_str(),
             out.describe().c_str());
  // rmsnorm_forward(x, w, eps, 0, out)'s reduction: units of both x's and out's types.
  const launch::NormOrder order = launch::norm_order(
      d, aligned16(x) && aligned16(out) && aligned16(w), vec_width(is_bf16(x) || is_bf16(out)));
  launch::rmsnorm_gated(stream_of(ex), x.raw(), is_bf16(x), w.data<float>(), gate.raw(),
                        is_bf16(gate), out.raw(), is_bf16(out), d ? x.numel() / d : 0, d, eps, 0.0f,
                        order);
}

}  // namespace loom::cuda
