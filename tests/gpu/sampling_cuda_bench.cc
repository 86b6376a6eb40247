// The batched GPU sampler (kernels/cuda/sampling.h) at real vocabularies, V = 163840 and 151936,
// for 1, 8, 64 and 256 rows, with CUDA events (median of many timed calls after warm-up). Each
// figure is a whole sample_logits call, as the engine pays it: the upload of the rows, the kernels
// and the download of the results (which waits for them). Sampled rows are timed on every sort
// path in the same run: "select" (the default: a radix select of each row's top entries, a full
// sort only for the rows whose cut or pick falls past them) against the two full sorts it
// replaced ("segmented", "per_row"). Roofline: reading the logits once, k * V * 4 bytes, at the
// device copy rate measured at the start of this run (bytes read plus written by one large
// device-to-device copy, per second). The logits are normal with sd 3 and row r draws u = (r +
// 0.5) / k, so at top_p = 1 the rows with the largest draws pick past the candidates and take the
// full sort (the "full" column says how many). For comparison, "host_readback" is what the host
// sampler needed before any sampling began: the logits downloaded to the host. Prints "GPUBENCH
// <name> <achieved> <unit> <roofline> <fraction> <median ms>" lines for tests/gpu/run.sh.
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

const Exec& gpu() {
  static const Exec ex = cuda::device_exec(0);
  return ex;
}

// Bytes read plus written per second by one 1 GiB device-to-device copy.
double measure_copy_gbs() {
  const int64_t bytes = int64_t{1} << 30;
  const Tensor a = Tensor::empty({bytes}, DType::kU8, Device::kCuda);
  const Tensor b = Tensor::empty({bytes}, DType::kU8, Device::kCuda);
  const cudaStream_t s = cuda::stream_of(gpu());
  const double ms = median_event_ms(
      s,
      [&](int) {
        LOOM_CUDA_CHECK(cudaMemcpyAsync(b.raw(), a.raw(), bytes, cudaMemcpyDeviceToDevice, s));
      },
      10, 2);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

Tensor random_logits(int64_t rows, int64_t vocab) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 3.0f);
  Tensor h = Tensor::empty({rows, vocab});
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

// Returns the median ms of one sample_logits call.
double bench(const Case& c, int64_t rows, int64_t vocab, const Tensor& logits, double copy_gbs) {
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
  const size_t bytes = cuda::sample_scratch_bytes(batch, vocab, c.path);
  const Tensor scratch = Tensor::empty({static_cast<int64_t>(bytes)}, DType::kU8, Device::kCuda);
  std::vector<cuda::launch::SampleOut> out;
  const double ms = median_event_ms(
      cuda::stream_of(gpu()),
      [&](int) { cuda::sample_logits(gpu(), logits, batch, scratch, out, c.path); }, 20, 3);
  const double gbs = static_cast<double>(rows * vocab * 4) / (ms * 1e-3) / 1e9;
  const std::string name = std::string("sampling_V") + std::to_string(vocab) + "_" + c.name + "_k" +
                           std::to_string(rows);
  emit_gpubench(name.c_str(), gbs, "GB/s", copy_gbs, ms);
  int full = 0;
  for (const auto& o : out) full += c.temperature > 0.0f && o.sorted_all == 1;
  std::printf("  %s: %.1f us, roofline %.1f us, full %d/%lld, scratch %.1f MB, first token %d\n",
              name.c_str(), ms * 1e3,
              static_cast<double>(rows * vocab * 4) / (copy_gbs * 1e9) * 1e6, full,
              static_cast<long long>(rows), bytes / 1e6, out[0].token);
  return ms;
}

void bench_readback(int64_t rows, int64_t vocab, const Tensor& logits, double copy_gbs) {
  std::vector<float> host(static_cast<size_t>(rows * vocab));
  const double ms = median_event_ms(
      cuda::stream_of(gpu()),
      [&](int) { download(gpu(), host.data(), logits.raw(), host.size() * sizeof(float)); }, 20, 3);
  const double gbs = static_cast<double>(rows * vocab * 4) / (ms * 1e-3) / 1e9;
  const std::string name =
      "sampling_V" + std::to_string(vocab) + "_host_readback_k" + std::to_string(rows);
  emit_gpubench(name.c_str(), gbs, "GB/s", copy_gbs, ms);
}

}  // namespace
}  // namespace loom

int main() {
  using loom::Case;
  loom::cuda::init();
  const double copy_gbs = loom::measure_copy_gbs();
  std::printf("device copy: %.0f GB/s (read + write)\n", copy_gbs);
  const Case greedy[] = {
      {"greedy", 0.0f, 0, 1.0f, -1, "auto"},
      {"greedy_logprobs20", 0.0f, 0, 1.0f, 20, "auto"},
  };
  // Each sampled case on the select path, then on the full sorts it replaced.
  const Case sampled[] = {
      {"t1_topp09", 1.0f, 0, 0.9f, -1, nullptr},
      {"t07_topk40", 0.7f, 40, 1.0f, -1, nullptr},
      {"t1_full", 1.0f, 0, 1.0f, -1, nullptr},
      {"t1_full_logprobs5", 1.0f, 0, 1.0f, 5, nullptr},
  };
  std::printf("\nsummary: V rows case | select us | segmented us | per_row us | roofline us\n");
  std::vector<std::string> summary;
  for (int64_t vocab : {int64_t{163840}, int64_t{151936}}) {
    for (int64_t rows : {int64_t{1}, int64_t{8}, int64_t{64}, int64_t{256}}) {
      const loom::Tensor logits = loom::random_logits(rows, vocab);
      for (const Case& c : greedy) loom::bench(c, rows, vocab, logits, copy_gbs);
      for (const Case& base : sampled) {
        double us[3];
        const char* paths[3] = {"select", "segmented", "per_row"};
        for (int p = 0; p < 3; ++p) {
          Case c = base;
          c.path = paths[p];
          const std::string name = std::string(base.name) + "_" + paths[p];
          c.name = name.c_str();
          us[p] = loom::bench(c, rows, vocab, logits, copy_gbs) * 1e3;
        }
        char line[256];
        std::snprintf(line, sizeof(line), "%lld %lld %s | %.1f | %.1f | %.1f | %.1f",
                      static_cast<long long>(vocab), static_cast<long long>(rows), base.name, us[0],
                      us[1], us[2], static_cast<double>(rows * vocab * 4) / (copy_gbs * 1e9) * 1e6);
        summary.push_back(line);
      }
      loom::bench_readback(rows, vocab, logits, copy_gbs);
    }
  }
  std::printf("\nSUMMARY device copy %.0f GB/s\n", copy_gbs);
  for (const std::string& s : summary) std::printf("SUMMARY %s\n", s.c_str());
  return 0;
}
