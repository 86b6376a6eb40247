// The MoE forward ops (kernels/moe.h: moe_route, moe_permute, moe_grouped_swiglu,
// moe_unpermute_combine) and attnres_aggregate (kernels/attnres.h) on the GPU against their CPU
// twins, on fresh random inputs (the seed is printed; LOOM_GPU_TEST_SEED replays one). Outputs
// are poisoned (NaN, or -7 for indices) before every GPU call, so anything left unwritten shows.
//
// Sizes are awkward on purpose: token counts that are not multiples of any tile, D and I not
// multiples of 16 or 64, E = 7 to 512 with top_k 1 to 10, grouped routing, owned expert ranges
// that are strict subsets, experts with no rows, experts spanning several row tiles, ties in the
// router's scores.
//
// bf16 activations: permute, the grouped SwiGLU and combine also run with bf16 x / x_sorted / y /
// out, each dtype on its own (the model's bf16 -> bf16 and every mixed pair, on every GEMM path).
// A bf16 input is drawn as f32, rounded to bf16 and widened again for the CPU twin, so both sides
// read the same values; a bf16 output is widened and compared with the CPU's f32 result.
//
// Bounds (each check prints "GPUCHECK <name> <error> <bound> <PASS|FAIL>" for tests/gpu/run.sh):
//  - moe_route ids: mismatches against the CPU, 0. The GPU computes the scores with the CPU's
//    operations in the CPU's order (kernels/cuda/moe.cu), exp rounded as glibc's expf rounds, so
//    even ties and near-ties select alike (observed: 0 mismatches in 48 cases on two seeds).
//    Weights: scaled error <= 2 eps (observed <= 1 eps: glibc's expf is not always correctly
//    rounded, so a one-ulp difference of a score can show);
//  - moe_permute offsets and row_of_slot: mismatches, 0; x_sorted's kept rows: 0 (copies, or one
//    round-to-nearest-even of each f32 value into a bf16 x_sorted, compared with the CPU's copy
//    rounded the same way); rows past the kept ones: still NaN;
//  - moe_grouped_swiglu, f32 arithmetic (the SIMT path, f32 or bf16 weights): scaled error
//    <= 1e-4 (the brief's f32 bound; two length-D and one length-I dot products of O(1) terms in
//    another order: ~sqrt(D) eps, observed <= 1.4e-6). Tensor-core paths (x and h rounded to
//    bf16 as operands, weights the same bf16 on both sides): relative L2 error <= 1e-2 (bf16's
//    2^-9 relative rounding of two operands: observed <= 3.0e-3 for y, 1.7e-3 for g and u; a
//    bf16 x is one of those operands already, a bf16 y adds one more rounding of at most 2^-9).
//    A bf16 y on the SIMT path: relative L2 error <= 2^-8 (the f32 arithmetic's ~1e-6 plus one
//    rounding of each output to bf16, <= 2^-9 relative: twice that leaves room, and a truncating
//    or misplaced store exceeds it). Rows past the experts' rows: still NaN;
//  - batch invariance of the whole chain (route, permute, grouped SwiGLU on each path, combine),
//    f32 and bf16 activations: a token's output row alone and inside batches of 600 and 201
//    tokens, bit for bit (0 bits differ);
//  - moe_unpermute_combine: scaled error <= 2 eps (the same products and sums in the same order;
//    the host compiler may fuse the CPU's multiply-add, the GPU rounds both; observed 1 eps), for
//    f32 or bf16 y (the same widened values on both sides); a bf16 out: relative L2 error <= 2^-8
//    (one rounding of each sum to bf16, <= 2^-9 relative, on top of the f32 sums' ~1e-7);
//  - the CPU twins and the backwards reject bf16 activations (death tests);
//  - attnres_aggregate: scaled error <= (2 sqrt(D) + 16) eps (sums of squares and dot products
//    of length D in another order, ~sqrt(D) eps each, through the softmax's logits of O(1), as
//    the model's are, and two norms; observed 1.2e-7 at D = 37 to 3.4e-6 at D = 5000, at most
//    0.22 of the bound).
// Observed: H200, three runs, five seeds, every check passing; compute-sanitizer memcheck clean.
// bf16 activations (H200, one run, 355 checks passing): permute 0 mismatches; SwiGLU on the tensor
// cores <= 3.4e-3 (x f32, y bf16; 2.4e-3 for the model's bf16 x and y), on the SIMT path with a
// bf16 y <= 1.7e-3 (bf16 x, f32 y: scaled 4.1e-7); combine into a bf16 out <= 1.7e-3.
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
#include "core/workspace.h"
#include "kernels/attnres.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/moe.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/moe.h"
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
Tensor poisoned_i32(Shape shape) {
  Tensor t = Tensor::empty(shape, DType::kI32);
  std::fill(t.data<int32_t>(), t.data<int32_t>() + t.numel(), -7);
  return dev(t);
}

