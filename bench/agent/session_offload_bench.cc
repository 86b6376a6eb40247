// loom-bench-session-offload: what a session's next turn costs when its kept cache stayed on the
// device, when it was offloaded to host memory and is copied back (engine/session_offload.h), and
// when it was evicted and the history is recomputed (no prefix cache: under the memory pressure
// that evicts a session, its prefix-cache entries went first). One conversation per history
// length: a first turn of `history` prompt tokens, then --turns timed turns of --new_tokens each
// (one generated token), every turn's end parking, offloading or evicting the cache again. Prints
// a Markdown table for bench/results/agent-sessions-cpu.md (on a GPU, bench/results/gpu-h200.md),
// with the copy time of the cache's bytes: the restore's floor (a host memcpy on the CPU, where
// both tiers are host memory; a page-locked host to device copy on a GPU).
//
// --device cuda runs the engine on the GPU; --random_weights SEED fills the config at --model
// with random weights (a production-shaped model without a checkpoint, as loom-bench offline).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/allocator.h"
#include "engine/engine.h"
#include "engine/model/random_weights.h"
#include "kernels/exec.h"
#include "weights/parameter_arena.h"

ABSL_FLAG(std::string, model, "../shared/fixtures/kimi_linear_s1", "model directory");
ABSL_FLAG(std::string, histories, "8192,32768", "comma-separated history lengths (tokens)");
ABSL_FLAG(int, new_tokens, 16, "new prompt tokens per timed turn");
ABSL_FLAG(int, turns, 5, "timed turns per history length and mode (the median is reported)");
ABSL_FLAG(int, max_num_batched_tokens, 2048, "engine token budget per step");
ABSL_FLAG(int64_t, cache_budget_mb, 1024, "KV pages + linear-state slots, MiB");
ABSL_FLAG(std::string, device, "cpu", "cpu, cuda or cuda:N");
ABSL_FLAG(std::string, weight_dtype, "auto", "weight matrices: auto, f32, bf16 or fp8");
ABSL_FLAG(std::string, random_weights, "",
          "random weights from this seed for the config.json at --model (no checkpoint)");

namespace loom {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<int32_t> random_tokens(int len, int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(3, vocab - 1);
  std::vector<int32_t> p(len);
  for (int32_t& t : p) t = d(rng);
  return p;
}

Request turn(std::vector<int32_t> tokens) {
  Request r;
  r.prompt = std::move(tokens);
  r.params.temperature = 0;
  r.params.max_tokens = 1;
  r.params.ignore_eos = true;
  r.session = "bench";
  return r;
}

// Runs the request to its end; returns milliseconds from submit to the final event.
double run(Engine& e, Request r) {
  const auto t0 = Clock::now();
  auto s = e.submit(std::move(r));
  if (!s.ok()) {
    std::fprintf(stderr, "loom-bench-session-offload: %s\n",
                 std::string(s.status().message()).c_str());
    std::exit(1);
  }
  while (auto ev = (*s)->next())
    if (ev->finish && *ev->finish != FinishReason::kLength) {
      std::fprintf(stderr, "loom-bench-session-offload: a turn ended with %s\n", ev->error.c_str());
      std::exit(1);
    }
  return ms_since(t0);
}

enum class Mode { kResident, kOffloaded, kRecomputed };

struct Result {
  double turn_ms = 0;
  int64_t offload_bytes = 0;  // the cache's bytes in the host tier before a turn (offloaded)
  int64_t restores = 0, evictions = 0, hit_tokens = 0;
};

[[noreturn]] void fail(const absl::Status& st) {
  std::fprintf(stderr, "loom-bench-session-offload: %s\n", std::string(st.message()).c_str());
  std::exit(1);
}

// The flags' placement; the device is checked (device_available) before anything is allocated.
Placement placement_from_flags() {
  auto device = parse_device(absl::GetFlag(FLAGS_device));
  if (!device.ok()) fail(device.status());
  if (absl::Status st = device_available(*device); !st.ok()) fail(st);
  auto wdt = parse_weight_dtype(absl::GetFlag(FLAGS_weight_dtype));
  if (!wdt.ok()) fail(wdt.status());
  return Placement{.device = *device, .dtype = *wdt};
}

std::unique_ptr<Model> load_model() {
  const Placement placement = placement_from_flags();
  absl::StatusOr<std::unique_ptr<Model>> model;
  if (absl::GetFlag(FLAGS_random_weights).empty()) {
    model = Model::load(absl::GetFlag(FLAGS_model), placement);
  } else {
    auto seed = parse_random_weights_seed(absl::GetFlag(FLAGS_random_weights));
    if (!seed.ok()) fail(seed.status());
    model = Model::load_random(absl::GetFlag(FLAGS_model), *seed, placement);
  }
  if (!model.ok()) fail(model.status());
  return std::move(*model);
}

Result measure(Mode mode, int history, std::mt19937& rng) {
  std::unique_ptr<Model> model = load_model();
  const int vocab = static_cast<int>(model->config().vocab_size);
  EngineOptions opt;
  opt.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  opt.cache_budget_bytes = absl::GetFlag(FLAGS_cache_budget_mb) << 20;
  opt.enable_prefix_cache = false;
  opt.max_model_len = history + 64 * (absl::GetFlag(FLAGS_turns) + 1) * 2 + 64;
  if (mode != Mode::kResident) opt.sessions_max_bytes = 1;  // no session stays on the device
  if (mode == Mode::kRecomputed) opt.session_offload_bytes = 0;
  auto e = Engine::create(std::move(model), nullptr, opt);
  if (!e.ok()) fail(e.status());
  run(**e, turn(random_tokens(history, vocab, rng)));
  std::vector<double> times;
  Result out;
  for (int i = 0; i < absl::GetFlag(FLAGS_turns); ++i) {
    (*e)->wait_idle();
    out.offload_bytes = std::max(out.offload_bytes, (*e)->stats().session_offload_bytes);
    times.push_back(run(**e, turn(random_tokens(absl::GetFlag(FLAGS_new_tokens), vocab, rng))));
  }
  (*e)->wait_idle();
  out.turn_ms = median(times);
  out.restores = (*e)->stats().session_restores;
  out.evictions = (*e)->stats().session_evictions;
  out.hit_tokens = (*e)->stats().prefix_hit_tokens;
  return out;
}

// The copy time of `bytes` into `device`'s memory (median of 5, warm buffers): a restore's floor.
// On the CPU a memcpy; on a GPU from page-locked host memory (allocate_transfer_buffer, as the
// host tier's blobs) to the device.
double copy_ms(int64_t bytes, Device device) {
  const auto n = static_cast<size_t>(bytes);
  std::shared_ptr<void> src = allocate_transfer_buffer(n, device);
  std::memset(src.get(), 1, n);
  const Tensor dst = Tensor::empty({(bytes + 3) / 4}, DType::kF32, device);
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    copy_bytes(dst.raw(), device, src.get(), Device::kCpu, n);
    t.push_back(ms_since(t0));
  }
  return median(t);
}

