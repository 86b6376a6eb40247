// loom-bench-engine: end-to-end engine throughput on the CPU or a GPU (--device). Output tokens per
// second at several concurrencies (greedy, EOS ignored so every request generates exactly
// max_tokens) and the time to first token of a long prompt. Prints a Markdown table for
// bench/results/engine-cpu.md (and the GPU runs of bench/results/gpu-h200.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "engine/engine.h"
#include "engine/model/cache_store.h"
#include "engine/model/random_weights.h"
#include "kernels/exec.h"

ABSL_FLAG(std::string, model, "../shared/fixtures/kimi_linear_s1",
          "model directory (with --random_weights: a config.json or a directory holding one)");
ABSL_FLAG(std::string, random_weights, "",
          "SEED: random weights for --model's config.json, filled on the device (the server's "
          "flag; e.g. --model bench/configs/kimi_linear_48b_a3b --random_weights 1)");
ABSL_FLAG(std::string, concurrency, "1,8,32", "comma-separated concurrency levels");
ABSL_FLAG(int, prompt_len, 128, "prompt tokens per request in the throughput runs");
ABSL_FLAG(int, max_tokens, 64, "generated tokens per request");
ABSL_FLAG(int, ttft_prompt_len, 2000, "prompt tokens of the time-to-first-token run");
ABSL_FLAG(int, max_num_batched_tokens, 2048, "engine token budget per step");
ABSL_FLAG(bool, deterministic, false, "batch-invariant numerics (the server's --deterministic)");
ABSL_FLAG(std::string, device, "cpu", "where the model runs: cpu, cuda or cuda:N (the server's)");
ABSL_FLAG(std::string, weight_dtype, "auto",
          "weight matrices: auto, f32, bf16 or fp8 (the server's)");
ABSL_FLAG(std::string, act_dtype, "auto", "activations: auto, f32 or bf16 (the server's)");
ABSL_FLAG(std::string, kv_dtype, "auto", "KV pages: auto, f32, bf16 or fp8 (the server's)");
ABSL_FLAG(int64_t, cache_budget_mb, 0,
          "KV pages + linear-state slots, MiB (the server's: 0 = derived from free memory on a "
          "GPU, 1024 on the CPU)");
ABSL_FLAG(double, gpu_memory_utilization, 0.9, "the server's");
ABSL_FLAG(bool, cuda_graphs, true, "decode steps as CUDA graphs on a GPU (the server's)");
ABSL_FLAG(int, max_num_seqs, 64,
          "sequences per step (the server's); at least the largest concurrency");

