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
#include "kernels/cuda/moe.h"
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
  const std::string tag = c.name + "_" + ran + (c.gate_up ? "_gate_up" : "") +
                          (c.act_bf16 ? "_bf16" : "_f32") +
                          (c.chunk_bytes ? "_chunk" + std::to_string(c.chunk_bytes) : "");
  const Tensor y = host_f32(y_d);
  if (!f32_math) {
    report("moe_fp8_y_relL2_" + tag, rel_l2(head_rows(y, kept), head_rows(y_ref, kept)), 1e-2);
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
        report("moe_fp8_" + which + "_relL2_" + tag, rel_l2(got, ref), 1e-2);
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

}  // namespace
}  // namespace loom
