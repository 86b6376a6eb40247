// The CUDA backward passes of the norms, gates, RoPE and row scatters (kernels/cuda/backward.h,
// kernels/cuda/rope.h) against their CPU twins, on fresh random inputs (the seed is printed;
// LOOM_GPU_TEST_SEED replays one), at sizes that are not multiples of the kernels' tiles. Outputs
// are NaN before each call; parameter gradients start from random values (they accumulate).
//
// Bounds (each check prints "GPUCHECK <name> <error> <bound> <PASS|FAIL>" for tests/gpu/run.sh):
//  - elementwise gates and sigmoid: the same formulas on both sides; expf (<= 2 ulp on the GPU, ~1
//    in glibc) inside a sigmoid and two or three products: <= 8 eps scaled (max |diff| / max(1,
//    max |ref|)), as cuda_kernels_test.cc's pointwise ops;
//  - RoPE backward: the rotation's bound from cuda_kernels_test.cc (8 eps scaled);
//  - norm dx: the row's sum of squares and the dot product with dout are length-d sums in
//    different orders (~sqrt(d) u each, twin_tolerances.h's norm bound), entering dx through the
//    scale and the mean: (sqrt(d) + 16) eps scaled;
//  - parameter gradients (a norm's weight, a bias): column sums of N terms, sequential on the CPU,
//    in 64-row chunks on the GPU. In condition units (|diff| / (|dw0| + sum_r |term_r|)) the
//    sequential sum's error is ~u sqrt(N) for zero-mean terms (twin_tolerances.h's GEMM argument):
//    bound (sqrt(N) + 16) eps; a dropped row is ~1/N there (1e-3 at N = 1000);
//  - linear_backward (cuBLAS through matmul): d_x and d_w are dot products of length N and M of
//    zero-mean terms; scaled by the largest |ref| (~3 sqrt(len) sigma) the error of either order
//    is ~u: bound kGemmTol (16 eps), as the forward GEMM's;
//  - causal_conv1d_backward: dx and the initial state's gradient are sums of W products (plus the
//    final state's gradient), the activation's gradient holds an expf: (W + 8) eps scaled; dweight
//    is a column sum over T as above, its condition taken with |silu'| <= 1.1;
//  - AdamW: the CPU's arithmetic element by element (a division, a square root, products that
//    either side may contract into fused multiply-adds): 8 eps scaled on param, m and v after
//    three steps; the sum of squares: a double sum in another order, rounded once to f32: 2 eps
//    relative;
//  - kda_gate_backward: d_f is a product of exp/log1p/sigmoid terms (a few ulp each on either
//    side): 16 eps scaled; d_dt_bias and d_A_log are sums over tokens (and a head's columns) as
//    above, in condition units with a budget of sum_tol(T * columns per head);
//  - MoE: moe_permute_backward adds a token's K rows in the CPU's order (0 differing bits without
//    contraction differences: asserted <= 4 eps scaled); moe_unpermute_combine_backward's d_y is
//    one product (0 bits: asserted <= 1 eps scaled) and d_weights a double dot product rounded
//    once (2 eps scaled); moe_route_backward is the CPU's row loop with expf: 16 eps scaled;
//    the auxiliary loss: double sums of the same f32 scores (expf against glibc's exp): 4 eps
//    relative, its gradient 16 eps scaled; moe_grouped_swiglu_backward is the CPU's sequence of
//    GEMMs through cuBLAS: kGemmTol (16 eps) scaled on d_x and on each accumulated weight gradient;
//    owned expert ranges of all 16 experts and of 7 (rows of -1, tokens with no owned slot);
//  - attnres_aggregate_backward: per token the CPU's recomputation with every length-D sum as a
//    block reduction (sums of squares, logits, the output norm, S dot products): the norm bound's
//    (sqrt(D) + 16) eps scaled on dsources, times 4 for the softmax and the two norms chained;
//    the parameter gradients are sums over N tokens of those: the per-token bound plus
//    4 sum_tol(N), scaled by the largest |ref|;
//  - causal attention for training: scores are length-d dot products (warp trees against the
//    CPU's sequential sums, ~sqrt(d) u), then exp and sums over up to T keys: out and lse within
//    4 (sqrt(d) + 16) eps scaled; dq, dk, dv add sums over T queries or keys on top:
//    4 (sqrt(d) + sqrt(T) + 16) eps scaled;
//  - kda_recurrent_backward: the reverse recurrence through the same replayed states, each token
//    a few length-dk or length-dv dot products as the forward's (twin_tolerances.h's kda_tol,
//    whose argument - non-expansive per-token maps damp older errors - holds for the transposed
//    maps too), chained through five stages a token: 8 kda_tol(dk) scaled on every gradient;
//  - row scatters (embedding and gather_rows backward): every target row adds its sources in
//    source order on both sides: 0 differing bits.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/activation.h"
#include "kernels/attention_backward.h"
#include "kernels/attnres.h"
#include "kernels/conv.h"
#include "kernels/cuda/device.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/gemm_backward.h"
#include "kernels/kda_backward.h"
#include "kernels/moe.h"
#include "kernels/norm.h"
#include "kernels/optim.h"
#include "kernels/rope.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/gpu/twin_tolerances.h"

namespace loom {
namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 r(gpu_test_seed());
  return r;
}

Tensor randn(Shape shape, float scale = 1.0f, float mean = 0.0f) {
  return twin::randn(rng(), shape, scale, mean);
}
Tensor dev(const Tensor& h) { return cuda::to_device(h); }
Tensor host(const Tensor& d) { return cuda::to_host(d); }
Tensor poisoned(Shape shape) { return dev(Tensor::full(shape, std::nanf(""))); }

