// moe_grouped_swiglu with stored FP8 expert weights (kernels/cuda/moe_fp8.cu) on the GPU against
// the CPU twin run on the same weights dequantized to f32 (f32(q) * scale_inv of each 128 x 128
// block: the reference dequantization, tests/gpu/fp8_test_support.h), on fresh random inputs
// (the seed is printed; LOOM_GPU_TEST_SEED replays one). Outputs (y, gate_up) are NaN before
// every GPU call, so anything left unwritten shows; rows past the experts' rows must stay NaN.
//
// Sizes are awkward on purpose: D and I not multiples of 128 (every matrix has partial edge
// blocks in both dimensions) and, for some, not of 16 (the GEMV's one-weight-per-lane loop) or 8
// (no tensor cores: the f32 SIMT path on f32 copies); experts with no rows, one row, and 129 and
// 300 rows (several row tiles); E = 7 and 13, not multiples of the dequantization's chunks (a
// budget of two or three experts per chunk is forced on some cases, so a call runs 3 to 5 chunks,
// the last one short). Activations f32, or the model's bf16 x and y.
//
// Bounds (each check prints "GPUCHECK <name> <error> <bound> <PASS|FAIL>"):
//  - f32 arithmetic on the exact dequantized weights (kGemv: dequantized in registers; kSimt: on
//    f32 copies): scaled error <= 1e-4 (moe_cuda_test's f32 bound: dot products of length D and I
//    in another order than the CPU's, ~sqrt(D) eps; a weight taken with the wrong block's scale
//    is off by a factor 2^-3..2^3 and exceeds it by far). A bf16 y: relative L2 <= 2^-8 (one
//    rounding of each output, <= 2^-9 relative, on top);
//  - tensor-core paths (the dequantized weight rounded once to bf16, x and h bf16 operands):
//    relative L2 <= 1e-2 (as moe_cuda_test's bf16 weights: three operands each within 2^-9);
//  - batch invariance: in batch-invariant mode (which never picks by row count) three tokens'
//    rows alone give the same bits as inside the whole call (0 bits differ).
// The block-scaled FP8 wgmma path (kWgmmaFp8, W8A8; sm_90 only) has tests of its own: each of its
// grouped GEMMs alone against a double oracle fed the same quantized activations and the
// dequantized weights (bound 2^-10 sum |a w|, the FP8 tensor cores' 128-deep block sums; shapes
// with partial edge blocks in N and K, 0 to 700 rows per expert), h's quantization in the gate/up
// epilogue against h of the GPU's own g and u, the quantizer against its CPU twin bit for bit, and
// the whole SwiGLU against the chain of those oracles, against the W8A16 twin, alone vs batched,
// and kAuto's choice (bounds at their tests).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/fp8_matrix.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm_fp8_launch.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_fp8_launch.h"
#include "kernels/moe.h"
#include "tests/gpu/fp8_test_support.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/gpu/twin_tolerances.h"

namespace loom {
namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 r(gpu_test_seed());
  return r;
}

const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}

Tensor to_bf16(const Tensor& f) {
  Tensor t = Tensor::empty(f.shape(), DType::kBF16);
  for (int64_t i = 0; i < f.numel(); ++i) t.data<uint16_t>()[i] = f32_to_bf16(f.data<float>()[i]);
  return t;
}
Tensor widen(const Tensor& t) {
  if (t.dtype() == DType::kF32) return t;
  Tensor f = Tensor::empty(t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) f.data<float>()[i] = bf16_to_f32(t.data<uint16_t>()[i]);
  return f;
}
Tensor poisoned(Shape shape, bool bf16) {
  const Tensor nan = Tensor::full(shape, std::nanf(""));
  return cuda::to_device(bf16 ? to_bf16(nan) : nan);
}
Tensor host_f32(const Tensor& d) { return widen(cuda::to_host(d)); }
Tensor head_rows(const Tensor& t, int64_t rows) { return t.slice(0, 0, rows).clone(); }

double rel_l2(const Tensor& got, const Tensor& ref) {
  if (got.shape() != ref.shape()) return INFINITY;
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double g = got.data<float>()[i], r = ref.data<float>()[i];
    if (!std::isfinite(g)) return INFINITY;
    num += (g - r) * (g - r);
    den += r * r;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}
// Values written at or past row `from` (the poison must survive there).
double written_past(const Tensor& t, int64_t from) {
  const int64_t d = t.numel() / std::max<int64_t>(t.dim(0), 1);
  double n = 0;
  for (int64_t i = from * d; i < t.numel(); ++i) n += !std::isnan(t.data<float>()[i]);
  return n;
}

