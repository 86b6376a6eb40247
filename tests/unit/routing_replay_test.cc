// Routing replay (issue 20; engine/model/routing_replay.h, kernels/moe.h moe_route_replay): the
// MoE layers route given rows to given experts, the gate weights still the router's. Checked:
// replaying a row's own experts gives moe_route's bits (kernel) and the unreplayed forward's and
// gradients' bits (model); hand-picked experts give the gate weights of a double-precision
// reference and an MoE layer's output as a double-precision reference computes it with those
// experts; the counters count the slots whose expert is not the router's own; the replayed
// path's gradient matches central differences of the replayed loss (no routing can flip: every
// row is replayed) and the selection bias has no effect on it; malformed replays are refused.
#include "engine/model/routing_replay.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "kernels/moe.h"
#include "tests/unit/engine_test_support.h"
#include "tests/unit/routing_replay_test_support.h"
#include "weights/weight_loader.h"

namespace loom {
namespace {

struct RouterCase {
  const char* name;
  RouterParams params;
  bool bias;
};

class MoeRouteReplay : public ::testing::TestWithParam<RouterCase> {};

// Replaying each row's own experts (in the router's order) gives moe_route's bits; rows marked -1
// keep theirs; nothing differs.
TEST_P(MoeRouteReplay, OwnExpertsGiveTheSameBits) {
  const RouterCase& rc = GetParam();
  const int64_t t = 37, e = 12, k = rc.params.top_k;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  Tensor logits = Tensor::empty({t, e}), bias = rc.bias ? Tensor::empty({e}) : Tensor();
  for (int64_t i = 0; i < logits.numel(); ++i) logits.data<float>()[i] = normal(rng);
  if (rc.bias)
    for (int64_t i = 0; i < e; ++i) bias.data<float>()[i] = 0.3f * normal(rng);
  Tensor ids = Tensor::empty({t, k}, DType::kI32), w = Tensor::empty({t, k});
  moe_route(host_exec(), logits, bias, rc.params, ids, w);
  Tensor replay = ids.clone();
  for (int64_t i = 0; i < t; i += 4) replay.data<int32_t>()[i * k] = -1;
  Tensor ids2 = ids.clone(), w2 = Tensor::empty({t, k});
  w2.copy_from(w);
  for (int64_t i = 0; i < t; i += 4) w2.data<float>()[i * k] = 123.0f;  // kept as it is
  Tensor counts = Tensor::empty({2}, DType::kI64);
  moe_route_replay(host_exec(), logits, replay, rc.params, ids2, w2, counts);
  for (int64_t i = 0; i < t * k; ++i) {
    EXPECT_EQ(ids2.data<int32_t>()[i], ids.data<int32_t>()[i]) << i;
    const bool kept_row = (i / k) % 4 == 0 && i % k == 0;
    EXPECT_EQ(w2.data<float>()[i], kept_row ? 123.0f : w.data<float>()[i]) << i;
  }
  EXPECT_EQ(counts.data<int64_t>()[0], (t - (t + 3) / 4) * k);
  EXPECT_EQ(counts.data<int64_t>()[1], 0);
}

// Hand-picked experts: the weights of a double-precision reference (scores without the bias,
// renormalised over the picked experts in slot order, scaled), and the differing slots counted as
// a set comparison with the router's own choice says.
TEST_P(MoeRouteReplay, PickedExpertsGetTheReferenceWeights) {
  const RouterCase& rc = GetParam();
  const RouterParams& p = rc.params;
  const int64_t t = 29, e = 12, k = p.top_k;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  Tensor logits = Tensor::empty({t, e}), bias = rc.bias ? Tensor::empty({e}) : Tensor();
  for (int64_t i = 0; i < logits.numel(); ++i) logits.data<float>()[i] = normal(rng);
  if (rc.bias)
    for (int64_t i = 0; i < e; ++i) bias.data<float>()[i] = 0.3f * normal(rng);
  Tensor ids = Tensor::empty({t, k}, DType::kI32), w = Tensor::empty({t, k});
  moe_route(host_exec(), logits, bias, p, ids, w);
  const Tensor own = ids.clone(), own_w = w.clone();
  Tensor replay = Tensor::empty({t, k}, DType::kI32);
  for (int64_t i = 0; i < t; ++i) {
    const std::vector<int32_t> picked = pick_experts(rng, e, k);
    std::copy(picked.begin(), picked.end(), replay.data<int32_t>() + i * k);
    if (i % 5 == 2) replay.data<int32_t>()[i * k] = -1;
  }
  Tensor counts = Tensor::empty({2}, DType::kI64);
  moe_route_replay(host_exec(), logits, replay, p, ids, w, counts);
  const bool sigmoid = p.score == RouterScore::kSigmoid;
  double worst = 0;
  for (int64_t i = 0; i < t; ++i) {
    const int32_t* r = replay.data<int32_t>() + i * k;
    if (r[0] < 0) {
      for (int64_t j = 0; j < k; ++j) {
        EXPECT_EQ(ids.data<int32_t>()[i * k + j], own.data<int32_t>()[i * k + j]);
        EXPECT_EQ(w.data<float>()[i * k + j], own_w.data<float>()[i * k + j]);
      }
      continue;
    }
    const float* l = logits.data<float>() + i * e;
    std::vector<double> s(static_cast<size_t>(e));
    double mx = *std::max_element(l, l + e), z = 0;
    for (int64_t j = 0; j < e; ++j) {
      s[j] = sigmoid ? 1.0 / (1.0 + std::exp(-double{l[j]})) : std::exp(double{l[j]} - mx);
      z += s[j];
    }
    if (!sigmoid)
      for (double& v : s) v /= z;
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += s[r[j]];
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(ids.data<int32_t>()[i * k + j], r[j]);
      const double want = (p.renormalize ? s[r[j]] / sum : s[r[j]]) * p.routed_scaling;
      worst = std::max(worst, std::fabs(w.data<float>()[i * k + j] - want) / want);
    }
  }
  // f32 scores and a k-term f32 sum: a few ulps.
  EXPECT_LE(worst, 2e-6) << rc.name;
  const int64_t replayed_rows = t - (t + 2) / 5;
  EXPECT_EQ(counts.data<int64_t>()[0], replayed_rows * k);
  EXPECT_EQ(counts.data<int64_t>()[1], differing_slots(own, replay));
  EXPECT_GT(counts.data<int64_t>()[1], 0);
}

RouterCase sigmoid_grouped() {
  RouterParams p;
  p.score = RouterScore::kSigmoid;
  p.top_k = 3;
  p.n_group = 2;
  p.topk_group = 1;
  p.routed_scaling = 2.446f;
  return {"sigmoid_grouped_bias", p, true};
}

RouterCase softmax_plain() {
  RouterParams p;
  p.score = RouterScore::kSoftmax;
  p.top_k = 2;
  return {"softmax", p, false};
}

RouterCase softmax_unnormalised() {
  RouterParams p;
  p.score = RouterScore::kSoftmax;
  p.top_k = 4;
  p.renormalize = false;
  return {"softmax_unnormalised", p, false};
}

INSTANTIATE_TEST_SUITE_P(Routers, MoeRouteReplay,
                         ::testing::Values(sigmoid_grouped(), softmax_plain(),
                                           softmax_unnormalised()),
                         [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------------------------
// Through the model

// kimi_linear_s1 with KDA mixers (as moe_backward_test): one dense FFN, four MoE layers with a
// sigmoid router, the selection bias, two groups of six experts (one kept), top-3, scaled, and a
// shared expert.
ModelConfig kimi_kda_moe() {
  auto cfg = load_model_config(loom::testing::kFixtures + "/kimi_linear_s1");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  for (MixerType& m : cfg->mixers) m = MixerType::kKda;
  return *cfg;
}

std::unique_ptr<Model> trainable_model(const ModelConfig& cfg) {
  auto model = Model::load(cfg, WeightLoader::synthetic(cfg, 5), Placement{.trainable = true});
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

std::vector<int32_t> random_tokens(const ModelConfig& cfg, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(0, cfg.vocab_size - 1);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t& t : tokens) t = tok(rng);
  return tokens;
}

// One forward over `tokens` from a fresh cache with a tape of `names`.
ActivationTape forward_tape(const Model& model, const std::vector<int32_t>& tokens,
                            std::vector<std::string> names, RoutingReplay* replay = nullptr) {
  SequenceCache cache = model.new_cache();
  ForwardBatch batch;
  batch.token_ids = tokens;
  batch.seqs.push_back({.num_tokens = static_cast<int64_t>(tokens.size()),
                        .logits = LogitsMode::kNone,
                        .cache = &cache});
  batch.routing_replay = replay;
  ActivationTape tape(std::move(names));
  auto out = model.forward(batch, &tape);
  EXPECT_TRUE(out.ok()) << out.status();
  return tape;
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  EXPECT_EQ(std::memcmp(a.data<uint8_t>(), b.data<uint8_t>(), a.nbytes()), 0) << what;
}

// The experts the model chose itself (the tape's expert_ids, what the engine records), replayed:
// the same forward, loss and gradients, bit for bit, and no slot differs.
TEST(RoutingReplay, OwnRoutingReplayedGivesTheSameBits) {
  const ModelConfig cfg = kimi_kda_moe();
  auto model = trainable_model(cfg);
  const std::vector<int32_t> tokens = random_tokens(cfg, 41, 3);
  const ActivationTape plain = forward_tape(*model, tokens, {"expert_ids", "final_normed"});
  RoutingReplay replay;
  replay.expert_ids.resize(cfg.num_layers);
  for (int l : moe_layers(cfg)) replay.expert_ids[l] = plain.find(l, "expert_ids")->clone();
  const ActivationTape replayed =
      forward_tape(*model, tokens, {"expert_ids", "final_normed"}, &replay);
  expect_same_bits(*plain.find(-1, "final_normed"), *replayed.find(-1, "final_normed"),
                   "final_normed");
  const int64_t slots = 41 * static_cast<int64_t>(moe_layers(cfg).size()) * cfg.moe.top_k;
  EXPECT_EQ(replay.replayed_slots, slots);
  EXPECT_EQ(replay.differing_slots, 0);

  Gradients g_plain, g_replayed;
  auto loss_plain = model->loss_and_gradients(tokens, g_plain);
  RoutingReplay again = replay;
  again.replayed_slots = again.differing_slots = 0;
  auto loss_replayed = model->loss_and_gradients(tokens, g_replayed, {}, nullptr, {}, &again);
  ASSERT_TRUE(loss_plain.ok() && loss_replayed.ok());
  EXPECT_EQ(*loss_plain, *loss_replayed);
  EXPECT_EQ(again.replayed_slots, slots) << "the backward's recomputation counted again";
  for (const char* name : {"layers.1.moe.router.weight", "layers.3.moe.experts.down",
                           "layers.0.mlp.up_proj.weight", "embed.weight"})
    expect_same_bits(*g_plain.find(name), *g_replayed.find(name), name);
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

// y = down(silu(gate x) * up x) in double; w_* point at one expert's (or the shared MLP's)
// row-major matrices: gate, up [inter, d], down [d, inter].
std::vector<double> swiglu(const float* x, const float* gate, const float* up, const float* down,
                           int64_t d, int64_t inter) {
  std::vector<double> h(static_cast<size_t>(inter)), y(static_cast<size_t>(d), 0.0);
  for (int64_t i = 0; i < inter; ++i) {
    double g = 0, u = 0;
    for (int64_t c = 0; c < d; ++c) {
      g += double{gate[i * d + c]} * x[c];
      u += double{up[i * d + c]} * x[c];
    }
    h[i] = silu(g) * u;
  }
  for (int64_t o = 0; o < d; ++o)
    for (int64_t i = 0; i < inter; ++i) y[o] += double{down[o * inter + i]} * h[i];
  return y;
}

// An MoE layer given hand-picked experts (other rows its own, -1): its output is what a
// double-precision reference computes from its input with those experts, the gate weights from
// its router's sigmoid scores (no bias), renormalised and scaled, plus the shared expert; the
// layers below it are untouched and the counters say how many slots left the router's choice.
TEST(RoutingReplay, PickedExpertsChangeTheLayerAsAReferenceSays) {
  const ModelConfig cfg = kimi_kda_moe();
  auto model = trainable_model(cfg);
  const int layer = moe_layers(cfg)[1];
  const int64_t n = 23, d = cfg.hidden_size, e = cfg.moe.num_experts, k = cfg.moe.top_k;
  const int64_t inter = cfg.moe.intermediate_size, shared = cfg.moe.shared_intermediate_size;
  const std::vector<int32_t> tokens = random_tokens(cfg, static_cast<int>(n), 8);
  const ActivationTape plain = forward_tape(*model, tokens, {"expert_ids", "ffn_in", "ffn_out"});
  const Tensor& own = *plain.find(layer, "expert_ids");
  RoutingReplay replay;
  replay.expert_ids.resize(cfg.num_layers);
  Tensor picked = Tensor::empty({n, k}, DType::kI32);
  std::mt19937 rng(17);
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<int32_t> p = pick_experts(rng, e, k);
    std::copy(p.begin(), p.end(), picked.data<int32_t>() + t * k);
    if (t % 6 == 1) picked.data<int32_t>()[t * k] = -1;
  }
  replay.expert_ids[layer] = picked;
  const ActivationTape tape =
      forward_tape(*model, tokens, {"expert_ids", "ffn_in", "ffn_out"}, &replay);
  expect_same_bits(*plain.find(layer, "ffn_in"), *tape.find(layer, "ffn_in"), "ffn_in");
  EXPECT_EQ(replay.replayed_slots, (n - (n + 4) / 6) * k);
  EXPECT_EQ(replay.differing_slots, differing_slots(own, picked));
  EXPECT_GT(replay.differing_slots, 0);

  const ParameterArena& params = model->parameters();
  auto param = [&](const std::string& name) {
    const Tensor* t = params.find("layers." + std::to_string(layer) + ".moe." + name);
    EXPECT_NE(t, nullptr) << name;
    return t->data<float>();
  };
  const float* router = param("router.weight");
  const float* w_gate = param("experts.gate");
  const float* w_up = param("experts.up");
  const float* w_down = param("experts.down");
  const float* s_gate = param("shared.gate_proj.weight");
  const float* s_up = param("shared.up_proj.weight");
  const float* s_down = param("shared.down_proj.weight");
  const Tensor& x = *tape.find(layer, "ffn_in");
  const Tensor& out = *tape.find(layer, "ffn_out");
  double err2 = 0, ref2 = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x.data<float>() + t * d;
    const int32_t* chosen =
        (picked.data<int32_t>()[t * k] < 0 ? own.data<int32_t>() : picked.data<int32_t>()) + t * k;
    std::vector<double> s(static_cast<size_t>(k));
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      double logit = 0;
      for (int64_t c = 0; c < d; ++c) logit += double{router[chosen[j] * d + c]} * xt[c];
      s[j] = 1.0 / (1.0 + std::exp(-logit));
      sum += s[j];
    }
    std::vector<double> y = swiglu(xt, s_gate, s_up, s_down, d, shared);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t ex = chosen[j];
      const double weight = s[j] / sum * cfg.moe.routed_scaling;
      const std::vector<double> ye = swiglu(xt, w_gate + ex * inter * d, w_up + ex * inter * d,
                                            w_down + ex * d * inter, d, inter);
      for (int64_t o = 0; o < d; ++o) y[o] += weight * ye[o];
    }
    for (int64_t o = 0; o < d; ++o) {
      const double diff = out.data<float>()[t * d + o] - y[o];
      err2 += diff * diff;
      ref2 += y[o] * y[o];
    }
  }
  const double rel = std::sqrt(err2 / ref2);
  std::printf("[routing replay] layer %d with picked experts: relative L2 %.2e vs double\n", layer,
              rel);
  // f32 GEMMs over d = 96 and inter = 64 against double: measured ~1e-7.
  EXPECT_LE(rel, 1e-5);
}

