// Model::loss_and_gradients_packed on the GPU: against the per-sequence calls on the GPU (its
// oracle on the device) and against the packed call on the CPU, every sequence's loss and every
// parameter's gradient, for fixture models covering KDA, GDN, MLA, GQA, MoE and Block AttnRes;
// then TrainStep with and without packing on the GPU. Sequence lengths on both sides of the
// chunked forms' threshold (kKdaRecurrentMaxTokens), none a multiple of a tile.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/gradients.h"
#include "engine/model/model.h"
#include "gtest/gtest.h"
#include "kernels/kda.h"
#include "tests/gpu/model_test_support.h"
#include "trainer/synthetic_tasks.h"
#include "trainer/train_step.h"
#include "weights/model_config.h"
#include "weights/weight_loader.h"

namespace loom {
namespace {

// The CUDA-against-CPU bound of trainer_cuda_test.cc (fla_kda_s0's f32 gradients move by up to
// 2.2e-4 with the CPU's summation order alone; a missing or wrong term gives 1e-2 and more).
// Packed against per-sequence on one device changes only the summation order too (cuBLAS picks
// other kernels for other row counts), so the same bound holds.
constexpr double kGradBound = 1e-3;
constexpr double kLossBound = 1e-5;

struct Result {
  std::vector<double> losses;
  std::vector<std::pair<std::string, Tensor>> grads;  // host copies, canonical-name order
};

std::unique_ptr<Model> load(const std::string& dir, Device device, bool trainable = false) {
  auto model = Model::load(dir, Placement{.device = device,
                                          .dtype = WeightDType::kF32,
                                          .activations = ActivationDType::kF32,
                                          .trainable = trainable});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

Result run(const Model& model, const std::vector<std::vector<int32_t>>& seqs, bool packed) {
  Result out;
  Gradients grads(model.device());
  grads.set_aux_loss_alpha(0.01f);
  if (packed) {
    std::vector<TrainingSequence> in;
    for (const auto& s : seqs) in.push_back({s});
    auto losses = model.loss_and_gradients_packed(in, grads);
    EXPECT_TRUE(losses.ok()) << losses.status();
    if (!losses.ok()) return out;
    out.losses = *losses;
  } else {
    for (const auto& s : seqs) {
      auto loss = model.loss_and_gradients(s, grads);
      EXPECT_TRUE(loss.ok()) << loss.status();
      if (!loss.ok()) return out;
      out.losses.push_back(*loss);
    }
  }
  for (const std::string& name : grads.names())
    out.grads.emplace_back(name, grads.find(name)->to(Device::kCpu));
  return out;
}

void expect_close(const Result& got, const Result& want, const char* what,
                  const std::string& fixture, double grad_bound = kGradBound,
                  double loss_bound = kLossBound) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t s = 0; s < want.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], want.losses[s], loss_bound * std::fabs(want.losses[s]))
        << fixture << " " << what << " sequence " << s;
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  double worst = 0;
  std::string worst_name;
  for (size_t i = 0; i < want.grads.size(); ++i) {
    ASSERT_EQ(got.grads[i].first, want.grads[i].first);
    const double r = rel_l2_or_abs(got.grads[i].second, want.grads[i].second);
    EXPECT_LE(r, grad_bound) << fixture << " " << what << " " << want.grads[i].first;
    if (r > worst) worst = r, worst_name = want.grads[i].first;
  }
  std::printf("%s %s: %zu gradients, worst rel L2 %.3g (%s)\n", fixture.c_str(), what,
              want.grads.size(), worst, worst_name.c_str());
}

TEST(TrainerPackedCuda, PackedMatchesPerSequenceAndTheCpu) {
  for (const char* name : {"kimi_linear_s0", "fla_kda_s0", "qwen3_next_s0", "deepseek_v3_s1"}) {
    const std::string dir = fixtures_dir() + "/" + name;
    auto cfg = load_model_config(dir);
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    std::mt19937_64 rng(13);
    std::vector<std::vector<int32_t>> seqs;
    for (int64_t len : {int64_t{77}, kKdaRecurrentMaxTokens - 3, int64_t{130}, int64_t{33}})
      seqs.push_back(random_ids(len, cfg->vocab_size, rng));
    auto gpu = load(dir, Device::cuda(0));
    auto cpu = load(dir, Device::kCpu);
    ASSERT_TRUE(gpu && cpu);
    const Result gpu_each = run(*gpu, seqs, false);
    const Result gpu_packed = run(*gpu, seqs, true);
    const Result cpu_packed = run(*cpu, seqs, true);
    expect_close(gpu_packed, gpu_each, "cuda packed vs cuda per-sequence", name);
    expect_close(gpu_packed, cpu_packed, "cuda packed vs cpu packed", name);
  }
}

