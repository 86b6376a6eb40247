// --random_weights: a model of any config.json with counter-based random weights
// (engine/model/random_weights.h). The parameters are those a checkpoint of the config loads
// (names, shapes, dtypes: compared with each fixture's real model), the values follow the
// documented rules (checked against an independent SplitMix64 and the rules' ranges), a seed
// gives the same logits every time and another seed others, a forward is finite, and bad seeds,
// paths and configs are refused with the flag or file named.
#include "engine/model/random_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "kernels/random_fill.h"
#include "nlohmann/json.hpp"

namespace loom {
namespace {

const std::string kFixtures = LOOM_FIXTURES_DIR;
const std::string kTmp = LOOM_TEST_TMPDIR;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The oracle generator, written out again from its definition (SplitMix64's finaliser of
// key + (counter + 1) * golden; the top 23 bits s give center + (2 s - 2^23 + 1) * hw / 2^23).
double oracle_value(uint64_t key, uint64_t counter, double center, double half_width) {
  uint64_t z = key + (counter + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  const double odd = 2.0 * static_cast<double>(z >> 41) - 8388608.0 + 1.0;
  return center + odd * half_width / 8388608.0;
}

Tensor logits_of(const Model& m, const std::vector<int32_t>& ids) {
  SequenceCache cache = m.new_cache();
  ForwardBatch b;
  b.token_ids = ids;
  b.seqs.push_back({.num_tokens = static_cast<int64_t>(ids.size()),
                    .logits = LogitsMode::kAll,
                    .cache = &cache});
  absl::StatusOr<Tensor> logits = m.forward(b);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? logits->to(Device::kCpu).clone() : Tensor();
}

std::vector<int32_t> prompt(int64_t vocab, int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 5) % vocab));
  return ids;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

class RandomWeightsFixture : public ::testing::TestWithParam<const char*> {};

// Every parameter a checkpoint of the config loads, in the same order, with the same shape and
// dtype: the random model is the checkpoint's layout with other values.
TEST_P(RandomWeightsFixture, ParametersMatchTheCheckpointLoader) {
  const std::string dir = kFixtures + "/" + GetParam();
  for (WeightDType dtype : {WeightDType::kF32, WeightDType::kBF16}) {
    auto real = Model::load(dir, Placement{.dtype = dtype});
    ASSERT_TRUE(real.ok()) << real.status();
    auto rnd = Model::load_random(dir, 3, Placement{.dtype = dtype});
    ASSERT_TRUE(rnd.ok()) << rnd.status();
    const auto& a = (*real)->parameters().entries();
    const auto& b = (*rnd)->parameters().entries();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].name, b[i].name);
      EXPECT_EQ(a[i].tensor.shape(), b[i].tensor.shape()) << a[i].name;
      EXPECT_EQ(a[i].tensor.dtype(), b[i].tensor.dtype()) << a[i].name;
    }
    EXPECT_EQ((*real)->parameters().bytes(), (*rnd)->parameters().bytes());
  }
}

// A forward through the random model is finite and neither flat nor exploding: logits of rms in
// a sane band, and not the same row for every position.
TEST_P(RandomWeightsFixture, ForwardIsFiniteAndSane) {
  auto m = Model::load_random(kFixtures + "/" + GetParam(), 11);
  ASSERT_TRUE(m.ok()) << m.status();
  const Tensor lg = logits_of(**m, prompt((*m)->config().vocab_size, 24));
  ASSERT_EQ(lg.ndim(), 2);
  double ss = 0, diff = 0;
  const int64_t v = lg.dim(1);
  const float* p = lg.data<float>();
  for (int64_t i = 0; i < lg.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(p[i])) << i;
    ss += double(p[i]) * p[i];
    if (i >= v) diff = std::max(diff, std::abs(double(p[i]) - p[i - v]));
  }
  const double rms = std::sqrt(ss / lg.numel());
  EXPECT_GT(rms, 0.05) << GetParam();
  EXPECT_LT(rms, 20.0) << GetParam();
  EXPECT_GT(diff, 1e-3) << GetParam();
}