// The replayed objective's gradient along several parameters' unit gradients against central
// differences of the replayed loss at steps h and h / 3. Every row of every MoE layer is replayed
// (hand-picked experts), so no routing can flip as the weights move and the loss is smooth: the
// bound is that of moe_backward_test (kModelGradTol |g| + ulp(loss) / (2 s)) without its routing
// check. The router's gradient flows through the gate weights only: the selection bias gets none,
// and moving it leaves the replayed loss unchanged.
TEST(RoutingReplay, ReplayedGradientMatchesCentralDifferences) {
  const ModelConfig cfg = kimi_kda_moe();
  auto model = trainable_model(cfg);
  const int64_t n = 31, e = cfg.moe.num_experts, k = cfg.moe.top_k;
  const std::vector<int32_t> tokens = random_tokens(cfg, static_cast<int>(n), 21);
  RoutingReplay replay;
  replay.expert_ids.resize(cfg.num_layers);
  std::mt19937 rng(23);
  for (int l : moe_layers(cfg)) {
    Tensor ids = Tensor::empty({n, k}, DType::kI32);
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<int32_t> p = pick_experts(rng, e, k);
      std::copy(p.begin(), p.end(), ids.data<int32_t>() + t * k);
    }
    replay.expert_ids[l] = ids;
  }
  auto replayed_loss = [&](Gradients& g) {
    auto loss = model->loss_and_gradients(tokens, g, {}, nullptr, {}, &replay);
    EXPECT_TRUE(loss.ok()) << loss.status();
    return *loss;
  };
  Gradients grads;
  const double loss = replayed_loss(grads);
  EXPECT_GT(replay.differing_slots, 0);
  for (int l : moe_layers(cfg))
    EXPECT_EQ(grads.find("layers." + std::to_string(l) + ".moe.router.bias"), nullptr);

  // Steps: 1e-2 where the truncation (shrinking as s^2) stays well inside the bound; the dense
  // layer below, whose loss curves faster along its gradient, 1e-3 (measured at 1e-2: 1.4e-2
  // relative, 1.7e-3 at 1e-2 / 3: the s^2 of truncation, not a wrong gradient).
  const float ulp = std::nextafter(static_cast<float>(loss), INFINITY) - static_cast<float>(loss);
  constexpr double kModelGradTol = 1e-3;
  const std::pair<const char*, double> dirs[] = {
      {"layers.1.moe.router.weight", 1e-2},   {"layers.4.moe.router.weight", 1e-2},
      {"layers.2.moe.experts.gate", 1e-2},    {"layers.3.moe.experts.up", 1e-2},
      {"layers.4.moe.experts.down", 1e-2},    {"layers.2.moe.shared.up_proj.weight", 1e-2},
      {"layers.0.mlp.gate_proj.weight", 1e-3}};
  for (const auto& [name, h] : dirs) {
    const Tensor* found = grads.find(name);
    ASSERT_NE(found, nullptr) << name;
    const Tensor g = found->clone();
    double norm = 0;
    for (int64_t i = 0; i < g.numel(); ++i) norm += double{g.data<float>()[i]} * g.data<float>()[i];
    norm = std::sqrt(norm);
    ASSERT_GT(norm, 0) << name;
    const Tensor& p = *model->parameters().find(name);
    const Tensor original = p.clone();
    auto loss_at = [&](double step) {
      for (int64_t i = 0; i < p.numel(); ++i)
        p.data<float>()[i] =
            original.data<float>()[i] + static_cast<float>(step * g.data<float>()[i] / norm);
      Gradients unused;
      const double moved = replayed_loss(unused);
      p.copy_from(original);
      return moved;
    };
    const double fd1 = (loss_at(h) - loss_at(-h)) / (2 * h);
    const double fd3 = (loss_at(h / 3) - loss_at(-h / 3)) / (2 * (h / 3));
    auto tol = [&](double s) { return kModelGradTol * norm + ulp / (2 * s); };
    std::printf(
        "[routing replay gradients] %-36s |g| %.6g; central differences %.6g at h = %.0e (rel "
        "%.2e), %.6g at h / 3 (rel %.2e)\n",
        name, norm, fd1, h, std::fabs(fd1 - norm) / norm, fd3, std::fabs(fd3 - norm) / norm);
    EXPECT_NEAR(fd1, norm, tol(h)) << name;
    EXPECT_NEAR(fd3, norm, tol(h / 3)) << name;
  }

  // The bias only selects; with every row replayed it changes nothing.
  const Tensor& bias = *model->parameters().find("layers.2.moe.router.bias");
  for (int64_t i = 0; i < bias.numel(); ++i) bias.data<float>()[i] += 0.5f * (i % 3);
  Gradients unused;
  EXPECT_EQ(replayed_loss(unused), loss);
}

