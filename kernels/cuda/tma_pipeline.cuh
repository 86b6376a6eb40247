// The pieces of the warp-specialised TMA + wgmma kernels on sm_90a that more than one kernel file
// uses (kernels/cuda/moe_gemm.cu's bf16 grouped GEMM, kernels/cuda/moe_fp8_wgmma.cu's
// block-scaled FP8 one): mbarrier and cluster primitives, 2D TMA loads (plain and multicast), the
// shared-memory matrix descriptor of a 128-byte-swizzled K-major tile, and on the host the tensor
// map encoder and per-device launch set-up. nvcc only. The device functions are inline PTX that
// only sm_90 code may call (the kernels guard their bodies with __CUDA_ARCH_FEAT_SM90_ALL).
#pragma once

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/smem_opt_in.cuh"

namespace loom::cuda::tma {

// ---- device ------------------------------------------------------------------------------------

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart (each
// row 128 bytes: 64 bf16 or 128 e4m3 values). Adding 2 advances it by 32 bytes of k (k16 of bf16,
// k32 of e4m3).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}
// Keeps the compiler from moving accesses of a wgmma accumulator across the asm around it.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// Arrives on the barrier at the same offset in CTA `cta` of the cluster (this CTA included).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t cta) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive;\nbarrier.cluster.wait;\n" ::: "memory");
}
// Box (k0.., row0..) of a 2D tensor map into shared memory at dst; completes on bar.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int k0, int row0,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(k0), "r"(row0)
      : "memory");
}
// The same into dst of every CTA of the cluster in `mask`, each completing on its barrier at
// offset bar.
__device__ __forceinline__ void tma_load_multicast(uint32_t dst, const CUtensorMap* map, int k0,
                                                   int row0, uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%4, %5}], [%2], %3;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "h"(mask), "r"(k0), "r"(row0)
      : "memory");
}

// ---- host --------------------------------------------------------------------------------------

[[noreturn]] inline void fail(const char* what, int code) {
  std::fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, what, code);
  std::abort();
}

// cuTensorMapEncodeTiled from the driver the runtime loaded (no link against libcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                           cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || f == nullptr) {
      fail("cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)", static_cast<int>(e));
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// Compute capability 9.0 (H100/H200), where the sm_90a code of the wgmma kernels runs.
inline bool device_has_wgmma() {
  int dev = 0, major = 0, minor = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&dev));
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major == 9 && minor == 0;
}

// The per-device shared-memory opt-in (smem_opt_in.cuh), under the names this header's users know.
using ::loom::cuda::allow_smem;
using ::loom::cuda::current_device;

// Clusters of the kernel that fit on the device at once (per device, asked once; cache[64]).
template <typename Kernel>
int64_t resident_clusters(Kernel kernel, cudaLaunchConfig_t cfg, std::atomic<int>* cache) {
  std::atomic<int>& c = cache[current_device() & 63];
  int n = c.load(std::memory_order_acquire);
  if (n > 0) return n;
  LOOM_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
  if (n <= 0) fail("cudaOccupancyMaxActiveClusters", n);
  c.store(n, std::memory_order_release);
  return n;
}

}  // namespace loom::cuda::tma
