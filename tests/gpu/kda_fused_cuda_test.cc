// The fused kernels around the KDA recurrence (kernels/kda.h) on the GPU: kda_decode_prepare (the
// decode step's convolution, split, q/k l2 norms, decay gate and sigmoid(beta) in one kernel) and
// rmsnorm_gated_forward (the per-head output RMSNorm times sigmoid(gate)), each against
//  - the separate CUDA ops it replaces, run on the same device inputs: bit for bit (0 differing
//    elements). Both fused kernels replay the separate kernels' operations in their order (the
//    convolution's fmaf chain, norm.cu's per-thread sums and shuffle trees, the gate and sigmoid
//    formulas), so any difference is a bug, not rounding;
//  - the CPU reference (the same ops composed on the host, f32), with the bounds below.
// Fresh random inputs each run (the seed is printed; LOOM_GPU_TEST_SEED replays one). Shapes are
// not multiples of the kernels' tiles: 3 heads, dk 36, 70, 72, 128, 200, 250 (the norm's vector,
// scalar and 64-thread-block reductions), dv 40 and 128, B = 1, 5 and 13 sequences in shuffled
// slots of a larger pool, with padding rows (slot -1) whose q, k, v rows must be zero and whose
// states are never touched; conv widths 2, 3, 4 (compiled) and 5 (the any-width loop); f32 and
// bf16 activations, conv states, f and beta; q and k 16-byte aligned or not (another reduction).
//
// Bounds against the CPU (scaled error, twin_tolerances.h's convention; eps = FLT_EPSILON,
// kBf16U = 2^-8, bf16's unit roundoff):
//  - v: the convolution, (W + 4) eps as varlen_ops_cuda_test.cc's conv (the GPU fuses each
//    multiply-add; a few ulp of expf in SiLU); a bf16 v is that rounded once: + kBf16U;
//  - q, k: the convolution's error carried through the norm (relative to the head's norm, at most
//    the same (W + 4) eps in scaled terms) plus the norm's own, twin::norm_tol(dk); doubled for
//    the two stacked. bf16: the GPU rounds the convolution to bf16 before the norm (each input
//    within kBf16U of the CPU's f32 value, moving the norm by at most as much) and rounds the
//    result: + 3 kBf16U;
//  - g: 16 eps (cuda_kernels_test.cc's KdaGate: expf, log1pf and the sigmoid within a few ulp);
//  - beta: 16 eps, + kBf16U when stored in bf16;
//  - conv states: 0 differing elements (copies; a bf16 pool holds the CPU's values rounded).
//  - rmsnorm_gated: twin::norm_tol(d) + 8 eps (the norm, then the sigmoid and one multiply); a
//    bf16 out is rounded twice on the GPU (after the norm, as the separate norm stores it, and
//    after the multiply): + 2 kBf16U.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/conv.h"
#include "kernels/cuda/device.h"
#include "kernels/elementwise.h"
#include "kernels/kda.h"
#include "kernels/kda_decode_step.h"
#include "kernels/norm.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/gpu/twin_tolerances.h"

