// Raw launchers of the varlen conv and cache-write kernels (kernels/cuda/conv_varlen.cu,
// kernels/cuda/cache_write.cu). Like launch.h this header includes no Loom or Abseil header, so
// nvcc never parses Abseil; the Tensor-level entry points and their checks are in
// kernels/cuda/conv_varlen.{h,cc} and kernels/cuda/cache_write.{h,cc}. cu, slots, page_table and
// past_lens live on the device and are never copied back: every launcher is one kernel launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda::launch {

// causal_conv1d_varlen: x, out [N, C]; w [C, W]; pool [num_slots, W-1, C]; slots i32 [B];
// cu i64 [B + 1]. One launch over (B sequence owners + chunks of `rows_per_block` rows, channel
// blocks); rows_per_block 0 picks it from the shape. `vec4` (C % 4 == 0 and x, out, pool 16-byte
// aligned) moves four channels per thread.
void causal_conv1d_varlen(cudaStream_t stream, const float* x, const float* w, float* pool,
                          const int32_t* slots, const int64_t* cu, float* out, int64_t N, int64_t C,
                          int64_t W, int64_t B, int64_t num_slots, bool silu, bool vec4,
                          int64_t rows_per_block = 0);

// cache_write_varlen: rows [N, row_elems] f32 to pool [num_pages, page_size, row_elems];
// page_table i32 [B, max_pages]; cu i64 [B + 1]; past i64 [B]. One launch over all rows. `vec4`
// (row_elems % 4 == 0, rows and pool 16-byte aligned) copies 16 bytes per thread and step.
void cache_write_varlen(cudaStream_t stream, const float* rows, float* pool,
                        const int32_t* page_table, const int64_t* cu, const int64_t* past,
                        int64_t N, int64_t B, int64_t max_pages, int64_t num_pages,
                        int64_t page_size, int64_t row_elems, bool vec4);
// The same into a bf16 pool [num_pages, page_size, row_elems] (each element rounded to nearest
// even); vec4 as above (rows 16-byte aligned, row_elems % 4 == 0, pool 8-byte aligned).
void cache_write_varlen_bf16(cudaStream_t stream, const float* rows, uint16_t* pool,
                             const int32_t* page_table, const int64_t* cu, const int64_t* past,
                             int64_t N, int64_t B, int64_t max_pages, int64_t num_pages,
                             int64_t page_size, int64_t row_elems, bool vec4);

}  // namespace loom::cuda::launch
