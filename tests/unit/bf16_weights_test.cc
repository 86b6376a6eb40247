// The bf16 fixtures loaded with a bf16 placement: the GEMM matrices are held in bf16 (half their
// bytes), everything else in f32, and the logits are those of the f32 placement (the same weight
// values, f32 arithmetic) and meet the fixtures' f32 bounds against the reference. A placement
// with an expert sub-range holds only those experts, and its MoE layers compute the range's share.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/model/layers.h"
#include "engine/model/model.h"
#include "kernels/gemm.h"
#include "kernels/moe.h"
#include "weights/safetensors.h"

namespace loom {
namespace {

const std::string kFixtures = LOOM_FIXTURES_DIR;

// fixtures/README.md: the CPU backend in f32 (which the bf16 fixtures' goldens are) must meet
// max |logit - ref| <= 1e-3 and relative L2 <= 1e-4.
constexpr double kMaxAbsBound = 1e-3, kRelL2Bound = 1e-4;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The documented rule (weights/parameter_arena.h, Placement): the matrices of linear_forward and
// moe_grouped_swiglu follow the placement dtype; vectors, the embedding table, the router and the
// shared-expert gate, MLA's kv_b_proj and the convolution weights stay f32.
bool is_matrix(const std::string& name, const Tensor& t) {
  if (t.ndim() < 2) return false;
  for (const char* f32 :
       {"embed.weight", "router.weight", "shared_gate.weight", "kv_b_proj.weight", "conv.weight"})
    if (ends_with(name, f32)) return false;
  return true;
}

struct Prompt {
  std::vector<int32_t> ids;
  Tensor logits;                // [T, V]
  std::vector<int32_t> greedy;  // tokens
  Tensor greedy_logits;         // [S, V]
};

std::vector<Prompt> load_prompts(const std::string& fixture) {
  auto golden = SafetensorsFile::open(kFixtures + "/" + fixture + "/golden.safetensors");
  EXPECT_TRUE(golden.ok()) << golden.status();
  std::vector<Prompt> out;
  for (int i = 0; i < 2; ++i) {
    Prompt p;
    const Tensor ids = *(*golden)->get("input_ids_" + std::to_string(i));
    for (int64_t t = 0; t < ids.numel(); ++t) p.ids.push_back(int32_t(ids.data<int64_t>()[t]));
    p.logits = (*golden)->get("logits_" + std::to_string(i))->to_f32();
    const Tensor g = *(*golden)->get("greedy_tokens_" + std::to_string(i));
    for (int64_t t = 0; t < g.numel(); ++t) p.greedy.push_back(int32_t(g.data<int64_t>()[t]));
    p.greedy_logits = (*golden)->get("greedy_logits_" + std::to_string(i))->to_f32();
    out.push_back(std::move(p));
  }
  return out;
}

// Full-prefill logits of every prompt token, then the logits of each greedy step fed the golden
// greedy tokens (teacher-forced), as rows [T + S - 1, V].
std::vector<float> run(const Model& m, const Prompt& p, bool invariant) {
  const int64_t v = m.config().vocab_size;
  SequenceCache cache = m.new_cache();
  ForwardBatch b;
  b.batch_invariant = invariant;
  b.token_ids = p.ids;
  b.seqs.push_back(
      {.num_tokens = int64_t(p.ids.size()), .logits = LogitsMode::kAll, .cache = &cache});
  auto l = m.forward(b);
  EXPECT_TRUE(l.ok()) << l.status();
  std::vector<float> out(l->data<float>(), l->data<float>() + l->numel());
  for (size_t s = 0; s + 1 < p.greedy.size(); ++s) {
    ForwardBatch d;
    d.batch_invariant = invariant;
    d.token_ids = {p.greedy[s]};
    d.seqs.push_back({.num_tokens = 1, .logits = LogitsMode::kLast, .cache = &cache});
    auto dl = m.forward(d);
    EXPECT_TRUE(dl.ok()) << dl.status();
    out.insert(out.end(), dl->data<float>(), dl->data<float>() + v);
  }
  return out;
}

struct Diff {
  double max_abs = 0, err2 = 0, ref2 = 0;
  void add(const float* a, const float* ref, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const double e = double(a[i]) - ref[i];
      max_abs = std::max(max_abs, std::abs(e));
      err2 += e * e;
      ref2 += double(ref[i]) * ref[i];
    }
  }
  double rel_l2() const { return std::sqrt(err2 / std::max(ref2, 1e-30)); }
};

int64_t argmax(const float* p, int64_t n) { return std::max_element(p, p + n) - p; }

class Bf16Fixture : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string dir = kFixtures + "/" + GetParam();
    auto a = Model::load(dir, Placement{.dtype = WeightDType::kF32});
    auto b = Model::load(dir, Placement{.dtype = WeightDType::kBF16});
    auto c = Model::load(dir, Placement{.dtype = WeightDType::kAuto});
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_TRUE(c.ok()) << c.status();
    f32_ = std::move(a).value();
    bf16_ = std::move(b).value();
    EXPECT_EQ((*c)->placement().dtype, WeightDType::kBF16) << "auto keeps a bf16 checkpoint bf16";
    EXPECT_EQ((*c)->parameters().bytes(), bf16_->parameters().bytes());
    prompts_ = load_prompts(GetParam());
  }
  std::unique_ptr<Model> f32_, bf16_;
  std::vector<Prompt> prompts_;
};

