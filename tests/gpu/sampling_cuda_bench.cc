// The batched GPU sampler (kernels/cuda/sampling.h) at a real vocabulary, V = 163840, for 1 and
// 64 rows, with CUDA events (median of many timed calls after warm-up). Each figure is a whole
// sample_logits call, as the engine pays it: the upload of the rows, the kernels and the download
// of the results (which waits for them). Roofline: reading the logits once, k * V * 4 bytes, at the
// H200's measured copy rate (4.24 TB/s); a sampled row sorts its V entries and reads them several
// times more, so it is far from that bound by design. For comparison, "host_readback" is what
// the host sampler needed before any sampling began: the logits downloaded to the host. The
// greedy_logprobs cases separate the log-sum-exp (logprobs 0) from the raw top-n picks.
// Prints "GPUBENCH <name> <achieved> <unit> <roofline> <fraction> <median ms>" lines for
// tests/gpu/run.sh.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/device.h"
#include "kernels/cuda/sampling.h"
#include "kernels/exec.h"
#include "tests/gpu/gpu_test_support.h"

namespace loom {
namespace {

constexpr int64_t kVocab = 163840;
constexpr double kCopyGBs = 4240.0;  // H200 device copy, measured (tests/gpu/run.sh's table)

const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}

Tensor random_logits(int64_t rows) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 3.0f);
  Tensor h = Tensor::empty({rows, kVocab});
  for (int64_t i = 0; i < h.numel(); ++i) h.data<float>()[i] = d(rng);
  return h.to(Device::kCuda);
}

struct Case {
  const char* name;
  float temperature;
  int top_k;
  float top_p;
  int logprobs;
  const char* path;
};

void bench(const Case& c, int64_t rows, const Tensor& logits) {
  cuda::SampleBatch batch;
  for (int64_t r = 0; r < rows; ++r) {
    cuda::launch::SampleRow row;
    row.row = static_cast<int32_t>(r);
    row.temperature = c.temperature;
    row.top_k = c.top_k;
    row.top_p = c.top_p;
    row.logprobs = c.logprobs;
    row.u = (static_cast<double>(r) + 0.5) / static_cast<double>(rows);
    batch.rows.push_back(row);
  }
  const size_t bytes = cuda::sample_scratch_bytes(batch, kVocab, c.path);
  const Tensor scratch = Tensor::empty({static_cast<int64_t>(bytes)}, DType::kU8, Device::kCuda);
  std::vector<cuda::launch::SampleOut> out;
  const double ms = median_event_ms(
      cuda::stream_of(gpu()),
      [&](int) { cuda::sample_logits(gpu(), logits, batch, scratch, out, c.path); }, 30, 3);
  const double gbs = static_cast<double>(rows * kVocab * 4) / (ms * 1e-3) / 1e9;
  const std::string name = std::string("sampling_") + c.name + "_k" + std::to_string(rows);
  emit_gpubench(name.c_str(), gbs, "GB/s", kCopyGBs, ms);
  std::printf("  %s: scratch %.1f MB, first token %d\n", name.c_str(), bytes / 1e6, out[0].token);
}

void bench_readback(int64_t rows, const Tensor& logits) {
  std::vector<float> host(static_cast<size_t>(rows * kVocab));
  const double ms = median_event_ms(
      cuda::stream_of(gpu()),
      [&](int) { download(gpu(), host.data(), logits.raw(), host.size() * sizeof(float)); }, 30, 3);
  const double gbs = static_cast<double>(rows * kVocab * 4) / (ms * 1e-3) / 1e9;
  const std::string name = "sampling_host_readback_k" + std::to_string(rows);
  emit_gpubench(name.c_str(), gbs, "GB/s", kCopyGBs, ms);
}

}  // namespace
}  // namespace loom

int main() {
  using loom::Case;
  loom::cuda::init();
  const Case cases[] = {
      {"greedy", 0.0f, 0, 1.0f, -1, "auto"},
      {"greedy_logprobs0", 0.0f, 0, 1.0f, 0, "auto"},
      {"greedy_logprobs1", 0.0f, 0, 1.0f, 1, "auto"},
      {"greedy_logprobs20", 0.0f, 0, 1.0f, 20, "auto"},
      {"t1_topp09_segmented", 1.0f, 0, 0.9f, -1, "segmented"},
      {"t1_topp09_per_row", 1.0f, 0, 0.9f, -1, "per_row"},
      {"t07_topk40", 0.7f, 40, 1.0f, -1, "auto"},
      {"t1_full_logprobs5", 1.0f, 0, 1.0f, 5, "auto"},
  };
  for (int64_t rows : {int64_t{1}, int64_t{64}}) {
    const loom::Tensor logits = loom::random_logits(rows);
    for (const Case& c : cases) loom::bench(c, rows, logits);
    loom::bench_readback(rows, logits);
  }
  return 0;
}