namespace loom {
namespace {

constexpr DType F = DType::kF32, H = DType::kBF16;
constexpr double kBf16U = 1.0 / 256;
constexpr float kQkEps = 1e-6f;  // linear_attention.cc's kQkNormEps

std::mt19937_64& rng() {
  static std::mt19937_64 r(gpu_test_seed());
  return r;
}

Tensor randn(Shape shape, float scale = 1.0f, float mean = 0.0f) {
  return twin::randn(rng(), shape, scale, mean);
}
Tensor dev(const Tensor& h) { return cuda::to_device(h); }
Tensor host(const Tensor& d) { return cuda::to_host(d); }

const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}

// A host f32 tensor in `dtype`: a copy, or each value rounded to nearest even bf16.
Tensor to_dtype(const Tensor& f, DType dtype) {
  if (dtype == F) return f.clone();
  Tensor b = Tensor::empty(f.shape(), H);
  for (int64_t i = 0; i < f.numel(); ++i) b.data<uint16_t>()[i] = f32_to_bf16(f.data<float>()[i]);
  return b;
}
// The values of a host f32 tensor as a `dtype` array holds them, kept in f32.
Tensor as_held(const Tensor& f, DType dtype) {
  return dtype == H ? to_dtype(f, H).to_f32() : f.clone();
}
const char* tag(DType d) { return d == H ? "bf16" : "f32"; }

// A device tensor of `shape` and `dtype` full of NaN, starting `offset` elements into its buffer
// (offset 1: not 16-byte aligned, which sends the separate norm to its scalar reduction).
Tensor poisoned(Shape shape, DType dtype, int64_t offset = 0) {
  const int64_t n = shape.numel();
  const Tensor buf = dev(to_dtype(Tensor::full({n + offset}, std::nanf("")), dtype));
  return buf.slice(0, offset, offset + n).reshape(shape);
}

// Elements whose bits differ between two tensors (host or device) of one dtype and shape (all of
// them if the shapes or dtypes differ).
int64_t differing(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.device() == Device::kCpu ? a.clone() : host(a);
  const Tensor hb = b.device() == Device::kCpu ? b.clone() : host(b);
  if (ha.shape() != hb.shape() || ha.dtype() != hb.dtype()) return std::max(ha.numel(), hb.numel());
  const size_t e = dtype_size(ha.dtype());
  const char* pa = static_cast<const char*>(ha.raw());
  const char* pb = static_cast<const char*>(hb.raw());
  int64_t n = 0;
  for (int64_t i = 0; i < ha.numel(); ++i) n += std::memcmp(pa + i * e, pb + i * e, e) != 0;
  return n;
}

double scaled_err(const Tensor& got_dev, const Tensor& ref) {
  return twin::scaled_err(host(got_dev).to_f32(), ref);
}

void report(const std::string& name, double err, double tol) {
  const bool pass = err <= tol;  // false for NaN
  std::printf("GPUCHECK %s %.3e %.3e %s\n", name.c_str(), err, tol, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(err, tol) << name;
}

// Rows `rows` of a [B, ...] tensor (host or device), stacked: a host tensor.
Tensor rows_of(const Tensor& t, const std::vector<int64_t>& rows) {
  const Tensor h = t.device() == Device::kCpu ? t.clone() : host(t);
  Shape s = h.shape();
  s[0] = static_cast<int64_t>(rows.size());
  Tensor out = Tensor::empty(s, h.dtype());
  const size_t row_bytes = h.nbytes() / static_cast<size_t>(h.dim(0));
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(static_cast<char*>(out.raw()) + i * row_bytes,
                static_cast<const char*>(h.raw()) + rows[i] * row_bytes, row_bytes);
  return out;
}

class KdaFusedCuda : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cuda::init();
    (void)gpu_test_seed();
  }
};

// ---------------------------------------------------------------------------------------------
// kda_decode_prepare.
struct PrepCase {
  std::string name;
  int64_t B, Hk, Hv, dk, dv, W;
  std::vector<int64_t> padding;  // rows with slot -1
  bool scalar_gate = false;      // f and g [B, Hv] (GDN's decay per head)
  bool misaligned_qk = false;    // q and k one element off 16-byte alignment
};

struct PrepDtypes {
  DType act, pool, f, beta;
};

// The host inputs of one case, as f32 holding exactly what the device arrays of `dt` hold.
struct PrepInputs {
  Tensor qkv, w, pool0, f, a_log, dt_bias, beta;
  std::vector<int32_t> slots;  // -1: padding
  int64_t num_slots = 0, width = 0, C = 0;
};

PrepInputs prep_inputs(const PrepCase& c, const PrepDtypes& dt, bool with_bias) {
  PrepInputs in;
  in.C = 2 * c.Hk * c.dk + c.Hv * c.dv;
  in.width = c.scalar_gate ? c.Hv : c.Hv * c.dk;
  in.num_slots = c.B + 3;
  in.qkv = as_held(randn({c.B, in.C}), dt.act);
  in.w = randn({in.C, c.W}, 0.5f);
  in.pool0 = as_held(randn({in.num_slots, c.W - 1, in.C}), dt.pool);
  in.f = as_held(randn({c.B, in.width}, 2.0f), dt.f);
  in.a_log = twin::uniform(rng(), {c.Hv}, -1.0f, 1.5f);
  if (with_bias) in.dt_bias = randn({in.width});
  in.beta = as_held(randn({c.B, c.Hv}, 2.0f), dt.beta);
  std::vector<int32_t> ids(static_cast<size_t>(in.num_slots));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng());
  in.slots.assign(ids.begin(), ids.begin() + c.B);
  for (int64_t b : c.padding) in.slots[static_cast<size_t>(b)] = -1;
  return in;
}

Tensor i32_tensor(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}
Tensor i64_iota(int64_t n) {
  Tensor t = Tensor::empty({n}, DType::kI64);
  for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = i;
  return t;
}

// The outputs of one run on the device.
struct PrepOut {
  Tensor q, k, v, g, beta, pool;
};

