// cache_write_varlen on the GPU: one launch over all N new rows, no host loop over sequences and
// no copy back of cu_seqlens or past_lens.
//
// A group of G threads (G a power of two <= 32, the smallest covering a row's 16-byte units, so
// short rows such as a 64-wide rope key do not leave most of a warp idle) copies one row: it finds
// the row's sequence b (the guess of equal lengths, exact for a decode batch, else a binary search
// in cu_seqlens; the same addresses across the group), loads the first units of the row, then
// looks up its position j = past_lens[b] + (row - cu_seqlens[b]) and page
// page_table[b, j / page_size] and stores the row in 16-byte (or narrower) units. Rows go to
// distinct positions (no page is written by two sequences), so there is nothing to order.
// A position past the page table or a page id outside the pool (caller bugs the CPU twin aborts
// on) is not written.
//
// Rows and pool are each f32 or bf16. Of one dtype, the row's bytes are copied in the widest unit
// (16, 4 or 2 bytes) the row width and both addresses allow. Across dtypes, each element converts
// as it is stored: bf16 to f32 exactly, f32 to bf16 rounded to nearest even (the host's
// f32_to_bf16), four elements per access where the row allows.
//
// An fp8 pool (kernels/attention.h's format) takes one warp per vector: the warp's max of |x| and
// whether every value is finite, the scale f32(amax / 448) (the IEEE division, as the host's),
// then each code from the double quotient with the host's encoder (kernels/cuda/kv_fp8.cuh), so
// the bytes equal kv_fp8_quantize's.
#include <cuda_bf16.h>

#include <cfloat>
#include <type_traits>

#include "kernels/cuda/bf16_io.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_fp8.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/pdl.h"
#include "kernels/cuda/varlen_launch.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kStage = 8;  // units per thread loaded ahead (a 1024-float row: all of it)

using bf16 = __nv_bfloat16;

// The sequence of row r: the guess of equal lengths (exact for a decode batch), else the last
// b < B with cu[b] <= r by binary search (cu[B] = N > r ends it).
__device__ __forceinline__ int64_t sequence_of(int64_t r, const int64_t* __restrict__ cu, int64_t N,
                                               int64_t B) {
  int64_t lo = min(B - 1, r * B / N);
  if (cu[lo] <= r && r < cu[lo + 1]) return lo;
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
  return lo;
}

template <typename Unit>
__global__ void __launch_bounds__(kThreads)
    cache_write_kernel(const Unit* __restrict__ rows, Unit* __restrict__ pool,
                       const int32_t* __restrict__ page_table, const int64_t* __restrict__ cu,
                       const int64_t* __restrict__ past, int64_t N, int64_t B, int64_t max_pages,
                       int64_t num_pages, int64_t page_size, int64_t units, int group) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * kThreads / group;
  const int lane = threadIdx.x & (group - 1);
  for (int64_t r = tid / group; r < N; r += groups) {
    const int64_t lo = sequence_of(r, cu, N, B);
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
void launch_copy(cudaStream_t stream, const void* rows, void* pool, const int32_t* page_table,
                 const int64_t* cu, const int64_t* past, int64_t N, int64_t B, int64_t max_pages,
                 int64_t num_pages, int64_t page_size, int64_t row_bytes) {
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(Unit));
  int group = 1;
  while (group < 32 && group < units) group *= 2;
  const unsigned blocks = dev::grid_for(N * group, kThreads);
  LOOM_MARK_PDL_KERNEL(cache_write_kernel<Unit>);
  cache_write_kernel<Unit><<<blocks, kThreads, 0, stream>>>(
      static_cast<const Unit*>(rows), static_cast<Unit*>(pool), page_table, cu, past, N, B,
      max_pages, num_pages, page_size, units, group);
  LOOM_CUDA_CHECK_LAUNCH();
}

// Four elements of f32 (16 bytes) or bf16 (8 bytes) as floats, and back (bf16 rounded to nearest
// even; NaN stays NaN).
template <typename T>
__device__ __forceinline__ float4 load4(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return *reinterpret_cast<const float4*>(p);
  } else {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
  }
}
template <typename T>
__device__ __forceinline__ void store4(T* p, float4 v) {
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(p) = v;
  } else {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
    uint2 u;
    u.x = *reinterpret_cast<const uint32_t*>(&lo);
    u.y = *reinterpret_cast<const uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(p) = u;
  }
}