void report(const std::string& name, double err, double tol) {
  const bool pass = err <= tol;  // false for NaN
  std::printf("GPUCHECK %s %.3e %.3e %s\n", name.c_str(), err, tol, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(err, tol) << name;
}

// The block-scaled path (kWgmmaFp8) against the W8A16 twin: x and h are quantized to e4m3, three
// roundings on the way to y (x into g and into u, then h), each <= 2^-4 relative and 2^-4 / sqrt(3)
// rms at most, so y's rms relative error is at most sqrt(3) 2^-4 / sqrt(3) = 0.0625 (about 0.05
// measured as expected for random data); twice that.
constexpr double kW8A8VsTwinTol = 0.125;
// The FP8 tensor cores' sums of a 128-deep block keep about 14 bits (DeepSeek-V3 report 3.3.2):
// each block's error is a few 2^-14 of its sum of |terms|, so |gpu - oracle| <= 2^-10 cond with
// cond = sum |a w| over all blocks leaves 16x (tests/gpu/gemm_fp8_cuda_test.cc, cuBLASLt's
// block-scaled GEMM, has the same bound). A block scale applied to the wrong block, or a
// dropped block, is ~1 / (blocks) of cond in the worst elements: far above it.
constexpr double kMmaTol = 1.0 / 1024;
// e4m3 rounding of a quotient v / s: relative 2^-4 (3 fraction bits; 2^-24 more for the f32
// quotient) for normal values, absolute 2^-10 s for subnormal ones (spacing 2^-9 s).
constexpr double kE4m3Rel = (1.0 / 16) * (1.0 + 1.0 / (1 << 20));
constexpr double kE4m3SubnormalAbs = 1.0 / 1024;

// A stored FP8 stack [E, N, K] (each expert its own blocks) and its dequantized f32 values. The
// scales are divided by sqrt(K) so the products stay O(1) (any f32 scale is a valid scale_inv).
struct Fp8Experts {
  Tensor q, deq;
};
Fp8Experts random_experts(int64_t E, int64_t N, int64_t K) {
  Fp8Experts s{fp8_matrix_empty({E, N, K}), Tensor::empty({E, N, K})};
  const Tensor scales = fp8_matrix_scales(s.q);
  const int64_t grid = scales.numel() / E;
  const float shrink = 1.0f / std::sqrt(static_cast<float>(K));
  for (int64_t e = 0; e < E; ++e) {
    Tensor one = fp8test::random_fp8_matrix(rng(), N, K);
    const Tensor os = fp8_matrix_scales(one);
    for (int64_t i = 0; i < grid; ++i) os.data<float>()[i] *= shrink;
    const Tensor deq = fp8test::dequantized(one);
    std::memcpy(static_cast<uint8_t*>(s.q.raw()) + e * N * K, one.raw(), N * K);
    std::memcpy(scales.data<float>() + e * grid, os.data<float>(), grid * sizeof(float));
    std::memcpy(s.deq.data<float>() + e * N * K, deq.data<float>(), N * K * sizeof(float));
  }
  return s;
}

struct Case {
  std::string name;
  int64_t D, I;
  std::vector<int32_t> counts;  // rows per expert
  const char* path;             // a launch::MoeGemmPath name, "auto" for kAuto's choice
  bool gate_up;
  bool act_bf16;           // x and y bf16 (the model's), else f32
  size_t chunk_bytes = 0;  // the dequantized copies' budget (0: the default)
};

struct Data {
  Fp8Experts gate, up, down;
  Tensor gate_d, up_d, down_d;
};

Data make_data(int64_t E, int64_t D, int64_t I) {
  Data d{random_experts(E, I, D), random_experts(E, I, D), random_experts(E, D, I), {}, {}, {}};
  d.gate_d = fp8test::fp8_to_device(d.gate.q);
  d.up_d = fp8test::fp8_to_device(d.up.q);
  d.down_d = fp8test::fp8_to_device(d.down.q);
  return d;
}

Tensor offsets_of(const std::vector<int32_t>& counts) {
  Tensor off = Tensor::empty({static_cast<int64_t>(counts.size()) + 1}, DType::kI32);
  off.data<int32_t>()[0] = 0;
  for (size_t e = 0; e < counts.size(); ++e)
    off.data<int32_t>()[e + 1] = off.data<int32_t>()[e] + counts[e];
  return off;
}

// Runs the op on the GPU on the named path ("auto": kAuto's choice); returns the path that ran.
std::string run_gpu(const Exec& ex, const Case& c, const Data& w, const Tensor& x_d,
                    const Tensor& off_d, const Tensor& y_d, const Tensor& gu_d) {
  return cuda::moe_grouped_swiglu_on(ex, c.path, x_d, off_d, w.gate_d, w.up_d, w.down_d, y_d, gu_d,
                                     7, c.chunk_bytes);
}

void run_case(const Case& c) {
  const int64_t E = static_cast<int64_t>(c.counts.size()), D = c.D, I = c.I;
  const Tensor off = offsets_of(c.counts);
  const int64_t kept = off.data<int32_t>()[E], R = kept + 3;
  const Data w = make_data(E, D, I);
  Tensor x = twin::randn(rng(), {R, D}, 1.0f, 0.0f);
  if (c.act_bf16) x = widen(to_bf16(x));  // the twin reads what the GPU reads

  Tensor y_ref = Tensor::full({R, D}, std::nanf(""));
  Tensor gu_ref = c.gate_up ? Tensor::full({2, R, I}, std::nanf("")) : Tensor();
  moe_grouped_swiglu(host_exec(), x, off, w.gate.deq, w.up.deq, w.down.deq, y_ref, gu_ref);

  const Tensor x_d = cuda::to_device(c.act_bf16 ? to_bf16(x) : x), off_d = cuda::to_device(off);
  const Tensor y_d = poisoned({R, D}, c.act_bf16);
  const Tensor gu_d = c.gate_up ? poisoned({2, R, I}, false) : Tensor();
  const std::string ran = run_gpu(gpu(), c, w, x_d, off_d, y_d, gu_d);
  const bool f32_math = ran == "simt" || ran == "gemv";
  const double tc_tol = ran == "wgmma_fp8" ? kW8A8VsTwinTol : 1e-2;
  const std::string tag = c.name + "_" + ran + (c.gate_up ? "_gate_up" : "") +
                          (c.act_bf16 ? "_bf16" : "_f32") +
                          (c.chunk_bytes ? "_chunk" + std::to_string(c.chunk_bytes) : "");
  const Tensor y = host_f32(y_d);
  if (!f32_math) {
    report("moe_fp8_y_relL2_" + tag, rel_l2(head_rows(y, kept), head_rows(y_ref, kept)), tc_tol);
  } else if (c.act_bf16) {
    report("moe_fp8_y_relL2_" + tag, rel_l2(head_rows(y, kept), head_rows(y_ref, kept)),
           std::ldexp(1.0, -8));
  } else {
    report("moe_fp8_y_" + tag, twin::scaled_err(head_rows(y, kept), head_rows(y_ref, kept)), 1e-4);
  }
  report("moe_fp8_y_untouched_" + tag, written_past(y, kept), 0);
  if (c.gate_up) {
    const Tensor gu = cuda::to_host(gu_d);
    for (int64_t m = 0; m < 2; ++m) {
      const Tensor got = head_rows(gu.select(m).clone(), kept);
      const Tensor ref = head_rows(gu_ref.select(m).clone(), kept);
      const std::string which = m == 0 ? "gate" : "up";
      if (f32_math) {
        report("moe_fp8_" + which + "_" + tag, twin::scaled_err(got, ref), 1e-4);
      } else {
        report("moe_fp8_" + which + "_relL2_" + tag, rel_l2(got, ref), tc_tol);
      }
      report("moe_fp8_" + which + "_untouched_" + tag, written_past(gu.select(m).clone(), kept), 0);
    }
  }
}

bool device_is_sm90() {
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return prop.major == 9 && prop.minor == 0;
}

class MoeFp8Cuda : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cuda::init();
    (void)gpu_test_seed();
  }
};

