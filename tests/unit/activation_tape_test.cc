// Model::forward records what an ActivationTape asks for (the trainer's saved activations, the
// conformance tool's per-layer hidden states) without changing a logit: every recorded tensor is
// checked against the op that produced it, recomputed here from another recorded tensor.
#include "engine/model/activation_tape.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/model/model.h"
#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "tests/unit/engine_test_support.h"
#include "weights/model_config.h"

namespace loom {
namespace {

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, vocab - 1);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = tok(rng);
  return ids;
}

// One prefill of `ids` on a fresh private cache, all logits.
Tensor prefill(const Model& model, const std::vector<int32_t>& ids, ActivationTape* tape) {
  SequenceCache cache = model.new_cache();
  ForwardBatch b;
  b.token_ids = ids;
  b.seqs.push_back({.num_tokens = static_cast<int64_t>(ids.size()),
                    .logits = LogitsMode::kAll,
                    .cache = &cache});
  absl::StatusOr<Tensor> logits = model.forward(b, tape);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? *logits : Tensor();
}

void expect_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(x[i], y[i]) << what << " element " << i;
}

TEST(ActivationTape, RecordsEveryLayerWithoutChangingLogits) {
  auto loaded = Model::load(loom::testing::kFixtures + "/kimi_linear_s1");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Model& model = **loaded;
  const ModelConfig& cfg = model.config();
  const std::vector<int32_t> ids = random_tokens(37, cfg.vocab_size, 3);

  const Tensor plain = prefill(model, ids, nullptr);
  ActivationTape tape;
  const Tensor taped = prefill(model, ids, &tape);
  expect_equal(taped, plain, "logits with a tape");

  const int L = cfg.num_layers;
  const auto moe_layers = std::count(cfg.ffns.begin(), cfg.ffns.end(), FfnType::kMoe);
  ASSERT_GT(moe_layers, 0);
  ASSERT_EQ(tape.entries().size(), static_cast<size_t>(2 + 5 * L + moe_layers));
  for (int l = 0; l < L; ++l) {  // MoE layers also keep the experts each row went to
    const Tensor* ids = tape.find(l, "expert_ids");
    if (cfg.ffns[static_cast<size_t>(l)] != FfnType::kMoe) {
      EXPECT_EQ(ids, nullptr) << l;
      continue;
    }
    ASSERT_NE(ids, nullptr) << l;
    EXPECT_EQ(ids->dtype(), DType::kI32);
    EXPECT_EQ(ids->shape(), Shape({37, cfg.moe.top_k}));
  }
  EXPECT_EQ(tape.entries().front().name, "embedding");
  EXPECT_EQ(tape.entries().back().name, "final_normed");
  const Tensor* embedding = tape.find(-1, "embedding");
  ASSERT_NE(embedding, nullptr);
  expect_equal(*tape.find(0, "residual"), *embedding, "layer 0 input");
  const Exec& ex = host_exec();
  auto weights = WeightLoader::open(loom::testing::kFixtures + "/kimi_linear_s1", cfg);
  ASSERT_TRUE(weights.ok()) << weights.status();
  for (int l = 0; l < L; ++l) {
    const Tensor* residual = tape.find(l, "residual");
    const Tensor* mixer_in = tape.find(l, "mixer_in");
    ASSERT_NE(residual, nullptr) << l;
    ASSERT_NE(mixer_in, nullptr) << l;
    ASSERT_NE(tape.find(l, "ffn_in"), nullptr) << l;
    EXPECT_EQ(residual->shape(), Shape({37, cfg.hidden_size}));
    // The next layer's input is this one's plus both sublayer outputs, added in that order.
    if (l + 1 < L) {
      Tensor next = residual->clone();
      add_inplace(ex, next, *tape.find(l, "mixer_out"));
      add_inplace(ex, next, *tape.find(l, "ffn_out"));
      expect_equal(*tape.find(l + 1, "residual"), next,
                   "residual of layer " + std::to_string(l + 1));
    }
    // The mixer's input is the pre-norm of the residual stream with layer l's weight: the norm
    // recomputed from the taped residual matches bit for bit.
    auto w = weights->load("layers." + std::to_string(l) + ".mixer_norm.weight", {cfg.hidden_size});
    ASSERT_TRUE(w.ok()) << w.status();
    Tensor again = Tensor::empty(residual->shape());
    rmsnorm_forward(ex, *residual, *w, cfg.rms_norm_eps, cfg.norm_weight_offset, again);
    expect_equal(*mixer_in, again, "mixer_in of layer " + std::to_string(l));
  }
  // The logits are the LM head applied to the final normalised rows.
  const Tensor* normed = tape.find(-1, "final_normed");
  ASSERT_NE(normed, nullptr);
  auto head = weights->load("lm_head.weight", {cfg.vocab_size, cfg.hidden_size});
  ASSERT_TRUE(head.ok()) << head.status();
  Tensor logits = Tensor::empty({37, cfg.vocab_size});
  linear_forward(ex, *normed, *head, logits);
  for (int64_t i = 0; i < logits.numel(); ++i)
    ASSERT_NEAR(logits.data<float>()[i], plain.data<float>()[i],
                1e-4f * (1.0f + std::fabs(plain.data<float>()[i])))
        << i;
  EXPECT_GE(tape.bytes(), static_cast<size_t>(2 + 5 * L) * 37 * cfg.hidden_size * 4);
}

