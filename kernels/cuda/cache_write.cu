// cache_write_varlen on the GPU: one launch over all N new rows, no host loop over sequences and
// no copy back of cu_seqlens or past_lens.
//
// A group of G threads (G a power of two <= 32, the smallest covering a row's 16-byte units, so
// short rows such as a 64-wide rope key do not leave most of a warp idle) copies one row: it finds
// the row's sequence b (the guess of equal lengths, exact for a decode batch, else a binary search
// in cu_seqlens; the same addresses across the group), loads the first units of the row, then
// looks up its position j = past_lens[b] + (row - cu_seqlens[b]) and page
// page_table[b, j / page_size] and stores the row in 16-byte (or 4-byte) units. Rows go to
// distinct positions (no page is written by two sequences), so there is nothing to order.
// A position past the page table or a page id outside the pool (caller bugs the CPU twin aborts
// on) is not written.
#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/varlen_launch.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kStage = 8;  // units per thread loaded ahead (a 1024-float row: all of it)

// Round to nearest even, as the host's f32_to_bf16 (NaN stays NaN).
__device__ __forceinline__ uint16_t bf16_bits(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

template <typename Unit>
__global__ void __launch_bounds__(kThreads)
    cache_write_kernel(const Unit* __restrict__ rows, Unit* __restrict__ pool,
                       const int32_t* __restrict__ page_table, const int64_t* __restrict__ cu,
                       const int64_t* __restrict__ past, int64_t N, int64_t B, int64_t max_pages,
                       int64_t num_pages, int64_t page_size, int64_t units, int group) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * kThreads / group;
  const int lane = threadIdx.x & (group - 1);
  for (int64_t r = tid / group; r < N; r += groups) {
    // The sequence of row r: the guess of equal lengths (exact for a decode batch), else the
    // last b < B with cu[b] <= r by binary search (cu[B] = N > r ends it).
    int64_t lo = min(B - 1, r * B / N);
    if (!(cu[lo] <= r && r < cu[lo + 1])) {
      lo = 0;
      int64_t hi = B - 1;
      while (lo < hi) {
        const int64_t mid = (lo + hi + 1) >> 1;
        if (cu[mid] <= r) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
    }
    // The row's first kStage units per thread are loaded before its page is looked up (the source
    // does not depend on it), so those loads overlap the chain past_lens -> page_table.
    const Unit* src = rows + r * units;
    Unit v[kStage];
#pragma unroll
    for (int k = 0; k < kStage; ++k) {
      const int64_t e = lane + static_cast<int64_t>(k) * group;
      if (e < units) v[k] = src[e];
    }
    const int64_t j = past[lo] + (r - cu[lo]);
    if (j < 0 || j / page_size >= max_pages) continue;
    const int64_t page = page_table[lo * max_pages + j / page_size];
    if (page < 0 || page >= num_pages) continue;
    Unit* dst = pool + (page * page_size + j % page_size) * units;
#pragma unroll
    for (int k = 0; k < kStage; ++k) {
      const int64_t e = lane + static_cast<int64_t>(k) * group;
      if (e < units) dst[e] = v[k];
    }
#pragma unroll 4
    for (int64_t e = lane + static_cast<int64_t>(kStage) * group; e < units; e += group)
      dst[e] = src[e];
  }
}

template <typename Unit>
void launch_write(cudaStream_t stream, const float* rows, float* pool, const int32_t* page_table,
                  const int64_t* cu, const int64_t* past, int64_t N, int64_t B, int64_t max_pages,
                  int64_t num_pages, int64_t page_size, int64_t units) {
  int group = 1;
  while (group < 32 && group < units) group *= 2;
  const unsigned blocks = dev::grid_for(N * group, kThreads);
  cache_write_kernel<Unit><<<blocks, kThreads, 0, stream>>>(
      reinterpret_cast<const Unit*>(rows), reinterpret_cast<Unit*>(pool), page_table, cu, past, N,
      B, max_pages, num_pages, page_size, units, group);
  LOOM_CUDA_CHECK_LAUNCH();
}

// bf16 pools (a bf16 KV cache): the same walk, each f32 element rounded to nearest-even bf16 as
// it is stored (the CPU's f32_to_bf16). Units are 4 elements (a float4 in, 8 bytes out) when the
// row allows, else single elements.
template <int kElems>
__global__ void __launch_bounds__(kThreads)
    cache_write_bf16_kernel(const float* __restrict__ rows, uint16_t* __restrict__ pool,
                            const int32_t* __restrict__ page_table, const int64_t* __restrict__ cu,
                            const int64_t* __restrict__ past, int64_t N, int64_t B,
                            int64_t max_pages, int64_t num_pages, int64_t page_size,
                            int64_t row_elems, int group) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * kThreads / group;
  const int lane = threadIdx.x & (group - 1);
  const int64_t units = row_elems / kElems;
  for (int64_t r = tid / group; r < N; r += groups) {
    int64_t lo = min(B - 1, r * B / N);
    if (!(cu[lo] <= r && r < cu[lo + 1])) {
      lo = 0;
      int64_t hi = B - 1;
      while (lo < hi) {
        const int64_t mid = (lo + hi + 1) >> 1;
        if (cu[mid] <= r) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
    }
    const int64_t j = past[lo] + (r - cu[lo]);
    if (j < 0 || j / page_size >= max_pages) continue;
    const int64_t page = page_table[lo * max_pages + j / page_size];
    if (page < 0 || page >= num_pages) continue;
    const float* src = rows + r * row_elems;
    uint16_t* dst = pool + (page * page_size + j % page_size) * row_elems;
    for (int64_t e = lane; e < units; e += group) {
      if constexpr (kElems == 4) {
        const float4 v = reinterpret_cast<const float4*>(src)[e];
        uint2 packed;
        packed.x =
            static_cast<uint32_t>(bf16_bits(v.x)) | (static_cast<uint32_t>(bf16_bits(v.y)) << 16);
        packed.y =
            static_cast<uint32_t>(bf16_bits(v.z)) | (static_cast<uint32_t>(bf16_bits(v.w)) << 16);
        reinterpret_cast<uint2*>(dst)[e] = packed;
      } else {
        dst[e] = bf16_bits(src[e]);
      }
    }
  }
}

}  // namespace

