// --random_weights on the GPU against the CPU (engine/model/random_weights.h): the CUDA fill
// writes the host fill's bits for every parameter of small models of each family (f32 and bf16
// placements, a partial expert range, and the raw kernel at 64-bit counters), a forward of the
// small random models on the GPU matches the CPU within the f32 bound, and the
// Kimi-Linear-48B-A3B-shaped config of bench/configs fills on one GPU in bf16 and runs a finite
// forward (skipped when the device lacks the memory).
//
// Configs: two tiny ones written here (always run), plus the fixtures' config.json files when
// present (tests/gpu/model_test_support.h's fixtures_dir).
// Each check prints "GPUCHECK <name> <error> <bound> <PASS|FAIL>" for run.sh's table.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/random_weights.h"
#include "gtest/gtest.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/launch.h"
#include "kernels/exec.h"
#include "kernels/random_fill.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/gpu/model_test_support.h"

namespace loom {
namespace {

// A small kimi_linear model (KDA + MLA, a dense layer then MoE with a shared expert) and a small
// qwen3_next one (GDN + gated GQA with q/k norms, MoE with a gated shared expert, partial RoPE).
constexpr const char* kKimiTiny = R"({
  "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "hidden_act": "silu",
  "vocab_size": 384, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
  "num_attention_heads": 4, "num_key_value_heads": 4, "kv_lora_rank": 64, "q_lora_rank": null,
  "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "rms_norm_eps": 1e-5,
  "linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2, 3], "head_dim": 32,
                         "num_heads": 2, "short_conv_kernel_size": 4},
  "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 1,
  "moe_intermediate_size": 64, "first_k_dense_replace": 1, "routed_scaling_factor": 2.446,
  "num_expert_group": 1, "topk_group": 1, "moe_renormalize": true, "tie_word_embeddings": false
})";
constexpr const char* kQwenTiny = R"({
  "model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "hidden_act": "silu",
  "vocab_size": 352, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
  "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
  "linear_conv_kernel_dim": 4, "linear_key_head_dim": 32, "linear_num_key_heads": 2,
  "linear_num_value_heads": 4, "linear_value_head_dim": 32, "num_experts": 8,
  "num_experts_per_tok": 2, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
  "norm_topk_prob": true, "partial_rotary_factor": 0.25, "rope_theta": 10000.0,
  "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "tie_word_embeddings": false
})";

struct NamedConfig {
  std::string name;
  ModelConfig cfg;
};

// The tiny configs, then every fixture config found.
std::vector<NamedConfig> configs() {
  std::vector<NamedConfig> out;
  for (auto [name, text] :
       {std::pair{"kimi_tiny", kKimiTiny}, std::pair{"qwen3_next_tiny", kQwenTiny}}) {
    absl::StatusOr<ModelConfig> cfg = parse_model_config(text);
    EXPECT_TRUE(cfg.ok()) << name << ": " << cfg.status();
    if (cfg.ok()) out.push_back({name, *cfg});
  }
  for (const char* f :
       {"kimi_linear_s0", "kimi_linear_s1", "qwen3_next_s0", "deepseek_v3_s1", "fla_kda_s0"}) {
    const std::string dir = fixtures_dir() + "/" + f;
    if (!std::filesystem::exists(dir + "/config.json")) continue;
    absl::StatusOr<ModelConfig> cfg = load_random_weights_config(dir);
    EXPECT_TRUE(cfg.ok()) << dir << ": " << cfg.status();
    if (cfg.ok()) out.push_back({f, *cfg});
  }
  return out;
}

