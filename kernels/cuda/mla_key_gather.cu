// Helpers of MLA's expanded form on the GPU (kernels/cuda/attention.cc, mla_expanded_sequence):
// the gather of one sequence's cached keys out of the paged pools into contiguous rows, which the
// expansion GEMM then multiplies by kv_b, and the shift of a sub-batch's row offsets. From fp8
// pools the gather dequantizes (f32(code) * scale, rounded to bf16), so the expansion reads the
// same bf16 rows as from a bf16 cache and no pass over the cache widens it first.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_fp8.cuh"
#include "kernels/cuda/mma_sync.cuh"

namespace loom::cuda {
namespace {

constexpr int kGatherWarps = 8;

// One warp per key: its latent row (R bf16) then its rope row (dr bf16), 16 bytes a lane a step.
// A page id outside the pool is not read: the key's rows are zeros.
__global__ void __launch_bounds__(kGatherWarps * 32)
    mla_gather_keys_kernel(const uint4* __restrict__ latent_pool,
                           const uint4* __restrict__ rope_pool, int lat_vecs, int rope_vecs,
                           const int32_t* __restrict__ pages, int64_t page_size, int64_t num_pages,
                           int64_t key0, int64_t nk, uint4* __restrict__ lat,
                           uint4* __restrict__ rope) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kGatherWarps + threadIdx.x / 32;
  if (j >= nk) return;
  const int lane = threadIdx.x % 32;
  const int64_t pos = key0 + j;
  const int64_t page = pages[pos / page_size];
  const bool inside = page >= 0 && page < num_pages;
  const int64_t row = inside ? page * page_size + pos % page_size : 0;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int v = lane; v < lat_vecs; v += 32)
    lat[j * lat_vecs + v] = inside ? latent_pool[row * lat_vecs + v] : zero;
  for (int v = lane; v < rope_vecs; v += 32)
    rope[j * rope_vecs + v] = inside ? rope_pool[row * rope_vecs + v] : zero;
}

// The fp8 twin: one warp per key; a lane widens 4 codes (one word) a step into 8 bytes of bf16.
// Rows of lat_words * 4 (+ 4) and rope_words * 4 (+ 4) bytes, 4-byte aligned.
__global__ void __launch_bounds__(kGatherWarps * 32)
    mla_gather_keys_fp8_kernel(const uint8_t* __restrict__ latent_pool,
                               const uint8_t* __restrict__ rope_pool, int lat_words, int rope_words,
                               const int32_t* __restrict__ pages, int64_t page_size,
                               int64_t num_pages, int64_t key0, int64_t nk, uint2* __restrict__ lat,
                               uint2* __restrict__ rope) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kGatherWarps + threadIdx.x / 32;
  if (j >= nk) return;
  const int lane = threadIdx.x % 32;
  const int64_t pos = key0 + j;
  const int64_t page = pages[pos / page_size];
  const bool inside = page >= 0 && page < num_pages;
  const int64_t row = inside ? page * page_size + pos % page_size : 0;
  auto widen = [&](const uint8_t* pool, int words, uint2* out) {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(pool + row * (words + 1) * 4);
    const float scale = inside ? __uint_as_float(src[words]) : 0.0f;
    for (int v = lane; v < words; v += 32) {
      const float4 f = dev::kv_fp8_word(inside ? src[v] : 0u, scale);
      out[j * words + v] = make_uint2(pack_bf16(f.x, f.y), pack_bf16(f.z, f.w));
    }
  };
  widen(latent_pool, lat_words, lat);
  if (rope_words > 0) widen(rope_pool, rope_words, rope);
}

__global__ void shift_offsets_kernel(const int64_t* __restrict__ cu, int64_t n,
                                     int64_t* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = cu[i] - cu[0];
}

}  // namespace

namespace launch {

void mla_gather_keys(cudaStream_t stream, const void* latent_pool, const void* rope_pool, int64_t R,
                     int64_t dr, bool fp8, const int32_t* pages, int64_t page_size,
                     int64_t num_pages, int64_t key0, int64_t nk, void* lat, void* rope) {
  if (nk <= 0) return;
  const int64_t blocks = (nk + kGatherWarps - 1) / kGatherWarps;
  if (fp8) {
    mla_gather_keys_fp8_kernel<<<static_cast<unsigned>(blocks), kGatherWarps * 32, 0, stream>>>(
        static_cast<const uint8_t*>(latent_pool), static_cast<const uint8_t*>(rope_pool),
        static_cast<int>(R / 4), static_cast<int>(dr / 4), pages, page_size, num_pages, key0, nk,
        static_cast<uint2*>(lat), static_cast<uint2*>(rope));
    LOOM_CUDA_CHECK_LAUNCH();
    return;
  }
  mla_gather_keys_kernel<<<static_cast<unsigned>(blocks), kGatherWarps * 32, 0, stream>>>(
      static_cast<const uint4*>(latent_pool), static_cast<const uint4*>(rope_pool),
      static_cast<int>(R / 8), static_cast<int>(dr / 8), pages, page_size, num_pages, key0, nk,
      static_cast<uint4*>(lat), static_cast<uint4*>(rope));
  LOOM_CUDA_CHECK_LAUNCH();
}

void shift_offsets(cudaStream_t stream, const int64_t* cu, int64_t n, int64_t* out) {
  if (n <= 0) return;
  shift_offsets_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(cu, n, out);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace launch
}  // namespace loom::cuda