const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}

void report(const std::string& name, double err, double tol) {
  const bool pass = err <= tol;  // false for NaN
  std::printf("GPUCHECK %s %.3e %.3e %s\n", name.c_str(), err, tol, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(err, tol) << name;
}

double scaled(const Tensor& got_dev, const Tensor& ref) {
  return twin::scaled_err(host(got_dev), ref);
}

// max_j |got_j - ref_j| / cond_j for host tensors (inf on NaN).
double condition_err(const Tensor& got, const Tensor& ref, const std::vector<double>& cond) {
  double worst = 0.0;
  for (int64_t j = 0; j < ref.numel(); ++j) {
    const double g = got.data<float>()[j], r = ref.data<float>()[j];
    if (!std::isfinite(g)) return INFINITY;
    worst = std::max(worst, std::fabs(g - r) / std::max(cond[j], 1e-30));
  }
  return worst;
}

int64_t differing_bits(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return std::max(a.numel(), b.numel());
  int64_t n = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    n += std::memcmp(a.data<float>() + i, b.data<float>() + i, sizeof(float)) != 0;
  return n;
}

double sum_tol(int64_t n) { return (std::sqrt(static_cast<double>(n)) + 16) * twin::kEps; }
double norm_dx_tol(int64_t d) { return (std::sqrt(static_cast<double>(d)) + 16) * twin::kEps; }

TEST(CudaBackward, Rmsnorm) {
  for (const auto& [n, d] : {std::pair<int64_t, int64_t>{67, 129}, {1000, 2304}, {1, 7}}) {
    for (float offset : {0.0f, 1.0f}) {
      for (bool alias : {false, true}) {
        const Tensor x = randn({n, d}), w = randn({d}, 0.5f), dout = randn({n, d});
        const Tensor dw0 = randn({d});
        Tensor dx_ref = Tensor::empty({n, d}), dw_ref = dw0.clone();
        rmsnorm_backward(host_exec(), x, w, 1e-6f, offset, dout, dx_ref, dw_ref);
        const Tensor xd = dev(x), wd = dev(w), doutd = dev(dout), dwd = dev(dw0);
        const Tensor dxd = alias ? doutd : poisoned({n, d});
        rmsnorm_backward(gpu(), xd, wd, 1e-6f, offset, doutd, dxd, dwd);
        // Condition of each dw column: |dw0| + sum over rows of |dout * x * rstd|.
        std::vector<double> rs(static_cast<size_t>(n));
        for (int64_t r = 0; r < n; ++r) {
          double ss = 0.0;
          for (int64_t i = 0; i < d; ++i) {
            const double xi = x.data<float>()[r * d + i];
            ss += xi * xi;
          }
          rs[r] = 1.0 / std::sqrt(ss / static_cast<double>(d) + 1e-6);
        }
        std::vector<double> cond(static_cast<size_t>(d));
        for (int64_t j = 0; j < d; ++j) {
          double c = std::fabs(dw0.data<float>()[j]);
          for (int64_t r = 0; r < n; ++r)
            c += std::fabs(double(dout.data<float>()[r * d + j]) * x.data<float>()[r * d + j] *
                           rs[r]);
          cond[j] = c;
        }
        const std::string tag = "rmsnorm_backward_" + std::to_string(n) + "x" + std::to_string(d) +
                                (offset != 0 ? "_zc" : "") + (alias ? "_alias" : "");
        report(tag + "_dx", scaled(dxd, dx_ref), norm_dx_tol(d));
        report(tag + "_dw", condition_err(host(dwd), dw_ref, cond), sum_tol(n));
      }
    }
  }
}

TEST(CudaBackward, L2norm) {
  for (const auto& [rows, d] : {std::pair<int64_t, int64_t>{37 * 5, 128}, {53, 72}, {3, 1000}}) {
    const Tensor x = randn({rows, d}), dout = randn({rows, d});
    Tensor ref = Tensor::empty({rows, d});
    l2norm_backward(host_exec(), x, 1e-6f, 0.7f, dout, ref);
    const Tensor dxd = poisoned({rows, d});
    l2norm_backward(gpu(), dev(x), 1e-6f, 0.7f, dev(dout), dxd);
    report("l2norm_backward_" + std::to_string(rows) + "x" + std::to_string(d), scaled(dxd, ref),
           norm_dx_tol(d));
  }
}

TEST(CudaBackward, Gates) {
  const int64_t n = 10007;
  const Tensor a = randn({n}, 2.0f), b = randn({n}, 3.0f), dout = randn({n});
  {
    Tensor da = Tensor::empty({n}), db = Tensor::empty({n});
    silu_mul_backward(host_exec(), a, b, dout, da, db);
    const Tensor dad = poisoned({n}), dbd = poisoned({n});
    silu_mul_backward(gpu(), dev(a), dev(b), dev(dout), dad, dbd);
    report("silu_mul_backward_dgate", scaled(dad, da), 8 * twin::kEps);
    report("silu_mul_backward_dup", scaled(dbd, db), 8 * twin::kEps);
  }
  {
    Tensor da = Tensor::empty({n}), db = Tensor::empty({n});
    mul_sigmoid_backward(host_exec(), a, b, dout, da, db);
    // In place: dx over x, dgate over gate.
    const Tensor ad = dev(a), bd = dev(b);
    mul_sigmoid_backward(gpu(), ad, bd, dev(dout), ad, bd);
    report("mul_sigmoid_backward_dx_inplace", scaled(ad, da), 8 * twin::kEps);
    report("mul_sigmoid_backward_dgate_inplace", scaled(bd, db), 8 * twin::kEps);
  }
  {
    Tensor da = Tensor::empty({n}), db = Tensor::empty({n});
    mul_silu_backward(host_exec(), a, b, dout, da, db);
    const Tensor dad = poisoned({n}), dbd = poisoned({n});
    mul_silu_backward(gpu(), dev(a), dev(b), dev(dout), dad, dbd);
    report("mul_silu_backward_dx", scaled(dad, da), 8 * twin::kEps);
    report("mul_silu_backward_dgate", scaled(dbd, db), 8 * twin::kEps);
  }
  {
    Tensor y = Tensor::empty({n});
    for (int64_t i = 0; i < n; ++i) y.data<float>()[i] = sigmoidf(a.data<float>()[i]);
    Tensor dx = Tensor::empty({n});
    sigmoid_backward(host_exec(), y, dout, dx);
    const Tensor dxd = poisoned({n});
    sigmoid_backward(gpu(), dev(y), dev(dout), dxd);
    report("sigmoid_backward", scaled(dxd, dx), 8 * twin::kEps);
  }
}

TEST(CudaBackward, MulSigmoidRows) {
  const int64_t n = 45, c = 333;
  const Tensor x = randn({n, c}), gate = randn({n}, 2.0f), dout = randn({n, c});
  Tensor dx = Tensor::empty({n, c}), dg = Tensor::empty({n});
  mul_sigmoid_rows_backward(host_exec(), x, gate, dout, dx, dg);
  const Tensor dxd = poisoned({n, c}), dgd = poisoned({n});
  mul_sigmoid_rows_backward(gpu(), dev(x), dev(gate), dev(dout), dxd, dgd);
  report("mul_sigmoid_rows_backward_dx", scaled(dxd, dx), 8 * twin::kEps);
  // dgate is a length-c dot product times sigmoid': the norm dx bound's dot-product term.
  report("mul_sigmoid_rows_backward_dgate", scaled(dgd, dg), norm_dx_tol(c));
}

TEST(CudaBackward, AddBias) {
  for (const auto& [n, c] : {std::pair<int64_t, int64_t>{1000, 517}, {63, 1}, {129, 64}}) {
    const Tensor dx = randn({n, c}), db0 = randn({c});
    Tensor ref = db0.clone();
    add_bias_backward(host_exec(), dx, ref);
    const Tensor dbd = dev(db0);
    add_bias_backward(gpu(), dev(dx), dbd);
    std::vector<double> cond(static_cast<size_t>(c));
    for (int64_t j = 0; j < c; ++j) {
      double s = std::fabs(db0.data<float>()[j]);
      for (int64_t r = 0; r < n; ++r) s += std::fabs(dx.data<float>()[r * c + j]);
      cond[j] = s;
    }
    report("add_bias_backward_" + std::to_string(n) + "x" + std::to_string(c),
           condition_err(host(dbd), ref, cond), sum_tol(n));
  }
}

// Embedding (i32 and i64 ids, on the host and the device) and gather_rows backward: heavy
// repeats (a few target rows named by many sources) and rows never named.
TEST(CudaBackward, RowScatters) {
  const int64_t t = 301, v = 97, d = 130;
  std::uniform_int_distribution<int64_t> pick(0, v - 1), hot(0, 4);
  std::vector<int64_t> ids64(static_cast<size_t>(t));
  for (auto& id : ids64) id = rng()() % 3 == 0 ? hot(rng()) : pick(rng());
  Tensor ids_i64 = Tensor::empty({t}, DType::kI64), ids_i32 = Tensor::empty({t}, DType::kI32);
  for (int64_t i = 0; i < t; ++i) {
    ids_i64.data<int64_t>()[i] = ids64[i];
    ids_i32.data<int32_t>()[i] = static_cast<int32_t>(ids64[i]);
  }
  const Tensor dout = randn({t, d}), table0 = randn({v, d});
  Tensor ref = table0.clone();
  embedding_backward(host_exec(), ids_i64, dout, ref);
  for (int variant = 0; variant < 4; ++variant) {
    const bool i32 = variant % 2 == 1, on_device = variant >= 2;
    const Tensor& ids = i32 ? ids_i32 : ids_i64;
    const Tensor dtable = dev(table0);
    embedding_backward(gpu(), on_device ? dev(ids) : ids, dev(dout), dtable);
    report(std::string("embedding_backward_") + (i32 ? "i32" : "i64") +
               (on_device ? "_device_ids" : "_host_ids") + "_differing_bits",
           static_cast<double>(differing_bits(host(dtable), ref)), 0.0);
  }
  Tensor gref = table0.clone();
  gather_rows_backward(host_exec(), dout, ids_i64, gref);
  const Tensor dsrc = dev(table0);
  gather_rows_backward(gpu(), dev(dout), dev(ids_i64), dsrc);
  report("gather_rows_backward_differing_bits",
         static_cast<double>(differing_bits(host(dsrc), gref)), 0.0);
}

TEST(CudaBackward, Linear) {
  for (float beta : {0.0f, 1.0f}) {
    const int64_t m = 133, k = 257, n = 67;
    const Tensor x = randn({m, k}), w = randn({n, k}), dy = randn({m, n});
    const Tensor dx0 = randn({m, k}), dw0 = randn({n, k});
    Tensor dx = dx0.clone(), dw = dw0.clone();
    linear_backward(host_exec(), x, w, dy, dx, beta, dw);
    const Tensor dxd = beta == 0.0f ? poisoned({m, k}) : dev(dx0), dwd = dev(dw0);
    linear_backward(gpu(), dev(x), dev(w), dev(dy), dxd, beta, dwd);
    const std::string tag = std::string("linear_backward") + (beta != 0 ? "_accumulate" : "");
    report(tag + "_dx", scaled(dxd, dx), twin::kGemmTol);
    report(tag + "_dw", scaled(dwd, dw), twin::kGemmTol);
  }
}

// Exec::matmul (the trainer's `matmul`): tf32 rounds both products' inputs to a 10-bit mantissa
// (relative error <= 2^-11 each), so an element is off by at most 2^-10 sum |x_i w_i|, about 2.6
// max |ref| for these random normals: 2^-8 of max |ref| bounds it. bf16 keeps 7 bits (relative
// error <= 2^-8 each): 2^-7 sum |x_i w_i|, so 2^-5 of max |ref|. Each error must also exceed
// f32's (bf16's TF32's), or the tensor cores were not used at that precision.
TEST(CudaBackward, LinearTf32AndBf16) {
  const int64_t m = 133, k = 257, n = 67;
  const Tensor x = randn({m, k}), w = randn({n, k}), dy = randn({m, n});
  // linear_backward adds into dw: zeros on both devices.
  Tensor y = Tensor::empty({m, n}), dx = Tensor::empty({m, k}), dw = Tensor::zeros({n, k});
  linear_forward(host_exec(), x, w, y);
  linear_backward(host_exec(), x, w, dy, dx, 0.0f, dw);
  double tf32_err[3] = {0, 0, 0};
  for (const MatmulPrecision precision : {MatmulPrecision::kTf32, MatmulPrecision::kBf16}) {
    const bool bf16 = precision == MatmulPrecision::kBf16;
    Exec ex = gpu();
    ex.matmul = precision;
    const Tensor yd = poisoned({m, n}), dxd = poisoned({m, k}), dwd = dev(Tensor::zeros({n, k}));
    linear_forward(ex, dev(x), dev(w), yd);
    linear_backward(ex, dev(x), dev(w), dev(dy), dxd, 0.0f, dwd);
    const double tol = std::ldexp(1.0, bf16 ? -5 : -8);
    int i = 0;
    for (const auto& [name, got, ref] :
         {std::tuple{"y", &yd, &y}, std::tuple{"dx", &dxd, &dx}, std::tuple{"dw", &dwd, &dw}}) {
      const std::string tag = std::string(bf16 ? "linear_bf16_" : "linear_tf32_") + name;
      const double err = scaled(*got, *ref);
      report(tag, err, tol);
      EXPECT_GT(err, bf16 ? 2 * tf32_err[i] : twin::kGemmTol)
          << tag << ": no " << (bf16 ? "bf16" : "TF32") << " rounding seen";
      if (!bf16) tf32_err[i] = err;
      ++i;
    }
  }
}

TEST(CudaBackward, CausalConv1d) {
  const int64_t C = 67, W = 4, P = W - 1;
  for (int64_t T : {1, 2, 37, 200}) {
    for (int variant = 0; variant < 4; ++variant) {
      const bool silu = variant % 2 == 0, states = variant < 2, alias = variant == 3;
      const Tensor x = randn({T, C}), w = randn({C, W}, 0.5f), dout = randn({T, C});
      const Tensor s0 = states ? randn({P, C}) : Tensor(), dfin = states ? randn({P, C}) : Tensor();
      const Tensor dw0 = randn({C, W});
      Tensor dx = Tensor::empty({T, C}), dw = dw0.clone();
      Tensor ds0 = states ? Tensor::empty({P, C}) : Tensor();
      causal_conv1d_backward(host_exec(), x, w, s0, silu, dout, dfin, dx, dw, ds0);
      const Tensor doutd = dev(dout), dwd = dev(dw0);
      const Tensor dxd = alias ? doutd : poisoned({T, C});
      const Tensor ds0d = states ? poisoned({P, C}) : Tensor();
      causal_conv1d_backward(gpu(), dev(x), dev(w), states ? dev(s0) : Tensor(), silu, doutd,
                             states ? dev(dfin) : Tensor(), dxd, dwd, ds0d);
      std::vector<double> cond(static_cast<size_t>(C * W));
      for (int64_t c = 0; c < C; ++c) {
        for (int64_t j = 0; j < W; ++j) {
          double s = std::fabs(dw0.data<float>()[c * W + j]);
          for (int64_t t = 0; t < T; ++t) {
            const int64_t p = t + j;
            const double xp = p >= P ? x.data<float>()[(p - P) * C + c]
                                     : (states ? s0.data<float>()[p * C + c] : 0.0);
            s += 1.1 * std::fabs(dout.data<float>()[t * C + c] * xp);
          }
          cond[c * W + j] = s;
        }
      }
      const std::string tag = "causal_conv1d_backward_T" + std::to_string(T) +
                              (silu ? "_silu" : "") + (states ? "_states" : "") +
                              (alias ? "_alias" : "");
      const double tol = (W + 8) * twin::kEps;
      report(tag + "_dx", scaled(dxd, dx), tol);
      report(tag + "_dweight", condition_err(host(dwd), dw, cond), sum_tol(T));
      if (states) report(tag + "_dinitial_state", scaled(ds0d, ds0), tol);
      if (!alias) {
        // dx in place of dout takes the three-kernel path, dx of its own the fused one (W <= 4):
        // the same bits.
        const Tensor dx_in_place = dev(dout), dw_in_place = dev(dw0);
        const Tensor ds0_in_place = states ? poisoned({P, C}) : Tensor();
        causal_conv1d_backward(gpu(), dev(x), dev(w), states ? dev(s0) : Tensor(), silu,
                               dx_in_place, states ? dev(dfin) : Tensor(), dx_in_place, dw_in_place,
                               ds0_in_place);
        std::vector<std::pair<Tensor, Tensor>> pairs = {{dxd, dx_in_place}, {dwd, dw_in_place}};
        if (states) pairs.emplace_back(ds0d, ds0_in_place);
        for (const auto& [fused, three] : pairs) {
          const Tensor a = host(fused), b = host(three);
          EXPECT_EQ(0, std::memcmp(a.raw(), b.raw(), a.nbytes())) << tag << ": fused vs three";
        }
      }
    }
  }
}

TEST(CudaBackward, AdamWAndSumOfSquares) {
  const int64_t n = 10007;
  const Tensor p0 = randn({n}), m0 = randn({n}, 0.1f);
  Tensor v0 = randn({n}, 0.1f);
  for (int64_t i = 0; i < n; ++i) v0.data<float>()[i] = std::fabs(v0.data<float>()[i]);
  Tensor p = p0.clone(), m = m0.clone(), v = v0.clone();
  const Tensor pd = dev(p0), md = dev(m0), vd = dev(v0);
  for (int64_t step = 1; step <= 3; ++step) {
    const Tensor g = randn({n});
    AdamWStep s;
    s.lr = 1e-2f;
    s.weight_decay = 0.1f;
    s.step = step;
    s.grad_scale = 0.7f;
    adamw_update(host_exec(), s, p, g, m, v);
    adamw_update(gpu(), s, pd, dev(g), md, vd);
  }
  report("adamw_param", scaled(pd, p), 8 * twin::kEps);
  report("adamw_m", scaled(md, m), 8 * twin::kEps);
  report("adamw_v", scaled(vd, v), 8 * twin::kEps);
  for (int64_t len : {int64_t{1}, int64_t{4095}, int64_t{1000003}}) {
    const Tensor x = randn({len});
    Tensor ref = Tensor::empty({1});
    sum_of_squares(host_exec(), x, ref);
    const Tensor out = poisoned({1});
    sum_of_squares(gpu(), dev(x), out);
    const double got = host(out).data<float>()[0], want = ref.data<float>()[0];
    report("sum_of_squares_" + std::to_string(len), std::fabs(got - want) / want, 2 * twin::kEps);
  }
}

// The multi-tensor update on the GPU: the bits of one adamw_update a tensor there (70 tensors: two
// launches; tensors of one and of several 4096-element blocks), the scale clipped on the device
// from the sum there, and the CPU's within rounding.
TEST(CudaBackward, AdamWManyTensors) {
  std::vector<AdamWTensor> many, one, cpu;
  for (int i = 0; i < 70; ++i) {
    const int64_t n = std::vector<int64_t>{1, 7, 4096, 4097, 9000}[i % 5] + i;
    Tensor v = randn({n}, 0.1f);
    for (int64_t k = 0; k < n; ++k) v.data<float>()[k] = std::fabs(v.data<float>()[k]);
    const AdamWTensor t{randn({n}), randn({n}), randn({n}, 0.1f), v, i % 3 != 0};
    cpu.push_back({t.param.clone(), t.grad, t.m.clone(), t.v.clone(), t.decay});
    many.push_back({dev(t.param), dev(t.grad), dev(t.m), dev(t.v), t.decay});
    one.push_back({dev(t.param), dev(t.grad), dev(t.m), dev(t.v), t.decay});
  }
  AdamWStep s;
  s.lr = 1e-2f;
  s.weight_decay = 0.1f;
  for (const double clip : {0.0, 3.0}) {
    ++s.step;
    Tensor sum = Tensor::empty({1});
    sum.data<float>()[0] = 1234.5f;  // norm 35.1 * mean 0.5: clipped to 3
    adamw_update_many(gpu(), s, many, {.sum_squares = dev(sum), .mean = 0.5, .clip_norm = clip});
    adamw_update_many(host_exec(), s, cpu, {.sum_squares = sum, .mean = 0.5, .clip_norm = clip});
    AdamWStep each = s;
    each.grad_scale = static_cast<float>(clipped_grad_scale(1234.5, 0.5, clip));
    for (const AdamWTensor& t : one) {
      each.weight_decay = t.decay ? s.weight_decay : 0.0f;
      adamw_update(gpu(), each, t.param, t.grad, t.m, t.v);
    }
  }
  double worst = 0;
  for (size_t i = 0; i < many.size(); ++i) {
    for (auto [a, b] : {std::pair{&many[i].param, &one[i].param}, std::pair{&many[i].m, &one[i].m},
                        std::pair{&many[i].v, &one[i].v}}) {
      const Tensor x = host(*a), y = host(*b);
      ASSERT_EQ(0, std::memcmp(x.raw(), y.raw(), x.nbytes())) << "tensor " << i;
    }
    worst = std::max(worst, scaled(many[i].param, cpu[i].param));
  }
  report("adamw_many_param", worst, 8 * twin::kEps);
}

TEST(CudaBackward, KdaGate) {
  const int64_t T = 300, H = 3, per_head = 67, width = H * per_head;
  for (float lb : {0.0f, -5.0f}) {
    for (bool with_bias : {false, true}) {
      const Tensor f = randn({T, width}, 2.0f), a_log = randn({H}, 0.5f), d_g = randn({T, width});
      const Tensor bias = with_bias ? randn({width}) : Tensor();
      const Tensor da0 = randn({H}), db0 = with_bias ? randn({width}) : Tensor();
      Tensor df = Tensor::empty({T, width}), da = da0.clone(),
             db = with_bias ? db0.clone() : Tensor();
      kda_gate_backward(host_exec(), f, a_log, bias, lb, d_g, df, da, db);
      const Tensor dfd = poisoned({T, width}), dad = dev(da0),
                   dbd = with_bias ? dev(db0) : Tensor();
      kda_gate_backward(gpu(), dev(f), dev(a_log), with_bias ? dev(bias) : Tensor(), lb, dev(d_g),
                        dfd, dad, dbd);
      // Conditions from double-precision magnitudes of each summed term.
      std::vector<double> cond_a(static_cast<size_t>(H)), cond_b(static_cast<size_t>(width));
      for (int64_t c = 0; c < width; ++c) {
        const double a = std::exp(double(a_log.data<float>()[c / per_head]));
        double sa = 0.0, sb = with_bias ? std::fabs(db0.data<float>()[c]) : 0.0;
        for (int64_t t = 0; t < T; ++t) {
          const double x =
              f.data<float>()[t * width + c] + (with_bias ? bias.data<float>()[c] : 0.0);
          const double up = std::fabs(d_g.data<float>()[t * width + c]);
          double dx, dalog;
          if (lb == 0.0f) {
            dx = a / (1.0 + std::exp(-x));
            dalog = a * (x > 20 ? x : std::log1p(std::exp(x)));
          } else {
            const double sg = 1.0 / (1.0 + std::exp(-a * x));
            dx = std::fabs(lb * sg * (1.0 - sg) * a);
            dalog = dx * std::fabs(x);
          }
          sa += up * dalog;
          sb += up * dx;
        }
        cond_a[c / per_head] += sa;
        cond_b[c] = sb;
      }
      for (int64_t h = 0; h < H; ++h) cond_a[h] += std::fabs(da0.data<float>()[h]);
      const std::string tag = std::string("kda_gate_backward") +
                              (lb != 0 ? "_bounded" : "_softplus") + (with_bias ? "_bias" : "");
      report(tag + "_d_f", scaled(dfd, df), 16 * twin::kEps);
      report(tag + "_d_A_log", condition_err(host(dad), da, cond_a), sum_tol(T * per_head));
      if (with_bias) report(tag + "_d_dt_bias", condition_err(host(dbd), db, cond_b), sum_tol(T));
    }
  }
}

Tensor random_expert_ids(int64_t t, int64_t k, int64_t e) {
  Tensor ids = Tensor::empty({t, k}, DType::kI32);
  std::vector<int32_t> all(static_cast<size_t>(e));
  std::iota(all.begin(), all.end(), 0);
  for (int64_t i = 0; i < t; ++i) {
    std::shuffle(all.begin(), all.end(), rng());
    std::copy(all.begin(), all.begin() + k, ids.data<int32_t>() + i * k);
  }
  return ids;
}

TEST(CudaBackward, Moe) {
  const int64_t T = 37, E = 16, K = 4, D = 70, I = 48;
  for (const auto& [first, count] : {std::pair<int64_t, int64_t>{0, 16}, {4, 7}}) {
    const std::string range = "_experts" + std::to_string(first) + "+" + std::to_string(count);
    const Tensor x = randn({T, D}), ids = random_expert_ids(T, K, E);
    Tensor offsets = Tensor::empty({count + 1}, DType::kI32);
    Tensor rows = Tensor::empty({T, K}, DType::kI32);
    Tensor x_sorted = Tensor::zeros({T * K, D});
    moe_permute(host_exec(), x, ids, first, E, offsets, rows, x_sorted);
    const int64_t R = T * K;
    {  // permute backward
      const Tensor dxs = randn({R, D}), dx0 = randn({T, D});
      Tensor ref = dx0.clone();
      moe_permute_backward(host_exec(), dxs, rows, ref);
      const Tensor dxd = dev(dx0);
      moe_permute_backward(gpu(), dev(dxs), dev(rows), dxd);
      report("moe_permute_backward" + range, scaled(dxd, ref), 4 * twin::kEps);
    }
    {  // unpermute-combine backward
      const Tensor y = randn({R, D}), w = randn({T, K}), dout = randn({T, D});
      Tensor dy = Tensor::zeros({R, D}), dw = Tensor::empty({T, K});
      moe_unpermute_combine_backward(host_exec(), y, rows, w, dout, dy, dw);
      const Tensor dyd = dev(Tensor::zeros({R, D})), dwd = poisoned({T, K});
      moe_unpermute_combine_backward(gpu(), dev(y), dev(rows), dev(w), dev(dout), dyd, dwd);
      report("moe_combine_backward_d_y" + range, scaled(dyd, dy), twin::kEps);
      report("moe_combine_backward_d_weights" + range, scaled(dwd, dw), 2 * twin::kEps);
    }
    {  // grouped SwiGLU backward, kept pre-activations and recomputed
      const Tensor wg = randn({count, I, D}, 0.1f), wu = randn({count, I, D}, 0.1f),
                   wd = randn({count, D, I}, 0.1f), dy = randn({R, D});
      Tensor y = Tensor::zeros({R, D}), gate_up = Tensor::zeros({2, R, I});
      moe_grouped_swiglu(host_exec(), x_sorted, offsets, wg, wu, wd, y, gate_up);
      for (bool kept : {true, false}) {
        const Tensor g0 = randn({count, I, D}), u0 = randn({count, I, D}),
                     d0 = randn({count, D, I});
        Tensor dx = Tensor::zeros({R, D}), dwg = g0.clone(), dwu = u0.clone(), dwd = d0.clone();
        moe_grouped_swiglu_backward(host_exec(), x_sorted, offsets, wg, wu, wd,
                                    kept ? gate_up : Tensor(), dy, dx, dwg, dwu, dwd);
        const Tensor dxd = dev(Tensor::zeros({R, D})), dwgd = dev(g0), dwud = dev(u0),
                     dwdd = dev(d0);
        moe_grouped_swiglu_backward(gpu(), dev(x_sorted), dev(offsets), dev(wg), dev(wu), dev(wd),
                                    kept ? dev(gate_up) : Tensor(), dev(dy), dxd, dwgd, dwud, dwdd);
        const std::string tag = "moe_grouped_swiglu_backward" + range + (kept ? "_kept" : "");
        report(tag + "_d_x", scaled(dxd, dx), twin::kGemmTol);
        report(tag + "_d_w_gate", scaled(dwgd, dwg), twin::kGemmTol);
        report(tag + "_d_w_up", scaled(dwud, dwu), twin::kGemmTol);
        report(tag + "_d_w_down", scaled(dwdd, dwd), twin::kGemmTol);
      }
    }
  }
  // The auxiliary balancing loss and its gradient, added to a d_logits that holds values.
  for (RouterScore score : {RouterScore::kSigmoid, RouterScore::kSoftmax}) {
    const Tensor logits = randn({T, E}, 2.0f), ids = random_expert_ids(T, K, E),
                 dl0 = randn({T, E}, 0.01f);
    Tensor loss = Tensor::empty({1}), dl = dl0.clone();
    moe_aux_loss_forward_backward(host_exec(), logits, ids, score, 0.01f, loss, dl);
    const Tensor lossd = poisoned({1}), dld = dev(dl0);
    moe_aux_loss_forward_backward(gpu(), dev(logits), dev(ids), score, 0.01f, lossd, dld);
    const std::string tag =
        std::string("moe_aux_loss_") + (score == RouterScore::kSigmoid ? "sigmoid" : "softmax");
    const double got = host(lossd).data<float>()[0], want = loss.data<float>()[0];
    report(tag + "_loss", std::fabs(got - want) / std::fabs(want), 4 * twin::kEps);
    report(tag + "_d_logits", scaled(dld, dl), 16 * twin::kEps);
  }
  // Router backward: sigmoid (renormalised, scaled) and softmax (renormalised and not).
  for (int variant = 0; variant < 3; ++variant) {
    RouterParams p;
    p.score = variant == 0 ? RouterScore::kSigmoid : RouterScore::kSoftmax;
    p.top_k = static_cast<int>(K);
    p.renormalize = variant != 2;
    p.routed_scaling = variant == 0 ? 2.5f : 1.0f;
    const Tensor logits = randn({T, E}, 2.0f), ids = random_expert_ids(T, K, E), dw = randn({T, K});
    Tensor ref = Tensor::empty({T, E});
    moe_route_backward(host_exec(), logits, ids, p, dw, ref);
    const Tensor dl = poisoned({T, E});
    moe_route_backward(gpu(), dev(logits), dev(ids), p, dev(dw), dl);
    report(std::string("moe_route_backward_") + (variant == 0   ? "sigmoid"
                                                 : variant == 1 ? "softmax"
                                                                : "softmax_plain"),
           scaled(dl, ref), 16 * twin::kEps);
  }
}

TEST(CudaBackward, AttnRes) {
  for (const auto& [S, N, D] :
       {std::tuple<int64_t, int64_t, int64_t>{3, 37, 129}, {9, 100, 2304}, {1, 5, 64}}) {
    for (bool alias : {false, true}) {
      const Tensor src = randn({S, N, D}), q = randn({D}, 0.1f), kn = randn({D}, 0.5f, 1.0f),
                   on = randn({D}, 0.5f, 1.0f), dout = randn({N, D});
      const Tensor dq0 = randn({D}), dk0 = randn({D}), do0 = randn({D});
      Tensor ds = Tensor::empty({S, N, D}), dq = dq0.clone(), dk = dk0.clone(), dov = do0.clone();
      attnres_aggregate_backward(host_exec(), src, q, kn, on, 1e-6f, dout, ds, dq, dk, dov);
      const Tensor srcd = dev(src), dsd = alias ? srcd : poisoned({S, N, D}), dqd = dev(dq0),
                   dkd = dev(dk0), dod = dev(do0);
      attnres_aggregate_backward(gpu(), srcd, dev(q), dev(kn), dev(on), 1e-6f, dev(dout), dsd, dqd,
                                 dkd, dod);
      const std::string tag = "attnres_backward_S" + std::to_string(S) + "_N" + std::to_string(N) +
                              "_D" + std::to_string(D) + (alias ? "_alias" : "");
      report(tag + "_dsources", scaled(dsd, ds), 4 * norm_dx_tol(D));
      const double param_tol = 4 * norm_dx_tol(D) + 4 * sum_tol(N);
      report(tag + "_dquery", scaled(dqd, dq), param_tol);
      report(tag + "_dkey_norm", scaled(dkd, dk), param_tol);
      report(tag + "_dout_norm", scaled(dod, dov), param_tol);
    }
  }
}

TEST(CudaBackward, CausalAttention) {
  struct Case {
    int64_t T, Hq, Hkv, d, dv;
  };
  // The tiled kernels (d <= 192, dv <= 128; one to 16 tiles of 64, the default's d 96 / dv 64 at
  // T 1000), then head dims past them (the one-row-a-block kernels).
  for (const Case& c : {Case{70, 4, 2, 48, 40}, Case{300, 2, 1, 192, 128}, Case{1, 3, 3, 17, 9},
                        Case{1000, 4, 4, 96, 64}, Case{90, 2, 2, 256, 160}}) {
    const Tensor q = randn({c.T, c.Hq, c.d}), k = randn({c.T, c.Hkv, c.d}),
                 v = randn({c.T, c.Hkv, c.dv}), dout = randn({c.T, c.Hq, c.dv});
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    Tensor out = Tensor::empty({c.T, c.Hq, c.dv}), lse = Tensor::empty({c.T, c.Hq});
    causal_attention_forward(host_exec(), q, k, v, scale, out, lse);
    Tensor dq = Tensor::empty(q.shape()), dk = Tensor::empty(k.shape()),
           dv = Tensor::empty(v.shape());
    causal_attention_backward(host_exec(), q, k, v, out, lse, dout, scale, dq, dk, dv);
    const Tensor qd = dev(q), kd = dev(k), vd = dev(v), outd = poisoned(out.shape()),
                 lsed = poisoned(lse.shape());
    causal_attention_forward(gpu(), qd, kd, vd, scale, outd, lsed);
    const Tensor dqd = poisoned(q.shape()), dkd = poisoned(k.shape()), dvd = poisoned(v.shape());
    // The backward reads the CPU's forward results, so its bound does not include the forward's.
    causal_attention_backward(gpu(), qd, kd, vd, dev(out), dev(lse), dev(dout), scale, dqd, dkd,
                              dvd);
    const std::string tag = "causal_attention_T" + std::to_string(c.T) + "_H" +
                            std::to_string(c.Hq) + "x" + std::to_string(c.Hkv) + "_d" +
                            std::to_string(c.d);
    const double fwd_tol = 4 * norm_dx_tol(c.d);
    const double bwd_tol = 4 * (std::sqrt(double(c.d)) + std::sqrt(double(c.T)) + 16) * twin::kEps;
    report(tag + "_out", scaled(outd, out), fwd_tol);
    report(tag + "_lse", scaled(lsed, lse), fwd_tol);
    report(tag + "_dq", scaled(dqd, dq), bwd_tol);
    report(tag + "_dk", scaled(dkd, dk), bwd_tol);
    report(tag + "_dv", scaled(dvd, dv), bwd_tol);
  }
}

TEST(CudaBackward, KdaRecurrent) {
  const twin::KdaCase cases[] = {{70, 2, 4, 32, 24, false, false},
                                 {130, 1, 2, 128, 128, true, true},
                                 {1, 1, 1, 16, 8, false, true}};
  for (const twin::KdaCase& c : cases) {
    const twin::KdaInputs in = twin::kda_inputs(rng(), c);
    const Tensor d_out = randn({c.T, c.Hv, c.dv}), d_final = randn({c.Hv, c.dk, c.dv});
    Tensor dq = Tensor::empty(in.q.shape()), dk = Tensor::empty(in.k.shape()),
           dv = Tensor::empty(in.v.shape()), dg = Tensor::empty(in.g.shape()),
           db = Tensor::empty(in.beta.shape()), ds0 = Tensor::empty(in.s0.shape());
    kda_recurrent_backward(host_exec(), in.q, in.k, in.v, in.g, in.beta, in.scale, in.s0, d_out,
                           d_final, dq, dk, dv, dg, db, ds0);
    const Tensor dqd = poisoned(dq.shape()), dkd = poisoned(dk.shape()), dvd = poisoned(dv.shape()),
                 dgd = poisoned(dg.shape()), dbd = poisoned(db.shape()),
                 ds0d = poisoned(ds0.shape());
    kda_recurrent_backward(gpu(), dev(in.q), dev(in.k), dev(in.v), dev(in.g), dev(in.beta),
                           in.scale, dev(in.s0), dev(d_out), dev(d_final), dqd, dkd, dvd, dgd, dbd,
                           ds0d);
    const std::string tag = "kda_recurrent_backward_T" + std::to_string(c.T) + "_" +
                            std::to_string(c.Hk) + "x" + std::to_string(c.Hv) + "_" +
                            std::to_string(c.dk) + "x" + std::to_string(c.dv) +
                            (c.scalar_g ? "_scalar_g" : "");
    const double tol = 8 * twin::kda_tol(c.dk);
    report(tag + "_dq", scaled(dqd, dq), tol);
    report(tag + "_dk", scaled(dkd, dk), tol);
    report(tag + "_dv", scaled(dvd, dv), tol);
    report(tag + "_dg", scaled(dgd, dg), tol);
    report(tag + "_dbeta", scaled(dbd, db), tol);
    report(tag + "_d_initial_state", scaled(ds0d, ds0), tol);
  }
}

TEST(CudaBackward, Rope) {
  const int64_t T = 61, H = 3, d = 133, off = 5;
  std::vector<int64_t> pos;
  std::uniform_int_distribution<int64_t> pick(0, 100000);
  for (int64_t t = 0; t < T; ++t) pos.push_back(pick(rng()));
  Tensor pos_t = Tensor::empty({T}, DType::kI64);
  std::copy(pos.begin(), pos.end(), pos_t.data<int64_t>());
  for (RopeStyle style : {RopeStyle::kHalf, RopeStyle::kInterleaved}) {
    for (bool yarn : {false, true}) {
      const RopeTable table =
          yarn ? rope_table_yarn(10000.0, 64, style, 40.0, 4096, 32, 1, 1.0, 1.0, -1.0, true)
               : rope_table_default(1e6, 126, style);
      const Tensor dy = randn({T, H, d});
      Tensor ref = dy.clone();
      rope_backward(host_exec(), ref, pos_t, table, yarn ? off : 0);
      const Tensor dxd = dev(dy);
      RopeTable table_d = table;
      table_d.inv_freq = dev(table.inv_freq);
      rope_backward(gpu(), dxd, dev(pos_t), table_d, yarn ? off : 0);
      report(std::string("rope_backward_") + (style == RopeStyle::kHalf ? "half" : "interleaved") +
                 (yarn ? "_yarn" : ""),
             scaled(dxd, ref), 8 * twin::kEps);
    }
  }
}

}  // namespace
}  // namespace loom