PrepOut prep_outputs(const PrepCase& c, const PrepDtypes& dt, const PrepInputs& in) {
  const int64_t off = c.misaligned_qk ? 1 : 0;
  return {poisoned({c.B, c.Hk, c.dk}, dt.act, off), poisoned({c.B, c.Hk, c.dk}, dt.act, off),
          poisoned({c.B, c.Hv, c.dv}, dt.act),      poisoned({c.B, in.width}, F),
          dev(to_dtype(in.beta, dt.beta)),          Tensor()};
}

void run_prep_case(const PrepCase& c, const PrepDtypes& dt, float lower_bound, bool with_bias) {
  const std::string name =
      c.name + "_act" + tag(dt.act) + "_pool" + tag(dt.pool) + "_f" + tag(dt.f) + "_beta" +
      tag(dt.beta) + (lower_bound == 0.0f ? "_softplus" : "_bounded") + (with_bias ? "_bias" : "");
  const PrepInputs in = prep_inputs(c, dt, with_bias);
  const int64_t ck = c.Hk * c.dk, cv = c.Hv * c.dv, P = c.W - 1;
  const Tensor qkv = dev(to_dtype(in.qkv, dt.act)), w = dev(in.w), f = dev(to_dtype(in.f, dt.f));
  const Tensor a_log = dev(in.a_log), bias = with_bias ? dev(in.dt_bias) : Tensor();
  std::vector<int64_t> real;
  for (int64_t b = 0; b < c.B; ++b)
    if (in.slots[static_cast<size_t>(b)] >= 0) real.push_back(b);

  // Fused.
  PrepOut fu = prep_outputs(c, dt, in);
  fu.pool = dev(to_dtype(in.pool0, dt.pool));
  kda_decode_prepare(gpu(), qkv, w, fu.pool, dev(i32_tensor(in.slots)), f, a_log, bias, lower_bound,
                     kQkEps, fu.beta, fu.q, fu.k, fu.v, fu.g);

  // Separate CUDA ops. The convolution takes no negative slot: padding rows convolve against
  // spare slots after the pool's own (slot num_slots + b), so the pool's slots see exactly the
  // real rows' updates.
  PrepOut se = prep_outputs(c, dt, in);
  {
    Tensor ext = Tensor::empty({in.num_slots + c.B, P, in.C});
    std::memcpy(ext.data<float>(), in.pool0.data<float>(), in.pool0.nbytes());
    const Tensor spare = as_held(randn({c.B, P, in.C}), dt.pool);
    std::memcpy(ext.data<float>() + in.pool0.numel(), spare.data<float>(), spare.nbytes());
    std::vector<int32_t> slots = in.slots;
    for (int64_t b = 0; b < c.B; ++b)
      if (slots[static_cast<size_t>(b)] < 0)
        slots[static_cast<size_t>(b)] = static_cast<int32_t>(in.num_slots + b);
    const Tensor pool_ext = dev(to_dtype(ext, dt.pool));
    const Tensor conv_out = poisoned({c.B, in.C}, dt.act);
    causal_conv1d_varlen(gpu(), qkv, w, pool_ext, dev(i32_tensor(slots)), dev(i64_iota(c.B + 1)),
                         /*apply_silu=*/true, conv_out);
    copy_columns(gpu(), conv_out, 0, se.q.reshape({c.B, ck}));
    copy_columns(gpu(), conv_out, ck, se.k.reshape({c.B, ck}));
    copy_columns(gpu(), conv_out, 2 * ck, se.v.reshape({c.B, cv}));
    l2norm_forward(gpu(), se.q, kQkEps, 1.0f, se.q);
    l2norm_forward(gpu(), se.k, kQkEps, 1.0f, se.k);
    kda_gate_forward(gpu(), f, a_log, bias, lower_bound, se.g);
    sigmoid_inplace(gpu(), se.beta);
    se.pool = pool_ext.slice(0, 0, in.num_slots);
  }
  const Tensor q = host(fu.q), k = host(fu.k), v = host(fu.v);
  report(name + "_q_vs_separate",
         static_cast<double>(differing(rows_of(q, real), rows_of(se.q, real))), 0.0);
  report(name + "_k_vs_separate",
         static_cast<double>(differing(rows_of(k, real), rows_of(se.k, real))), 0.0);
  report(name + "_v_vs_separate",
         static_cast<double>(differing(rows_of(v, real), rows_of(se.v, real))), 0.0);
  report(name + "_g_vs_separate", static_cast<double>(differing(fu.g, se.g)), 0.0);
  report(name + "_beta_vs_separate", static_cast<double>(differing(fu.beta, se.beta)), 0.0);
  report(name + "_states_vs_separate", static_cast<double>(differing(fu.pool, se.pool)), 0.0);

  // Padding rows: q, k, v zero (+0 bits); the slots nobody names: untouched.
  int64_t pad_bad = 0;
  for (int64_t b : c.padding) {
    for (const Tensor* t : {&q, &k, &v}) {
      const Tensor row = t->slice(0, b, b + 1).clone();
      pad_bad += differing(row, to_dtype(Tensor::zeros(row.shape()), dt.act));
    }
  }
  report(name + "_padding_rows_nonzero", static_cast<double>(pad_bad), 0.0);
  std::vector<bool> named(static_cast<size_t>(in.num_slots), false);
  for (int32_t s : in.slots)
    if (s >= 0) named[static_cast<size_t>(s)] = true;
  const Tensor pool_raw = host(fu.pool), pool0_raw = to_dtype(in.pool0, dt.pool);
  int64_t untouched = 0;
  for (int64_t s = 0; s < in.num_slots; ++s)
    if (!named[static_cast<size_t>(s)])
      untouched += differing(pool_raw.select(s).clone(), pool0_raw.select(s).clone());
  report(name + "_unnamed_states_changed", static_cast<double>(untouched), 0.0);

  // The CPU reference: the same ops composed on the host.
  PrepOut ref;
  ref.q = Tensor::empty({c.B, c.Hk, c.dk});
  ref.k = Tensor::empty({c.B, c.Hk, c.dk});
  ref.v = Tensor::empty({c.B, c.Hv, c.dv});
  ref.g = Tensor::empty({c.B, in.width});
  ref.beta = in.beta.clone();
  ref.pool = in.pool0.clone();
  kda_decode_prepare(host_exec(), in.qkv, in.w, ref.pool, i32_tensor(in.slots), in.f, in.a_log,
                     in.dt_bias, lower_bound, kQkEps, ref.beta, ref.q, ref.k, ref.v, ref.g);
  const double eps = twin::kEps, conv_tol = (c.W + 4) * eps;
  const bool bf = dt.act == H;
  const double qk_tol = 2 * (conv_tol + twin::norm_tol(c.dk)) + (bf ? 3 * kBf16U : 0.0);
  report(name + "_q_vs_cpu", scaled_err(fu.q, ref.q), qk_tol);
  report(name + "_k_vs_cpu", scaled_err(fu.k, ref.k), qk_tol);
  report(name + "_v_vs_cpu", scaled_err(fu.v, ref.v), conv_tol + (bf ? kBf16U : 0.0));
  report(name + "_g_vs_cpu", scaled_err(fu.g, ref.g), 16 * eps);
  report(name + "_beta_vs_cpu", scaled_err(fu.beta, ref.beta),
         16 * eps + (dt.beta == H ? kBf16U : 0.0));
  report(name + "_states_vs_cpu",
         static_cast<double>(differing(pool_raw, to_dtype(ref.pool, dt.pool))), 0.0);
}