std::unique_ptr<Model> random_model(const ModelConfig& cfg, uint64_t seed, const Placement& p) {
  absl::StatusOr<std::unique_ptr<Model>> m = Model::load(cfg, random_weight_loader(cfg, seed), p);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

void check(const std::string& name, double err, double bound) {
  const bool pass = err <= bound;
  std::printf("GPUCHECK %s %.3e %.3e %s\n", name.c_str(), err, bound, pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  EXPECT_LE(err, bound) << name;
}

// How many of the tensors' bytes differ (0: bit-identical).
int64_t differing_bytes(const Tensor& host, const Tensor& device) {
  const Tensor back = device.to(Device::kCpu);
  if (back.nbytes() != host.nbytes())
    return static_cast<int64_t>(std::max(back.nbytes(), host.nbytes()));
  int64_t n = 0;
  const auto* a = static_cast<const unsigned char*>(host.raw());
  const auto* b = static_cast<const unsigned char*>(back.raw());
  for (size_t i = 0; i < host.nbytes(); ++i) n += a[i] != b[i];
  return n;
}

// Every parameter of the GPU model against the CPU model's, same seed and placement dtype.
TEST(RandomWeightsCuda, DeviceFillEqualsHostFillForEveryTensor) {
  ASSERT_TRUE(device_available(Device::kCuda).ok());
  const uint64_t seed = gpu_test_seed();
  for (const NamedConfig& c : configs()) {
    for (WeightDType dtype : {WeightDType::kF32, WeightDType::kBF16}) {
      auto cpu = random_model(c.cfg, seed, Placement{.dtype = dtype});
      auto gpu = random_model(c.cfg, seed, Placement{.device = Device::kCuda, .dtype = dtype});
      ASSERT_TRUE(cpu && gpu);
      const auto& h = cpu->parameters().entries();
      const auto& d = gpu->parameters().entries();
      ASSERT_EQ(h.size(), d.size());
      ASSERT_EQ(gpu->parameters().device(), Device::kCuda);
      int64_t bad = 0, tensors = 0;
      for (size_t i = 0; i < h.size(); ++i) {
        ASSERT_EQ(h[i].name, d[i].name);
        ASSERT_EQ(h[i].tensor.shape(), d[i].tensor.shape()) << h[i].name;
        ASSERT_EQ(h[i].tensor.dtype(), d[i].tensor.dtype()) << h[i].name;
        const int64_t diff = differing_bytes(h[i].tensor, d[i].tensor);
        EXPECT_EQ(diff, 0) << c.name << " " << h[i].name;
        bad += diff;
        ++tensors;
      }
      check(c.name + (dtype == WeightDType::kBF16 ? "_bf16" : "_f32") + "_fill_bytes_differing",
            static_cast<double>(bad), 0.0);
      EXPECT_GT(tensors, 10);
    }
  }
}

// A rank holding experts [3, 7) of 8 gets exactly those rows of the CPU's full expert tensors.
TEST(RandomWeightsCuda, ExpertRangeOnDeviceIsTheFullTensorsRows) {
  ASSERT_TRUE(device_available(Device::kCuda).ok());
  const ModelConfig cfg = *parse_model_config(kKimiTiny);
  auto cpu = random_model(cfg, 17, Placement{.dtype = WeightDType::kBF16});
  auto gpu = random_model(
      cfg, 17,
      Placement{
          .device = Device::kCuda, .dtype = WeightDType::kBF16, .experts = ExpertRange{3, 7}});
  ASSERT_TRUE(cpu && gpu);
  int experts = 0;
  for (const auto& e : gpu->parameters().entries()) {
    const Tensor& full = *cpu->parameters().find(e.name);
    const Tensor want = e.tensor.shape() == full.shape() ? full : full.slice(0, 3, 7).clone();
    experts += e.tensor.shape() != full.shape();
    EXPECT_EQ(differing_bytes(want, e.tensor), 0) << e.name;
  }
  EXPECT_EQ(experts, 3 * 3);  // gate, up, down of the three MoE layers
}

// The kernel itself at counters past 2^32 and 2^40, odd lengths and offsets, both dtypes.
TEST(RandomWeightsCuda, KernelMatchesHostAtLargeCounters) {
  ASSERT_TRUE(device_available(Device::kCuda).ok());
  const Exec gpu = exec_for(Device::kCuda);
  std::mt19937_64 rng(gpu_test_seed());
  for (int64_t first : {int64_t{0}, int64_t{1} << 32, (int64_t{1} << 40) + 12345}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const int64_t n = 3'000'017;
      const RandomFillParams p{
          .key = rng(), .first = first, .center = -0.75f, .half_width = 0.0371f};
      const Tensor h = Tensor::empty({n}, dtype);
      const Tensor d = Tensor::empty({n}, dtype, Device::kCuda);
      random_fill(host_exec(), h, p);
      random_fill(gpu, d, p);
      check(std::string("kernel_") + (dtype == DType::kBF16 ? "bf16" : "f32") + "_first_" +
                std::to_string(first),
            static_cast<double>(differing_bytes(h, d)), 0.0);
    }
  }
}

// One forward of `ids` through a fresh private cache; all logits, on the host.
Tensor logits_of(const Model& m, SequenceCache& cache, const std::vector<int32_t>& ids,
                 LogitsMode mode = LogitsMode::kAll) {
  ForwardBatch b;
  b.token_ids = ids;
  b.seqs.push_back(
      {.num_tokens = static_cast<int64_t>(ids.size()), .logits = mode, .cache = &cache});
  absl::StatusOr<Tensor> logits = m.forward(b);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? logits->to(Device::kCpu) : Tensor();
}

// Prefill and three decode steps of the random f32 models: GPU logits against CPU logits within
// the fixtures' f32 bound (1e-4 relative L2; the backends differ only in summation order).
TEST(RandomWeightsCuda, ForwardMatchesCpu) {
  ASSERT_TRUE(device_available(Device::kCuda).ok());
  const uint64_t seed = gpu_test_seed();
  std::mt19937_64 rng(seed);
  for (const NamedConfig& c : configs()) {
    auto cpu = random_model(c.cfg, seed, Placement{.dtype = WeightDType::kF32});
    auto gpu =
        random_model(c.cfg, seed, Placement{.device = Device::kCuda, .dtype = WeightDType::kF32});
    ASSERT_TRUE(cpu && gpu);
    SequenceCache hc = cpu->new_cache(), dc = gpu->new_cache();
    const std::vector<int32_t> prompt = random_ids(45, c.cfg.vocab_size, rng);
    double err = rel_l2(logits_of(*gpu, dc, prompt), logits_of(*cpu, hc, prompt));
    for (int s = 0; s < 3; ++s) {
      const std::vector<int32_t> next = random_ids(1, c.cfg.vocab_size, rng);
      err = std::max(err, rel_l2(logits_of(*gpu, dc, next, LogitsMode::kLast),
                                 logits_of(*cpu, hc, next, LogitsMode::kLast)));
    }
    check(c.name + "_random_forward_f32", err, 1e-4);
  }
}

// A small kimi_linear model with the DeepSeek/Kimi MLA head dims (dn = dv = 128, dr = 64, R =
// 512), which the GPU's expanded MLA form supports. Dense FFNs in both layers: a random router's
// near-ties flip under bf16 rounding of the attention (LOOM_GPU_TEST_SEED=2707238239 moved the
// logits by 2.8e-2 where other seeds give 7e-4, suspected a flipped expert), and this test is
// about the attention.
constexpr const char* kKimiMlaHeads = R"({
  "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "hidden_act": "silu",
  "vocab_size": 320, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
  "num_attention_heads": 3, "num_key_value_heads": 3, "kv_lora_rank": 512, "q_lora_rank": null,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-5,
  "linear_attn_config": {"full_attn_layers": [2], "kda_layers": [1], "head_dim": 32,
                         "num_heads": 2, "short_conv_kernel_size": 4},
  "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 1,
  "moe_intermediate_size": 64, "first_k_dense_replace": 2, "routed_scaling_factor": 2.446,
  "num_expert_group": 1, "topk_group": 1, "moe_renormalize": true, "tie_word_embeddings": false
})";