const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}

Tensor i32_tensor(const std::vector<int32_t>& v, Shape shape) {
  Tensor t = Tensor::empty(shape, DType::kI32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

Tensor to_bf16(const Tensor& f) {
  Tensor t = Tensor::empty(f.shape(), DType::kBF16);
  for (int64_t i = 0; i < f.numel(); ++i) t.data<uint16_t>()[i] = f32_to_bf16(f.data<float>()[i]);
  return t;
}

// A host tensor (f32 or bf16) as f32.
Tensor widen(const Tensor& t) {
  if (t.dtype() == DType::kF32) return t;
  Tensor f = Tensor::empty(t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) f.data<float>()[i] = bf16_to_f32(t.data<uint16_t>()[i]);
  return f;
}
// f32 values as a bf16 tensor holds them (rounded to nearest even), still f32: the CPU twin's
// input for a bf16 activation, or the CPU's f32 copy as a bf16 output of it must read.
Tensor rounded(const Tensor& f) { return widen(to_bf16(f)); }
// The device tensor of an activation of host f32 values, bf16 (the values rounded) or f32.
Tensor dev_act(const Tensor& h, bool bf16) { return dev(bf16 ? to_bf16(h) : h); }
// NaN everywhere, f32 or bf16.
Tensor poisoned_act(Shape shape, bool bf16) {
  const Tensor nan = Tensor::full(shape, std::nanf(""));
  return dev(bf16 ? to_bf16(nan) : nan);
}
// A device activation read back as host f32.
Tensor host_f32(const Tensor& d) { return widen(host(d)); }
const char* act_name(bool bf16) { return bf16 ? "bf16" : "f32"; }

void report(const std::string& name, double err, double tol) {
  const bool pass = err <= tol;  // false for NaN
  std::printf("GPUCHECK %s %.3e %.3e %s\n", name.c_str(), err, tol, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(err, tol) << name;
}

// Rows [0, rows) of two host f32 tensors of one shape, as contiguous copies.
Tensor head_rows(const Tensor& t, int64_t rows) { return t.slice(0, 0, rows).clone(); }

double scaled_err(const Tensor& got, const Tensor& ref) { return twin::scaled_err(got, ref); }

// ||got - ref|| / ||ref|| (infinite for NaN or a shape mismatch).
double rel_l2(const Tensor& got, const Tensor& ref) {
  if (got.shape() != ref.shape()) return INFINITY;
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double g = got.data<float>()[i], r = ref.data<float>()[i];
    if (!std::isfinite(g)) return INFINITY;
    num += (g - r) * (g - r);
    den += r * r;
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Elements of t (host f32) in rows [from, rows) that are not NaN: written where nothing may be.
double written_past(const Tensor& t, int64_t from) {
  const int64_t d = t.numel() / std::max<int64_t>(t.dim(0), 1);
  double n = 0;
  for (int64_t i = from * d; i < t.numel(); ++i) n += !std::isnan(t.data<float>()[i]);
  return n;
}

int64_t mismatches_i32(const Tensor& got, const Tensor& ref) {
  if (got.numel() != ref.numel()) return got.numel() + ref.numel();
  int64_t n = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) n += got.data<int32_t>()[i] != ref.data<int32_t>()[i];
  return n;
}

class MoeCuda : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cuda::init();
    (void)gpu_test_seed();
  }
};

// ---------------------------------------------------------------------------------------------
// moe_route.

struct RouteCase {
  std::string name;
  int64_t T;
  int E, K, ng = 1, kg = 1;
  RouterScore score = RouterScore::kSigmoid;
  bool bias = false, renorm = true, ties = false;
  float scaling = 1.0f;
};

void run_route_case(const RouteCase& c) {
  Tensor logits = randn({c.T, c.E}, 2.0f);
  Tensor bias = c.bias ? randn({c.E}, 0.1f) : Tensor();
  if (c.ties) {  // a handful of values: many exact ties in scores, group scores and picks
    for (int64_t i = 0; i < logits.numel(); ++i) {
      float& v = logits.data<float>()[i];
      v = std::round(v) / 4.0f;
    }
    if (bias.defined())
      for (int64_t i = 0; i < c.E; ++i) bias.data<float>()[i] = (i % 3) * 0.125f;
  }
  RouterParams p;
  p.score = c.score;
  p.top_k = c.K;
  p.n_group = c.ng;
  p.topk_group = c.kg;
  p.renormalize = c.renorm;
  p.routed_scaling = c.scaling;
  Tensor ids_ref = Tensor::empty({c.T, c.K}, DType::kI32), w_ref = Tensor::empty({c.T, c.K});
  moe_route(host_exec(), logits, bias, p, ids_ref, w_ref);
  const Tensor ids_d = poisoned_i32({c.T, c.K}), w_d = poisoned({c.T, c.K});
  moe_route(gpu(), dev(logits), bias.defined() ? dev(bias) : Tensor(), p, ids_d, w_d);
  report("moe_route_ids_" + c.name, static_cast<double>(mismatches_i32(host(ids_d), ids_ref)), 0);
  report("moe_route_weights_" + c.name, scaled_err(host(w_d), w_ref), 2 * twin::kEps);
}

TEST_F(MoeCuda, Route) {
  std::vector<RouteCase> cases;
  for (int k : {1, 3, 7}) {
    cases.push_back({"E7_softmax_k" + std::to_string(k), 37, 7, k, 1, 1, RouterScore::kSoftmax});
    cases.push_back(
        {"E7_sigmoid_bias_k" + std::to_string(k), 37, 7, k, 1, 1, RouterScore::kSigmoid, true});
  }
  for (int k = 1; k <= 8; ++k) {
    cases.push_back({"E64_ng8_kg4_sigmoid_bias_k" + std::to_string(k), 1000, 64, k, 8, 4,
                     RouterScore::kSigmoid, true, true, false, 2.5f});
  }
  cases.push_back({"E64_softmax_k8_raw", 1000, 64, 8, 1, 1, RouterScore::kSoftmax, false, false});
  cases.push_back({"E64_sigmoid_k6_raw_scaled", 999, 64, 6, 1, 1, RouterScore::kSigmoid, true,
                   false, false, 16.0f});
  cases.push_back({"E256_ng8_kg4_k8_deepseek", 513, 256, 8, 8, 4, RouterScore::kSigmoid, true, true,
                   false, 2.5f});
  cases.push_back(
      {"E384_k8_kimi", 300, 384, 8, 1, 1, RouterScore::kSigmoid, true, true, false, 2.827f});
  cases.push_back({"E512_softmax_k10_qwen", 257, 512, 10, 1, 1, RouterScore::kSoftmax});
  cases.push_back({"E1024_ng32_kg2_k16", 65, 1024, 16, 32, 2, RouterScore::kSigmoid, true});
  cases.push_back({"T1_E64_k8", 1, 64, 8, 1, 1, RouterScore::kSigmoid, true});
  // Ties in the scores, the group scores and the picks.
  cases.push_back(
      {"ties_E64_ng8_kg3_k8", 2000, 64, 8, 8, 3, RouterScore::kSigmoid, true, true, true});
  cases.push_back(
      {"ties_E64_softmax_k8", 2000, 64, 8, 1, 1, RouterScore::kSoftmax, false, true, true});
  cases.push_back(
      {"ties_E7_sigmoid_k7", 500, 7, 7, 1, 1, RouterScore::kSigmoid, false, true, true});
  for (const RouteCase& c : cases) run_route_case(c);
}

// ---------------------------------------------------------------------------------------------
// moe_permute.

struct PermuteCase {
  std::string name;
  int64_t T, K, E, first, ne, D;
  int skip_every = 0;  // > 0: experts e % skip_every == 1 never chosen (zero rows)
};

// x_bf16, xs_bf16: the dtypes of x and x_sorted.
void run_permute_case(const PermuteCase& c, bool x_bf16, bool xs_bf16) {
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.E - 1));
  std::vector<int32_t> ids(static_cast<size_t>(c.T * c.K));
  for (int32_t& id : ids) {
    do id = pick(rng());
    while (c.skip_every > 0 && id % c.skip_every == 1);
  }
  Tensor x = randn({c.T, c.D});
  if (x_bf16) x = rounded(x);
  const Tensor ids_h = i32_tensor(ids, {c.T, c.K});
  const int64_t R = c.T * c.K + 5;
  Tensor off_ref = Tensor::empty({c.ne + 1}, DType::kI32);
  Tensor rows_ref = Tensor::empty({c.T, c.K}, DType::kI32);
  Tensor xs_ref = Tensor::full({R, c.D}, std::nanf(""));
  moe_permute(host_exec(), x, ids_h, c.first, c.E, off_ref, rows_ref, xs_ref);
  const int64_t kept = off_ref.data<int32_t>()[c.ne];
  if (xs_bf16) xs_ref = rounded(xs_ref);

  const Tensor off_d = poisoned_i32({c.ne + 1}), rows_d = poisoned_i32({c.T, c.K});
  const Tensor xs_d = poisoned_act({R, c.D}, xs_bf16);
  moe_permute(gpu(), dev_act(x, x_bf16), dev(ids_h), c.first, c.E, off_d, rows_d, xs_d);
  const Tensor xs = host_f32(xs_d);
  const std::string tag =
      c.name +
      (x_bf16 || xs_bf16 ? std::string("_") + act_name(x_bf16) + "_to_" + act_name(xs_bf16) : "");
  report("moe_permute_offsets_" + tag, static_cast<double>(mismatches_i32(host(off_d), off_ref)),
         0);
  report("moe_permute_rows_" + tag, static_cast<double>(mismatches_i32(host(rows_d), rows_ref)), 0);
  report("moe_permute_x_sorted_" + tag, scaled_err(head_rows(xs, kept), head_rows(xs_ref, kept)),
         0);
  report("moe_permute_untouched_" + tag, written_past(xs, kept), 0);
}