// Measure-only replays count the differing slots and leave the forward as the router chose it.
TEST(RoutingReplay, MeasureOnlyCountsWithoutRouting) {
  const ModelConfig cfg = kimi_kda_moe();
  auto model = trainable_model(cfg);
  const int64_t n = 19, e = cfg.moe.num_experts, k = cfg.moe.top_k;
  const std::vector<int32_t> tokens = random_tokens(cfg, static_cast<int>(n), 4);
  const ActivationTape plain = forward_tape(*model, tokens, {"expert_ids", "final_normed"});
  RoutingReplay replay;
  replay.apply = false;
  replay.expert_ids.resize(cfg.num_layers);
  std::mt19937 rng(2);
  int64_t want = 0;
  for (int l : moe_layers(cfg)) {
    Tensor ids = Tensor::empty({n, k}, DType::kI32);
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<int32_t> p = pick_experts(rng, e, k);
      std::copy(p.begin(), p.end(), ids.data<int32_t>() + t * k);
    }
    want += differing_slots(*plain.find(l, "expert_ids"), ids);
    replay.expert_ids[l] = ids;
  }
  const ActivationTape measured = forward_tape(*model, tokens, {"final_normed"}, &replay);
  expect_same_bits(*plain.find(-1, "final_normed"), *measured.find(-1, "final_normed"),
                   "final_normed");
  EXPECT_EQ(replay.replayed_slots, n * static_cast<int64_t>(moe_layers(cfg).size()) * k);
  EXPECT_EQ(replay.differing_slots, want);
}