namespace launch {

void cache_write_varlen_bf16(cudaStream_t stream, const float* rows, uint16_t* pool,
                             const int32_t* page_table, const int64_t* cu, const int64_t* past,
                             int64_t N, int64_t B, int64_t max_pages, int64_t num_pages,
                             int64_t page_size, int64_t row_elems, bool vec4) {
  if (N == 0 || B == 0 || row_elems == 0) return;
  const int64_t units = vec4 ? row_elems / 4 : row_elems;
  int group = 1;
  while (group < 32 && group < units) group *= 2;
  const unsigned blocks = dev::grid_for(N * group, kThreads);
  if (vec4) {
    cache_write_bf16_kernel<4><<<blocks, kThreads, 0, stream>>>(
        rows, pool, page_table, cu, past, N, B, max_pages, num_pages, page_size, row_elems, group);
  } else {
    cache_write_bf16_kernel<1><<<blocks, kThreads, 0, stream>>>(
        rows, pool, page_table, cu, past, N, B, max_pages, num_pages, page_size, row_elems, group);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

void cache_write_varlen(cudaStream_t stream, const float* rows, float* pool,
                        const int32_t* page_table, const int64_t* cu, const int64_t* past,
                        int64_t N, int64_t B, int64_t max_pages, int64_t num_pages,
                        int64_t page_size, int64_t row_elems, bool vec4) {
  if (N == 0 || B == 0 || row_elems == 0) return;
  if (vec4) {
    launch_write<float4>(stream, rows, pool, page_table, cu, past, N, B, max_pages, num_pages,
                         page_size, row_elems / 4);
  } else {
    launch_write<float>(stream, rows, pool, page_table, cu, past, N, B, max_pages, num_pages,
                        page_size, row_elems);
  }
}

}  // namespace launch
}  // namespace loom::cuda