// Not chaotic: computing with other summation orders (the batch-invariant kernels) moves the
// logits far less than the GPU-vs-CPU bound (1e-4 relative L2, model_random_weights_cuda_test),
// so that bound tests the GPU, not the luck of the draw.
TEST_P(RandomWeightsFixture, SummationOrderBarelyMovesTheLogits) {
  auto m = Model::load_random(kFixtures + "/" + GetParam(), 12);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<int32_t> ids = prompt((*m)->config().vocab_size, 45);
  Tensor out[2];
  for (int inv = 0; inv < 2; ++inv) {
    SequenceCache cache = (*m)->new_cache();
    ForwardBatch b;
    b.token_ids = ids;
    b.batch_invariant = inv == 1;
    b.seqs.push_back({.num_tokens = 45, .logits = LogitsMode::kAll, .cache = &cache});
    absl::StatusOr<Tensor> lg = (*m)->forward(b);
    ASSERT_TRUE(lg.ok()) << lg.status();
    out[inv] = lg->clone();
  }
  double num = 0, den = 0;
  for (int64_t i = 0; i < out[0].numel(); ++i) {
    const double a = out[0].data<float>()[i], b = out[1].data<float>()[i];
    num += (a - b) * (a - b);
    den += b * b;
  }
  const double rel = std::sqrt(num / den);
  std::printf("%s: default vs batch-invariant kernels, rel L2 %.2e\n", GetParam(), rel);
  EXPECT_LT(rel, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RandomWeightsFixture,
                         ::testing::Values("kimi_linear_s0", "kimi_linear_s1", "qwen3_next_s0",
                                           "deepseek_v3_s1", "fla_kda_s0"));

TEST(RandomWeights, SameSeedSameLogitsOtherSeedOthers) {
  const std::string dir = kFixtures + "/kimi_linear_s0";
  auto a = Model::load_random(dir, 42);
  auto b = Model::load_random(dir + "/config.json", 42);  // the file itself: the same model
  auto c = Model::load_random(dir, 43);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const std::vector<int32_t> ids = prompt((*a)->config().vocab_size, 17);
  const Tensor la = logits_of(**a, ids), lb = logits_of(**b, ids), lc = logits_of(**c, ids);
  EXPECT_TRUE(same_bits(la, lb));
  EXPECT_FALSE(same_bits(la, lc));
  double d = 0;
  for (int64_t i = 0; i < la.numel(); ++i)
    d = std::max(d, std::abs(double(la.data<float>()[i]) - lc.data<float>()[i]));
  EXPECT_GT(d, 0.1);  // not a rounding difference: other weights
  // Every parameter bit-identical for the same seed.
  const auto& pa = (*a)->parameters().entries();
  const auto& pb = (*b)->parameters().entries();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(same_bits(pa[i].tensor, pb[i].tensor));
}

// The values are the documented generator's (an independent SplitMix64 here) under the documented
// rule of each parameter: exact for f32, and the rules' ranges and moments hold.
TEST(RandomWeights, ValuesFollowTheGeneratorAndTheRules) {
  const uint64_t seed = 5;
  for (const char* fixture : {"kimi_linear_s0", "qwen3_next_s0", "fla_kda_s0"}) {
    auto m = Model::load_random(kFixtures + "/" + fixture, seed);
    ASSERT_TRUE(m.ok()) << m.status();
    const ModelConfig& cfg = (*m)->config();
    for (const auto& e : (*m)->parameters().entries()) {
      const Tensor& t = e.tensor;
      ASSERT_EQ(t.dtype(), DType::kF32);
      const float* p = t.data<float>();
      const int64_t n = t.numel();
      absl::StatusOr<RandomInit> init = random_init(cfg, e.name, t.shape());
      ASSERT_TRUE(init.ok()) << init.status();
      const uint64_t key = random_fill_key(seed, e.name);
      for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 257)) {
        const double want = oracle_value(key, i, init->center, init->half_width);
        ASSERT_EQ(p[i], static_cast<float>(want)) << e.name << "[" << i << "]";
      }
      // The rules themselves, from the names (MODELS.md's parameters).
      const bool offset_norm =
          ends_with(e.name, "mixer_norm.weight") || ends_with(e.name, "ffn_norm.weight") ||
          e.name == "final_norm.weight" || ends_with(e.name, "q_norm.weight") ||
          ends_with(e.name, "k_norm.weight");
      double lo = 1e30, hi = -1e30, sum = 0, sq = 0;
      for (int64_t i = 0; i < n; ++i) {
        lo = std::min<double>(lo, p[i]);
        hi = std::max<double>(hi, p[i]);
        sum += p[i];
        sq += double(p[i]) * p[i];
      }
      const double mean = sum / n, var = sq / n - mean * mean;
      if (ends_with(e.name, "norm.weight")) {
        const double want = offset_norm ? 1.0 - cfg.norm_weight_offset : 1.0;
        EXPECT_EQ(lo, want) << e.name;
        EXPECT_EQ(hi, want) << e.name;
      } else if (ends_with(e.name, "router.bias") || ends_with(e.name, "res_proj.weight") ||
                 ends_with(e.name, ".bias")) {
        EXPECT_EQ(lo, 0.0) << e.name;
        EXPECT_EQ(hi, 0.0) << e.name;
      } else if (ends_with(e.name, "A_log")) {
        EXPECT_GE(lo, 0.0) << e.name;
        EXPECT_LE(hi, std::log(16.0)) << e.name;
      } else if (ends_with(e.name, "gdn.dt_bias")) {
        EXPECT_EQ(lo, 1.0);
        EXPECT_EQ(hi, 1.0);
      } else if (ends_with(e.name, "kda.dt_bias")) {
        // softplus(dt_bias) in [1e-3, 0.1]
        EXPECT_GE(std::log1p(std::exp(lo)), 1e-3 * (1 - 1e-5)) << e.name;
        EXPECT_LE(std::log1p(std::exp(hi)), 0.1 * (1 + 1e-5)) << e.name;
      } else {
        ASSERT_GE(t.ndim(), 2) << e.name;
        const double fan_in = static_cast<double>(t.dim(t.ndim() - 1));
        const double want_var = e.name == "embed.weight"           ? 1.0
                                : ends_with(e.name, "conv.weight") ? 1.0 / (3.0 * fan_in)
                                                                   : 1.0 / fan_in;
        const double bound = std::sqrt(3.0 * want_var);
        EXPECT_LT(hi, bound) << e.name;
        EXPECT_GT(lo, -bound) << e.name;
        if (n >= 4096) {  // moments of a large sample: within a few standard errors
          EXPECT_NEAR(var / want_var, 1.0, 0.05) << e.name << " n=" << n;
          EXPECT_NEAR(mean / std::sqrt(want_var), 0.0, 0.05) << e.name;
        }
      }
    }
  }
}

