// Where a decode step's (or a prefill chunk's) device time goes, kernel by kernel.
//
//   decode_step_profile MODEL_DIR [BATCH] [CONTEXT] [STEPS] [PREFILL]
//
// Loads MODEL_DIR's config.json with random weights on the GPU (bf16 matrices and activations, as
// the engine runs them), prefills BATCH sequences of CONTEXT random tokens each, then times STEPS
// eager decode steps (every sequence one token; wall clock around forward + synchronize) and runs
// one more step between cudaProfilerStart and cudaProfilerStop, so that
//
//   ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv ...
//
// lists exactly that step's kernels. The eager wall time less the kernels' summed time is what the
// step loses to launches and host work; CUDA graphs (the engine's default) remove most of that.
// With PREFILL > 0 the timed and profiled step is instead the prefill of a new sequence's first
// PREFILL tokens (an empty cache each time: the time to first token of such a prompt; the timing
// includes the cache's allocation, the profile lists kernels only); BATCH and CONTEXT are unused.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/sequence_cache.h"
#include "tests/gpu/model_test_support.h"

namespace loom {
namespace {

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR [BATCH] [CONTEXT] [STEPS]\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  const int batch = argc > 2 ? std::atoi(argv[2]) : 1;
  const int64_t context = argc > 3 ? std::atoll(argv[3]) : 4096;
  const int steps = argc > 4 ? std::atoi(argv[4]) : 20;
  const int64_t prefill = argc > 5 ? std::atoll(argv[5]) : 0;
  if (batch < 1 || context < 1 || steps < 1 || prefill < 0) {
    std::fprintf(stderr, "BATCH, CONTEXT and STEPS must be >= 1, PREFILL >= 0\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Model>> m =
      Model::load_random(path, 1,
                         Placement{.device = Device::kCuda,
                                   .dtype = WeightDType::kBF16,
                                   .activations = ActivationDType::kBF16});
  if (!m.ok()) {
    std::fprintf(stderr, "load: %s\n", m.status().ToString().c_str());
    return 1;
  }
  const int64_t vocab = (*m)->config().vocab_size;
  std::mt19937_64 rng(1);
  std::vector<SequenceCache> caches;
  caches.reserve(static_cast<size_t>(batch));
  for (int b = 0; b < (prefill > 0 ? 0 : batch); ++b) {
    caches.push_back((*m)->new_cache());
    // Prefill in chunks of at most 8192 tokens, as the engine's default budget does.
    for (int64_t done = 0; done < context;) {
      const int64_t n = std::min<int64_t>(8192, context - done);
      ForwardBatch fb;
      fb.token_ids = random_ids(n, vocab, rng);
      fb.seqs.push_back({.num_tokens = n, .logits = LogitsMode::kLast, .cache = &caches.back()});
      absl::StatusOr<Tensor> l = (*m)->forward(fb);
      if (!l.ok()) {
        std::fprintf(stderr, "prefill: %s\n", l.status().ToString().c_str());
        return 1;
      }
      done += n;
    }
  }
  std::vector<SequenceCache> chunk_cache;
  auto step = [&]() -> bool {
    ForwardBatch fb;
    if (prefill > 0) {
      chunk_cache.clear();
      chunk_cache.push_back((*m)->new_cache());
      fb.token_ids = random_ids(prefill, vocab, rng);
      fb.seqs.push_back(
          {.num_tokens = prefill, .logits = LogitsMode::kLast, .cache = &chunk_cache.back()});
    } else {
      fb.token_ids = random_ids(batch, vocab, rng);
      for (SequenceCache& c : caches)
        fb.seqs.push_back({.num_tokens = 1, .logits = LogitsMode::kLast, .cache = &c});
    }
    absl::StatusOr<Tensor> l = (*m)->forward(fb);
    if (!l.ok())
      std::fprintf(stderr, "%s: %s\n", prefill > 0 ? "prefill" : "decode",
                   l.status().ToString().c_str());
    return l.ok() && cudaDeviceSynchronize() == cudaSuccess;
  };
  for (int i = 0; i < 3; ++i)
    if (!step()) return 1;
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!step()) return 1;
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("%s batch %d context %lld prefill %lld eager median %.3f ms min %.3f ms (%d steps)\n",
              prefill > 0 ? "PREFILLSTEP" : "DECODESTEP", batch, static_cast<long long>(context),
              static_cast<long long>(prefill), ms[ms.size() / 2], ms.front(), steps);
  cudaProfilerStart();
  const bool ok = step();
  cudaProfilerStop();
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) { return loom::run(argc, argv); }