TEST_F(MoeFp8Cuda, GroupedSwigluAgainstDequantizedTwin) {
  // Experts with no rows, one row, several row tiles; and a decode-sized call (<= 64 rows).
  const std::vector<int32_t> awkward = {0, 1, 129, 300, 0, 5, 128};
  const std::vector<int32_t> decode = {1, 0, 2, 1, 1, 0, 0, 2, 1, 1, 0, 1, 2};
  std::vector<const char*> tc_paths = {"mma"};
  if (device_is_sm90()) tc_paths.insert(tc_paths.end(), {"wgmma", "wgmma128"});
  std::vector<Case> cases;
  for (const bool bf16 : {false, true}) {
    for (const bool gu : {false, true}) {
      // D, I % 16 == 0 (the GEMV's 16-byte loads), partial blocks in both: 272 = 2 x 128 + 16.
      cases.push_back({"D272_I400_E7", 272, 400, awkward, "gemv", gu, bf16});
      cases.push_back({"D272_I400_E7", 272, 400, awkward, "simt", gu, bf16});
      cases.push_back({"D272_I400_E13_decode", 272, 400, decode, "auto", gu, bf16});
      // % 8 only (tensor cores yes, the GEMV's one weight per lane).
      cases.push_back({"D200_I136_E7", 200, 136, awkward, "gemv", gu, bf16});
      // Neither (the SIMT path on f32 copies, the GEMV's scalar loop).
      cases.push_back({"D67_I45_E7", 67, 45, awkward, "auto", gu, bf16});
      cases.push_back({"D67_I45_E7", 67, 45, awkward, "gemv", gu, bf16});
      for (const char* p : tc_paths)
        cases.push_back({"D200_I136_E7", 200, 136, awkward, p, gu, bf16});
    }
    // The public dispatch past the GEMV's rows (the tensor cores on copies), and chunked copies:
    // 2 experts per chunk (4 chunks over 7, the last one short) and 3 (5 over 13).
    cases.push_back({"D272_I400_E7", 272, 400, awkward, "auto", false, bf16});
    cases.push_back({"D272_I400_E7", 272, 400, awkward, "auto", true, bf16,
                     2 * 3 * 272 * 400 * sizeof(uint16_t)});
    cases.push_back({"D67_I45_E7", 67, 45, awkward, "simt", true, bf16, 2 * 3 * 67 * 45 * 4});
    cases.push_back({"D272_I400_E13_decode", 272, 400, decode, "simt", false, bf16,
                     3 * 3 * 272 * 400 * sizeof(float) + 100});
  }
  for (const Case& c : cases) run_case(c);
}