TEST_F(KdaFusedCuda, DecodePrepare) {
  const std::vector<PrepCase> cases = {
      // The model's head sizes at batch 1, then batches with padding rows.
      {"B1_Hk3_dk128_dv128", 1, 3, 3, 128, 128, 4, {}},
      {"B1_padding_only", 1, 3, 3, 128, 128, 4, {0}},
      {"B5_Hk3_dk72_dv40", 5, 3, 3, 72, 40, 4, {1, 4}},
      {"B13_Hk3_Hv6_dk128_dv40", 13, 3, 6, 128, 40, 4, {0, 7}},
      {"B13_Hk3_dk72_dv128_scalar_gate", 13, 3, 3, 72, 128, 4, {5}, true},
      // The norm's other reductions: q and k off alignment (scalar units; 72 > 64 of them take
      // norm.cu's 64-thread block), dk 36 (bf16: scalar, a warp), 70 and 250 (scalar, the block),
      // 200 (16-byte units in one warp).
      {"B5_dk72_misaligned", 5, 3, 3, 72, 40, 4, {2}, false, true},
      {"B5_dk36_dv40", 5, 3, 3, 36, 40, 4, {3}},
      {"B5_dk70_dv40", 5, 3, 3, 70, 40, 4, {0}},
      {"B5_Hk1_dk250_dv40", 5, 1, 3, 250, 40, 4, {1}},
      {"B5_Hk2_dk200_dv40", 5, 2, 2, 200, 40, 4, {}},
      // Other conv widths: 2 and 3 compiled, 5 the any-width loop.
      {"B5_W2", 5, 3, 3, 72, 40, 2, {4}},
      {"B5_W3", 5, 3, 3, 72, 40, 3, {4}},
      {"B5_W5", 5, 3, 3, 72, 40, 5, {4}},
  };
  const std::vector<PrepDtypes> dtypes = {{F, F, F, F}, {H, H, H, H}, {H, F, H, F}, {F, H, F, H}};
  int i = 0;
  for (const PrepCase& c : cases)
    for (const PrepDtypes& dt : dtypes) {
      // Softplus and bounded gates, with and without dt_bias, in turn.
      run_prep_case(c, dt, i % 2 == 0 ? 0.0f : -5.0f, i % 3 != 2);
      ++i;
    }
}

