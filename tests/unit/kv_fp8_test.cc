// FP8 KV pages (--kv_dtype fp8, kernels/attention.h's format: e4m3fn codes + one f32 scale per
// cached vector) on the CPU: the per-vector quantizer against a double-precision reference that
// finds the nearest e4m3 value by enumerating every code; cache writes into shuffled pages and
// attention over them against f32 pages holding the reference's dequantized values; and the page
// arithmetic (bytes per token, tokens per memory against bf16).
#include "kernels/cpu/kv_fp8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "engine/model/cache_store.h"
#include "kernels/attention.h"
#include "weights/model_config.h"

namespace loom {
namespace {

// The e4m3fn value nearest to q (|q| past 448 saturates), ties to the even code, found by
// scanning every finite non-negative code in double: independent of core's encoder.
double reference_e4m3(double q) {
  const double a = std::fabs(q);
  double best = 0, best_err = std::numeric_limits<double>::infinity();
  int best_code = 0;
  for (int code = 0; code <= 0x7E; ++code) {
    const double v = f8e4m3_to_f32(static_cast<uint8_t>(code));
    const double err = std::fabs(v - a);
    if (err < best_err || (err == best_err && code % 2 == 0)) {
      best = v;
      best_err = err;
      best_code = code;
    }
  }
  (void)best_code;
  if (a >= 448.0) best = 448.0;
  return std::signbit(q) ? -best : best;
}

// A vector's dequantized values as the format defines them, from the reference: scale =
// f32(amax / 448) (1 for all zeros), value = f32(reference_e4m3(x / scale)) * scale in f32.
std::vector<float> reference_dequantized(const float* x, int64_t n, float* scale_out = nullptr) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  float scale = amax / 448.0f;
  if (!(scale > 0.0f)) scale = 1.0f;
  if (scale_out) *scale_out = scale;
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<float>(reference_e4m3(static_cast<double>(x[i]) / scale)) * scale;
  return out;
}

std::vector<float> round_trip(const std::vector<float>& x, float* scale = nullptr) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(n + kKvFp8ScaleBytes);
  cpu::kv_fp8_quantize(x.data(), n, q.data());
  if (scale) std::memcpy(scale, q.data() + n, 4);
  std::vector<float> out(n);
  cpu::kv_fp8_dequantize(q.data(), n, out.data());
  return out;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Every value equals the reference's, bit for bit, and lies within the error e4m3 allows: with
// 3 mantissa bits a normal quotient q = x / scale rounds by at most half an ulp, 2^-4 |q|; a
// subnormal one (|q| < 2^-6) by half the subnormal spacing, 2^-10; the f32 product adds 2^-24
// relative. So |value - x| <= 2^-4 |x| + 2^-10 scale + 2^-24 |value|.
TEST(KvFp8, RoundTripMatchesDoubleReference) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> exponent(-20, 10), sign(-1, 1);
  int64_t checked = 0, subnormal = 0;
  for (int64_t n : {1, 7, 48, 129, 512}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x(n);
      // Magnitudes spread over 2^-20 .. 2^10 within a vector, so that small entries of a vector
      // with a large amax land in e4m3's subnormal range (and below it, to zero).
      for (float& v : x)
        v = static_cast<float>((sign(rng) < 0 ? -1 : 1) * std::exp2(exponent(rng)));
      float scale = 0, ref_scale = 0;
      const std::vector<float> got = round_trip(x, &scale);
      const std::vector<float> want = reference_dequantized(x.data(), n, &ref_scale);
      ASSERT_TRUE(same_bits(scale, ref_scale));
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(same_bits(got[i], want[i]))
            << "n " << n << " i " << i << " x " << x[i] << " got " << got[i] << " want " << want[i];
        const double err = std::fabs(static_cast<double>(got[i]) - x[i]);
        const double bound =
            0x1p-4 * std::fabs(x[i]) + 0x1p-10 * scale + 0x1p-24 * std::fabs(got[i]);
        ASSERT_LE(err, bound) << "x " << x[i] << " scale " << scale;
        subnormal += std::fabs(x[i] / scale) < 0x1p-6;
        ++checked;
      }
    }
  }
  EXPECT_GT(subnormal, checked / 10);  // the subnormal branch was exercised
}