TEST(RoutingReplay, MalformedReplaysAreRefused) {
  const ModelConfig cfg = kimi_kda_moe();
  auto model = trainable_model(cfg);
  const int64_t n = 7, k = cfg.moe.top_k;
  const std::vector<int32_t> tokens = random_tokens(cfg, static_cast<int>(n), 1);
  auto refused = [&](RoutingReplay replay, const char* what) {
    SequenceCache cache = model->new_cache();
    ForwardBatch batch;
    batch.token_ids = tokens;
    batch.seqs.push_back({.num_tokens = n, .logits = LogitsMode::kNone, .cache = &cache});
    batch.routing_replay = &replay;
    auto out = model->forward(batch);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << what;
    std::printf("[routing replay] %s: %s\n", what, std::string(out.status().message()).c_str());
  };
  auto valid = [&] {
    RoutingReplay r;
    r.expert_ids.resize(cfg.num_layers);
    Tensor ids = Tensor::empty({n, k}, DType::kI32);
    for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int32_t>()[i] = static_cast<int32_t>(i % k);
    r.expert_ids[1] = ids;
    return r;
  };
  {
    RoutingReplay r = valid();
    r.expert_ids.pop_back();
    refused(r, "a layer short");
  }
  {
    RoutingReplay r = valid();
    r.expert_ids[0] = r.expert_ids[1].clone();  // layer 0 is dense
    refused(r, "experts for a dense layer");
  }
  {
    RoutingReplay r = valid();
    r.expert_ids[1] = Tensor::zeros({n + 1, k}, DType::kI32);
    refused(r, "a row too many");
  }
  {
    RoutingReplay r = valid();
    r.expert_ids[1].data<int32_t>()[3] = static_cast<int32_t>(cfg.moe.num_experts);
    refused(r, "an expert out of range");
  }
  {
    RoutingReplay r = valid();
    r.expert_ids[1].data<int32_t>()[k + 1] = r.expert_ids[1].data<int32_t>()[k];
    refused(r, "an expert twice in a row");
  }
  {
    RoutingReplay r = valid();
    r.expert_ids[1].data<int32_t>()[0] = -2;
    refused(r, "a row starting with -2");
  }
}

}  // namespace
}  // namespace loom