// A bf16 placement holds the f32 values rounded to nearest even (matrices only), and a rank with
// some experts holds exactly those rows of every expert tensor.
TEST(RandomWeights, Bf16AndExpertRangesAreTheSameValues) {
  const std::string dir = kFixtures + "/kimi_linear_s0";
  auto f32 = Model::load_random(dir, 9);
  auto bf16 = Model::load_random(dir, 9, Placement{.dtype = WeightDType::kBF16});
  auto part = Model::load_random(dir, 9, Placement{.experts = ExpertRange{2, 5}});
  ASSERT_TRUE(f32.ok() && bf16.ok() && part.ok());
  const ParameterArena& full = (*f32)->parameters();
  int matrices = 0, experts = 0;
  for (const auto& e : (*bf16)->parameters().entries()) {
    const Tensor& ref = *full.find(e.name);
    if (e.tensor.dtype() == DType::kF32) {
      EXPECT_TRUE(same_bits(e.tensor, ref)) << e.name;
      continue;
    }
    ++matrices;
    for (int64_t i = 0; i < ref.numel(); ++i)
      ASSERT_EQ(e.tensor.data<uint16_t>()[i], f32_to_bf16(ref.data<float>()[i])) << e.name;
  }
  EXPECT_GT(matrices, 10);
  for (const auto& e : (*part)->parameters().entries()) {
    const Tensor& ref = *full.find(e.name);
    if (e.tensor.shape() == ref.shape()) {
      EXPECT_TRUE(same_bits(e.tensor, ref)) << e.name;
      continue;
    }
    ++experts;
    ASSERT_EQ(e.tensor.dim(0), 3) << e.name;
    EXPECT_TRUE(same_bits(e.tensor, ref.slice(0, 2, 5).clone())) << e.name;
  }
  EXPECT_GT(experts, 0);
}