// Placement::activations on the CPU: auto and f32 give f32 activations (the CPU computes in
// f32); bf16 is refused with the reason, before any weight is read.
TEST_P(Bf16Fixture, CpuActivationsAreF32AndBf16IsRefused) {
  EXPECT_EQ(f32_->act_dtype(), DType::kF32);
  EXPECT_EQ(bf16_->act_dtype(), DType::kF32) << "auto on the CPU: f32 even with bf16 matrices";
  EXPECT_EQ(bf16_->placement().activations, ActivationDType::kF32) << "resolved";
  const std::string dir = kFixtures + "/" + GetParam();
  auto refused = Model::load(
      dir, Placement{.dtype = WeightDType::kBF16, .activations = ActivationDType::kBF16});
  EXPECT_EQ(refused.status().message(),
            "bf16 activations need a GPU: the CPU backend computes in f32 (use f32 or auto)");
  auto f32 = Model::load(
      dir, Placement{.dtype = WeightDType::kBF16, .activations = ActivationDType::kF32});
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_EQ((*f32)->act_dtype(), DType::kF32);
  EXPECT_EQ(parse_activation_dtype("bf16").value(), ActivationDType::kBF16);
  EXPECT_EQ(parse_activation_dtype("fp16").status().message(),
            "activation dtype 'fp16' is not supported; expected auto, f32 or bf16");
}

TEST_P(Bf16Fixture, MatricesHeldInBf16AtHalfTheBytes) {
  const ParameterArena& a = f32_->parameters();
  const ParameterArena& b = bf16_->parameters();
  EXPECT_TRUE(a.frozen());
  EXPECT_TRUE(b.frozen());
  ASSERT_EQ(a.entries().size(), b.entries().size());
  size_t matrix_bytes = 0, other_bytes = 0, matrices = 0;
  for (const auto& [name, t] : a.entries()) {
    const Tensor* u = b.find(name);
    ASSERT_NE(u, nullptr) << name;
    ASSERT_EQ(t.shape(), u->shape()) << name;
    EXPECT_EQ(t.dtype(), DType::kF32) << name;
    const bool matrix = is_matrix(name, t);
    EXPECT_EQ(u->dtype(), matrix ? DType::kBF16 : DType::kF32) << name;
    (matrix ? matrix_bytes : other_bytes) += t.nbytes();
    matrices += matrix;
    // The same values: a bf16 checkpoint stored in bf16 loses nothing.
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float bv = matrix ? bf16_to_f32(u->data<uint16_t>()[i]) : u->data<float>()[i];
      ASSERT_EQ(bv, t.data<float>()[i]) << name << "[" << i << "]";
    }
  }
  EXPECT_GT(matrices, 10u);
  EXPECT_EQ(b.bytes(DType::kBF16) * 2, matrix_bytes);
  EXPECT_EQ(b.bytes(DType::kF32), other_bytes);
  EXPECT_EQ(a.bytes(), matrix_bytes + other_bytes);
  std::printf(
      "%s: parameters f32 placement %zu bytes, bf16 placement %zu bytes (%.3f); "
      "matrices %zu -> %zu bytes, f32 rest %zu bytes\n",
      GetParam(), a.bytes(), b.bytes(), double(b.bytes()) / a.bytes(), matrix_bytes,
      b.bytes(DType::kBF16), other_bytes);
}