TEST(ActivationTape, KeepsOnlyTheNamesAskedFor) {
  auto loaded = Model::load(loom::testing::kFixtures + "/kimi_linear_s1");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Model& model = **loaded;
  const std::vector<int32_t> ids = random_tokens(19, model.config().vocab_size, 5);
  ActivationTape all, ffn_only({"ffn_in"});
  prefill(model, ids, &all);
  prefill(model, ids, &ffn_only);
  ASSERT_EQ(ffn_only.entries().size(), static_cast<size_t>(model.config().num_layers));
  for (const ActivationTape::Entry& e : ffn_only.entries()) {
    EXPECT_EQ(e.name, "ffn_in");
    expect_equal(e.value, *all.find(e.layer, "ffn_in"),
                 "ffn_in of layer " + std::to_string(e.layer));
  }
  // A second forward on the same tape replaces its records instead of adding to them.
  prefill(model, ids, &ffn_only);
  EXPECT_EQ(ffn_only.entries().size(), static_cast<size_t>(model.config().num_layers));
  ffn_only.clear();
  EXPECT_TRUE(ffn_only.entries().empty());
  EXPECT_EQ(ffn_only.find(0, "ffn_in"), nullptr);
}

// keep_in: the records are views of the given workspace (no tensor of their own), hold what a
// tape without it holds, and a strided value still gets a copy of its own.
TEST(ActivationTape, KeepsItsCopiesInAWorkspace) {
  auto loaded = Model::load(loom::testing::kFixtures + "/kimi_linear_s1");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Model& model = **loaded;
  const std::vector<int32_t> ids = random_tokens(19, model.config().vocab_size, 5);
  ActivationTape own, kept;
  Workspace memory(Device::kCpu, size_t{64} << 20);
  kept.keep_in(exec_for(Device::kCpu, &memory), &memory);
  prefill(model, ids, &own);
  prefill(model, ids, &kept);
  ASSERT_EQ(kept.entries().size(), own.entries().size());
  const Tensor probe = memory.take({1});  // the next view: after every record
  for (const ActivationTape::Entry& e : kept.entries()) {
    const std::string what = e.name + " of layer " + std::to_string(e.layer);
    expect_equal(e.value, *own.find(e.layer, e.name), what);
    EXPECT_LT(static_cast<const char*>(e.value.raw()), static_cast<const char*>(probe.raw()))
        << what << " is not in the workspace";
  }
  EXPECT_EQ(memory.overflow_allocations(), 0u);
  const Tensor wide = Tensor::full({4, 6}, 2.5f);
  kept.record(7, "strided", wide.slice(1, 1, 3));
  const Tensor* strided = kept.find(7, "strided");
  ASSERT_NE(strided, nullptr);
  EXPECT_EQ(strided->shape(), (Shape{4, 2}));
  EXPECT_TRUE(strided->is_contiguous());
  EXPECT_EQ(strided->data<float>()[7], 2.5f);
}

TEST(ActivationTape, RecordsSublayerInputsUnderBlockAttentionResiduals) {
  auto cfg = load_model_config(loom::testing::kFixtures + "/kimi_linear_s1");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  cfg->attnres_block_size = 2;
  auto loaded = Model::load(*cfg, WeightLoader::synthetic(*cfg, 11));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::vector<int32_t> ids = random_tokens(23, cfg->vocab_size, 9);
  ActivationTape tape;
  const Tensor plain = prefill(**loaded, ids, nullptr);
  expect_equal(prefill(**loaded, ids, &tape), plain, "AttnRes logits with a tape");
  // No residual stream under AttnRes: each sublayer's input is its own aggregation (MoE layers
  // add their expert ids).
  const auto moe_layers = std::count(cfg->ffns.begin(), cfg->ffns.end(), FfnType::kMoe);
  ASSERT_EQ(tape.entries().size(), static_cast<size_t>(2 + 4 * cfg->num_layers + moe_layers));
  for (int l = 0; l < cfg->num_layers; ++l) {
    EXPECT_EQ(tape.find(l, "residual"), nullptr);
    ASSERT_NE(tape.find(l, "mixer_in"), nullptr);
    ASSERT_NE(tape.find(l, "ffn_in"), nullptr);
  }
}

}  // namespace
}  // namespace loom