// Batch-invariant mode, through the public dispatch (kernels/moe.h): three tokens' output rows
// computed alone are the bits they have inside the whole call, on the path kAuto takes there for
// FP8 weights (copies, at any row count).
TEST_F(MoeFp8Cuda, BatchInvariantRowsAlone) {
  for (const bool bf16 : {false, true}) {
    const std::vector<int32_t> counts = {3, 0, 40, 1, 17};
    const int64_t E = 5, D = 272, I = 136;
    const Tensor off = offsets_of(counts);
    const int64_t R = off.data<int32_t>()[E];
    const Data w = make_data(E, D, I);
    Tensor x = twin::randn(rng(), {R, D}, 1.0f, 0.0f);
    const Tensor xh = bf16 ? to_bf16(x) : x;
    Exec ex = gpu();
    ex.batch_invariant = true;
    const Tensor y_all = poisoned({R, D}, bf16);
    moe_grouped_swiglu(ex, cuda::to_device(xh), cuda::to_device(off), w.gate_d, w.up_d, w.down_d,
                       y_all, Tensor());
    const Tensor all = host_f32(y_all);
    size_t differing = 0;
    // Row 0 (expert 0), row 20 (expert 2), row 43 (expert 3's one row).
    for (const int64_t row : {int64_t{0}, int64_t{20}, int64_t{43}}) {
      int64_t e = 0;
      while (off.data<int32_t>()[e + 1] <= row) ++e;
      std::vector<int32_t> one(static_cast<size_t>(E), 0);
      one[static_cast<size_t>(e)] = 1;
      const Tensor x1 = xh.slice(0, row, row + 1).clone();
      const Tensor y1 = poisoned({1, D}, bf16);
      moe_grouped_swiglu(ex, cuda::to_device(x1), cuda::to_device(offsets_of(one)), w.gate_d,
                         w.up_d, w.down_d, y1, Tensor());
      const Tensor got = host_f32(y1);
      differing +=
          std::memcmp(got.data<float>(), all.data<float>() + row * D, D * sizeof(float)) ? 1 : 0;
    }
    report(std::string("moe_fp8_batch_invariant_rows_differing_") + (bf16 ? "bf16" : "f32"),
           static_cast<double>(differing), 0);
  }
}

// ---- the block-scaled FP8 wgmma path (kWgmmaFp8)
// -------------------------------------------------

// Activations [m, k]: N(0, 1) times a factor 2^U(-2, 2) per row and 128-column group (so that the
// groups' scales differ and a scale applied to the wrong group shows).
Tensor random_groups(int64_t m, int64_t k) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(-2.0f, 2.0f);
  Tensor x = Tensor::empty({m, k});
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c0 = 0; c0 < k; c0 += kFp8BlockSize) {
      const float f = std::exp2(ud(rng()));
      for (int64_t c = c0; c < std::min(k, c0 + kFp8BlockSize); ++c)
        x.data<float>()[r * k + c] = nd(rng()) * f;
    }
  }
  return x;
}

template <typename T>
Tensor device_array(const std::vector<T>& v, DType dtype) {
  Tensor h = Tensor::empty({static_cast<int64_t>(v.size())}, dtype);
  std::memcpy(h.raw(), v.data(), v.size() * sizeof(T));
  return cuda::to_device(h);
}
template <typename T>
std::vector<T> host_array(const Tensor& d) {
  const Tensor h = cuda::to_host(d);
  std::vector<T> v(static_cast<size_t>(h.nbytes() / sizeof(T)));
  std::memcpy(v.data(), h.raw(), v.size() * sizeof(T));
  return v;
}

// The double-precision oracle of one grouped GEMM on quantized activations: for every row r of
// expert e (offsets) and column n, ref = sum_c a(r, c) w[e, n, c] and cond = sum_c |a(r, c) w[e, n,
// c]| with a(r, c) = f32(q[r, c]) * s[(c / 128) R + r] taken exactly and w the dequantized weights
// (the reference's f32 products). Rows of no expert stay 0.
struct GroupedOracle {
  std::vector<double> ref, cond;  // [R, N]
};
GroupedOracle grouped_oracle(const std::vector<uint8_t>& q, const std::vector<float>& s, int64_t R,
                             const Tensor& w, const std::vector<int32_t>& counts) {
  const int64_t N = w.dim(1), K = w.dim(2);
  const float* lut = f8e4m3_table();
  GroupedOracle o{std::vector<double>(R * N, 0.0), std::vector<double>(R * N, 0.0)};
  std::vector<double> a(static_cast<size_t>(K));
  int64_t r = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    for (int32_t i = 0; i < counts[e]; ++i, ++r) {
      for (int64_t c = 0; c < K; ++c)
        a[c] = static_cast<double>(lut[q[r * K + c]]) * s[(c / kFp8BlockSize) * R + r];
      for (int64_t n = 0; n < N; ++n) {
        const float* wr = w.data<float>() + (static_cast<int64_t>(e) * N + n) * K;
        double ref = 0.0, cond = 0.0;
        for (int64_t c = 0; c < K; ++c) {
          ref += a[c] * wr[c];
          cond += std::fabs(a[c] * wr[c]);
        }
        o.ref[r * N + n] = ref;
        o.cond[r * N + n] = cond;
      }
    }
  }
  return o;
}

