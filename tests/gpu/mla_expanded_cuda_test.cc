// The expanded-form MLA prefill kernel (kernels/cuda/mla_expanded_launch.h) against a plain CPU
// reference written here: double accumulation over the same bf16 inputs (scores, softmax and
// P V in double). Fresh random inputs every run (the seed is printed; LOOM_GPU_TEST_SEED replays
// one): q, k_nope, k_rope, v standard normal rounded to bf16, scale 1 / sqrt(dn + dr) (scores of
// standard deviation ~1).
//
// Bound, per output element e = (row, head, d), from the only rounding the kernel adds to the
// reference: each weight p_j is rounded to bf16 for P V (relative error <= u = 2^-8, bf16's unit
// roundoff), while the sum l = sum p_j stays f32, so
//   |out_e - ref_e| <= u * A_e,   A_e = sum_j p_j |v_jd| / sum_j p_j   (<= max |v|),
// plus 1e-3 A_e for the f32 arithmetic at its worst (scores: 192-term f32 sums on the tensor
// cores, which may truncate, err by <= 2 * 192 * 2^-23 * scale * sum |q k| ~ 5e-4 with these
// inputs, and a score error e moves a normalised weight by e^(2e) - 1; the sums of <= 5037
// weights in l and in P V, ~3e-4; ex2.approx's 2 ulp) and, for a bf16 output, its own rounding
// u |ref_e|. Observed: up to ~0.9 of the bound, from rows of a few keys where one weight's
// rounding is near its worst. Each check prints
// "GPUCHECK <name> <max err / bound> 1 <PASS|FAIL>" and the largest |err| / max |ref|. That bound
// is per element and follows each row's weights, so a dropped or extra tile (>= 64 keys) or a
// mask off by one on the diagonal (where rows have few keys) exceeds it.
//
// Cases: one block (first && last) with past = 0 and T = 1, 37, 200, 1000; a later prefill
// chunk (T = 300, past = 777); several key blocks (100, 1000, then the rest) whose boundaries fall
// inside query tiles and diagonals, where rows that see none of a block must keep their state bit
// for bit (checked after every launch), one ending with an empty block (nk = 0, last: only the
// normalisation); a few rows over a long past in blocks of whole tiles; bf16 and f32 outputs;
// H = 32 and H = 3; non-packed strides (every row of q, kv, k_rope and out longer than its
// data). Row padding of the inputs holds NaN (a kernel reading it poisons its output) and the
// outputs start as NaN, their padding checked untouched after the run.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/mla_expanded_launch.h"
#include "tests/gpu/gpu_test_support.h"