// Both placements hold the same values and compute in f32; they differ only where a GEMM sums in
// another order: one row (sgemv for f32 weights, the row kernel for bf16) and 9 to 32 rows
// (OpenBLAS for f32, the row kernel on widened panels for bf16; MoE experts see such row counts
// in prefill), each a few f32 ulps, which these small random models amplify as they amplify any
// f32 rounding (the f32 placement itself is up to 5e-4 from the reference on qwen3_next_b0).
// Measured: max abs 9.3e-6 (kimi_linear_b0) and 1.7e-4 (qwen3_next_b0), relative L2 <= 3.2e-6.
// Bounds: max abs 5e-4 (half the fixtures' 1e-3) and relative L2 1e-5 (a tenth of their 1e-4);
// and each placement meets the fixture bounds against the reference on its own.
TEST_P(Bf16Fixture, LogitsMatchTheF32PlacementAndTheReference) {
  const int64_t v = f32_->config().vocab_size;
  for (size_t i = 0; i < prompts_.size(); ++i) {
    const Prompt& p = prompts_[i];
    const std::vector<float> a = run(*f32_, p, false), b = run(*bf16_, p, false);
    ASSERT_EQ(a.size(), b.size());
    const int64_t t = int64_t(p.ids.size());
    Diff ab, prefill;
    ab.add(b.data(), a.data(), int64_t(a.size()));
    prefill.add(b.data(), a.data(), t * v);
    for (const std::vector<float>* out : {&a, &b}) {
      Diff full, greedy;
      full.add(out->data(), p.logits.data<float>(), t * v);
      // Greedy step s's logits: the last prompt row, then the teacher-forced decode rows.
      for (size_t s = 0; s < p.greedy.size(); ++s) {
        const float* row = out->data() + (t - 1 + int64_t(s)) * v;
        greedy.add(row, p.greedy_logits.data<float>() + int64_t(s) * v, v);
        EXPECT_EQ(argmax(row, v), p.greedy[s]) << "prompt " << i << " step " << s;
      }
      EXPECT_LE(full.max_abs, kMaxAbsBound);
      EXPECT_LE(full.rel_l2(), kRelL2Bound);
      EXPECT_LE(greedy.max_abs, kMaxAbsBound);
    }
    std::printf(
        "%s prompt %zu: bf16 vs f32 placement: max abs %.3g (prefill rows %.3g), rel L2 %.3g over "
        "%zu logits\n",
        GetParam(), i, ab.max_abs, prefill.max_abs, ab.rel_l2(), a.size());
    EXPECT_LE(ab.max_abs, 5e-4);
    EXPECT_LE(ab.rel_l2(), 1e-5);
  }
}