// The largest |got - ref| / (kMmaTol cond (+ 2^-8 |got| for a bf16 result)) over rows < kept of a
// [R, N] result with row stride N (infinite for a non-finite value).
double worst_ratio(const float* got, const GroupedOracle& o, int64_t kept, int64_t N, bool bf16) {
  double worst = 0.0;
  for (int64_t i = 0; i < kept * N; ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double tol =
        kMmaTol * o.cond[i] + (bf16 ? std::ldexp(std::fabs(got[i]), -8) : 0.0) + 1e-300;
    worst = std::max(worst, std::fabs(got[i] - o.ref[i]) / tol);
  }
  return worst;
}

// Entries of a [rows, cols] array at or past row `from` that are not NaN (the poison).
double written_rows(const std::vector<float>& v, int64_t cols, int64_t from) {
  double n = 0;
  for (size_t i = static_cast<size_t>(from * cols); i < v.size(); ++i) n += !std::isnan(v[i]);
  return n;
}

double silu_d(double g) { return g / (1.0 + std::exp(-g)); }

TEST_F(MoeFp8Cuda, BlockScaledGemmsAgainstQuantizedOracle) {
  if (!device_is_sm90()) GTEST_SKIP() << "wgmma_fp8 needs an sm_90 GPU";
  struct Shape3 {
    const char* name;
    int64_t D, I;
    std::vector<int32_t> counts;
  };
  const std::vector<Shape3> shapes = {
      // Partial edge blocks in both dimensions of all three matrices (400 = 3 x 128 + 16, 272 =
      // 2 x 128 + 16); 0 to 700 rows per expert (1 to 6 row tiles, clusters with an empty half).
      {"D400_I272_E9", 400, 272, {0, 1, 700, 129, 0, 64, 255, 300, 17}},
      // Whole blocks and tiles.
      {"D256_I128_E5", 256, 128, {3, 130, 0, 2, 256}},
      // 18 k blocks on gate/up, 9 column tiles of 256 on down.
      {"D2304_I144_E4", 2304, 144, {1, 260, 0, 40}},
  };
  const cudaStream_t stream = cuda::stream_of(gpu());
  for (const Shape3& sh : shapes) {
    const int64_t E = static_cast<int64_t>(sh.counts.size()), D = sh.D, I = sh.I;
    const Tensor off = offsets_of(sh.counts);
    const int64_t kept = off.data<int32_t>()[E], R = kept + 3;  // 3 rows of no expert
    const int64_t gi = (I + kFp8BlockSize - 1) / kFp8BlockSize;
    const Data w = make_data(E, D, I);
    const Tensor x = random_groups(R, D);
    const fp8test::GroupQuant xq = fp8test::quantize_groups(x);
    // The GPU's quantizer (what the SwiGLU runs on x) gives the twin's bits, f32 and bf16 x.
    for (const bool bf16 : {false, true}) {
      const Tensor xb = bf16 ? widen(to_bf16(x)) : x;
      const fp8test::GroupQuant want = bf16 ? fp8test::quantize_groups(xb) : xq;
      const Tensor q_d = Tensor::empty({R * D}, DType::kU8, Device::kCuda);
      const Tensor s_d =
          Tensor::empty({static_cast<int64_t>(want.s.size())}, DType::kF32, Device::kCuda);
      cuda::launch::quantize_fp8_groups(cuda::stream_of(gpu()),
                                        cuda::to_device(bf16 ? to_bf16(x) : x).raw(),
                                        bf16 ? cuda::launch::Elem::kBF16 : cuda::launch::Elem::kF32,
                                        R, D, static_cast<uint8_t*>(q_d.raw()), s_d.data<float>());
      const std::vector<uint8_t> q = host_array<uint8_t>(q_d);
      const std::vector<float> qs = host_array<float>(s_d);
      double bad = 0;
      for (size_t i = 0; i < q.size(); ++i) bad += q[i] != want.q[i];
      for (size_t i = 0; i < qs.size(); ++i) bad += std::memcmp(&qs[i], &want.s[i], 4) != 0;
      report(
          std::string("moe_fp8_block_quantize_x_differing_") + sh.name + (bf16 ? "_bf16" : "_f32"),
          bad, 0);
    }
    const Tensor xq_d = device_array(xq.q, DType::kU8), xs_d = device_array(xq.s, DType::kF32);
    const Tensor off_d = cuda::to_device(off);
    const Tensor hq_d = device_array(std::vector<uint8_t>(R * I, 0x7f), DType::kU8);  // e4m3 NaN
    const Tensor hs_d = device_array(std::vector<float>(gi * R, std::nanf("")), DType::kF32);
    const Tensor gu_d = poisoned({2, R, I}, false);

    cuda::launch::MoeFp8BlockGemm up;
    up.a = static_cast<const uint8_t*>(xq_d.raw());
    up.a_scales = xs_d.data<float>();
    up.offsets = off_d.data<int32_t>();
    up.b0 = static_cast<const uint8_t*>(w.gate_d.raw());
    up.s0 = fp8_matrix_scales(w.gate_d).data<float>();
    up.b1 = static_cast<const uint8_t*>(w.up_d.raw());
    up.s1 = fp8_matrix_scales(w.up_d).data<float>();
    up.R = R, up.E = E, up.N = I, up.K = D;
    up.h_q = static_cast<uint8_t*>(hq_d.raw());
    up.h_scales = hs_d.data<float>();
    up.gate_up = gu_d.data<float>();
    ASSERT_TRUE(cuda::launch::moe_fp8_block_gemm_supported(up)) << sh.name;
    cuda::launch::moe_fp8_block_gemm(stream, up);
    const std::vector<float> gu = host_array<float>(gu_d), hs = host_array<float>(hs_d);
    const std::vector<uint8_t> hq = host_array<uint8_t>(hq_d);
    const std::string tag = std::string(sh.name) + "_R" + std::to_string(R);

    // g and u against the oracle on the same quantized x.
    const GroupedOracle og = grouped_oracle(xq.q, xq.s, R, w.gate.deq, sh.counts);
    const GroupedOracle ou = grouped_oracle(xq.q, xq.s, R, w.up.deq, sh.counts);
    report("moe_fp8_block_gate_vs_oracle_ratio_" + tag, worst_ratio(gu.data(), og, kept, I, false),
           1.0);
    report("moe_fp8_block_up_vs_oracle_ratio_" + tag,
           worst_ratio(gu.data() + R * I, ou, kept, I, false), 1.0);
    report("moe_fp8_block_gate_up_untouched_" + tag,
           written_rows(std::vector<float>(gu.begin(), gu.begin() + R * I), I, kept) +
               written_rows(std::vector<float>(gu.begin() + R * I, gu.end()), I, kept),
           0);

    // h = silu(g) u of the GPU's own g and u, in double: each row's 128-column group has scale
    // amax / 448 (within 1e-5 relative: the GPU's f32 silu), and each value s f32(q) is within
    // the e4m3 rounding of h / s (plus the same 1e-5 relative).
    const float* lut = f8e4m3_table();
    double scale_err = 0.0, value_ratio = 0.0, h_untouched = 0.0;
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t b = 0; b < gi; ++b) {
        const float s = hs[b * R + r];
        const int64_t c0 = b * kFp8BlockSize, c1 = std::min(I, c0 + kFp8BlockSize);
        if (r >= kept) {
          h_untouched += !std::isnan(s);
          for (int64_t c = c0; c < c1; ++c) h_untouched += hq[r * I + c] != 0x7f;
          continue;
        }
        double amax = 0.0;
        std::vector<double> h(static_cast<size_t>(c1 - c0));
        for (int64_t c = c0; c < c1; ++c) {
          h[c - c0] = silu_d(gu[r * I + c]) * gu[R * I + r * I + c];
          amax = std::max(amax, std::fabs(h[c - c0]));
        }
        const double s_ref = amax > 0 ? amax / kFp8E4M3Max : 1.0;
        scale_err = std::max(scale_err, std::isfinite(s) ? std::fabs(s - s_ref) / s_ref : INFINITY);
        for (int64_t c = c0; c < c1; ++c) {
          const double v = static_cast<double>(lut[hq[r * I + c]]) * s, hv = h[c - c0];
          const double tol = std::fabs(hv) * (kE4m3Rel + 1e-5) + s * kE4m3SubnormalAbs + 1e-300;
          value_ratio =
              std::max(value_ratio, std::isfinite(v) ? std::fabs(v - hv) / tol : INFINITY);
        }
      }
    }
    report("moe_fp8_block_h_scale_relerr_" + tag, scale_err, 1e-5);
    report("moe_fp8_block_h_value_ratio_" + tag, value_ratio, 1.0);
    report("moe_fp8_block_h_untouched_" + tag, h_untouched, 0);

    // Down on the GPU's h, against the oracle on the same h, f32 and bf16 y.
    const GroupedOracle oy = grouped_oracle(hq, hs, R, w.down.deq, sh.counts);
    for (const bool bf16 : {false, true}) {
      const Tensor y_d = poisoned({R, D}, bf16);
      cuda::launch::MoeFp8BlockGemm down;
      down.a = up.h_q;
      down.a_scales = up.h_scales;
      down.offsets = up.offsets;
      down.b0 = static_cast<const uint8_t*>(w.down_d.raw());
      down.s0 = fp8_matrix_scales(w.down_d).data<float>();
      down.R = R, down.E = E, down.N = D, down.K = I;
      down.out = y_d.raw();
      down.out_bf16 = bf16;
      ASSERT_TRUE(cuda::launch::moe_fp8_block_gemm_supported(down)) << sh.name;
      cuda::launch::moe_fp8_block_gemm(stream, down);
      const Tensor y = host_f32(y_d);
      const std::string t2 = tag + (bf16 ? "_ybf16" : "_yf32");
      report("moe_fp8_block_down_vs_oracle_ratio_" + t2,
             worst_ratio(y.data<float>(), oy, kept, D, bf16), 1.0);
      report("moe_fp8_block_down_untouched_" + t2, written_past(y, kept), 0);
    }
  }
}