// The largest magnitude maps to the largest code (448: the scale is amax / 448, rounded, so the
// quotient may exceed 448 by an f32 rounding and saturates); ties round to the even code.
TEST(KvFp8, SaturationAndTies) {
  const std::vector<float> x = {-3.0f, 1.0f, 0.5f, 2.0f / 3.0f};
  float scale = 0;
  const std::vector<float> got = round_trip(x, &scale);
  EXPECT_EQ(scale, 3.0f / 448.0f);
  EXPECT_NEAR(got[0], -3.0f, 3.0f * 0x1p-22);
  // 1 / scale = 149.33..: e4m3's spacing in [128, 256) is 16, so 144 (nearer than 160).
  EXPECT_EQ(got[1], 144.0f * scale);
  // Ties: with amax 448 the scale is 1; in [16, 32) the spacing is 2, so 17 lies halfway between
  // 16 (even code) and 18 (odd) and goes to 16, and 19 goes to 20 (even).
  const std::vector<float> ties = {448.0f, 17.0f, 19.0f, -17.0f};
  const std::vector<float> t = round_trip(ties, &scale);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(t[0], 448.0f);
  EXPECT_EQ(t[1], 16.0f);
  EXPECT_EQ(t[2], 20.0f);
  EXPECT_EQ(t[3], -16.0f);
}

// A vector whose amax is 0 stores scale 1 and reads back exact zeros with their signs; a
// non-finite value makes the whole vector NaN (as an f32 cache would carry it), never a finite
// value that hides it.
TEST(KvFp8, ZerosAndNonFinite) {
  float scale = 0;
  const std::vector<float> z = round_trip({0.0f, -0.0f, 0.0f}, &scale);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_TRUE(same_bits(z[0], 0.0f));
  EXPECT_TRUE(same_bits(z[1], -0.0f));
  for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
    const std::vector<float> v = round_trip({1.0f, bad, 2.0f}, &scale);
    EXPECT_TRUE(std::isnan(scale));
    for (float f : v) EXPECT_TRUE(std::isnan(f));
  }
  // Zeros beside non-zeros stay exact zeros.
  const std::vector<float> mixed = round_trip({0.0f, 5.0f, -0.0f});
  EXPECT_TRUE(same_bits(mixed[0], 0.0f) && same_bits(mixed[2], -0.0f));
}