// Prefill chunks long enough for MLA's expanded form on the GPU (kernels/cuda/attention.h): a
// 300-token prompt beside another sequence's 6-token one, then a step that mixes its next
// 200-token chunk (expanded, over 500 keys) with that sequence's decode row (absorbed, as a
// sub-batch), over bf16 KV
// pages on both sides; every logit row against the CPU's (the same bf16 pages, f32 arithmetic).
// The GPU's batch-invariant mode (absorbed everywhere, tensor cores) is measured beside it: both
// round q, the keys and the softmax weights to bf16 for their products, so both sit near the
// bf16 rounding of one product (2^-9 relative) and the bound is 10x that.
TEST(RandomWeightsCuda, MlaExpandedPrefillMatchesCpu) {
  ASSERT_TRUE(device_available(Device::kCuda).ok());
  const uint64_t seed = gpu_test_seed();
  std::mt19937_64 rng(seed + 7);
  const absl::StatusOr<ModelConfig> cfg = parse_model_config(kKimiMlaHeads);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto cpu = random_model(*cfg, seed, Placement{.dtype = WeightDType::kF32});
  auto gpu =
      random_model(*cfg, seed, Placement{.device = Device::kCuda, .dtype = WeightDType::kF32});
  ASSERT_TRUE(cpu && gpu);
  const int64_t page = 16;
  CacheStore::Options opt{
      .num_pages = 80, .page_size = page, .num_slots = 4, .kv_dtype = DType::kBF16};
  CacheStore::Options gopt = opt;
  gopt.device = Device::kCuda;
  const std::vector<int32_t> a = random_ids(500, cfg->vocab_size, rng);
  const std::vector<int32_t> b = random_ids(7, cfg->vocab_size, rng);
  std::vector<int32_t> table_a(40), table_b(4);
  for (int i = 0; i < 40; ++i) table_a[i] = 79 - 2 * i;  // scattered pages
  for (int i = 0; i < 4; ++i) table_b[i] = 2 * i;
  // Round 0: b[0, 6) and a[0, 300); round 1: b[6] (a decode row) and a[300, 500).
  auto run = [&](const Model& m, CacheStore& store, bool invariant) {
    std::vector<Tensor> out;
    if (store.has_linear()) {
      store.reset_slot(1);
      store.reset_slot(2);
    }
    for (int round = 0; round < 2; ++round) {
      ForwardBatch fb;
      fb.store = &store;
      fb.batch_invariant = invariant;
      const int64_t a0 = round == 0 ? 0 : 300, an = round == 0 ? 300 : 200;
      const int64_t b0 = round == 0 ? 0 : 6, bn = round == 0 ? 6 : 1;
      fb.token_ids.assign(b.begin() + b0, b.begin() + b0 + bn);
      fb.token_ids.insert(fb.token_ids.end(), a.begin() + a0, a.begin() + a0 + an);
      fb.seqs.push_back(
          {.num_tokens = bn, .logits = LogitsMode::kAll, .start = b0, .slot = 2, .pages = table_b});
      fb.seqs.push_back(
          {.num_tokens = an, .logits = LogitsMode::kAll, .start = a0, .slot = 1, .pages = table_a});
      absl::StatusOr<Tensor> logits = m.forward(fb);
      EXPECT_TRUE(logits.ok()) << logits.status();
      out.push_back(logits.ok() ? logits->to(Device::kCpu) : Tensor());
    }
    return out;
  };
  auto cs = CacheStore::create(cpu->config(), opt);
  auto gs = CacheStore::create(gpu->config(), gopt);
  ASSERT_TRUE(cs.ok() && gs.ok()) << cs.status() << gs.status();
  const std::vector<Tensor> ref = run(*cpu, **cs, false);
  const uint64_t before = cuda::mla_expanded_sequences_run();
  const std::vector<Tensor> expanded = run(*gpu, **gs, false);
  // The 300- and 200-row chunks of the one MLA layer took the expanded form; nothing else did.
  EXPECT_EQ(cuda::mla_expanded_sequences_run() - before, 2u);
  const uint64_t mid = cuda::mla_expanded_sequences_run();
  const std::vector<Tensor> absorbed = run(*gpu, **gs, true);
  EXPECT_EQ(cuda::mla_expanded_sequences_run(), mid) << "batch-invariant mode runs absorbed";
  double err_x = 0, err_a = 0;
  for (int round = 0; round < 2; ++round) {
    err_x = std::max(err_x, rel_l2(expanded[round], ref[round]));
    err_a = std::max(err_a, rel_l2(absorbed[round], ref[round]));
  }
  std::printf("GPUINFO mla_heads_absorbed_invariant_vs_cpu %.3e\n", err_a);
  check("mla_heads_expanded_prefill_vs_cpu", err_x, 10 * std::ldexp(1.0, -9));
}