namespace loom {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int32_t> random_prompt(int len, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(3, vocab - 1);
  std::vector<int32_t> p(len);
  for (int32_t& t : p) t = d(rng);
  return p;
}

std::unique_ptr<Engine> make_engine() {
  const absl::StatusOr<Device> device = parse_device(absl::GetFlag(FLAGS_device));
  const absl::StatusOr<WeightDType> dtype = parse_weight_dtype(absl::GetFlag(FLAGS_weight_dtype));
  const absl::StatusOr<ActivationDType> act =
      parse_activation_dtype(absl::GetFlag(FLAGS_act_dtype));
  const absl::StatusOr<std::optional<DType>> kv_dtype =
      parse_kv_dtype(absl::GetFlag(FLAGS_kv_dtype));
  for (const absl::Status& st :
       {device.status(), dtype.status(), act.status(), kv_dtype.status()}) {
    if (!st.ok()) {
      std::fprintf(stderr, "loom-bench-engine: %s\n", std::string(st.message()).c_str());
      std::exit(2);
    }
  }
  const Placement placement{.device = *device, .dtype = *dtype, .activations = *act};
  const std::string seed = absl::GetFlag(FLAGS_random_weights);
  absl::StatusOr<uint64_t> random_seed = uint64_t{0};
  if (!seed.empty()) random_seed = parse_random_weights_seed(seed);
  if (!random_seed.ok()) {
    std::fprintf(stderr, "loom-bench-engine: %s\n",
                 std::string(random_seed.status().message()).c_str());
    std::exit(2);
  }
  const auto load_start = Clock::now();
  auto model = seed.empty()
                   ? Model::load(absl::GetFlag(FLAGS_model), placement)
                   : Model::load_random(absl::GetFlag(FLAGS_model), *random_seed, placement);
  if (!model.ok()) {
    std::fprintf(stderr, "loom-bench-engine: %s\n", std::string(model.status().message()).c_str());
    std::exit(1);
  }
  std::fprintf(stderr, "loom-bench-engine: %s: %.3f GB of parameters (%s) loaded in %.2f s\n",
               absl::GetFlag(FLAGS_model).c_str(), (*model)->parameters().bytes() / 1e9,
               (*model)->placement().describe().c_str(),
               std::chrono::duration<double>(Clock::now() - load_start).count());
  EngineOptions opt;
  opt.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  opt.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  opt.cache_budget_bytes = absl::GetFlag(FLAGS_cache_budget_mb) << 20;
  if (opt.cache_budget_bytes == 0 && device->is_cpu()) opt.cache_budget_bytes = int64_t{1} << 30;
  opt.gpu_memory_utilization = absl::GetFlag(FLAGS_gpu_memory_utilization);
  opt.enable_prefix_cache = false;  // random prompts: nothing to share; keep the work honest
  opt.deterministic = absl::GetFlag(FLAGS_deterministic);
  opt.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  opt.kv_dtype = *kv_dtype;
  const DType act_dtype = (*model)->act_dtype();  // what kv_dtype auto resolves to
  auto e = Engine::create(std::move(*model), nullptr, opt);
  if (!e.ok()) {
    std::fprintf(stderr, "loom-bench-engine: %s\n", std::string(e.status().message()).c_str());
    std::exit(1);
  }
  if (const auto& plan = (*e)->memory_plan())
    std::fprintf(stderr, "loom-bench-engine: %s\n", plan->describe().c_str());
  if (const auto& graphs = (*e)->graph_capture())
    std::fprintf(stderr, "loom-bench-engine: %s\n", graphs->describe().c_str());
  const EngineStats st = (*e)->stats();
  const ModelConfig& cfg = (*e)->config();
  const DType kv = opt.kv_dtype.value_or(act_dtype);
  std::fprintf(stderr,
               "loom-bench-engine: caches: %d KV pages of %d tokens (%zu bytes each, kv %s), %d "
               "state slots (%zu bytes each)\n",
               st.pages_total, opt.page_size, CacheStore::page_bytes(cfg, opt.page_size, kv),
               std::string(dtype_name(kv)).c_str(), st.slots_total,
               CacheStore::slot_bytes(cfg, act_dtype));
  return std::move(*e);
}

int run() {
  std::mt19937 rng(1);
  auto engine = make_engine();
  const int vocab = engine->config().vocab_size;
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.ignore_eos = true;
  greedy.max_tokens = absl::GetFlag(FLAGS_max_tokens);

  // Warm-up: first-touch page faults and OpenBLAS thread start-up.
  {
    Request r{random_prompt(64, vocab, rng), greedy};
    auto s = *engine->submit(r);
    while (s->next()) {
    }
  }
  // Step ms: the median gap between request 0's tokens, read as they arrive (the others are
  // drained afterwards): a decode step's time once every prompt is in, prefill steps left out.
  std::printf(
      "| concurrency | requests | output tokens | seconds | output tok/s | per-request tok/s | "
      "decode step ms (median) |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_concurrency), ',')) {
    const int conc = std::stoi(std::string(c));
    std::vector<std::shared_ptr<RequestStream>> streams;
    const auto t0 = Clock::now();
    for (int i = 0; i < conc; ++i) {
      Request r{random_prompt(absl::GetFlag(FLAGS_prompt_len), vocab, rng), greedy};
      streams.push_back(*engine->submit(r));
    }
    int64_t tokens = 0;
    std::vector<double> gaps;
    auto last = Clock::now();
    for (size_t i = 0; i < streams.size(); ++i)
      while (auto ev = streams[i]->next()) {
        tokens += static_cast<int64_t>(ev->token_ids.size());
        if (i != 0 || ev->token_ids.empty()) continue;
        const auto now = Clock::now();
        if (tokens > 1) gaps.push_back(std::chrono::duration<double>(now - last).count());
        last = now;
      }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    double step_ms = 0;
    if (!gaps.empty()) {
      std::nth_element(gaps.begin(), gaps.begin() + gaps.size() / 2, gaps.end());
      step_ms = gaps[gaps.size() / 2] * 1e3;
    }
    std::printf("| %d | %d | %lld | %.2f | %.1f | %.1f | %.2f |\n", conc, conc,
                static_cast<long long>(tokens), secs, tokens / secs, tokens / secs / conc, step_ms);
  }
  // Time to first token of one long prompt, on an idle engine.
  SamplingParams one = greedy;
  one.max_tokens = 1;
  Request r{random_prompt(absl::GetFlag(FLAGS_ttft_prompt_len), vocab, rng), one};
  const auto t0 = Clock::now();
  auto s = *engine->submit(r);
  auto first = s->next();
  const double ttft = std::chrono::duration<double>(Clock::now() - t0).count();
  while (s->next()) {
  }
  std::printf("\nTime to first token, %d-token prompt, idle engine: %.1f ms (%.0f prompt tok/s)\n",
              absl::GetFlag(FLAGS_ttft_prompt_len), ttft * 1e3,
              absl::GetFlag(FLAGS_ttft_prompt_len) / ttft);
  return first ? 0 : 1;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return loom::run();
}