// The bundled default's shape (weights/default/config.json: head dims of 64, four MoE layers, MLA
// with and without its rotary part) on sequences of up to 506 tokens: eight 64-token chunks, the
// shapes a passkey batch at 512 trains on, which the fixture models above (dims of 16 and 32, up
// to 130 tokens) do not reach. Packed on the GPU against packed on the CPU in f32; with the GEMMs
// in TF32 (`"matmul": "tf32"`) only with dense MLPs: TF32's rounding moves router scores enough
// to flip near-tied top-k choices of a random router, which changes those tokens' outputs
// outright (s16a: every MoE model gradient 8-18% off, the dense ones are the measure of TF32).
TEST(TrainerPackedCuda, DefaultShapedModelMatchesTheCpu) {
  std::ifstream f(std::string(LOOM_SOURCE_DIR) + "/weights/default/config.json");
  ASSERT_TRUE(f.good());
  std::ostringstream text;
  text << f.rdbuf();
  struct Variant {
    const char* name;
    int rope;
    bool moe;
  };
  for (const Variant& v :
       {Variant{"default (RoPE MLA)", 32, true}, Variant{"default (NoPE MLA)", 0, true},
        Variant{"default (NoPE MLA, dense MLPs)", 0, false}}) {
    auto cfg = parse_model_config(text.str());
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    cfg->mla.qk_rope_head_dim = v.rope;
    if (!v.moe) std::fill(cfg->ffns.begin(), cfg->ffns.end(), FfnType::kDense);
    const WeightLoader weights = WeightLoader::synthetic(*cfg, 1);
    auto load_on = [&](Device device) -> std::unique_ptr<Model> {
      auto m = Model::load(*cfg, weights,
                           Placement{.device = device,
                                     .dtype = WeightDType::kF32,
                                     .activations = ActivationDType::kF32,
                                     .trainable = true});
      EXPECT_TRUE(m.ok()) << m.status();
      return m.ok() ? std::move(*m) : nullptr;
    };
    std::mt19937_64 rng(17);
    std::vector<std::vector<int32_t>> seqs;
    for (int64_t len : {506, 301, 257, 129}) seqs.push_back(random_ids(len, cfg->vocab_size, rng));
    auto gpu = load_on(Device::cuda(0));
    auto cpu = load_on(Device::kCpu);
    ASSERT_TRUE(gpu && cpu);
    const Result cpu_packed = run(*cpu, seqs, true);
    expect_close(run(*gpu, seqs, true), cpu_packed, "cuda packed vs cpu packed", v.name);
    if (v.moe) continue;
    ASSERT_TRUE(gpu->set_matmul_precision(MatmulPrecision::kTf32).ok());
    expect_close(run(*gpu, seqs, true), cpu_packed, "cuda tf32 packed vs cpu packed", v.name,
                 /*grad_bound=*/3e-2, /*loss_bound=*/1e-3);
  }
}

// TrainStep on the GPU with the default token budget (each batch in one pass) against one example
// per pass: the same losses and gradient norms over a few steps.
TEST(TrainerPackedCuda, TrainStepPacksTheSameUpdate) {
  const std::string dir = fixtures_dir() + "/kimi_linear_s0";
  auto steps = [&](int64_t budget) {
    std::vector<StepStats> out;
    auto model = load(dir, Device::cuda(0), /*trainable=*/true);
    if (!model) return out;
    OptimizerOptions opt;
    opt.lr = {.peak_lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 1, .total_steps = 3};
    opt.max_tokens_per_pass = budget;
    auto step = TrainStep::create(*model, opt);
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) return out;
    std::mt19937_64 rng(5);
    for (int s = 0; s < 3; ++s) {
      std::vector<Example> batch;
      for (int i = 0; i < 5; ++i) {
        MqarOptions task;
        task.num_pairs = 2 + i;
        task.seq_len = 20 + 7 * i;
        task.num_keys = 32;
        task.value_begin = 33;
        task.num_values = 32;
        batch.push_back(make_mqar(task, rng));
      }
      auto st = step->run(batch);
      EXPECT_TRUE(st.ok()) << st.status();
      if (!st.ok()) return out;
      out.push_back(*st);
    }
    return out;
  };
  const std::vector<StepStats> each = steps(0), packed = steps(16384);
  ASSERT_EQ(each.size(), 3u);
  ASSERT_EQ(packed.size(), 3u);
  for (size_t s = 0; s < each.size(); ++s) {
    EXPECT_NEAR(packed[s].loss, each[s].loss, 1e-4 * each[s].loss) << "step " << s;
    EXPECT_NEAR(packed[s].grad_norm, each[s].grad_norm, kGradBound * each[s].grad_norm);
    std::printf("TrainStep cuda step %zu: loss %.7f packed / %.7f per example\n", s + 1,
                packed[s].loss, each[s].loss);
  }
}

}  // namespace
}  // namespace loom