// Pages in shuffled order, sequences with cached pasts and new rows: the write stores each
// vector's codes and scale (untouched rows stay zero), and attention over the fp8 pages equals,
// bit for bit, attention over f32 pages holding the reference's dequantized rows (the CPU
// dequantizes a page at a time, then runs the same GEMMs), in both numerics modes, MLA (one
// vector per row) and GQA (one vector per kv head).
TEST(KvFp8, CacheWriteAndAttentionMatchDequantizedReference) {
  std::mt19937 rng(11);
  const int64_t page = 16;
  const std::vector<int64_t> lens = {1, 9, 64, 33, 1}, past = {0, 40, 3, 100, 77};
  const int64_t B = static_cast<int64_t>(lens.size());
  std::vector<int64_t> cu = {0};
  int64_t cols = 0, used = 0;
  for (int64_t b = 0; b < B; ++b) {
    cu.push_back(cu.back() + lens[b]);
    cols = std::max(cols, (past[b] + lens[b] + page - 1) / page);
    used += (past[b] + lens[b] + page - 1) / page;
  }
  const int64_t N = cu.back(), P = used + 3;
  std::vector<int32_t> ids(P);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  Tensor table = Tensor::zeros({B, cols}, DType::kI32), cu_t = Tensor::empty({B + 1}, DType::kI64),
         past_t = Tensor::empty({B}, DType::kI64);
  std::copy(cu.begin(), cu.end(), cu_t.data<int64_t>());
  std::copy(past.begin(), past.end(), past_t.data<int64_t>());
  for (int64_t b = 0, next = 0; b < B; ++b)
    for (int64_t pg = 0; pg < (past[b] + lens[b] + page - 1) / page; ++pg)
      table.data<int32_t>()[b * cols + pg] = ids[next++];
  std::uniform_real_distribution<float> dist(-1, 1);
  auto random = [&](Shape s, float scale = 1) {
    Tensor t = Tensor::empty(s);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = scale * dist(rng);
    return t;
  };

  // Writes `rows` ([N, vectors, n]) into a fresh fp8 pool and the reference's dequantized values
  // into an f32 twin; positions before past[b] get cached rows of their own (written the same
  // way, as an earlier step would have), so attention reads old and new rows.
  struct Pools {
    Tensor fp8, f32;
  };
  auto write = [&](int64_t vectors, int64_t n) {
    Shape s8 = vectors == 1 ? Shape({P, page, n + 4}) : Shape({P, page, vectors, n + 4});
    Shape s32 = vectors == 1 ? Shape({P, page, n}) : Shape({P, page, vectors, n});
    Pools p{Tensor::zeros(s8, DType::kF8E4M3), Tensor::zeros(s32)};
    const Exec ex = host_exec();
    // Earlier steps: every sequence's past in one write (rows of varied magnitude per vector).
    std::vector<int64_t> cu_past = {0};
    for (int64_t b = 0; b < B; ++b) cu_past.push_back(cu_past.back() + past[b]);
    Tensor cu_p = Tensor::empty({B + 1}, DType::kI64), zero_t = Tensor::zeros({B}, DType::kI64);
    std::copy(cu_past.begin(), cu_past.end(), cu_p.data<int64_t>());
    const Tensor old_rows = random({cu_past.back(), vectors, n}, 3.0f);
    cache_write_varlen(ex, p.fp8, table, cu_p, zero_t,
                       vectors == 1 ? old_rows.reshape({cu_past.back(), n}) : old_rows);
    const Tensor new_rows = random({N, vectors, n}, 0.25f);
    const Tensor new_shaped = vectors == 1 ? new_rows.reshape({N, n}) : new_rows;
    cache_write_varlen(ex, p.fp8, table, cu_t, past_t, new_shaped);
    // The reference pool, row by row from the page table.
    int64_t written_bytes = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < past[b] + lens[b]; ++j) {
        const float* src = j < past[b]
                               ? old_rows.data<float>() + (cu_past[b] + j) * vectors * n
                               : new_rows.data<float>() + (cu[b] + j - past[b]) * vectors * n;
        const int64_t pg = table.data<int32_t>()[b * cols + j / page], r = j % page;
        for (int64_t v = 0; v < vectors; ++v) {
          const std::vector<float> deq = reference_dequantized(src + v * n, n);
          std::copy(deq.begin(), deq.end(),
                    p.f32.data<float>() + ((pg * page + r) * vectors + v) * n);
          // The stored bytes decode to exactly these values.
          std::vector<float> got(n);
          cpu::kv_fp8_dequantize(p.fp8.data<uint8_t>() + ((pg * page + r) * vectors + v) * (n + 4),
                                 n, got.data());
          for (int64_t i = 0; i < n; ++i) EXPECT_TRUE(same_bits(got[i], deq[i]));
          written_bytes += n + 4;
        }
      }
    // Every other byte is still zero.
    int64_t nonzero = 0;
    for (int64_t i = 0; i < p.fp8.numel(); ++i) nonzero += p.fp8.data<uint8_t>()[i] != 0;
    EXPECT_LE(nonzero, written_bytes);
    return p;
  };

  const MlaDims m{3, 12, 6, 10, 20};
  const Pools latent = write(1, 20), rope = write(1, 6);
  const Pools k = write(2, 9), v = write(2, 7);
  for (bool invariant : {false, true}) {
    Exec ex = host_exec();
    ex.batch_invariant = invariant;
    const Tensor q = random({N, 3, 18});
    const Tensor kv_b = random({3 * 22, 20}, 0.4f);
    Tensor got = Tensor::empty({N, 3, 10}), want = Tensor::empty({N, 3, 10});
    mla_attention_varlen(ex, q, latent.fp8, rope.fp8, table, cu_t, past_t, kv_b, m, 0.5f, got);
    mla_attention_varlen(ex, q, latent.f32, rope.f32, table, cu_t, past_t, kv_b, m, 0.5f, want);
    EXPECT_EQ(std::memcmp(got.raw(), want.raw(), got.nbytes()), 0)
        << "MLA, invariant " << invariant;

    const Tensor qg = random({N, 6, 9});
    Tensor ggot = Tensor::empty({N, 6, 7}), gwant = Tensor::empty({N, 6, 7});
    gqa_attention_varlen(ex, qg, k.fp8, v.fp8, table, cu_t, past_t, 0.7f, ggot);
    gqa_attention_varlen(ex, qg, k.f32, v.f32, table, cu_t, past_t, 0.7f, gwant);
    EXPECT_EQ(std::memcmp(ggot.raw(), gwant.raw(), ggot.nbytes()), 0)
        << "GQA, invariant " << invariant;
  }
}

