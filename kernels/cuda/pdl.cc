#include "kernels/cuda/pdl.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "absl/strings/numbers.h"

namespace loom::cuda {
namespace {

struct Registry {
  std::mutex mu;
  std::vector<const void*> kernels;  // a few dozen template instances: a scan is enough
};
Registry& registry() {
  static auto* r = new Registry;  // never destroyed: launches may run during static teardown
  return *r;
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  int64_t out = 0;
  return v != nullptr && absl::SimpleAtoi(v, &out) ? out : fallback;
}

}  // namespace

void mark_pdl_kernel(const void* kernel) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (std::find(r.kernels.begin(), r.kernels.end(), kernel) != r.kernels.end()) return;
  // The wait exists only in code compiled for sm_90 or later (pdl.cuh): a kernel whose loaded
  // code is older (a build without sm_90 code, JIT-compiled from older PTX) keeps plain edges,
  // or it would run early without waiting.
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  if (attr.ptxVersion < 90 || attr.binaryVersion < 90) return;
  r.kernels.push_back(kernel);
}

bool is_pdl_kernel(const void* kernel) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return std::find(r.kernels.begin(), r.kernels.end(), kernel) != r.kernels.end();
}

bool pdl_enabled() {
  static const bool on = env_int("LOOM_CUDA_PDL", 1) != 0;
  return on;
}

int64_t pdl_prefetch_rows(int64_t n, int64_t row_bytes) {
  static const int64_t budget =
      pdl_enabled()
          ? std::max<int64_t>(0, env_int("LOOM_CUDA_PDL_PREFETCH_MB", kDefaultPrefetchMiB)) << 20
          : 0;
  if (row_bytes <= 0) return 0;
  return std::min(n, budget / row_bytes);
}

}  // namespace loom::cuda