TEST_F(MoeCuda, Permute) {
  const std::vector<PermuteCase> cases = {
      {"T37_K3_E7_all_D67", 37, 3, 7, 0, 7, 67},
      {"T37_K3_E7_owned_2to5_D67", 37, 3, 7, 2, 3, 67},
      {"T1_K8_E64_all_D128", 1, 8, 64, 0, 64, 128},
      // Up to 32 slots rank and copy in one kernel (a decode step's): the 48B model's shape at
      // two tokens, a scalar-copy owned subset, and the first two-kernel count.
      {"T2_K8_E256_all_D2304", 2, 8, 256, 0, 256, 2304},
      {"T8_K4_E64_owned_8to40_D67", 8, 4, 64, 8, 32, 67},
      {"T11_K3_E64_all_D64", 11, 3, 64, 0, 64, 64},
      // The one-block ranking's largest count, and the chunked ranking's smallest.
      {"T1024_K8_E64_all_D64", 1024, 8, 64, 0, 64, 64},
      {"T1025_K8_E64_owned_3to50_D64", 1025, 8, 64, 3, 47, 64, 6},
      {"T5000_K2_E1024_all_D8", 5000, 2, 1024, 0, 1024, 8},
      {"T1000_K8_E64_owned_16to32_D128", 1000, 8, 64, 16, 16, 128},
      {"T4099_K8_E64_zero_row_experts_D32", 4099, 8, 64, 0, 64, 32, 4},
      {"T4099_K6_E64_owned_40to64_zero_rows_D36", 4099, 6, 64, 40, 24, 36, 5},
      {"T20011_K8_E384_all_D16", 20011, 8, 384, 0, 384, 16},
      {"T300_K2_E1024_all_D8", 300, 2, 1024, 0, 1024, 8},
      {"T50_K4_E16_owned_none_D20", 50, 4, 16, 16, 0, 20},
  };
  for (const PermuteCase& c : cases) {
    run_permute_case(c, false, false);
    run_permute_case(c, true, true);  // the model's
    // Mixed pairs, on a vectorised (D % 4 == 0) and a scalar case.
    if (c.name == "T37_K3_E7_all_D67" || c.name == "T1000_K8_E64_owned_16to32_D128") {
      run_permute_case(c, false, true);
      run_permute_case(c, true, false);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// moe_grouped_swiglu.

struct SwigluCase {
  std::string name;
  int64_t D, I;
  std::vector<int32_t> counts;  // rows per owned expert
  bool bf16;
  const char* path;  // "auto" goes through the public dispatch
  bool gate_up;
  bool x_bf16 = false, y_bf16 = false;  // activation dtypes
};

struct ExpertWeights {
  Tensor gate, up, down;  // host, f32 or bf16
};

ExpertWeights random_weights(int64_t E, int64_t D, int64_t I, bool bf16) {
  const float sg = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(D, 1)));
  const float sd = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(I, 1)));
  ExpertWeights w{randn({E, I, D}, sg), randn({E, I, D}, sg), randn({E, D, I}, sd)};
  if (bf16) w = {to_bf16(w.gate), to_bf16(w.up), to_bf16(w.down)};
  return w;
}