// ---------------------------------------------------------------------------------------------
// rmsnorm_gated_forward. Rows as KdaMixer has them: x [n * hv, d], gate [n, hv * d].
void run_gated_case(int64_t d, DType xt, DType gt, DType ot, bool in_place, bool misaligned) {
  const int64_t n = 7, hv = 3, rows = n * hv;
  const std::string name = "rmsnorm_gated_d" + std::to_string(d) + "_x" + tag(xt) + "_gate" +
                           tag(gt) + "_out" + tag(ot) + (in_place ? "_in_place" : "") +
                           (misaligned ? "_misaligned" : "");
  const Tensor x = as_held(randn({rows, d}, 2.0f), xt),
               gate = as_held(randn({n, hv * d}, 2.0f), gt);
  const Tensor w = twin::randn(rng(), {d}, 0.2f, 1.0f);
  const float eps = 1e-5f;
  const int64_t off = misaligned ? 1 : 0;
  const auto x_dev = [&] {
    const Tensor t = poisoned({rows, d}, xt, off);
    t.copy_from(dev(to_dtype(x, xt)));
    return t;
  };
  const Tensor xd = x_dev(), gd = dev(to_dtype(gate, gt)), wd = dev(w);
  const Tensor out = in_place ? xd : poisoned({rows, d}, ot, off);
  rmsnorm_gated_forward(gpu(), xd, wd, eps, gd, out);

  const Tensor xs = x_dev(), sep = in_place ? xs : poisoned({rows, d}, ot, off);
  rmsnorm_forward(gpu(), xs, wd, eps, 0.0f, sep);
  mul_sigmoid_inplace(gpu(), sep, gd);
  report(name + "_vs_separate", static_cast<double>(differing(out, sep)), 0.0);

  Tensor ref = Tensor::empty({rows, d});
  rmsnorm_gated_forward(host_exec(), x, w, eps, gate, ref);
  report(name + "_vs_cpu", scaled_err(out, ref),
         twin::norm_tol(d) + 8 * twin::kEps + (ot == H ? 2 * kBf16U : 0.0));
}

TEST_F(KdaFusedCuda, RmsNormGated) {
  // d: KDA's dv (40, 128: one warp of 16-byte units); 100 (f32: 16-byte units; bf16: scalar, 100
  // units, norm.cu's 64-thread block); 333 (scalar, the block); 1000 and 2500 (norm.cu's 128- and
  // 256-thread blocks).
  for (int64_t d : {40, 128, 100, 333, 1000, 2500}) {
    run_gated_case(d, F, F, F, false, false);
    run_gated_case(d, F, F, F, true, false);
    run_gated_case(d, H, H, H, true, false);
    run_gated_case(d, H, F, F, false, false);
    run_gated_case(d, F, H, H, false, false);
  }
  run_gated_case(128, F, F, F, true, true);  // misaligned rows: the scalar reduction
  run_gated_case(128, H, H, H, false, true);
}

// ---------------------------------------------------------------------------------------------
// kda_decode_step: the one fused kernel against the three separate CUDA ops it replaces
// (kda_decode_prepare, kda_varlen_forward's decode kernel, rmsnorm_gated_forward or rmsnorm_forward
// then mul_silu_inplace) on the same device inputs: the output rows (padding rows too), the conv
// state pool and the recurrent state pool bit for bit. Batches on both sides of the recurrence's
// layout switch (16-column tiles below 4 blocks of 64 columns an SM, 64-column tiles above),
// KDA (a decay per channel, sigmoid output gate) and GDN (a decay per head, two value heads a
// key head, silu output gate), f32 and bf16 activations, conv width 4 and the any-width loop.
struct StepCase {
  std::string name;
  int64_t B, Hk, Hv, dk, dv, W;
  std::vector<int64_t> padding;  // rows with slot -1
  bool gdn = false;
  DType act = H;
  bool fused = true;  // whether kda_decode_step takes the fused kernel (else its composition)
};