// A tied config: lm_head holds the embedding's values (the checkpoint loader maps both names to
// one tensor), drawn with the matrices' variance 1 / hidden.
TEST(RandomWeights, TiedEmbeddingsShareTheirValues) {
  std::ifstream in(kFixtures + "/kimi_linear_s0/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["tie_word_embeddings"] = true;
  std::filesystem::create_directories(kTmp + "/random_weights_test");
  const std::string path = kTmp + "/random_weights_test/tied.json";
  std::ofstream(path) << j.dump();
  auto m = Model::load_random(path, 4);
  ASSERT_TRUE(m.ok()) << m.status();
  const Tensor& embed = *(*m)->parameters().find("embed.weight");
  const Tensor& head = *(*m)->parameters().find("lm_head.weight");
  ASSERT_EQ(embed.shape(), head.shape());
  EXPECT_TRUE(same_bits(embed, head));
  double sq = 0;
  for (int64_t i = 0; i < embed.numel(); ++i)
    sq += double(embed.data<float>()[i]) * embed.data<float>()[i];
  EXPECT_NEAR(sq / embed.numel() * embed.dim(1), 1.0, 0.05);
}

// Depth: the 48B config's 27 layers (20 KDA + 7 MLA, MoE with a shared expert) at small widths
// keep a finite, non-degenerate forward: logits of rms within a sane band at every position.
TEST(RandomWeights, DeepModelStaysSane) {
  std::ifstream in(std::string(LOOM_SOURCE_DIR) + "/bench/configs/kimi_linear_48b_a3b/config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j["hidden_size"] = 128;
  j["intermediate_size"] = 256;
  j["vocab_size"] = 512;
  j["num_attention_heads"] = 4;
  j["num_key_value_heads"] = 4;
  j["kv_lora_rank"] = 32;
  j["qk_nope_head_dim"] = 16;
  j["qk_rope_head_dim"] = 8;
  j["v_head_dim"] = 16;
  j["linear_attn_config"]["num_heads"] = 4;
  j["linear_attn_config"]["head_dim"] = 16;
  j["num_experts"] = 16;
  j["moe_intermediate_size"] = 32;
  std::filesystem::create_directories(kTmp + "/random_weights_test");
  const std::string path = kTmp + "/random_weights_test/deep.json";
  std::ofstream(path) << j.dump();
  auto m = Model::load_random(path, 2);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ((*m)->config().num_layers, 27);
  const Tensor lg = logits_of(**m, prompt(512, 40));
  for (int64_t r = 0; r < lg.dim(0); ++r) {
    double ss = 0;
    for (int64_t c = 0; c < lg.dim(1); ++c) {
      const float v = lg.data<float>()[r * lg.dim(1) + c];
      ASSERT_TRUE(std::isfinite(v));
      ss += double(v) * v;
    }
    const double rms = std::sqrt(ss / lg.dim(1));
    EXPECT_GT(rms, 0.1) << "row " << r;
    EXPECT_LT(rms, 10.0) << "row " << r;
    if (r == 0 || r == lg.dim(0) - 1)
      std::printf("27 layers: logits rms %.3f at row %lld\n", rms, static_cast<long long>(r));
  }
}

// A native (loom) config: the random model has the synthetic loader's layout too.
TEST(RandomWeights, NativeConfig) {
  const std::string cfg_path = std::string(LOOM_SOURCE_DIR) + "/weights/default/config.json";
  auto rnd = Model::load_random(cfg_path, 1);
  ASSERT_TRUE(rnd.ok()) << rnd.status();
  auto cfg = load_random_weights_config(cfg_path);
  ASSERT_TRUE(cfg.ok());
  auto syn = Model::load(*cfg, WeightLoader::synthetic(*cfg, 1));
  ASSERT_TRUE(syn.ok());
  const auto& a = (*syn)->parameters().entries();
  const auto& b = (*rnd)->parameters().entries();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].tensor.shape(), b[i].tensor.shape());
  }
  const Tensor lg = logits_of(**rnd, prompt((*rnd)->config().vocab_size, 9));
  for (int64_t i = 0; i < lg.numel(); ++i) ASSERT_TRUE(std::isfinite(lg.data<float>()[i]));
}

TEST(RandomWeights, SeedsParseOrAreRefused) {
  EXPECT_EQ(*parse_random_weights_seed("0"), 0u);
  EXPECT_EQ(*parse_random_weights_seed("42"), 42u);
  EXPECT_EQ(*parse_random_weights_seed("18446744073709551615"), 18446744073709551615ull);
  for (const char* bad :
       {"", "-1", "+1", "abc", "1.5", "0x10", " 7", "7 ", "18446744073709551616"}) {
    absl::StatusOr<uint64_t> s = parse_random_weights_seed(bad);
    ASSERT_FALSE(s.ok()) << "'" << bad << "'";
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("--random_weights"), std::string::npos);
  }
}

TEST(RandomWeights, BadPathsAndConfigsAreRefused) {
  const std::string root = kTmp + "/random_weights_test";
  std::filesystem::create_directories(root + "/empty");
  auto missing = Model::load_random(root + "/nothing_here", 1);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nothing_here"), std::string::npos);
  auto empty = Model::load_random(root + "/empty", 1);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("no config.json"), std::string::npos);

  const std::string bad_type = root + "/bad_type.json";
  std::ofstream(bad_type) << R"({"model_type": "llama", "hidden_size": 8})";
  auto unsupported = Model::load_random(bad_type, 1);
  ASSERT_FALSE(unsupported.ok());
  EXPECT_NE(unsupported.status().message().find("bad_type.json"), std::string::npos);
  EXPECT_NE(unsupported.status().message().find("llama"), std::string::npos);

  const std::string not_json = root + "/not_json.json";
  std::ofstream(not_json) << "{ hidden_size: ";
  auto garbled = Model::load_random(not_json, 1);
  ASSERT_FALSE(garbled.ok());
  EXPECT_NE(garbled.status().message().find("not_json.json"), std::string::npos);

  // A parameter no rule covers is refused, naming it (a new kind of parameter needs a rule).
  ModelConfig cfg;
  auto rule = random_init(cfg, "layers.0.kda.something_new", Shape{8});
  ASSERT_FALSE(rule.ok());
  EXPECT_NE(rule.status().message().find("something_new"), std::string::npos);
}

}  // namespace
}  // namespace loom