// Rows of one dtype into a pool of the other (f32 rows into a bf16 KV cache, bf16 rows into an f32
// one): the same walk, each element converted as it is stored, kElems (4 or 1) per access.
template <typename In, typename Out, int kElems>
__global__ void __launch_bounds__(kThreads)
    cache_convert_kernel(const In* __restrict__ rows, Out* __restrict__ pool,
                         const int32_t* __restrict__ page_table, const int64_t* __restrict__ cu,
                         const int64_t* __restrict__ past, int64_t N, int64_t B, int64_t max_pages,
                         int64_t num_pages, int64_t page_size, int64_t row_elems, int group) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * kThreads / group;
  const int lane = threadIdx.x & (group - 1);
  const int64_t units = row_elems / kElems;
  for (int64_t r = tid / group; r < N; r += groups) {
    const int64_t lo = sequence_of(r, cu, N, B);
    const int64_t j = past[lo] + (r - cu[lo]);
    if (j < 0 || j / page_size >= max_pages) continue;
    const int64_t page = page_table[lo * max_pages + j / page_size];
    if (page < 0 || page >= num_pages) continue;
    const In* src = rows + r * row_elems;
    Out* dst = pool + (page * page_size + j % page_size) * row_elems;
    for (int64_t e = lane; e < units; e += group) {
      if constexpr (kElems == 4) {
        store4(dst + 4 * e, load4(src + 4 * e));
      } else {
        dev::st(dst + e, dev::ld(src + e));
      }
    }
  }
}