// The inputs of a step on the device, fresh copies of the pools and beta each call.
struct StepInputs {
  Tensor qkv, w, conv0, f, a_log, bias, beta, states0, norm_w, gate, slots, cu;
};

KdaDecodeStep step_of(const StepCase& c, const StepInputs& in, const Tensor& conv,
                      const Tensor& states, const Tensor& beta) {
  KdaDecodeStep s;
  s.qkv = in.qkv;
  s.conv_weight = in.w;
  s.conv_states = conv;
  s.state_slots = in.slots;
  s.f = in.f;
  s.A_log = in.a_log;
  s.dt_bias = in.bias;
  s.lower_bound = c.gdn ? 0.0f : -5.0f;
  s.qk_eps = kQkEps;
  s.beta = beta;
  s.cu_seqlens = in.cu;
  s.states = states;
  s.scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
  s.norm_weight = in.norm_w;
  s.norm_eps = 1e-5f;
  s.gate = in.gate;
  s.gate_silu = c.gdn;
  return s;
}

void run_step_case(const StepCase& c) {
  const std::string name = "decode_step_" + c.name + "_" + tag(c.act);
  const int64_t ck = c.Hk * c.dk, cv = c.Hv * c.dv, C = 2 * ck + cv;
  const int64_t width = c.gdn ? c.Hv : c.Hv * c.dk, num_slots = c.B + 3;
  StepInputs in;
  in.qkv = dev(to_dtype(randn({c.B, C}), c.act));
  in.w = dev(randn({C, c.W}, 0.5f));
  in.conv0 = to_dtype(randn({num_slots, c.W - 1, C}), c.act);
  in.f = dev(to_dtype(randn({c.B, width}, 2.0f), c.act));
  in.a_log = dev(twin::uniform(rng(), {c.Hv}, -1.0f, 1.5f));
  in.bias = dev(randn({width}));
  in.beta = to_dtype(randn({c.B, c.Hv}, 2.0f), c.act);
  in.states0 = randn({num_slots, c.Hv, c.dk, c.dv}, 0.5f);
  in.norm_w = dev(twin::randn(rng(), {c.dv}, 0.2f, 1.0f));
  in.gate = dev(to_dtype(randn({c.B, cv}, 2.0f), c.act));
  std::vector<int32_t> ids(static_cast<size_t>(num_slots));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng());
  std::vector<int32_t> slots(ids.begin(), ids.begin() + c.B);
  for (int64_t b : c.padding) slots[static_cast<size_t>(b)] = -1;
  in.slots = dev(i32_tensor(slots));
  in.cu = dev(i64_iota(c.B + 1));

  // Fused.
  const Tensor conv_f = dev(in.conv0), states_f = dev(in.states0), beta_f = dev(in.beta);
  const Tensor out_f = poisoned({c.B, c.Hv, c.dv}, c.act);
  const KdaDecodeStep sf = step_of(c, in, conv_f, states_f, beta_f);
  const bool fused = kda_decode_step_is_fused(gpu(), sf, out_f);
  report(name + (c.fused ? "_takes_fused_kernel" : "_takes_composition"),
         fused == c.fused ? 0.0 : 1.0, 0.0);
  kda_decode_step(gpu(), sf, out_f);

  // The separate ops.
  const Tensor conv_s = dev(in.conv0), states_s = dev(in.states0), beta_s = dev(in.beta);
  const Tensor out_s = poisoned({c.B, c.Hv, c.dv}, c.act);
  const KdaDecodeStep ss = step_of(c, in, conv_s, states_s, beta_s);
  const Tensor q = poisoned({c.B, c.Hk, c.dk}, c.act), k = poisoned({c.B, c.Hk, c.dk}, c.act);
  const Tensor v = poisoned({c.B, c.Hv, c.dv}, c.act);
  const Tensor g = poisoned({c.B, c.Hv, width / c.Hv}, F);
  kda_decode_prepare(gpu(), ss.qkv, ss.conv_weight, conv_s, ss.state_slots, ss.f, ss.A_log,
                     ss.dt_bias, ss.lower_bound, ss.qk_eps, beta_s, q, k, v, g);
  kda_varlen_forward(gpu(), q, k, v, g, beta_s, ss.scale, states_s, ss.state_slots, in.cu, out_s,
                     1);
  const Tensor rows = out_s.reshape({c.B * c.Hv, c.dv});
  if (c.gdn) {
    rmsnorm_forward(gpu(), rows, in.norm_w, ss.norm_eps, 0.0f, rows);
    mul_silu_inplace(gpu(), rows, in.gate);
  } else {
    rmsnorm_gated_forward(gpu(), rows, in.norm_w, ss.norm_eps, in.gate, rows);
  }

  report(name + "_out_vs_separate", static_cast<double>(differing(out_f, out_s)), 0.0);
  report(name + "_conv_states_vs_separate", static_cast<double>(differing(conv_f, conv_s)), 0.0);
  report(name + "_states_vs_separate", static_cast<double>(differing(states_f, states_s)), 0.0);
  // The states moved at all (a kernel that wrote nothing would match a separate path that did
  // the same), and no output is NaN.
  report(name + "_states_unchanged",
         c.padding.size() == static_cast<size_t>(c.B)
             ? 0.0
             : (differing(states_f, dev(in.states0)) > 0 ? 0.0 : 1.0),
         0.0);
  const Tensor o = host(out_f).to_f32();
  int64_t nan = 0;
  for (int64_t i = 0; i < o.numel(); ++i) nan += std::isnan(o.data<float>()[i]) ? 1 : 0;
  report(name + "_out_nan", static_cast<double>(nan), 0.0);
}