int main_impl() {
  std::vector<int> histories;
  for (absl::string_view h : absl::StrSplit(absl::GetFlag(FLAGS_histories), ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(h, &v) || v < 1) {
      std::fprintf(stderr, "loom-bench-session-offload: bad --histories entry '%s'\n",
                   std::string(h).c_str());
      return 2;
    }
    histories.push_back(v);
  }
  if (absl::GetFlag(FLAGS_new_tokens) < 1 || absl::GetFlag(FLAGS_turns) < 1) {
    std::fprintf(stderr, "loom-bench-session-offload: --new_tokens and --turns must be >= 1\n");
    return 2;
  }
  std::printf(
      "| history | cache bytes | kept on device ms | offloaded, restored ms | evicted, recomputed "
      "ms | restore - kept ms | copy of the bytes ms | recompute / restore |\n"
      "|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int h : histories) {
    std::mt19937 rng(h);
    const Result kept = measure(Mode::kResident, h, rng);
    const Result off = measure(Mode::kOffloaded, h, rng);
    const Result lost = measure(Mode::kRecomputed, h, rng);
    // Every timed turn restored with offload, and recomputed everything without.
    if (off.restores != absl::GetFlag(FLAGS_turns) || off.evictions != 0 || lost.restores != 0 ||
        lost.hit_tokens != 0) {
      std::fprintf(stderr,
                   "loom-bench-session-offload: history %d: %lld restores and %lld evictions with "
                   "offload, %lld restores and %lld cached tokens without: not the intended "
                   "modes\n",
                   h, static_cast<long long>(off.restores), static_cast<long long>(off.evictions),
                   static_cast<long long>(lost.restores), static_cast<long long>(lost.hit_tokens));
      return 1;
    }
    std::printf("| %d | %lld | %.2f | %.2f | %.1f | %.2f | %.3f | %.0fx |\n", h,
                static_cast<long long>(off.offload_bytes), kept.turn_ms, off.turn_ms, lost.turn_ms,
                off.turn_ms - kept.turn_ms,
                copy_ms(off.offload_bytes, placement_from_flags().device),
                lost.turn_ms / off.turn_ms);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return loom::main_impl();
}