void run_swiglu_case(const SwigluCase& c) {
  const int64_t E = static_cast<int64_t>(c.counts.size());
  std::vector<int32_t> off(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + c.counts[e];
  const int64_t kept = off[E], R = kept + 3, D = c.D, I = c.I;
  const ExpertWeights w = random_weights(E, D, I, c.bf16);
  Tensor x = randn({R, D});
  if (c.x_bf16) x = rounded(x);
  const Tensor off_h = i32_tensor(off, {E + 1});
  Tensor y_ref = Tensor::full({R, D}, std::nanf(""));
  Tensor gu_ref = c.gate_up ? Tensor::full({2, R, I}, std::nanf("")) : Tensor();
  moe_grouped_swiglu(host_exec(), x, off_h, w.gate, w.up, w.down, y_ref, gu_ref);

  const Tensor y_d = poisoned_act({R, D}, c.y_bf16);
  const Tensor gu_d = c.gate_up ? poisoned({2, R, I}) : Tensor();
  const Tensor xd = dev_act(x, c.x_bf16), offd = dev(off_h), wg = dev(w.gate), wu = dev(w.up),
               wd = dev(w.down);
  std::string ran = c.path;
  if (ran == "auto") {
    moe_grouped_swiglu(gpu(), xd, offd, wg, wu, wd, y_d, gu_d);
  } else {
    ran = cuda::moe_grouped_swiglu_on(gpu(), c.path, xd, offd, wg, wu, wd, y_d, gu_d);
  }
  // bf16 operands on the tensor cores (the SIMT and GEMV paths compute in f32)
  const bool tc = c.bf16 && ran != "simt" && ran != "gemv";
  const std::string tag =
      c.name + "_" + ran + (c.gate_up ? "_gate_up" : "") +
      (c.x_bf16 || c.y_bf16 ? std::string("_x") + act_name(c.x_bf16) + "_y" + act_name(c.y_bf16)
                            : "");
  const Tensor y = host_f32(y_d);
  if (tc) {
    report("moe_swiglu_y_relL2_" + tag, rel_l2(head_rows(y, kept), head_rows(y_ref, kept)), 1e-2);
  } else if (c.y_bf16) {
    report("moe_swiglu_y_relL2_" + tag, rel_l2(head_rows(y, kept), head_rows(y_ref, kept)),
           std::ldexp(1.0, -8));
  } else {
    report("moe_swiglu_y_" + tag, scaled_err(head_rows(y, kept), head_rows(y_ref, kept)), 1e-4);
  }
  report("moe_swiglu_y_untouched_" + tag, written_past(y, kept), 0);
  if (c.gate_up) {
    const Tensor gu = host(gu_d);
    for (int64_t m = 0; m < 2; ++m) {
      const Tensor got = gu.select(m).clone(), ref = gu_ref.select(m).clone();
      const std::string which = m == 0 ? "gate" : "up";
      if (tc) {
        report("moe_swiglu_" + which + "_relL2_" + tag,
               rel_l2(head_rows(got, kept), head_rows(ref, kept)), 1e-2);
      } else {
        report("moe_swiglu_" + which + "_" + tag,
               scaled_err(head_rows(got, kept), head_rows(ref, kept)), 1e-4);
      }
      report("moe_swiglu_" + which + "_untouched_" + tag, written_past(got, kept), 0);
    }
  }
}

std::vector<int32_t> random_counts(int64_t E, int32_t max_rows, double zero_share) {
  std::uniform_int_distribution<int32_t> n(1, max_rows);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int32_t> c(static_cast<size_t>(E));
  for (int32_t& v : c) v = u(rng()) < zero_share ? 0 : n(rng());
  return c;
}

bool device_is_sm90() {
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return prop.major == 9 && prop.minor == 0;
}

TEST_F(MoeCuda, GroupedSwiglu) {
  // Experts with no rows, one row, tile-sized and multi-tile row counts.
  const std::vector<int32_t> awkward = {0, 1, 129, 300, 0, 5, 128};
  std::vector<const char*> tc_paths = {"mma", "gemv"};
  if (device_is_sm90()) tc_paths.insert(tc_paths.end(), {"wgmma", "wgmma128"});
  std::vector<SwigluCase> cases;
  for (bool gu : {false, true}) {
    cases.push_back({"f32_D67_I45_E7", 67, 45, awkward, false, "simt", gu});
    cases.push_back({"bf16_D67_I45_E7", 67, 45, awkward, true, "simt", gu});
    cases.push_back({"bf16_D200_I136_E7", 200, 136, awkward, true, "simt", gu});
    for (const char* path : tc_paths) {
      cases.push_back({"bf16_D200_I136_E7", 200, 136, awkward, true, path, gu});
    }
  }
  // bf16 activations, every (x, y) pair, on every path (f32 and bf16 weights on the SIMT one).
  for (const auto& [xb, yb] : {std::pair{true, true}, {true, false}, {false, true}}) {
    cases.push_back({"f32_D67_I45_E7", 67, 45, awkward, false, "simt", false, xb, yb});
    cases.push_back({"bf16_D67_I45_E7", 67, 45, awkward, true, "simt", xb && yb, xb, yb});
    for (const char* path : tc_paths) {
      cases.push_back({"bf16_D200_I136_E7", 200, 136, awkward, true, path, xb && yb, xb, yb});
    }
  }
  // The public dispatch (f32 weights: SIMT; bf16 aligned: the tensor cores), f32 and bf16
  // activations.
  for (bool act : {false, true}) {
    cases.push_back(
        {"f32_D96_I40_E64", 96, 40, random_counts(64, 40, 0.3), false, "auto", false, act, act});
    cases.push_back(
        {"bf16_D256_I128_E64", 256, 128, random_counts(64, 40, 0.3), true, "auto", true, act, act});
    // Decode-like: a few single rows among many empty experts.
    cases.push_back({"bf16_D512_I256_E64_decode", 512, 256, random_counts(64, 1, 0.9), true, "auto",
                     false, act, act});
    // A decode step of 3 tokens at top-8 over 200 experts (rows 0-3 each), gate_up kept.
    cases.push_back({"bf16_D264_I136_E200_decode", 264, 136, random_counts(200, 3, 0.9), true,
                     "auto", true, act, act});
    // The GEMV path's tile searches: the block search at exactly a block's threads of experts,
    // the staged one past it (both hand their tiles to the down launch).
    cases.push_back({"bf16_D264_I136_E256_decode", 264, 136, random_counts(256, 2, 0.95), true,
                     "gemv", false, act, act});
    cases.push_back({"bf16_D264_I136_E300_decode", 264, 136, random_counts(300, 2, 0.95), true,
                     "gemv", act, act, act});
  }
  // Larger, Kimi-like proportions (D = 2 I) with row counts around a few tiles.
  const std::vector<int32_t> big = random_counts(8, 600, 0.1);
  for (const char* path : {"simt", "mma", "wgmma", "wgmma128", "gemv"}) {
    if (std::string(path).rfind("wgmma", 0) == 0 && !device_is_sm90()) continue;
    for (bool act : {false, true}) {
      cases.push_back({"bf16_D1024_I512_E8", 1024, 512, big, true, path, false, act, act});
    }
  }
  // More cluster tiles than the kWgmma grid has clusters: each cluster loops over several tiles
  // of different experts, its ring of stages carrying across them; ragged experts of 0 to 600
  // rows leave row tiles whose second CTA or warpgroup has no rows.
  if (device_is_sm90()) {
    const std::vector<int32_t> ragged = random_counts(64, 600, 0.1);
    for (bool act : {false, true}) {
      cases.push_back({"bf16_D264_I136_E64", 264, 136, ragged, true, "wgmma", true, act, act});
    }
  }
  for (const SwigluCase& c : cases) run_swiglu_case(c);
}

// The workspace path (ex.workspace set): same result as the stream-ordered scratch.
TEST_F(MoeCuda, GroupedSwigluWorkspace) {
  const std::vector<int32_t> counts = {3, 0, 140, 17};
  const int64_t E = 4, D = 64, I = 32;
  std::vector<int32_t> off(E + 1, 0);
  for (int64_t e = 0; e < E; ++e) off[e + 1] = off[e] + counts[e];
  const int64_t R = off[E];
  const ExpertWeights w = random_weights(E, D, I, true);
  const Tensor x = dev(randn({R, D})), offd = dev(i32_tensor(off, {E + 1}));
  const Tensor wg = dev(w.gate), wu = dev(w.up), wd = dev(w.down);
  const Tensor y0 = poisoned({R, D}), y1 = poisoned({R, D});
  moe_grouped_swiglu(gpu(), x, offd, wg, wu, wd, y0);
  Workspace ws(Device::kCuda, 1 << 20);
  const Exec ex = cuda::device_exec(0, &ws);
  moe_grouped_swiglu(ex, x, offd, wg, wu, wd, y1);
  report("moe_swiglu_workspace_vs_scratch", scaled_err(host(y1), host(y0)), 0);
  // bf16 activations (a smaller scratch: no copy of x).
  const Tensor xb = dev(to_bf16(host(x)));
  const Tensor yb0 = poisoned_act({R, D}, true), yb1 = poisoned_act({R, D}, true);
  moe_grouped_swiglu(gpu(), xb, offd, wg, wu, wd, yb0);
  moe_grouped_swiglu(ex, xb, offd, wg, wu, wd, yb1);
  report("moe_swiglu_workspace_vs_scratch_bf16", scaled_err(host_f32(yb1), host_f32(yb0)), 0);
}

// ---------------------------------------------------------------------------------------------
// Batch invariance of the whole routed chain.

struct Chain {
  int64_t E, K, D, I;
  RouterParams params;
  Tensor router;          // [E, D] host f32
  Tensor gate, up, down;  // device
  const char* path;
  bool act_bf16 = false;  // x, the permuted rows, y and out bf16 (the model's activations)
};

// out [T, D] (host) for tokens x [T, D] with router logits [T, E] (host; computed once for the
// largest batch and sliced, so that every batch routes from the same bits).
Tensor run_chain(const Chain& c, const Tensor& x, const Tensor& logits) {
  const int64_t T = x.dim(0);
  const bool b = c.act_bf16;
  const Tensor xd = dev_act(x, b), ids = poisoned_i32({T, c.K}), wts = poisoned({T, c.K});
  moe_route(gpu(), dev(logits), Tensor(), c.params, ids, wts);
  const Tensor off = poisoned_i32({c.E + 1}), rows = poisoned_i32({T, c.K});
  const Tensor xs = poisoned_act({T * c.K, c.D}, b), y = poisoned_act({T * c.K, c.D}, b);
  moe_permute(gpu(), xd, ids, 0, c.E, off, rows, xs);
  cuda::moe_grouped_swiglu_on(gpu(), c.path, xs, off, c.gate, c.up, c.down, y, Tensor());
  const Tensor out = poisoned_act({T, c.D}, b);
  moe_unpermute_combine(gpu(), y, rows, wts, out);
  return host(out);
}

int64_t differing_bits(const Tensor& a, const Tensor& b) {
  if (a.nbytes() != b.nbytes()) return -1;
  int64_t n = 0;
  const uint8_t* pa = static_cast<const uint8_t*>(a.raw());
  const uint8_t* pb = static_cast<const uint8_t*>(b.raw());
  for (size_t i = 0; i < a.nbytes(); ++i) n += __builtin_popcount(pa[i] ^ pb[i]);
  return n;
}

TEST_F(MoeCuda, BatchInvariance) {
  struct Cfg {
    const char* path;
    int64_t D, I;
    bool bf16;
    bool act_bf16 = false;
  };
  std::vector<Cfg> cfgs = {{"simt", 72, 40, false},      {"simt", 70, 36, true},
                           {"mma", 256, 136, true},      {"simt", 72, 40, false, true},
                           {"simt", 70, 36, true, true}, {"mma", 256, 136, true, true}};
  for (bool act : {false, true}) cfgs.push_back({"gemv", 256, 136, true, act});
  if (device_is_sm90()) {
    for (bool act : {false, true}) {
      cfgs.push_back({"wgmma", 256, 136, true, act});
      cfgs.push_back({"wgmma128", 256, 136, true, act});
    }
  }
  for (const Cfg& f : cfgs) {
    Chain c;
    c.E = 16;
    c.K = 4;
    c.D = f.D;
    c.I = f.I;
    c.params.top_k = 4;
    c.path = f.path;
    c.act_bf16 = f.act_bf16;
    c.router = randn({c.E, c.D}, 0.3f);
    const ExpertWeights w = random_weights(c.E, c.D, c.I, f.bf16);
    c.gate = dev(w.gate);
    c.up = dev(w.up);
    c.down = dev(w.down);
    const int64_t T = 600;  // ~150 rows per expert: two row tiles on every path
    const Tensor x = randn({T, c.D});
    Tensor logits = Tensor::empty({T, c.E});
    linear_forward(host_exec(), x, c.router, logits, 0.0f);
    const auto rows = [](const Tensor& t, int64_t a, int64_t b) {
      return t.slice(0, a, b).clone();
    };
    const Tensor full = run_chain(c, x, logits);
    const Tensor part = run_chain(c, rows(x, 150, 351), rows(logits, 150, 351));  // 201 tokens
    int64_t bits = 0;
    for (int64_t t : {0, 1, 150, 151, 299, 350, 599}) {
      const Tensor alone = run_chain(c, rows(x, t, t + 1), rows(logits, t, t + 1));
      bits += differing_bits(alone, full.slice(0, t, t + 1).clone());
      if (t >= 150 && t < 351)
        bits += differing_bits(alone, part.slice(0, t - 150, t - 149).clone());
    }
    const std::string tag = std::string(f.path) + (f.bf16 ? "_bf16" : "_f32") + "_D" +
                            std::to_string(f.D) + "_I" + std::to_string(f.I) +
                            (f.act_bf16 ? "_bf16_activations" : "");
    report("moe_chain_batch_invariance_bits_" + tag, static_cast<double>(bits), 0);
  }
}

// ---------------------------------------------------------------------------------------------
// moe_unpermute_combine.

void run_combine_case(const std::string& name, int64_t T, int64_t K, int64_t D, bool y_bf16,
                      bool out_bf16) {
  const int64_t R = T * K + 2;
  std::vector<int32_t> perm(static_cast<size_t>(R));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng());
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<int32_t> rows(static_cast<size_t>(T * K));
  for (size_t j = 0; j < rows.size(); ++j) rows[j] = u(rng()) < 0.3 ? -1 : perm[j];
  for (int64_t i = 0; i < K; ++i) rows[static_cast<size_t>(i)] = -1;  // token 0: no owned slot
  Tensor y = randn({R, D});
  if (y_bf16) y = rounded(y);
  const Tensor wts = randn({T, K}, 0.3f), rows_h = i32_tensor(rows, {T, K});
  Tensor ref = Tensor::empty({T, D});
  moe_unpermute_combine(host_exec(), y, rows_h, wts, ref);
  const Tensor out = poisoned_act({T, D}, out_bf16);
  moe_unpermute_combine(gpu(), dev_act(y, y_bf16), dev(rows_h), dev(wts), out);
  const std::string tag = name + (y_bf16 || out_bf16 ? std::string("_y") + act_name(y_bf16) +
                                                           "_out" + act_name(out_bf16)
                                                     : "");
  if (out_bf16) {
    report("moe_combine_relL2_" + tag, rel_l2(host_f32(out), ref), std::ldexp(1.0, -8));
  } else {
    report("moe_combine_" + tag, scaled_err(host_f32(out), ref), 2 * twin::kEps);
  }
  // With an addend (the shared expert's output): the bits of the combine followed by add_inplace.
  const Tensor addend = dev_act(randn({T, D}), out_bf16);
  add_inplace(gpu(), out, addend);
  const Tensor fused = poisoned_act({T, D}, out_bf16);
  moe_unpermute_combine(gpu(), dev_act(y, y_bf16), dev(rows_h), dev(wts), fused, addend);
  report("moe_combine_add_bits_" + tag, static_cast<double>(differing_bits(host(fused), host(out))),
         0);
}