// Page bytes of production configs. Kimi-Linear-48B-A3B (MLA, kv_lora_rank 512, 64-dim rope
// key): fp8 stores 512 + 4 and 64 + 4 bytes a token per MLA layer where bf16 stores 2 * 576, so
// the same memory holds 1152 / 584 = 1.97x the tokens (>= 1.9x, issue 19's target).
// Qwen3-Next-80B-A3B (GQA, 2 kv heads of 256): 2 * 2 * 260 against 2 * 2 * 512 bytes, 1.97x. The
// bundled default model (kv_lora_rank 128, rope 32): 320 / 168 = 1.905x. The store's pools hold
// exactly the bytes the arithmetic counts.
TEST(KvFp8, PageBytesHoldNearlyTwiceBf16Tokens) {
  for (const char* dir : {"/bench/configs/kimi_linear_48b_a3b", "/bench/configs/qwen3_next_80b_a3b",
                          "/weights/default"}) {
    absl::StatusOr<ModelConfig> cfg = load_model_config(std::string(LOOM_SOURCE_DIR) + dir);
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    const double bf16 = static_cast<double>(CacheStore::page_bytes(*cfg, 64, DType::kBF16));
    const double fp8 = static_cast<double>(CacheStore::page_bytes(*cfg, 64, DType::kF8E4M3));
    ASSERT_GT(fp8, 0) << dir;
    std::printf("[kv_fp8] %s: page of 64 tokens: bf16 %.0f bytes, fp8 %.0f bytes, ratio %.4f\n",
                dir, bf16, fp8, bf16 / fp8);
    if (cfg->mla.kv_lora_rank == 512 && cfg->mla.qk_rope_head_dim == 64) {
      EXPECT_DOUBLE_EQ(bf16 / fp8, 1152.0 / 584.0);
    }
    EXPECT_GE(bf16 / fp8, 1.9) << dir;
  }
  absl::StatusOr<ModelConfig> cfg =
      load_model_config(std::string(LOOM_SOURCE_DIR) + "/bench/configs/kimi_linear_48b_a3b");
  ASSERT_TRUE(cfg.ok());
  // The store's own allocation, at a small page count: the pools' bytes are what page_bytes says.
  ModelConfig small = *cfg;
  CacheStore::Options o{.num_pages = 3, .page_size = 4, .num_slots = 0, .kv_dtype = DType::kF8E4M3};
  auto store = CacheStore::create(small, o);
  ASSERT_TRUE(store.ok()) << store.status();
  size_t bytes = 0;
  for (int l = 0; l < small.num_layers; ++l)
    if (small.mixers[l] == MixerType::kMla || small.mixers[l] == MixerType::kGqa)
      bytes += (*store)->pool(l, 0).nbytes() + (*store)->pool(l, 1).nbytes();
  EXPECT_EQ(bytes, 3 * CacheStore::page_bytes(small, 4, DType::kF8E4M3));
}

TEST(KvFp8, ParseAndRefusals) {
  EXPECT_FALSE(parse_kv_dtype("auto")->has_value());
  EXPECT_EQ(*parse_kv_dtype("fp8"), DType::kF8E4M3);
  EXPECT_EQ(*parse_kv_dtype("bf16"), DType::kBF16);
  EXPECT_EQ(*parse_kv_dtype("f32"), DType::kF32);
  EXPECT_EQ(parse_kv_dtype("e4m3").status().message(),
            "kv_dtype 'e4m3': must be auto, f32, bf16 or fp8");
  absl::StatusOr<ModelConfig> cfg =
      load_model_config(std::string(LOOM_SOURCE_DIR) + "/weights/default");
  ASSERT_TRUE(cfg.ok());
  CacheStore::Options o{
      .num_pages = 2, .num_slots = 1, .device = Device::kCuda, .kv_dtype = DType::kF8E4M3};
  // fp8 pages run on both backends (the CUDA kernels dequantize as they load): a CUDA store is
  // refused only by a build without the CUDA backend.
  const absl::Status on_cuda = CacheStore::validate(*cfg, o);
#ifdef LOOM_WITH_CUDA
  EXPECT_TRUE(on_cuda.ok()) << on_cuda;
#else
  EXPECT_EQ(on_cuda.message(), "CacheStore on cuda:0: this build has no CUDA backend");
#endif
  o.device = Device::kCpu;
  EXPECT_TRUE(CacheStore::validate(*cfg, o).ok());
  o.kv_dtype = DType::kF16;  // a float no kernel reads as pages
  EXPECT_EQ(CacheStore::validate(*cfg, o).message(),
            "CacheStore: kv_dtype f16 on cpu: use f32, bf16 or fp8");
  o.kv_dtype = DType::kF8E4M3;
  o.act_dtype = DType::kF8E4M3;  // the convolution tails are activations: never fp8
  EXPECT_FALSE(CacheStore::validate(*cfg, o).ok());
}

}  // namespace
}  // namespace loom