namespace loom {
namespace {

constexpr int kDn = 128, kDr = 64, kDv = 128;
constexpr uint16_t kBf16NaN = 0x7fc0;

std::mt19937_64& rng() {
  static std::mt19937_64 r(gpu_test_seed());
  return r;
}

struct Case {
  std::string name;
  int T = 0, H = 0;
  int64_t past = 0;
  std::vector<int64_t> blocks;  // key block sizes, summing to past + T
  bool out_f32 = false;
  int64_t q_pad = 0, kv_pad = 0, rope_pad = 0, out_pad = 0;  // extra elements a row
  bool trailing_empty = false;  // a last launch with nk = 0 (normalisation only)
};

template <typename T>
T* dalloc(size_t n) {
  void* p = nullptr;
  LOOM_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}
template <typename T>
T* upload(const std::vector<T>& h) {
  T* d = dalloc<T>(h.size());
  LOOM_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> h(n);
  LOOM_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// Reference output ref[i][h][d] and the bound's A[i][h][d] (see the file comment).
void reference(const Case& c, const std::vector<float>& q, const std::vector<float>& kn,
               const std::vector<float>& kr, const std::vector<float>& v, float scale,
               std::vector<double>* ref, std::vector<double>* amag) {
  const int T = c.T, H = c.H;
  ref->assign(static_cast<size_t>(T) * H * kDv, 0.0);
  amag->assign(ref->size(), 0.0);
  constexpr int kRows = 16;
  const int chunks = (T + kRows - 1) / kRows;
  std::atomic<int> next{0};
  auto work = [&] {
    std::vector<double> s, o(kDv), a(kDv);
    for (int item = next++; item < H * chunks; item = next++) {
      const int h = item % H, i0 = (item / H) * kRows;
      for (int i = i0; i < std::min(T, i0 + kRows); ++i) {
        const int64_t n = c.past + i + 1;  // keys 0 .. past + i
        s.resize(static_cast<size_t>(n));
        const float* qi = &q[(static_cast<size_t>(i) * H + h) * (kDn + kDr)];
        double mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          const float* kj = &kn[(static_cast<size_t>(j) * H + h) * kDn];
          const float* rj = &kr[static_cast<size_t>(j) * kDr];
          double dot = 0.0;
          for (int d = 0; d < kDn; ++d) dot += static_cast<double>(qi[d]) * kj[d];
          for (int d = 0; d < kDr; ++d) dot += static_cast<double>(qi[kDn + d]) * rj[d];
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        double l = 0.0;
        std::fill(o.begin(), o.end(), 0.0);
        std::fill(a.begin(), a.end(), 0.0);
        for (int64_t j = 0; j < n; ++j) {
          const double p = std::exp(s[j] - mx);
          l += p;
          const float* vj = &v[(static_cast<size_t>(j) * H + h) * kDv];
          for (int d = 0; d < kDv; ++d) {
            o[d] += p * vj[d];
            a[d] += p * std::fabs(vj[d]);
          }
        }
        for (int d = 0; d < kDv; ++d) {
          (*ref)[(static_cast<size_t>(i) * H + h) * kDv + d] = o[d] / l;
          (*amag)[(static_cast<size_t>(i) * H + h) * kDv + d] = a[d] / l;
        }
      }
    }
  };
  const unsigned nt = std::max(1u, std::min(64u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < nt; ++t) pool.emplace_back(work);
  for (auto& t : pool) t.join();
}

void run_case(const Case& c) {
  const int T = c.T, H = c.H;
  const int64_t nkeys = c.past + T;
  int64_t sum = 0;
  for (int64_t b : c.blocks) sum += b;
  ASSERT_EQ(sum, nkeys) << c.name;
  const int64_t q_row = static_cast<int64_t>(H) * (kDn + kDr) + c.q_pad;
  const int64_t kv_row = static_cast<int64_t>(H) * (kDn + kDv) + c.kv_pad;
  const int64_t rope_row = kDr + c.rope_pad;
  const int64_t out_row = static_cast<int64_t>(H) * kDv + c.out_pad;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kDn + kDr));

  // Inputs: bf16 device images (padding NaN) and their f32 values for the reference.
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto draw = [&](float* f) {
    const uint16_t b = f32_to_bf16(nd(rng()));
    *f = bf16_to_f32(b);
    return b;
  };
  std::vector<uint16_t> qb(static_cast<size_t>(T) * q_row, kBf16NaN);
  std::vector<uint16_t> kvb(static_cast<size_t>(nkeys) * kv_row, kBf16NaN);
  std::vector<uint16_t> rb(static_cast<size_t>(nkeys) * rope_row, kBf16NaN);
  std::vector<float> qf(static_cast<size_t>(T) * H * (kDn + kDr));
  std::vector<float> knf(static_cast<size_t>(nkeys) * H * kDn),
      vf(static_cast<size_t>(nkeys) * H * kDv);
  std::vector<float> rf(static_cast<size_t>(nkeys) * kDr);
  for (int i = 0; i < T; ++i)
    for (int x = 0; x < H * (kDn + kDr); ++x)
      qb[i * q_row + x] = draw(&qf[static_cast<size_t>(i) * H * (kDn + kDr) + x]);
  for (int64_t j = 0; j < nkeys; ++j) {
    for (int h = 0; h < H; ++h) {
      for (int d = 0; d < kDn; ++d)
        kvb[j * kv_row + h * (kDn + kDv) + d] = draw(&knf[(j * H + h) * kDn + d]);
      for (int d = 0; d < kDv; ++d)
        kvb[j * kv_row + h * (kDn + kDv) + kDn + d] = draw(&vf[(j * H + h) * kDv + d]);
    }
    for (int d = 0; d < kDr; ++d) rb[j * rope_row + d] = draw(&rf[j * kDr + d]);
  }

  uint16_t* q_d = upload(qb);
  uint16_t* kv_d = upload(kvb);
  uint16_t* r_d = upload(rb);
  const size_t state_n = static_cast<size_t>(T) * H * kDv;
  float* acc_d = upload(std::vector<float>(state_n, std::nanf("")));
  float* ml_d = upload(std::vector<float>(static_cast<size_t>(T) * H * 2, std::nanf("")));
  const size_t out_n = static_cast<size_t>(T) * out_row;
  std::vector<float> out_f_init(out_n, std::nanf(""));
  std::vector<uint16_t> out_b_init(out_n, kBf16NaN);
  void* out_d = c.out_f32 ? static_cast<void*>(upload(out_f_init)) : upload(out_b_init);
  cudaStream_t stream;
  LOOM_CUDA_CHECK(cudaStreamCreate(&stream));

  cuda::launch::MlaExpandedArgs a;
  a.q = q_d;
  a.q_row = q_row;
  a.kv_row = kv_row;
  a.rope_row = rope_row;
  a.T = T;
  a.H = H;
  a.dn = kDn;
  a.dr = kDr;
  a.dv = kDv;
  a.past = c.past;
  a.scale = scale;
  a.acc = acc_d;
  a.ml = ml_d;
  a.out = out_d;
  a.out_row = out_row;
  a.out_f32 = c.out_f32;
  std::vector<int64_t> blocks = c.blocks;
  if (c.trailing_empty) blocks.push_back(0);
  std::vector<float> prev_acc, prev_ml;
  int64_t key0 = 0;
  bool state_kept = true;
  for (size_t b = 0; b < blocks.size(); ++b) {
    a.key0 = key0;
    a.nk = blocks[b];
    a.kv = kv_d + key0 * kv_row;
    a.k_rope = r_d + key0 * rope_row;
    a.first = b == 0;
    a.last = b + 1 == blocks.size();
    cuda::launch::mla_expanded_attention(stream, a);
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (!a.last) {
      std::vector<float> acc = download(acc_d, state_n);
      std::vector<float> ml = download(ml_d, static_cast<size_t>(T) * H * 2);
      // Rows that see none of this block's keys keep their state bit for bit.
      if (b > 0) {
        for (int i = 0; i < T; ++i) {
          if (c.past + i >= key0 && a.nk > 0) continue;
          const size_t s0 = static_cast<size_t>(i) * H;
          if (std::memcmp(&acc[s0 * kDv], &prev_acc[s0 * kDv], H * kDv * sizeof(float)) != 0 ||
              std::memcmp(&ml[s0 * 2], &prev_ml[s0 * 2], H * 2 * sizeof(float)) != 0) {
            state_kept = false;
          }
        }
      }
      prev_acc = std::move(acc);
      prev_ml = std::move(ml);
    }
    key0 += blocks[b];
  }
  EXPECT_TRUE(state_kept) << c.name << ": a row that sees none of a block changed its state";

  std::vector<float> got(state_n);
  bool pads_ok = true;
  if (c.out_f32) {
    const std::vector<float> o = download(static_cast<float*>(out_d), out_n);
    for (int i = 0; i < T; ++i) {
      std::copy_n(&o[i * out_row], H * kDv, &got[static_cast<size_t>(i) * H * kDv]);
      for (int64_t x = H * kDv; x < out_row; ++x) pads_ok &= std::isnan(o[i * out_row + x]);
    }
  } else {
    const std::vector<uint16_t> o = download(static_cast<uint16_t*>(out_d), out_n);
    for (int i = 0; i < T; ++i) {
      for (int x = 0; x < H * kDv; ++x)
        got[static_cast<size_t>(i) * H * kDv + x] = bf16_to_f32(o[i * out_row + x]);
      for (int64_t x = H * kDv; x < out_row; ++x) pads_ok &= o[i * out_row + x] == kBf16NaN;
    }
  }
  EXPECT_TRUE(pads_ok) << c.name << ": the output's row padding was written";

  std::vector<double> ref, amag;
  reference(c, qf, knf, rf, vf, scale, &ref, &amag);
  const double u = std::ldexp(1.0, -8);
  double worst = 0.0, max_err = 0.0, max_ref = 0.0;
  int64_t bad = 0;
  for (size_t e = 0; e < state_n; ++e) {
    const double err = std::fabs(got[e] - ref[e]);
    const double bound = (u + 1e-3) * amag[e] + (c.out_f32 ? 0.0 : u * std::fabs(ref[e])) + 1e-7;
    if (!std::isfinite(got[e])) {
      ++bad;
      worst = INFINITY;
      continue;
    }
    worst = std::max(worst, err / bound);
    max_err = std::max(max_err, err);
    max_ref = std::max(max_ref, std::fabs(ref[e]));
  }
  const bool pass = worst <= 1.0;
  std::printf(
      "GPUCHECK mla_expanded_%s %.3e 1 %s (max |err| %.3e, / max |ref| %.3e, %lld "
      "non-finite)\n",
      c.name.c_str(), worst, pass ? "PASS" : "FAIL", max_err, max_err / max_ref,
      static_cast<long long>(bad));
  std::fflush(stdout);
  EXPECT_LE(worst, 1.0) << c.name;

  LOOM_CUDA_CHECK(cudaStreamDestroy(stream));
  for (void* p : {static_cast<void*>(q_d), static_cast<void*>(kv_d), static_cast<void*>(r_d),
                  static_cast<void*>(acc_d), static_cast<void*>(ml_d), out_d})
    LOOM_CUDA_CHECK(cudaFree(p));
}

TEST(MlaExpanded, Supported) {
  EXPECT_TRUE(cuda::launch::mla_expanded_supported(128, 64, 128));
  EXPECT_FALSE(cuda::launch::mla_expanded_supported(128, 64, 64));
  EXPECT_FALSE(cuda::launch::mla_expanded_supported(512, 64, 512));
}

TEST(MlaExpanded, FreshOneBlock) {
  run_case({.name = "fresh_T1_H32_f32", .T = 1, .H = 32, .blocks = {1}, .out_f32 = true});
  run_case({.name = "fresh_T37_H32_f32", .T = 37, .H = 32, .blocks = {37}, .out_f32 = true});
  run_case({.name = "fresh_T200_H3_bf16", .T = 200, .H = 3, .blocks = {200}});
  run_case({.name = "fresh_T1000_H32_bf16", .T = 1000, .H = 32, .blocks = {1000}});
}

TEST(MlaExpanded, LaterChunk) {
  run_case({.name = "past777_T300_H32_f32",
            .T = 300,
            .H = 32,
            .past = 777,
            .blocks = {1077},
            .out_f32 = true});
  run_case({.name = "past777_T300_H3_bf16", .T = 300, .H = 3, .past = 777, .blocks = {1077}});
}

TEST(MlaExpanded, KeyBlocks) {
  // past 0: rows < 100 see only part of the first block and none of the others.
  run_case({.name = "blocks_T1500_H32_f32",
            .T = 1500,
            .H = 32,
            .blocks = {100, 1000, 400},
            .out_f32 = true});
  run_case({.name = "blocks_T1500_H3_bf16", .T = 1500, .H = 3, .blocks = {100, 1000, 400}});
  // A later chunk: the third block starts at row 200 (inside query tile 1's diagonal).
  run_case({.name = "blocks_past900_T700_H32_bf16_empty_last",
            .T = 700,
            .H = 32,
            .past = 900,
            .blocks = {100, 1000, 500},
            .trailing_empty = true});
  // A few rows over a long past: every tile but the block ends' fully visible.
  run_case({.name = "blocks_past5000_T37_H3_f32",
            .T = 37,
            .H = 3,
            .past = 5000,
            .blocks = {2048, 2048, 941},
            .out_f32 = true});
}

TEST(MlaExpanded, Strided) {
  run_case({.name = "strided_past900_T700_H3_f32",
            .T = 700,
            .H = 3,
            .past = 900,
            .blocks = {100, 1000, 500},
            .out_f32 = true,
            .q_pad = 40,
            .kv_pad = 24,
            .rope_pad = 8,
            .out_pad = 8});
  run_case({.name = "strided_T200_H32_bf16",
            .T = 200,
            .H = 32,
            .blocks = {200},
            .q_pad = 8,
            .kv_pad = 64,
            .rope_pad = 64,
            .out_pad = 16});
}

}  // namespace
}  // namespace loom