TEST_F(MoeCuda, UnpermuteCombine) {
  // (y, out) dtypes: f32 (unchanged), the model's bf16 -> bf16, and the mixed pairs.
  for (const auto& [yb, ob] :
       {std::pair{false, false}, {true, true}, {true, false}, {false, true}}) {
    run_combine_case("T1000_K8_D130", 1000, 8, 130, yb, ob);
    run_combine_case("T1000_K8_D256", 1000, 8, 256, yb, ob);
    run_combine_case("T37_K1_D67", 37, 1, 67, yb, ob);
    run_combine_case("T5_K10_D2048", 5, 10, 2048, yb, ob);
  }
}

// The CPU twins take f32 activations only, and the backwards f32 only on any device: bf16 stops
// with a message naming the op and the tensor.
TEST_F(MoeCuda, CpuAndBackwardsRejectBf16) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Tensor xb = to_bf16(randn({4, 8})), xf = randn({4, 8});
  const Tensor ids = i32_tensor({0, 1, 1, 0}, {4, 1}), off = Tensor::empty({3}, DType::kI32);
  const Tensor rows = Tensor::empty({4, 1}, DType::kI32), wts = randn({4, 1});
  EXPECT_DEATH(moe_permute(host_exec(), xb, ids, 0, 2, off, rows, Tensor::empty({4, 8})),
               "moe_permute: x .*CPU kernel takes contiguous f32 only");
  const ExpertWeights w = random_weights(2, 8, 4, true);
  const Tensor off2 = i32_tensor({0, 2, 4}, {3});
  EXPECT_DEATH(moe_grouped_swiglu(host_exec(), xf, off2, w.gate, w.up, w.down, xb),
               "moe_grouped_swiglu: y .*CPU kernel takes contiguous f32 only");
  const Tensor rows2 = i32_tensor({0, 1, 2, 3}, {4, 1});
  EXPECT_DEATH(moe_unpermute_combine(host_exec(), xb, rows2, wts, Tensor::empty({4, 8})),
               "moe_unpermute_combine: y .*CPU kernel takes contiguous f32 only");
  EXPECT_DEATH(moe_permute_backward(host_exec(), xb, rows2, Tensor::empty({4, 8})),
               "moe_permute_backward: d_x_sorted .*backward takes contiguous f32 only");
  EXPECT_DEATH(moe_unpermute_combine_backward(host_exec(), xb, rows2, wts, xf,
                                              Tensor::empty({4, 8}), Tensor::empty({4, 1})),
               "moe_unpermute_combine_backward: y .*backward takes contiguous f32 only");
}