TEST_F(KdaFusedCuda, DecodeStep) {
  const std::vector<StepCase> cases = {
      // The 48B model's head shape at batch 1 and 8 (16-column tiles).
      {"B1_H4_dk128_dv128", 1, 4, 4, 128, 128, 4, {}},
      {"B8_H4_dk128_dv128_pad", 8, 4, 4, 128, 128, 4, {3}},
      // 9 x 32 (row, head) blocks: more than one wave (two an SM on 132 SMs), the composition.
      {"B9_H32_dk128_dv128", 9, 32, 32, 128, 128, 4, {5}, false, H, false},
      // Small heads, f32 (the norms' 4-wide units), a tile group past dv.
      {"B5_H3_dk72_dv40", 5, 3, 3, 72, 40, 4, {1}, false, F},
      {"B5_H3_dk72_dv40", 5, 3, 3, 72, 40, 4, {1}},
      // The any-width convolution; dk 256 (the norm's largest head), dv 64.
      {"B3_H2_dk64_dv64_W5", 3, 2, 2, 64, 64, 5, {}},
      {"B3_H2_dk256_dv64", 3, 2, 2, 256, 64, 4, {2}},
      // Gated DeltaNet: two value heads a key head, a decay per head, silu gate.
      {"gdn_B6_Hk2_Hv4_dk128_dv128", 6, 2, 4, 128, 128, 4, {2}, true},
      // 40 x 8 heads x 2 tiles of 64 columns = 640 >= 4 x 132 SMs: the recurrence's 64-column
      // tiles, in 160 blocks.
      {"gdn_B40_Hk4_Hv8_dk128_dv128", 40, 4, 8, 128, 128, 4, {0, 39}, true, F},
      {"gdn_B40_Hk4_Hv8_dk128_dv128", 40, 4, 8, 128, 128, 4, {7}, true, H},
      {"gdn_B1_Hk16_Hv32_dk128_dv128", 1, 16, 32, 128, 128, 4, {}, true},
      {"B2_padding_only", 2, 2, 2, 128, 128, 4, {0, 1}},
  };
  for (const StepCase& c : cases) run_step_case(c);
}

