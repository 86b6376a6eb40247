// The GPU half of agent RL (issue 20) against its CPU twin:
//  - the weight sync into bf16 engine weights: an f32 trainer on the GPU into a bf16 engine on the
//    same GPU (the device's converting copy), an f32 trainer on the CPU into it (converted on the
//    host, uploaded) and a GPU trainer into a bf16 CPU engine (downloaded, converted) give the
//    engine exactly the parameters, and so the greedy tokens and logprobs, of a fresh bf16 engine
//    loaded from a checkpoint of those f32 weights (the loader's rounding), on the bundled config
//    (KDA + MLA + MoE + Block AttnRes);
//  - one RL step by hand on both devices (the tiny KDA + MLA config of the CPU demonstration, f32
//    deterministic engines, the trainer's weights synced into each): the rollouts token for token,
//    the behaviour and the trainer's logprobs, the policy loss and the update's gradient norm
//    within the bounds stated below;
//  - `run_rl` with "device": "cuda" (f32 and bf16 engines) against the same run on the CPU: the
//    warm start's first losses, a metrics line per step, and a checkpoint that loads;
//  - routing replay on the GPU: a short run on the bundled MoE config records and replays every
//    position.
// Run from the repository root (the configs are read from weights/ and tests/long/).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/model/native_export.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "kernels/exec.h"
#include "nlohmann/json.hpp"
#include "tests/gpu/model_test_support.h"
#include "trainer/rl/arithmetic_env.h"
#include "trainer/rl/policy_loss.h"
#include "trainer/rl/rl_run.h"
#include "trainer/rl/rollout.h"
#include "trainer/run_config.h"
#include "trainer/train_step.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kBundled = "weights/default/config.json";
const std::string kTiny = "tests/long/rl_tiny_config.json";
const Device kGpu = Device::cuda(0);

std::unique_ptr<Model> load(const std::string& config, uint64_t seed, Device device,
                            WeightDType dtype, bool trainable) {
  Placement p;
  p.device = device;
  p.dtype = dtype;
  p.trainable = trainable;
  p.writable = !trainable;
  auto m = Model::load_random(config, seed, p);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(m).value();
}