// ---------------------------------------------------------------------------------------------
// attnres_aggregate.

TEST_F(MoeCuda, AttnResAggregate) {
  for (int64_t D : {37, 256, 1000, 2048, 5000}) {
    for (int64_t S = 1; S <= 5; ++S) {
      const int64_t N = 37;
      Tensor src = randn({S, N, D});
      for (int64_t i = 0; i < S; ++i) {  // sources of different sizes, as block sums are
        const float scale = 0.5f + static_cast<float>(i);
        float* p = src.data<float>() + i * N * D;
        for (int64_t j = 0; j < N * D; ++j) p[j] *= scale;
      }
      const Tensor q = randn({D}, 2.0f / std::sqrt(static_cast<float>(D)));
      const Tensor kn = randn({D}, 0.2f, 1.0f), on = randn({D}, 0.2f, 1.0f);
      Tensor ref = Tensor::empty({N, D});
      attnres_aggregate(host_exec(), src, q, kn, on, 1e-6f, ref);
      const Tensor out = poisoned({N, D});
      attnres_aggregate(gpu(), dev(src), dev(q), dev(kn), dev(on), 1e-6f, out);
      report("attnres_aggregate_S" + std::to_string(S) + "_N37_D" + std::to_string(D),
             scaled_err(host(out), ref), (2 * std::sqrt(static_cast<double>(D)) + 16) * twin::kEps);
    }
  }
}

}  // namespace
}  // namespace loom