// Batch-invariant mode runs every GEMM through one kernel that widens bf16 in registers: the bf16
// placement's logits are the f32 placement's bit for bit, and a prompt alone and beside another
// are bit-identical.
TEST_P(Bf16Fixture, BatchInvariantLogitsBitIdenticalToF32Placement) {
  for (const Prompt& p : prompts_) {
    const std::vector<float> a = run(*f32_, p, true), b = run(*bf16_, p, true);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
  const int64_t v = bf16_->config().vocab_size;
  SequenceCache c0 = bf16_->new_cache(), c1 = bf16_->new_cache();
  ForwardBatch both;
  both.batch_invariant = true;
  both.token_ids = prompts_[0].ids;
  both.token_ids.insert(both.token_ids.end(), prompts_[1].ids.begin(), prompts_[1].ids.end());
  both.seqs.push_back(
      {.num_tokens = int64_t(prompts_[0].ids.size()), .logits = LogitsMode::kAll, .cache = &c0});
  both.seqs.push_back(
      {.num_tokens = int64_t(prompts_[1].ids.size()), .logits = LogitsMode::kAll, .cache = &c1});
  auto l = bf16_->forward(both);
  ASSERT_TRUE(l.ok()) << l.status();
  const std::vector<float> alone = run(*bf16_, prompts_[0], true);
  EXPECT_EQ(std::memcmp(l->data<float>(), alone.data(), prompts_[0].ids.size() * v * sizeof(float)),
            0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Bf16Fixture,
                         ::testing::Values("kimi_linear_b0", "qwen3_next_b0"));

// Experts [2, 5) of kimi_linear_b0's 8: the arena holds exactly those experts of every MoE layer
// (and the whole router); the model runs.
TEST(ExpertPlacement, OnlyTheRangesExpertsAreResident) {
  const std::string dir = kFixtures + "/kimi_linear_b0";
  auto full = Model::load(dir, Placement{.dtype = WeightDType::kBF16});
  auto part =
      Model::load(dir, Placement{.dtype = WeightDType::kBF16, .experts = ExpertRange{2, 5}});
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_TRUE(part.ok()) << part.status();
  const ModelConfig& cfg = (*full)->config();
  const int64_t e = cfg.moe.num_experts;
  size_t expert_bytes = 0, moe_layers = 0;
  for (const auto& [name, t] : (*full)->parameters().entries()) {
    const Tensor* u = (*part)->parameters().find(name);
    ASSERT_NE(u, nullptr) << name;
    if (name.find(".moe.experts.") != std::string::npos) {
      Shape want = t.shape();
      want[0] = 3;
      EXPECT_EQ(u->shape(), want) << name;
      for (int64_t j = 0; j < u->numel(); ++j)  // experts 2, 3, 4 of the whole load
        ASSERT_EQ(u->data<uint16_t>()[j], t.data<uint16_t>()[2 * (t.numel() / e) + j]) << name;
      expert_bytes += t.nbytes();
    } else {
      EXPECT_EQ(u->shape(), t.shape()) << name;  // the router keeps every expert
    }
    moe_layers += ends_with(name, ".moe.router.weight");
  }
  ASSERT_EQ(moe_layers, 3u);
  EXPECT_EQ((*full)->parameters().bytes() - (*part)->parameters().bytes(),
            expert_bytes / e * (e - 3));
  std::printf("experts [2, 5) of %lld: %zu bytes resident vs %zu for all experts\n", (long long)e,
              (*part)->parameters().bytes(), (*full)->parameters().bytes());
  const std::vector<Prompt> prompts = load_prompts("kimi_linear_b0");
  const std::vector<float> logits = run(**part, prompts[0], false);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

// An MoE layer built over expert ranges computes each range's share through the dispatcher seam:
// slots routed outside the range add nothing (a token with no owned expert gets exactly the
// shared expert's output), and the routed shares of ranges covering every expert add up to the
// whole layer's.
TEST(ExpertPlacement, MoeLayerComputesItsRangesShare) {
  const std::string dir = kFixtures + "/kimi_linear_b0";
  auto cfg = load_model_config(dir);
  ASSERT_TRUE(cfg.ok());
  auto loader = WeightLoader::open(dir, *cfg);
  ASSERT_TRUE(loader.ok());
  const int layer = 1;
  ASSERT_EQ(cfg->ffns[layer], FfnType::kMoe);
  ASSERT_FALSE(cfg->moe.shared_expert_gate);
  const int64_t t = 37, d = cfg->hidden_size, e = cfg->moe.num_experts, k = cfg->moe.top_k;

  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Tensor x = Tensor::empty({t, d});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = dist(rng);

  BatchLayout layout;  // an FFN reads no step data
  Workspace ws(Device::kCpu);
  Exec ex;
  ex.workspace = &ws;
  const ForwardContext ctx{ex, layout};
  ParameterArena arena(Device::kCpu);
  auto all = loader->placed(arena, {.dtype = WeightDType::kBF16});
  ASSERT_TRUE(all.ok());
  // The shared expert alone, and the routing the layer's router makes.
  auto shared =
      make_dense_ffn(*cfg, *all, "layers.1.moe.shared.", cfg->moe.shared_intermediate_size);
  ASSERT_TRUE(shared.ok()) << shared.status();
  Tensor s = Tensor::empty({t, d});
  (*shared)->forward(ctx, x, s);
  auto router = all->load("layers.1.moe.router.weight", {e, d});
  auto bias = all->load("layers.1.moe.router.bias", {e});
  ASSERT_TRUE(router.ok() && bias.ok());
  Tensor logits = Tensor::empty({t, e}), ids = Tensor::empty({t, k}, DType::kI32),
         wts = Tensor::empty({t, k});
  linear_forward(ex, x, *router, logits);
  RouterParams rp;
  rp.score = cfg->moe.score_sigmoid ? RouterScore::kSigmoid : RouterScore::kSoftmax;
  rp.top_k = cfg->moe.top_k;
  rp.n_group = cfg->moe.n_group;
  rp.topk_group = cfg->moe.topk_group;
  rp.renormalize = cfg->moe.renormalize;
  rp.routed_scaling = cfg->moe.routed_scaling;
  moe_route(ex, logits, *bias, rp, ids, wts);

  auto layer_out = [&](std::optional<ExpertRange> r) {
    ParameterArena a(Device::kCpu);
    auto w = loader->placed(a, {.dtype = WeightDType::kBF16, .experts = r});
    EXPECT_TRUE(w.ok()) << w.status();
    auto ffn = make_moe_ffn(*cfg, *w, layer);
    EXPECT_TRUE(ffn.ok()) << ffn.status();
    Tensor out = Tensor::empty({t, d});
    (*ffn)->forward(ctx, x, out);
    return out;
  };
  const Tensor whole = layer_out(std::nullopt);
  std::vector<double> routed_sum(t * d, 0.0);
  int64_t tokens_without_owned = 0;
  for (const ExpertRange r : {ExpertRange{0, 3}, ExpertRange{3, 4}, ExpertRange{4, 8}}) {
    const Tensor out = layer_out(r);
    for (int64_t i = 0; i < t; ++i) {
      bool owned = false;
      for (int64_t j = 0; j < k; ++j) owned |= r.contains(ids.at<int32_t>({i, j}));
      if (!owned) {
        ++tokens_without_owned;
        EXPECT_EQ(std::memcmp(out.data<float>() + i * d, s.data<float>() + i * d, d * 4), 0)
            << "token " << i << " has no expert in [" << r.begin << ", " << r.end << ")";
      }
      for (int64_t c = 0; c < d; ++c)
        routed_sum[i * d + c] += double(out.data<float>()[i * d + c]) - s.data<float>()[i * d + c];
    }
  }
  EXPECT_GT(tokens_without_owned, 0);
  double err = 0.0, scale = 0.0;
  for (int64_t i = 0; i < t * d; ++i) {
    const double want = double(whole.data<float>()[i]) - s.data<float>()[i];
    err = std::max(err, std::abs(routed_sum[i] - want));
    scale = std::max(scale, std::abs(want));
  }
  std::printf("MoE shares of [0,3) [3,4) [4,8): max abs diff %.3g to the whole layer (max %.3g)\n",
              err, scale);
  // Three f32 partial sums (each out = routed + shared, rounded) re-added: a few ulps of |out|.
  EXPECT_LT(err, 1e-5 * std::max(scale, 1.0));
}

}  // namespace
}  // namespace loom
