// Routing replay on the GPU (issue 20; kernels/cuda/moe.cu route_replay_kernel, engine/model/ffn.cc
// MoeFfn::route): the CUDA twin of moe_route_replay against the CPU's, bit for bit (ids, weights
// and counters, for sigmoid and softmax routers, grouped or not, renormalised or not, from 12 to
// 512 experts: rows left to the router, rows replaying their own experts, rows of hand-picked
// ones); through the model on the GPU (the bundled config: KDA + MLA + MoE), the experts a forward
// chose replayed give that forward's bits and its loss and gradients, and hand-picked experts give
// what the CPU model computes with them within the f32 twins' bound, and measuring them (no
// rerouting) counts the slots that differ from each device's own routing.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/routing_replay.h"
#include "gtest/gtest.h"
#include "kernels/exec.h"
#include "kernels/moe.h"
#include "tests/gpu/model_test_support.h"
#include "tests/unit/routing_replay_test_support.h"

namespace loom {
namespace {

const Device kGpu = Device::cuda(0);
const std::string kBundled = "weights/default/config.json";

struct RouterCase {
  const char* name;
  RouterParams params;
  bool bias;
  int64_t experts;
};

std::vector<RouterCase> router_cases() {
  RouterParams kimi;  // kimi_linear_s1's shape: sigmoid, two groups of six, one kept, scaled
  kimi.score = RouterScore::kSigmoid;
  kimi.top_k = 3;
  kimi.n_group = 2;
  kimi.topk_group = 1;
  kimi.routed_scaling = 2.5f;
  RouterParams v3 = kimi;  // DeepSeek-V3's: 256 experts in 8 groups, 4 kept, top-8
  v3.top_k = 8;
  v3.n_group = 8;
  v3.topk_group = 4;
  v3.routed_scaling = 2.827f;
  RouterParams qwen;  // Qwen3-Next's: softmax over 512, top-10, renormalised
  qwen.score = RouterScore::kSoftmax;
  qwen.top_k = 10;
  RouterParams plain;  // softmax without renormalisation
  plain.score = RouterScore::kSoftmax;
  plain.top_k = 2;
  plain.renormalize = false;
  return {{"sigmoid_grouped_12", kimi, true, 12},
          {"sigmoid_grouped_256", v3, true, 256},
          {"softmax_512", qwen, false, 512},
          {"softmax_unnormalised_12", plain, false, 12}};
}

void expect_same_bits(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  const Tensor g = gpu.to(Device::kCpu);
  ASSERT_EQ(g.shape(), cpu.shape()) << what;
  ASSERT_EQ(g.dtype(), cpu.dtype()) << what;
  EXPECT_EQ(std::memcmp(g.data<uint8_t>(), cpu.data<uint8_t>(), cpu.nbytes()), 0) << what;
}

TEST(RoutingReplayCuda, KernelMatchesTheCpuBitForBit) {
  for (const RouterCase& rc : router_cases()) {
    SCOPED_TRACE(rc.name);
    const RouterParams& p = rc.params;
    const int64_t t = 37, e = rc.experts, k = p.top_k;  // 37 rows: the last block part-full
    std::mt19937 rng(17);
    std::normal_distribution<float> normal(0.0f, 1.5f);
    Tensor logits = Tensor::empty({t, e}), bias = rc.bias ? Tensor::empty({e}) : Tensor();
    for (int64_t i = 0; i < logits.numel(); ++i) logits.data<float>()[i] = normal(rng);
    if (rc.bias)
      for (int64_t i = 0; i < e; ++i) bias.data<float>()[i] = 0.3f * normal(rng);

    Tensor ids = Tensor::empty({t, k}, DType::kI32), w = Tensor::empty({t, k});
    moe_route(host_exec(), logits, bias, p, ids, w);
    // Rows i % 5 == 0 left to the router, == 1 their own experts, others hand-picked.
    Tensor replay = Tensor::empty({t, k}, DType::kI32);
    for (int64_t i = 0; i < t; ++i) {
      int32_t* r = replay.data<int32_t>() + i * k;
      if (i % 5 == 0) {
        std::fill(r, r + k, -1);
      } else if (i % 5 == 1) {
        std::copy(ids.data<int32_t>() + i * k, ids.data<int32_t>() + (i + 1) * k, r);
      } else {
        const std::vector<int32_t> picked = pick_experts(rng, e, k);
        std::copy(picked.begin(), picked.end(), r);
      }
    }

    const Exec gpu = exec_for(kGpu);
    const Tensor g_logits = logits.to(kGpu), g_bias = rc.bias ? bias.to(kGpu) : Tensor();
    Tensor g_ids = Tensor::empty({t, k}, DType::kI32, kGpu),
           g_w = Tensor::empty({t, k}, DType::kF32, kGpu);
    moe_route(gpu, g_logits, g_bias, p, g_ids, g_w);
    expect_same_bits(g_ids, ids, "router ids");
    expect_same_bits(g_w, w, "router weights");

    Tensor counts = Tensor::empty({2}, DType::kI64);
    moe_route_replay(host_exec(), logits, replay, p, ids, w, counts);
    Tensor g_counts = Tensor::empty({2}, DType::kI64, kGpu);
    moe_route_replay(gpu, g_logits, replay.to(kGpu), p, g_ids, g_w, g_counts);
    synchronize(gpu);
    expect_same_bits(g_ids, ids, "replayed ids");
    expect_same_bits(g_w, w, "replayed weights");
    expect_same_bits(g_counts, counts, "counts");
    EXPECT_EQ(counts.data<int64_t>()[0], (t - (t + 4) / 5) * k);
    EXPECT_GT(counts.data<int64_t>()[1], 0);
    std::printf("[replay cuda] %s: %lld slots replayed, %lld differing, same bits\n", rc.name,
                static_cast<long long>(counts.data<int64_t>()[0]),
                static_cast<long long>(counts.data<int64_t>()[1]));
  }
}

std::unique_ptr<Model> trainable(Device device) {
  Placement p;
  p.device = device;
  p.trainable = true;
  auto m = Model::load_random(kBundled, 3, p);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(m).value();
}

// One forward over `tokens` from a fresh cache; the tape's `names` on the host.
struct Recorded {
  Tensor final_normed;
  std::vector<Tensor> expert_ids;  // by layer; MoE layers only
};

Recorded forward(const Model& model, const std::vector<int32_t>& tokens,
                 RoutingReplay* replay = nullptr) {
  SequenceCache cache = model.new_cache();
  ForwardBatch batch;
  batch.token_ids = tokens;
  batch.seqs.push_back({.num_tokens = static_cast<int64_t>(tokens.size()),
                        .logits = LogitsMode::kNone,
                        .cache = &cache});
  batch.routing_replay = replay;
  ActivationTape tape({"expert_ids", "final_normed"});
  auto out = model.forward(batch, &tape);
  EXPECT_TRUE(out.ok()) << out.status();
  Recorded r;
  r.final_normed = tape.find(-1, "final_normed")->to(Device::kCpu);
  r.expert_ids.resize(static_cast<size_t>(model.config().num_layers));
  for (int l : moe_layers(model.config()))
    r.expert_ids[static_cast<size_t>(l)] = tape.find(l, "expert_ids")->to(Device::kCpu);
  return r;
}

TEST(RoutingReplayCuda, ThroughTheModelOnTheGpu) {
  auto gpu = trainable(kGpu);
  auto cpu = trainable(Device::kCpu);
  const ModelConfig& cfg = gpu->config();
  const std::vector<int> layers = moe_layers(cfg);
  ASSERT_FALSE(layers.empty());
  std::mt19937_64 token_rng(9);
  const std::vector<int32_t> tokens = random_ids(53, cfg.vocab_size, token_rng);
  const int64_t n = static_cast<int64_t>(tokens.size()), k = cfg.moe.top_k;

  // The GPU's own experts replayed: the same forward, bit for bit, nothing differing.
  const Recorded plain = forward(*gpu, tokens);
  RoutingReplay own;
  own.expert_ids.resize(static_cast<size_t>(cfg.num_layers));
  for (int l : layers) own.expert_ids[l] = plain.expert_ids[l].clone();
  const Recorded again = forward(*gpu, tokens, &own);
  EXPECT_EQ(std::memcmp(again.final_normed.data<uint8_t>(), plain.final_normed.data<uint8_t>(),
                        plain.final_normed.nbytes()),
            0);
  EXPECT_EQ(own.replayed_slots, n * static_cast<int64_t>(layers.size()) * k);
  EXPECT_EQ(own.differing_slots, 0);

  // Its loss and gradients too (the backward recomputes the replayed routing, uncounted).
  Gradients g_plain, g_replayed;
  auto loss_plain = gpu->loss_and_gradients(tokens, g_plain);
  RoutingReplay own2 = own;
  own2.replayed_slots = own2.differing_slots = 0;
  auto loss_replayed = gpu->loss_and_gradients(tokens, g_replayed, {}, nullptr, {}, &own2);
  ASSERT_TRUE(loss_plain.ok() && loss_replayed.ok()) << loss_replayed.status();
  EXPECT_EQ(*loss_plain, *loss_replayed);
  EXPECT_EQ(own2.replayed_slots, n * static_cast<int64_t>(layers.size()) * k);
  // Every gradient the plain call has (the router's selection bias has none), the same bits.
  ASSERT_EQ(g_plain.names(), g_replayed.names());
  for (const std::string& name : g_plain.names()) {
    const Tensor ha = g_plain.find(name)->to(Device::kCpu);
    const Tensor hb = g_replayed.find(name)->to(Device::kCpu);
    EXPECT_EQ(std::memcmp(ha.data<uint8_t>(), hb.data<uint8_t>(), ha.nbytes()), 0) << name;
  }

  // Hand-picked experts on every row but every seventh, in every MoE layer: the GPU's forward is
  // the CPU's with the same experts (the f32 twins' bound).
  std::mt19937 rng(23);
  RoutingReplay picked_gpu;
  picked_gpu.expert_ids.resize(static_cast<size_t>(cfg.num_layers));
  for (int l : layers) {
    Tensor r = Tensor::empty({n, k}, DType::kI32);
    for (int64_t i = 0; i < n; ++i) {
      const std::vector<int32_t> p = pick_experts(rng, cfg.moe.num_experts, k);
      std::copy(p.begin(), p.end(), r.data<int32_t>() + i * k);
      if (i % 7 == 3) r.data<int32_t>()[i * k] = -1;
    }
    picked_gpu.expert_ids[l] = r;
  }
  RoutingReplay picked_cpu = picked_gpu;
  const Recorded g = forward(*gpu, tokens, &picked_gpu);
  const Recorded c = forward(*cpu, tokens, &picked_cpu);
  const double rel = rel_l2(g.final_normed, c.final_normed);
  EXPECT_LT(rel, 1e-4);
  EXPECT_EQ(picked_gpu.replayed_slots, picked_cpu.replayed_slots);
  // Measuring the same picks (each layer keeps its own routing, so the forward is the plain one):
  // the differing slots are those of the picks against each device's own routing.
  RoutingReplay measure_gpu = picked_gpu, measure_cpu = picked_gpu;
  for (RoutingReplay* m : {&measure_gpu, &measure_cpu}) {
    m->apply = false;
    m->replayed_slots = m->differing_slots = 0;
  }
  const Recorded measured = forward(*gpu, tokens, &measure_gpu);
  EXPECT_EQ(std::memcmp(measured.final_normed.data<uint8_t>(), plain.final_normed.data<uint8_t>(),
                        plain.final_normed.nbytes()),
            0);
  const Recorded c_plain = forward(*cpu, tokens, &measure_cpu);
  int64_t want_gpu = 0, want_cpu = 0;
  for (int l : layers) {
    want_gpu += differing_slots(plain.expert_ids[l], picked_gpu.expert_ids[l]);
    want_cpu += differing_slots(c_plain.expert_ids[l], picked_cpu.expert_ids[l]);
  }
  EXPECT_EQ(measure_gpu.differing_slots, want_gpu);
  EXPECT_EQ(measure_cpu.differing_slots, want_cpu);
  EXPECT_EQ(measure_gpu.replayed_slots, picked_gpu.replayed_slots);
  std::printf(
      "[replay cuda] bundled config, %lld tokens: own routing replayed bit for bit; picked experts "
      "GPU vs CPU final_normed rel L2 %.3g; differing slots gpu %lld cpu %lld of %lld\n",
      static_cast<long long>(n), rel, static_cast<long long>(measure_gpu.differing_slots),
      static_cast<long long>(measure_cpu.differing_slots),
      static_cast<long long>(picked_gpu.replayed_slots));
}

}  // namespace
}  // namespace loom
