// FP8 storage and DeepSeek-V3's block-quantized weights: exact widening of both FP8 formats,
// dequantization with partial blocks and an unrounded f32 scale, errors for a wrong scale grid,
// and the quantization_config that selects it (anything else is refused by name).
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "weights/fp8.h"
#include "weights/model_config.h"

namespace loom {
namespace {

TEST(Fp8, E4M3KnownValues) {
  EXPECT_EQ(f8e4m3_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(f8e4m3_to_f32(0x80)));
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);  // exponent 7 = bias
  EXPECT_EQ(f8e4m3_to_f32(0xB8), -1.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x7E), 448.0f);        // the largest finite e4m3fn value
  EXPECT_EQ(f8e4m3_to_f32(0x08), 0.015625f);     // smallest normal, 2^-6
  EXPECT_EQ(f8e4m3_to_f32(0x01), 0.001953125f);  // smallest subnormal, 2^-9
  EXPECT_EQ(f8e4m3_to_f32(0x07), 0.013671875f);  // largest subnormal, 7 * 2^-9
  EXPECT_EQ(f8e4m3_to_f32(0x3C), 1.5f);
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7F)));  // "fn": no infinities, S.1111.111 is NaN
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0xFF)));
  EXPECT_EQ(f8e4m3_to_f32(0x78), 256.0f);  // S.1111.000 is a number in e4m3fn
  // Positive codes are strictly increasing (no gaps or duplicates in the decoding).
  for (int v = 1; v < 0x7F; ++v) EXPECT_LT(f8e4m3_to_f32(v - 1), f8e4m3_to_f32(v)) << v;
}

TEST(Fp8, E5M2KnownValues) {
  EXPECT_EQ(f8e5m2_to_f32(0x3C), 1.0f);
  EXPECT_EQ(f8e5m2_to_f32(0x7B), 57344.0f);
  EXPECT_EQ(f8e5m2_to_f32(0x7C), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f8e5m2_to_f32(0xFC), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f8e5m2_to_f32(0x7D)));
  EXPECT_EQ(f8e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(f8e5m2_to_f32(0x04), std::ldexp(1.0f, -14));
  for (int v = 1; v < 0x7C; ++v) EXPECT_LT(f8e5m2_to_f32(v - 1), f8e5m2_to_f32(v)) << v;
}

// A [rows, cols] e4m3 tensor of random codes (never NaN) and a random f32 scale grid.
struct Quantized {
  Tensor q, scale;
};
Quantized make(int64_t rows, int64_t cols, int64_t grid_r, int64_t grid_c, std::mt19937& rng) {
  Quantized out{Tensor::empty({rows, cols}, DType::kF8E4M3), Tensor::empty({grid_r, grid_c})};
  auto* qp = static_cast<uint8_t*>(out.q.raw());
  for (int64_t i = 0; i < rows * cols; ++i) {
    uint8_t v;
    do {
      v = static_cast<uint8_t>(rng());
    } while ((v & 0x7F) == 0x7F);
    qp[i] = v;
  }
  std::uniform_real_distribution<float> d(1e-4f, 3e-3f);
  for (int64_t i = 0; i < grid_r * grid_c; ++i) out.scale.data<float>()[i] = d(rng);
  return out;
}

TEST(Fp8, DequantizesBlocksIncludingPartialOnes) {
  std::mt19937 rng(5);
  // 576 rows over 5 blocks of 128 (the last has 64), 300 columns over 3 (the last has 44):
  // DeepSeek-V3's kv_a_proj_with_mqa has the same row split.
  Quantized t = make(576, 300, 5, 3, rng);
  auto w = dequantize_fp8_blocks(t.q, t.scale, 128, 128, "x.weight");
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->shape(), Shape({576, 300}));
  const auto* qp = static_cast<const uint8_t*>(t.q.raw());
  for (int64_t r = 0; r < 576; ++r) {
    for (int64_t c = 0; c < 300; ++c) {
      const float s = t.scale.data<float>()[(r / 128) * 3 + c / 128];
      const float want = f8e4m3_to_f32(qp[r * 300 + c]) * s;  // one f32 rounding
      ASSERT_EQ(w->data<float>()[r * 300 + c], want) << r << "," << c;
    }
  }
}

TEST(Fp8, TransposedGridIsRefused) {
  std::mt19937 rng(6);
  Quantized t = make(384, 256, 2, 3, rng);  // [384, 256] needs a 3 x 2 grid, not 2 x 3
  auto w = dequantize_fp8_blocks(t.q, t.scale, 128, 128, "q_b_proj.weight");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("q_b_proj.weight"), std::string_view::npos) << w.status();
  EXPECT_NE(w.status().message().find("[3, 2]"), std::string_view::npos) << w.status();
  EXPECT_FALSE(dequantize_fp8_blocks(t.q, t.scale, 0, 0, "w").ok()) << "no block size in config";
}

std::string config_with(const std::string& quantization) {
  return R"({"model_type": "deepseek_v3", "vocab_size": 320, "hidden_size": 128,
    "intermediate_size": 256, "moe_intermediate_size": 128, "num_hidden_layers": 1,
    "num_attention_heads": 2, "q_lora_rank": 256, "kv_lora_rank": 128, "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 64, "v_head_dim": 64, "n_routed_experts": 4, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
    "quantization_config": )" +
         quantization + "}";
}

TEST(Fp8, QuantizationConfig) {
  auto ok = parse_model_config(config_with(
      R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
          "weight_block_size": [128, 64]})"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->fp8_block_rows, 128);
  EXPECT_EQ(ok->fp8_block_cols, 64);
  for (const char* bad :
       {R"({"quant_method": "awq", "bits": 4})",
        R"({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]})",
        R"({"quant_method": "fp8", "activation_scheme": "static",
                              "weight_block_size": [128, 128]})",
        R"({"quant_method": "fp8", "weight_block_size": [128]})",
        R"({"quant_method": "fp8", "weight_block_size": [0, 128]})", R"("fp8")"}) {
    auto c = parse_model_config(config_with(bad));
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.status().message().find("quantization_config"), std::string_view::npos)
        << c.status();
  }
}

}  // namespace
}  // namespace loom