template <typename In, typename Out>
void launch_convert(cudaStream_t stream, const void* rows, void* pool, const int32_t* page_table,
                    const int64_t* cu, const int64_t* past, int64_t N, int64_t B, int64_t max_pages,
                    int64_t num_pages, int64_t page_size, int64_t row_elems) {
  const bool vec4 = row_elems % 4 == 0 &&
                    reinterpret_cast<uintptr_t>(rows) % (4 * sizeof(In)) == 0 &&
                    reinterpret_cast<uintptr_t>(pool) % (4 * sizeof(Out)) == 0;
  const int64_t units = vec4 ? row_elems / 4 : row_elems;
  int group = 1;
  while (group < 32 && group < units) group *= 2;
  const unsigned blocks = dev::grid_for(N * group, kThreads);
  const auto* in = static_cast<const In*>(rows);
  auto* out = static_cast<Out*>(pool);
  if (vec4) {
    LOOM_MARK_PDL_KERNEL((cache_convert_kernel<In, Out, 4>));
    cache_convert_kernel<In, Out, 4><<<blocks, kThreads, 0, stream>>>(
        in, out, page_table, cu, past, N, B, max_pages, num_pages, page_size, row_elems, group);
  } else {
    LOOM_MARK_PDL_KERNEL((cache_convert_kernel<In, Out, 1>));
    cache_convert_kernel<In, Out, 1><<<blocks, kThreads, 0, stream>>>(
        in, out, page_table, cu, past, N, B, max_pages, num_pages, page_size, row_elems, group);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

// Rows into an fp8 pool: warp w of the grid takes vectors w, w + warps, ... (vector v is vector
// v % vectors of row v / vectors).
template <typename In>
__global__ void __launch_bounds__(kThreads)
    cache_fp8_kernel(const In* __restrict__ rows, uint8_t* __restrict__ pool,
                     const int32_t* __restrict__ page_table, const int64_t* __restrict__ cu,
                     const int64_t* __restrict__ past, int64_t N, int64_t B, int64_t max_pages,
                     int64_t num_pages, int64_t page_size, int64_t vectors, int64_t n) {
  dev::pdl_wait();  // PDL-aware (kernels/cuda/pdl.h): before any access
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kThreads / 32);
  const int lane = threadIdx.x & 31;
  const int64_t vec_bytes = n + 4;
  for (int64_t v = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
       v < N * vectors; v += warps) {
    const int64_t r = v / vectors, e = v % vectors;
    const int64_t lo = sequence_of(r, cu, N, B);
    const int64_t j = past[lo] + (r - cu[lo]);
    if (j < 0 || j / page_size >= max_pages) continue;
    const int64_t page = page_table[lo * max_pages + j / page_size];
    if (page < 0 || page >= num_pages) continue;
    const In* src = rows + r * vectors * n + e * n;
    uint8_t* dst = pool + (page * page_size + j % page_size) * vectors * vec_bytes + e * vec_bytes;
    // The host's loop: amax ignores NaN (a > amax is false), `finite` catches it and infinities.
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = lane; i < n; i += 32) {
      const float a = fabsf(dev::ld(src + i));
      finite = finite && a <= FLT_MAX;
      amax = a > amax ? a : amax;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    finite = __all_sync(0xffffffffu, finite);
    float scale;
    if (!finite) {
      scale = __int_as_float(0x7fc00000);  // the host's quiet NaN
      for (int64_t i = lane; i < n; i += 32) dst[i] = 0;
    } else {
      scale = __fdiv_rn(amax, 448.0f);
      if (!(scale > 0.0f)) scale = 1.0f;
      const double s = scale;
      for (int64_t i = lane; i < n; i += 32)
        dst[i] = dev::kv_fp8_encode(static_cast<double>(dev::ld(src + i)) / s);
    }
    if (lane < 4) dst[n + lane] = static_cast<uint8_t>(__float_as_uint(scale) >> (8 * lane));
  }
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

namespace launch {

void cache_write_varlen(cudaStream_t stream, const void* rows, bool rows_bf16, void* pool,
                        bool pool_bf16, const int32_t* page_table, const int64_t* cu,
                        const int64_t* past, int64_t N, int64_t B, int64_t max_pages,
                        int64_t num_pages, int64_t page_size, int64_t row_elems) {
  if (N == 0 || B == 0 || row_elems == 0) return;
  if (rows_bf16 != pool_bf16) {
    if (rows_bf16) {
      return launch_convert<bf16, float>(stream, rows, pool, page_table, cu, past, N, B, max_pages,
                                         num_pages, page_size, row_elems);
    }
    return launch_convert<float, bf16>(stream, rows, pool, page_table, cu, past, N, B, max_pages,
                                       num_pages, page_size, row_elems);
  }
  // One dtype: a byte copy in the widest unit that divides the row and both addresses.
  const int64_t row_bytes = row_elems * (rows_bf16 ? 2 : 4);
  const auto fits = [&](size_t unit) {
    return row_bytes % static_cast<int64_t>(unit) == 0 && aligned(rows, unit) &&
           aligned(pool, unit);
  };
  if (fits(16)) {
    launch_copy<uint4>(stream, rows, pool, page_table, cu, past, N, B, max_pages, num_pages,
                       page_size, row_bytes);
  } else if (fits(4)) {
    launch_copy<uint32_t>(stream, rows, pool, page_table, cu, past, N, B, max_pages, num_pages,
                          page_size, row_bytes);
  } else {
    launch_copy<uint16_t>(stream, rows, pool, page_table, cu, past, N, B, max_pages, num_pages,
                          page_size, row_bytes);
  }
}

void cache_write_varlen_fp8(cudaStream_t stream, const void* rows, bool rows_bf16, void* pool,
                            const int32_t* page_table, const int64_t* cu, const int64_t* past,
                            int64_t N, int64_t B, int64_t max_pages, int64_t num_pages,
                            int64_t page_size, int64_t vectors, int64_t n) {
  if (N == 0 || B == 0 || vectors == 0 || n == 0) return;
  const unsigned blocks = dev::grid_for(N * vectors * 32, kThreads);
  auto* out = static_cast<uint8_t*>(pool);
  if (rows_bf16) {
    LOOM_MARK_PDL_KERNEL(cache_fp8_kernel<bf16>);
    cache_fp8_kernel<bf16><<<blocks, kThreads, 0, stream>>>(static_cast<const bf16*>(rows), out,
                                                            page_table, cu, past, N, B, max_pages,
                                                            num_pages, page_size, vectors, n);
  } else {
    LOOM_MARK_PDL_KERNEL(cache_fp8_kernel<float>);
    cache_fp8_kernel<float><<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(rows), out,
                                                             page_table, cu, past, N, B, max_pages,
                                                             num_pages, page_size, vectors, n);
  }
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace launch
}  // namespace loom::cuda