// The whole SwiGLU on kWgmmaFp8 through the public dispatch (x f32 or bf16): g and u against the
// oracle on x quantized by the CPU twin of the quantizer (the GPU's must give the same bits);
// y against the chain h = silu(g) u of the GPU's own g and u, quantized by the same twin, then the
// down oracle: only the rare h that the GPU's f32 silu rounds to the other e4m3 neighbour differ
// (one step, <= 2^-3 relative, of one element of h), so relative L2 <= 2^-8 (measured ~1e-4: the
// FP8 sums); y without gate_up is the same bits; y against the W8A16 twin (kW8A8VsTwinTol); rows
// of no expert untouched; a token's row alone gives the bits it has in the whole call. kAuto takes
// the path from kMoeFp8BlockRowsPerExpert rows per expert, never in batch-invariant mode.
TEST_F(MoeFp8Cuda, BlockScaledSwigluComposition) {
  if (!device_is_sm90()) GTEST_SKIP() << "wgmma_fp8 needs an sm_90 GPU";
  const std::vector<int32_t> counts = {0, 1, 129, 300, 0, 5, 128};
  const int64_t E = static_cast<int64_t>(counts.size()), D = 272, I = 400;
  const Tensor off = offsets_of(counts);
  const int64_t kept = off.data<int32_t>()[E], R = kept + 3;
  const Data w = make_data(E, D, I);
  const Tensor off_d = cuda::to_device(off);
  for (const bool bf16 : {false, true}) {
    Tensor x = random_groups(R, D);
    if (bf16) x = widen(to_bf16(x));
    const Tensor x_d = cuda::to_device(bf16 ? to_bf16(x) : x);
    const std::string tag = std::string("D272_I400_E7") + (bf16 ? "_bf16" : "_f32");
    const Tensor y_d = poisoned({R, D}, bf16), gu_d = poisoned({2, R, I}, false);
    const std::string ran = cuda::moe_grouped_swiglu_on(gpu(), "wgmma_fp8", x_d, off_d, w.gate_d,
                                                        w.up_d, w.down_d, y_d, gu_d);
    EXPECT_EQ(ran, "wgmma_fp8");
    const Tensor y = host_f32(y_d);
    const std::vector<float> gu = host_array<float>(gu_d);

    const fp8test::GroupQuant xq = fp8test::quantize_groups(x);
    report(
        "moe_fp8_block_swiglu_gate_ratio_" + tag,
        worst_ratio(gu.data(), grouped_oracle(xq.q, xq.s, R, w.gate.deq, counts), kept, I, false),
        1.0);
    report("moe_fp8_block_swiglu_up_ratio_" + tag,
           worst_ratio(gu.data() + R * I, grouped_oracle(xq.q, xq.s, R, w.up.deq, counts), kept, I,
                       false),
           1.0);
    Tensor h = Tensor::zeros({R, I});
    for (int64_t i = 0; i < kept * I; ++i)
      h.data<float>()[i] = static_cast<float>(silu_d(gu[i]) * gu[R * I + i]);
    const fp8test::GroupQuant hq = fp8test::quantize_groups(h);
    const GroupedOracle oy = grouped_oracle(hq.q, hq.s, R, w.down.deq, counts);
    Tensor y_chain = Tensor::empty({kept, D});
    for (int64_t i = 0; i < kept * D; ++i) y_chain.data<float>()[i] = static_cast<float>(oy.ref[i]);
    report("moe_fp8_block_swiglu_y_vs_chain_relL2_" + tag, rel_l2(head_rows(y, kept), y_chain),
           std::ldexp(1.0, -8));
    report("moe_fp8_block_swiglu_y_untouched_" + tag, written_past(y, kept), 0);
    report("moe_fp8_block_swiglu_gate_up_untouched_" + tag,
           written_rows(std::vector<float>(gu.begin(), gu.begin() + R * I), I, kept), 0);

    Tensor y_ref = Tensor::full({R, D}, std::nanf(""));
    moe_grouped_swiglu(host_exec(), x, off, w.gate.deq, w.up.deq, w.down.deq, y_ref, Tensor());
    const double vs_twin = rel_l2(head_rows(y, kept), head_rows(y_ref, kept));
    report("moe_fp8_block_swiglu_y_vs_w8a16_twin_relL2_" + tag, vs_twin, kW8A8VsTwinTol);

    // Without gate_up: the same y. Rows alone (batch-invariant mode; the path is forced): the
    // same bits as in the whole call.
    const Tensor y2_d = poisoned({R, D}, bf16);
    cuda::moe_grouped_swiglu_on(gpu(), "wgmma_fp8", x_d, off_d, w.gate_d, w.up_d, w.down_d, y2_d,
                                Tensor());
    const Tensor y2 = host_f32(y2_d);
    report("moe_fp8_block_swiglu_no_gate_up_rows_differing_" + tag,
           std::memcmp(y2.data<float>(), y.data<float>(), kept * D * sizeof(float)) ? 1 : 0, 0);
    Exec inv = gpu();
    inv.batch_invariant = true;
    const Tensor xh = bf16 ? to_bf16(x) : x;
    size_t differing = 0;
    for (const int64_t row : {int64_t{0}, int64_t{200}, kept - 1}) {
      int64_t e = 0;
      while (off.data<int32_t>()[e + 1] <= row) ++e;
      std::vector<int32_t> one(static_cast<size_t>(E), 0);
      one[static_cast<size_t>(e)] = 1;
      const Tensor y1 = poisoned({1, D}, bf16);
      cuda::moe_grouped_swiglu_on(
          inv, "wgmma_fp8", cuda::to_device(xh.slice(0, row, row + 1).clone()),
          cuda::to_device(offsets_of(one)), w.gate_d, w.up_d, w.down_d, y1, Tensor());
      const Tensor got = host_f32(y1);
      differing +=
          std::memcmp(got.data<float>(), y.data<float>() + row * D, D * sizeof(float)) ? 1 : 0;
    }
    report("moe_fp8_block_swiglu_rows_alone_differing_" + tag, static_cast<double>(differing), 0);
  }

  // kAuto: 157 rows per expert on average (>= kMoeFp8BlockRowsPerExpert) takes the path, except
  // in batch-invariant mode (the copies there at every row count).
  const std::vector<int32_t> many = {128, 300, 0, 200};
  const Tensor off2 = offsets_of(many);
  const int64_t R2 = off2.data<int32_t>()[4];
  ASSERT_GE(R2, cuda::launch::kMoeFp8BlockRowsPerExpert * 4);
  const Data w2 = make_data(4, D, I);
  const Tensor x2 = cuda::to_device(to_bf16(random_groups(R2, D)));
  const Tensor y2 = poisoned({R2, D}, true);
  const std::string ran_auto = cuda::moe_grouped_swiglu_on(
      gpu(), "auto", x2, cuda::to_device(off2), w2.gate_d, w2.up_d, w2.down_d, y2, Tensor());
  Exec inv = gpu();
  inv.batch_invariant = true;
  const std::string ran_inv = cuda::moe_grouped_swiglu_on(
      inv, "auto", x2, cuda::to_device(off2), w2.gate_d, w2.up_d, w2.down_d, y2, Tensor());
  std::printf("GPUINFO kAuto at %lld rows per expert: %s, batch-invariant: %s\n",
              static_cast<long long>(R2 / 4), ran_auto.c_str(), ran_inv.c_str());
  report("moe_fp8_block_auto_not_taken", ran_auto == "wgmma_fp8" ? 0 : 1, 0);
  report("moe_fp8_block_auto_taken_in_invariant_mode", ran_inv == "wgmma_fp8" ? 1 : 0, 0);
}