// ---------------------------------------------------------------------------------------------
// Timing (CUDA events, median of 200 after warm-up): the fused decode preparation and gated norm
// against the separate kernels, at a 48B Kimi-Linear layer's shape (32 heads of 128, W = 4, bf16)
// for B = 1, 8 and 64. Prints "KDAFUSEDBENCH <name> <fused us> <separate us>".
TEST_F(KdaFusedCuda, Timing) {
  const int64_t Hk = 32, Hv = 32, dk = 128, dv = 128, W = 4, C = 2 * Hk * dk + Hv * dv;
  const cudaStream_t stream = cuda::stream_of(gpu());
  const auto ms = [&](const std::function<void()>& f) {
    return median_event_ms(
        stream, [&](int) { f(); }, 200, 10);
  };
  for (int64_t B : {1, 8, 64}) {
    const Tensor qkv = dev(to_dtype(randn({B, C}), H)), w = dev(randn({C, W}, 0.5f));
    const Tensor pool = dev(to_dtype(randn({B, W - 1, C}), H));
    const Tensor f = dev(to_dtype(randn({B, Hv * dk}), H)), a_log = dev(randn({Hv}, 0.5f));
    const Tensor bias = dev(randn({Hv * dk})), beta = dev(to_dtype(randn({B, Hv}), H));
    std::vector<int32_t> s(static_cast<size_t>(B));
    std::iota(s.begin(), s.end(), 0);
    const Tensor slots = dev(i32_tensor(s)), cu = dev(i64_iota(B + 1));
    const Tensor q = poisoned({B, Hk, dk}, H), k = poisoned({B, Hk, dk}, H);
    const Tensor v = poisoned({B, Hv, dv}, H), g = poisoned({B, Hv * dk}, F);
    const Tensor conv_out = poisoned({B, C}, H);
    const double fused = ms([&] {
      kda_decode_prepare(gpu(), qkv, w, pool, slots, f, a_log, bias, 0.0f, kQkEps, beta, q, k, v,
                         g);
    });
    const double separate = ms([&] {
      causal_conv1d_varlen(gpu(), qkv, w, pool, slots, cu, true, conv_out);
      copy_columns(gpu(), conv_out, 0, q.reshape({B, Hk * dk}));
      copy_columns(gpu(), conv_out, Hk * dk, k.reshape({B, Hk * dk}));
      copy_columns(gpu(), conv_out, 2 * Hk * dk, v.reshape({B, Hv * dv}));
      l2norm_forward(gpu(), q, kQkEps, 1.0f, q);
      l2norm_forward(gpu(), k, kQkEps, 1.0f, k);
      kda_gate_forward(gpu(), f, a_log, bias, 0.0f, g);
      sigmoid_inplace(gpu(), beta);
    });
    std::printf("KDAFUSEDBENCH decode_prepare_B%lld %.2f %.2f\n", static_cast<long long>(B),
                fused * 1e3, separate * 1e3);
    const Tensor o = dev(to_dtype(randn({B * Hv, dv}), H)), gate = dev(to_dtype(randn({B, C}), H));
    const Tensor on = dev(twin::randn(rng(), {dv}, 0.2f, 1.0f));
    const Tensor gate_v = gate.reshape({B * C}).slice(0, 0, B * Hv * dv);
    const double gated = ms([&] { rmsnorm_gated_forward(gpu(), o, on, 1e-5f, gate_v, o); });
    const double pair = ms([&] {
      rmsnorm_forward(gpu(), o, on, 1e-5f, 0.0f, o);
      mul_sigmoid_inplace(gpu(), o, gate_v);
    });
    std::printf("KDAFUSEDBENCH rmsnorm_gated_B%lld %.2f %.2f\n", static_cast<long long>(B),
                gated * 1e3, pair * 1e3);
    // The whole step: one fused kernel against prepare, recurrence and gated norm.
    const Tensor states = dev(randn({B, Hv, dk, dv}, 0.5f));
    const Tensor out = poisoned({B, Hv, dv}, H);
    KdaDecodeStep st;
    st.qkv = qkv;
    st.conv_weight = w;
    st.conv_states = pool;
    st.state_slots = slots;
    st.f = f;
    st.A_log = a_log;
    st.dt_bias = bias;
    st.beta = beta;
    st.cu_seqlens = cu;
    st.states = states;
    st.scale = 1.0f / std::sqrt(static_cast<float>(dk));
    st.norm_weight = on;
    st.gate = gate_v;
    // Past one wave of blocks (B = 64) kda_decode_step is the composition: timed all the same.
    int sms = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
    EXPECT_EQ(kda_decode_step_is_fused(gpu(), st, out), B * Hk <= 2 * sms);
    const double step = ms([&] { kda_decode_step(gpu(), st, out); });
    const Tensor g3 = g.reshape({B, Hv, dk});
    const double three = ms([&] {
      kda_decode_prepare(gpu(), qkv, w, pool, slots, f, a_log, bias, 0.0f, kQkEps, beta, q, k, v,
                         g);
      kda_varlen_forward(gpu(), q, k, v, g3, beta, st.scale, states, slots, cu, out, 1);
      rmsnorm_gated_forward(gpu(), out.reshape({B * Hv, dv}), on, 1e-6f, gate_v,
                            out.reshape({B * Hv, dv}));
    });
    std::printf("KDAFUSEDBENCH decode_step_B%lld %.2f %.2f\n", static_cast<long long>(B),
                step * 1e3, three * 1e3);
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace loom