std::unique_ptr<Engine> make_engine(std::unique_ptr<Model> model,
                                    std::shared_ptr<const Tokenizer> tok = nullptr) {
  EngineOptions o;
  o.deterministic = true;
  auto e = Engine::create(std::move(model), std::move(tok), o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(e).value();
}

struct Generated {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

Generated generate(Engine& e, const std::vector<int32_t>& prompt) {
  Request r;
  r.prompt = prompt;
  r.params.temperature = 0;  // greedy
  r.params.max_tokens = 16;
  r.params.ignore_eos = true;
  r.params.logprobs = 0;
  auto stream = e.submit(std::move(r));
  EXPECT_TRUE(stream.ok()) << stream.status();
  Generated g;
  while (std::optional<RequestOutput> ev = (*stream)->next()) {
    g.tokens.insert(g.tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
    for (const TokenLogprob& lp : ev->logprobs) g.logprobs.push_back(lp.logprob);
  }
  e.wait_idle();
  return g;
}

// Whether every parameter of `a` has exactly the bits of `b`'s (host copies compared).
void expect_same_bits(const ParameterArena& a, const ParameterArena& b, const char* what) {
  size_t bf16 = 0;
  for (const ParameterArena::Entry& e : b.entries()) {
    const Tensor* mine = a.find(e.name);
    ASSERT_NE(mine, nullptr) << what << " " << e.name;
    ASSERT_EQ(mine->dtype(), e.tensor.dtype()) << what << " " << e.name;
    const Tensor x = mine->to(Device::kCpu), y = e.tensor.to(Device::kCpu);
    EXPECT_EQ(std::memcmp(x.raw(), y.raw(), y.nbytes()), 0) << what << " " << e.name;
    bf16 += e.tensor.dtype() == DType::kBF16;
  }
  EXPECT_GT(bf16, 0u) << what;
}

TEST(RlCuda, Bf16WeightSyncMatchesAFreshBf16Engine) {
  const std::unique_ptr<Model> trainer_gpu = load(kBundled, 4, kGpu, WeightDType::kF32, true);
  const std::unique_ptr<Model> trainer_cpu =
      load(kBundled, 4, Device::kCpu, WeightDType::kF32, true);
  for (const ParameterArena::Entry& e : trainer_cpu->parameters().entries())
    trainer_gpu->parameters().find(e.name)->copy_from(e.tensor);

  // The oracle: the f32 weights as a checkpoint, loaded in bf16 by the loader on each device.
  const std::string dir = (fs::temp_directory_path() / "rl_cuda_bf16_sync").string();
  WeightLoader::Record record;
  for (const ParameterArena::Entry& e : trainer_cpu->parameters().entries())
    record.emplace_back(e.name, e.tensor);
  ASSERT_TRUE(write_native_checkpoint(trainer_cpu->config(), record, dir).ok());
  auto fresh_gpu = Model::load(dir, Placement{.device = kGpu, .dtype = WeightDType::kBF16});
  ASSERT_TRUE(fresh_gpu.ok()) << fresh_gpu.status();
  auto fresh_cpu = Model::load(dir, Placement{.dtype = WeightDType::kBF16});
  ASSERT_TRUE(fresh_cpu.ok()) << fresh_cpu.status();

  std::mt19937_64 rng(21);
  const std::vector<int32_t> prompt = random_ids(150, trainer_cpu->config().vocab_size, rng);
  struct Case {
    const char* what;
    Device engine;
    const Model* source;
    const Model* fresh;
  };
  const Case cases[] = {
      {"gpu f32 -> gpu bf16 (device copy)", kGpu, trainer_gpu.get(), fresh_gpu->get()},
      {"cpu f32 -> gpu bf16 (host cast, upload)", kGpu, trainer_cpu.get(), fresh_gpu->get()},
      {"gpu f32 -> cpu bf16 (download, host cast)", Device::kCpu, trainer_gpu.get(),
       fresh_cpu->get()}};
  std::unique_ptr<Engine> fresh_engines[2];
  Generated reference[2];  // [0] the GPU's fresh engine, [1] the CPU's
  for (const Case& c : cases) {
    std::unique_ptr<Model> served = load(kBundled, 3, c.engine, WeightDType::kBF16, false);
    const ParameterArena& engine_params = served->parameters();
    std::unique_ptr<Engine> engine = make_engine(std::move(served));
    auto version = engine->update_weights(c.source->parameters());
    ASSERT_TRUE(version.ok()) << c.what << ": " << version.status();
    expect_same_bits(engine_params, c.fresh->parameters(), c.what);
    const int r = c.engine.is_cpu() ? 1 : 0;
    if (!fresh_engines[r]) {
      // A fresh engine over the oracle's weights (a copy: the engine takes its model).
      auto copy = Model::load(dir, Placement{.device = c.engine, .dtype = WeightDType::kBF16});
      ASSERT_TRUE(copy.ok()) << copy.status();
      fresh_engines[r] = make_engine(std::move(copy).value());
      reference[r] = generate(*fresh_engines[r], prompt);
    }
    const Generated got = generate(*engine, prompt);
    EXPECT_EQ(got.tokens, reference[r].tokens) << c.what;
    EXPECT_EQ(got.logprobs, reference[r].logprobs) << c.what;
  }
}

// One RL step by hand on `device`: rollouts on an f32 deterministic engine synced from the
// trainer, the trainer's logprobs, advantages given (+1 / -1 alternating: an untrained model earns
// no reward, and the loss's arithmetic does not care where they come from), one AdamW update, the
// sync and a second rollout.
constexpr double kHandLr = 1e-3;
struct HandStep {
  std::vector<Trajectory> first, second;
  PolicyLossStats loss;
  StepStats update;
  std::vector<std::pair<std::string, Tensor>> params;  // after the update, host copies
};

HandStep hand_step(Device device, const ParameterArena& start) {
  HandStep out;
  std::shared_ptr<const Tokenizer> tok = Tokenizer::byte_level();
  auto chat = chat_setup_for(ChatFormat::kNative, *tok);
  EXPECT_TRUE(chat.ok()) << chat.status();
  std::unique_ptr<Model> model = load(kTiny, 1, device, WeightDType::kF32, true);
  for (const ParameterArena::Entry& e : start.entries())
    model->parameters().find(e.name)->copy_from(e.tensor);
  std::unique_ptr<Engine> engine =
      make_engine(load(kTiny, 2, device, WeightDType::kF32, false), tok);
  EXPECT_TRUE(engine->update_weights(model->parameters()).ok());
  std::vector<std::unique_ptr<ArithmeticEnv>> envs;
  std::vector<EpisodeSpec> specs;
  for (int i = 0; i < 8; ++i) {
    envs.push_back(
        std::make_unique<ArithmeticEnv>(ArithmeticEnvOptions{.operands = 2, .max_operand = 2}));
    specs.push_back({.env = envs.back().get(), .env_seed = 5u + i / 4, .sample_seed = 300u + i});
  }
  const RolloutOptions ro{.max_turns = 2, .max_turn_tokens = 48, .max_trajectory_tokens = 1024};
  auto first = run_rollouts(*engine, *tok, *chat, specs, ro);
  EXPECT_TRUE(first.ok()) << first.status();
  out.first = std::move(first).value();
  std::vector<const Trajectory*> batch;
  for (size_t i = 0; i < out.first.size(); ++i) {
    Trajectory& tr = out.first[i];
    auto logp = token_logprobs(*model, tr.tokens);
    EXPECT_TRUE(logp.ok()) << logp.status();
    tr.old_logp = std::move(logp).value();
    tr.advantage = i % 2 == 0 ? 1.0 : -1.0;
    batch.push_back(&tr);
  }
  OptimizerOptions oo;
  oo.lr = {.peak_lr = kHandLr, .min_lr = kHandLr, .warmup_steps = 0, .total_steps = 10};
  oo.balance = BalanceMethod::kNone;
  auto step = TrainStep::create(*model, oo);
  EXPECT_TRUE(step.ok()) << step.status();
  Gradients& grads = step->begin();
  auto pl = accumulate_policy_gradient(*model, batch, GrpoOptions{}, grads, false);
  EXPECT_TRUE(pl.ok()) << pl.status();
  out.loss = *pl;
  auto st = step->update(1.0);
  EXPECT_TRUE(st.ok()) << st.status();
  out.update = *st;
  EXPECT_TRUE(engine->update_weights(model->parameters()).ok());
  auto second = run_rollouts(*engine, *tok, *chat, specs, ro);
  EXPECT_TRUE(second.ok()) << second.status();
  out.second = std::move(second).value();
  for (const ParameterArena::Entry& e : model->parameters().entries())
    out.params.emplace_back(e.name, e.tensor.to(Device::kCpu));
  return out;
}

TEST(RlCuda, OneStepByHandMatchesTheCpu) {
  const std::unique_ptr<Model> start = load(kTiny, 1, Device::kCpu, WeightDType::kF32, true);
  const HandStep cpu = hand_step(Device::kCpu, start->parameters());
  const HandStep gpu = hand_step(kGpu, start->parameters());
  ASSERT_EQ(cpu.first.size(), gpu.first.size());
  // The first rollouts: the same weights in f32 on both devices, the same seeds; the sampled
  // tokens must agree exactly (a logit difference of f32 rounding moves a draw only when it lands
  // within ~1e-6 of a boundary of the cumulative distribution).
  double behav = 0, old = 0;
  int64_t tokens = 0;
  for (size_t i = 0; i < cpu.first.size(); ++i) {
    const Trajectory &c = cpu.first[i], &g = gpu.first[i];
    ASSERT_EQ(g.tokens, c.tokens) << "episode " << i;
    ASSERT_EQ(g.sampled, c.sampled) << "episode " << i;
    for (size_t t = 0; t + 1 < c.tokens.size(); ++t) {
      if (!c.sampled[t]) continue;
      ++tokens;
      behav = std::max(behav, std::fabs(double{g.behav_logp[t]} - c.behav_logp[t]));
      old = std::max(old, std::fabs(double{g.old_logp[t]} - c.old_logp[t]));
    }
  }
  // f32 forwards with different summation orders: the CPU's engine and trainer forwards differ by
  // ~4e-6 (rl_rollout_test); a wrong mask, position or weight gives differences of O(0.1).
  EXPECT_GT(tokens, 0);
  EXPECT_LE(behav, 1e-4);
  EXPECT_LE(old, 1e-4);
  // The policy loss is a token mean of ratio x advantage x tis terms (|A| = 1, ratio 1, tis within
  // 1e-4 of 1): logprob differences of 1e-4 move it by at most about that.
  EXPECT_EQ(gpu.loss.tokens, cpu.loss.tokens);
  EXPECT_NEAR(gpu.loss.loss, cpu.loss.loss, 2e-4);
  EXPECT_NEAR(gpu.loss.entropy, cpu.loss.entropy, 1e-4 * std::max(1.0, cpu.loss.entropy));
  // The gradient's global norm: the trainer GPU test's gradient bound (1e-3 relative).
  EXPECT_NEAR(gpu.update.grad_norm, cpu.update.grad_norm, 1e-3 * cpu.update.grad_norm);
  // One AdamW step from the same weights: its first update moves every weight by lr * g / |g|
  // (the bias-corrected moments' ratio is +-1) plus the same decay on both devices, so two
  // weights can differ by at most 2 lr, where a near-zero gradient has opposite signs.
  double worst = 0, worst_rel = 0;
  for (size_t i = 0; i < cpu.params.size(); ++i) {
    const Tensor &g = gpu.params[i].second, &c = cpu.params[i].second;
    for (int64_t k = 0; k < c.numel(); ++k)
      worst = std::max(worst, std::fabs(double{g.data<float>()[k]} - c.data<float>()[k]));
    worst_rel = std::max(worst_rel, rel_l2(g, c));
  }
  EXPECT_LE(worst, 2 * kHandLr + 1e-6);
  int same_second = 0;
  for (size_t i = 0; i < cpu.second.size(); ++i)
    same_second += gpu.second[i].tokens == cpu.second[i].tokens;
  std::printf(
      "[rl cuda] step by hand: %lld sampled tokens identical; worst |gpu - cpu| behaviour logprob "
      "%.3g, trainer logprob %.3g; loss cpu %.6f gpu %.6f; grad norm cpu %.6f gpu %.6f; updated "
      "weights worst |gpu - cpu| %.3g (bound %.3g), worst rel L2 %.3g; second rollouts identical "
      "in %d of %zu episodes\n",
      static_cast<long long>(tokens), behav, old, cpu.loss.loss, gpu.loss.loss,
      cpu.update.grad_norm, gpu.update.grad_norm, worst, 2 * kHandLr, worst_rel, same_second,
      cpu.second.size());
}

// The tiny demonstration config, shortened: a warm start so that some episodes earn a reward.
json run_config(const std::string& out, const std::string& device, const std::string& dtype) {
  return {{"model", {{"config", kTiny}, {"seed", 1}}},
          {"env", {{"name", "arithmetic"}, {"arithmetic", {{"operands", 2}, {"max_operand", 2}}}}},
          {"rollout", {{"max_turns", 2}, {"max_turn_tokens", 64}, {"max_trajectory_tokens", 1024}}},
          {"warm_start", {{"steps", 12}, {"batch_size", 4}, {"lr", 1e-3}}},
          {"groups_per_step", 4},
          {"group_size", 4},
          {"steps", 3},
          {"optimizer", {{"peak_lr", 5e-4}, {"min_lr", 5e-4}, {"warmup_steps", 0}}},
          {"balance", {{"method", "none"}}},
          {"engine", {{"weight_dtype", dtype}}},
          {"device", device},
          {"out", out},
          {"seed", 7}};
}

std::vector<json> metrics_of(const std::string& out) {
  std::vector<json> lines;
  std::ifstream f(fs::path(out) / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) lines.push_back(json::parse(line));
  return lines;
}

TEST(RlCuda, RunRlOnTheGpuMatchesTheCpuWarmStartAndCompletes) {
  std::vector<std::vector<json>> runs;
  for (const auto& [device, dtype] : {std::pair{"cpu", "f32"}, {"cuda", "f32"}, {"cuda", "bf16"}}) {
    const std::string out =
        (fs::temp_directory_path() / (std::string("rl_cuda_run_") + device + "_" + dtype)).string();
    fs::remove_all(out);
    auto config = parse_rl_config(run_config(out, device, dtype).dump());
    ASSERT_TRUE(config.ok()) << config.status();
    auto summary = run_rl(*config, stderr);
    ASSERT_TRUE(summary.ok()) << device << " " << dtype << ": " << summary.status();
    auto loaded = Model::load(summary->last_checkpoint, Placement{});
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    std::printf(
        "[rl cuda] %s, %s engine: warm start loss %.4f, reward first %.3f last %.3f, "
        "first sync %.4fs\n",
        device, dtype, summary->warm_start_loss, summary->first_reward, summary->last_reward,
        summary->initial_sync_s);
    runs.push_back(metrics_of(out));
  }
  // The warm start is supervised training on the same examples on both devices, at the trainer
  // GPU test's rate (lr 1e-3): its bound, 1e-4 relative over the first four steps (the first
  // differs by the summation order only; AdamW then spreads the gradients' differences only where
  // a gradient is near zero). Later steps are printed.
  const std::vector<json>& cpu = runs[0];
  for (size_t r = 1; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].size(), cpu.size());
    for (size_t i = 0; i < cpu.size(); ++i) {
      if (cpu[i].contains("warm_start_step")) {
        const double c = cpu[i]["loss"].get<double>(), g = runs[r][i]["loss"].get<double>();
        if (cpu[i]["warm_start_step"].get<int>() <= 4) {
          EXPECT_NEAR(g, c, 1e-4 * c) << "warm start step " << cpu[i]["warm_start_step"];
        }
        std::printf("[rl cuda] run %zu warm start step %d loss cpu %.6f gpu %.6f\n", r,
                    cpu[i]["warm_start_step"].get<int>(), c, g);
        continue;
      }
      for (const char* key : {"reward_mean", "loss", "weight_sync_s", "rollout_s", "train_s"})
        EXPECT_TRUE(std::isfinite(runs[r][i].value(key, NAN))) << key;
      std::printf(
          "[rl cuda] step %d: cpu reward %.3f loss %.5f length %.1f | run %zu reward "
          "%.3f loss %.5f length %.1f sync %.4fs\n",
          cpu[i].value("step", 0), cpu[i].value("reward_mean", 0.0), cpu[i].value("loss", 0.0),
          cpu[i].value("response_length", 0.0), r, runs[r][i].value("reward_mean", 0.0),
          runs[r][i].value("loss", 0.0), runs[r][i].value("response_length", 0.0),
          runs[r][i].value("weight_sync_s", 0.0));
    }
  }
}

// Routing replay on the GPU (the replay kernel's own checks are in rl_routing_replay_cuda_test):
// a short run on the bundled MoE config records every position and replays it, the trainer's
// router agreeing with the f32 engine's on the GPU.
TEST(RlCuda, RoutingReplayRunsOnTheGpu) {
  const std::string out = (fs::temp_directory_path() / "rl_cuda_routing_replay").string();
  fs::remove_all(out);
  json c = run_config(out, "cuda", "f32");
  c["model"]["config"] = kBundled;
  c["warm_start"]["steps"] = 2;
  c["steps"] = 2;
  c["routing_replay"] = "on";
  auto config = parse_rl_config(c.dump());
  ASSERT_TRUE(config.ok()) << config.status();
  auto summary = run_rl(*config, stderr);
  ASSERT_TRUE(summary.ok()) << summary.status();
  int steps = 0;
  for (const json& m : metrics_of(out)) {
    if (!m.contains("step")) continue;
    ++steps;
    EXPECT_EQ(m.value("routing_coverage", 0.0), 1.0);
    EXPECT_GT(m.value("routing_replayed_slots", 0), 0);
    EXPECT_LE(m.value("routing_differing", 1.0), 0.01);
    EXPECT_TRUE(std::isfinite(m.value("loss", NAN)));
    std::printf("[rl cuda] replay step %d: %lld slots replayed, differing %.4f\n",
                m.value("step", 0), static_cast<long long>(m.value("routing_replayed_slots", 0)),
                m.value("routing_differing", 0.0));
  }
  EXPECT_EQ(steps, 2);
}

}  // namespace
}  // namespace loom