// The engine sizes its workspace by one step at the largest batch (core/workspace.h): kAuto's
// plan may never ask for more scratch at fewer rows. Below kMoeFp8BlockRowsPerExpert rows per
// expert the experts' dequantized copies run (scratch up to the dequantization budget), above it
// kWgmmaFp8 (a few bytes a row), so its plan reserves the copies' too. Plans read no memory: the
// pointers stand in with the alignment the workspace gives.
TEST_F(MoeFp8Cuda, AutoPlanScratchNeverExceedsTheLargestStep) {
  namespace launch = cuda::launch;
  const auto stand_in = reinterpret_cast<void*>(uintptr_t{256});
  struct Shape {
    int64_t E, D, I, top_k;
  };
  for (const Shape sh :
       {Shape{256, 2304, 1024, 8}, Shape{128, 2048, 768, 8}, Shape{8, 400, 272, 2}}) {
    for (const int64_t tokens_max : {int64_t{2048}, int64_t{8192}, int64_t{16384}}) {
      const auto plan = [&](int64_t tokens) {
        launch::MoeSwigluArgs a;
        a.x = a.w_gate = a.w_up = a.w_down = stand_in;
        a.y = stand_in;
        a.offsets = static_cast<const int32_t*>(stand_in);
        a.s_gate = a.s_up = a.s_down = static_cast<const float*>(stand_in);
        a.fp8 = true;
        a.x_bf16 = a.y_bf16 = true;
        a.R = tokens * sh.top_k;
        a.D = sh.D;
        a.I = sh.I;
        a.E = sh.E;
        return launch::moe_swiglu_plan(a, launch::MoeGemmPath::kAuto);
      };
      const launch::MoeSwigluPlan top = plan(tokens_max);
      size_t worst = 0;
      int64_t worst_tokens = 0;
      for (int64_t t = 1; t <= tokens_max; t += std::max<int64_t>(1, tokens_max / 512)) {
        const launch::MoeSwigluPlan p = plan(t);
        if (p.scratch_bytes > worst) worst = p.scratch_bytes, worst_tokens = t;
      }
      // Just below and at the block path's threshold, where the paths change.
      for (int64_t r : {launch::kMoeFp8BlockRowsPerExpert * sh.E - 1,
                        launch::kMoeFp8BlockRowsPerExpert * sh.E}) {
        const int64_t t = r / sh.top_k;
        if (t < 1 || t > tokens_max) continue;
        const launch::MoeSwigluPlan p = plan(t);
        if (p.scratch_bytes > worst) worst = p.scratch_bytes, worst_tokens = t;
      }
      char tag_buf[64];
      std::snprintf(tag_buf, sizeof tag_buf, "E%lld_max%lld", static_cast<long long>(sh.E),
                    static_cast<long long>(tokens_max));
      const std::string tag = tag_buf;
      std::printf("GPUINFO moe_fp8_auto_scratch_%s top %s %zu worst %zu at %lld tokens\n",
                  tag.c_str(), launch::moe_gemm_path_name(top.path), top.scratch_bytes, worst,
                  static_cast<long long>(worst_tokens));
      report("moe_fp8_auto_scratch_" + tag, worst > top.scratch_bytes ? 1 : 0, 0);
    }
  }
}

}  // namespace
}  // namespace loom