std::string bench_config(const char* name) {
  if (const char* env = std::getenv("LOOM_BENCH_CONFIGS")) return std::string(env) + "/" + name;
  return std::string("bench/configs/") + name;  // run.sh runs from the repository root
}

// The 48B-shaped model (about 99 GB in bf16) filled on one GPU: the fill's rate, and a finite
// forward (a 64-token prefill and a decode step) through all 27 layers.
TEST(RandomWeightsCuda, Kimi48bShapedFillsAndRunsOnOneGpu) {
  ASSERT_TRUE(device_available(Device::kCuda).ok());
  const std::string path = bench_config("kimi_linear_48b_a3b");
  if (!std::filesystem::exists(path + "/config.json")) GTEST_SKIP() << "no " << path;
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  constexpr double kNeed = 99.1e9 + 4.0 * (1ull << 30);  // weights, then caches and workspace
  if (free_bytes < kNeed)
    GTEST_SKIP() << "the device has " << free_bytes / 1e9 << " GB free; the 48B shape needs "
                 << kNeed / 1e9;
  // kAuto, as the server's default --weight_dtype: bf16 matrices for random weights on a GPU.
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<Model>> m =
      Model::load_random(path, 1, Placement{.device = Device::kCuda, .dtype = WeightDType::kAuto});
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double bytes = static_cast<double>((*m)->parameters().bytes());
  std::printf("GPUBENCH random_weights_fill_48b %.1f GB/s load %.2f s for %.2f GB\n",
              bytes / secs / 1e9, secs, bytes / 1e9);
  EXPECT_EQ((*m)->placement().dtype, WeightDType::kBF16);
  EXPECT_NEAR(bytes / 99.09e9, 1.0, 0.01);

  std::mt19937_64 rng(gpu_test_seed());
  SequenceCache cache = (*m)->new_cache();
  const Tensor prefill = logits_of(**m, cache, random_ids(64, 163840, rng), LogitsMode::kLast);
  const Tensor decode = logits_of(**m, cache, random_ids(1, 163840, rng), LogitsMode::kLast);
  for (const Tensor* t : {&prefill, &decode}) {
    ASSERT_EQ(t->numel(), 163840);
    double ss = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < t->numel(); ++i) {
      const float v = t->data<float>()[i];
      bad += !std::isfinite(v);
      ss += double(v) * v;
    }
    const double rms = std::sqrt(ss / t->numel());
    check("kimi_48b_random_nonfinite_logits", static_cast<double>(bad), 0.0);
    std::printf("kimi_48b random logits rms %.3f\n", rms);
    EXPECT_GT(rms, 0.05);
    EXPECT_LT(rms, 100.0);
  }
}

}  // namespace
}  // namespace loom
