// Raw launchers of the varlen conv and cache-write kernels (kernels/cuda/conv_varlen.cu,
// kernels/cuda/cache_write.cu). Like launch.h this header includes no Loom or Abseil header, so
// nvcc never parses Abseil; the Tensor-level entry points and their checks are in
// kernels/cuda/conv_varlen.{h,cc} and kernels/cuda/cache_write.{h,cc}. cu, slots, page_table and
// past_lens live on the device and are never copied back: every launcher is one kernel launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda::launch {

// Which tensors of a causal_conv1d_varlen launch hold bf16 (the others f32).
struct ConvDtypes {
  bool x_bf16 = false, out_bf16 = false, pool_bf16 = false;
};

// causal_conv1d_varlen: x, out [N, C]; w [C, W] f32; pool [num_slots, W-1, C]; slots i32 [B];
// cu i64 [B + 1]; x, out and pool f32 or bf16 as `dt` says (f32 arithmetic; bf16 stores round to
// nearest even). One launch over (B sequence owners + chunks of `rows_per_block` rows, channel
// blocks); rows_per_block 0 picks it from the shape. `vec4` (C % 4 == 0 and x, out, pool aligned
// to four elements: 16 bytes of f32, 8 of bf16) moves four channels per thread.
void causal_conv1d_varlen(cudaStream_t stream, const void* x, const float* w, void* pool,
                          const int32_t* slots, const int64_t* cu, void* out, int64_t N, int64_t C,
                          int64_t W, int64_t B, int64_t num_slots, bool silu, ConvDtypes dt,
                          bool vec4, int64_t rows_per_block = 0);

// cache_write_varlen: rows [N, row_elems] to pool [num_pages, page_size, row_elems], each f32 or
// bf16 as the flags say (one dtype: the bytes are copied; bf16 into f32 widens exactly; f32 into
// bf16 rounds to nearest even); page_table i32 [B, max_pages]; cu i64 [B + 1]; past i64 [B]. One
// launch over all rows, in the widest accesses (up to 16 bytes) that the row width and the two
// addresses allow.
void cache_write_varlen(cudaStream_t stream, const void* rows, bool rows_bf16, void* pool,
                        bool pool_bf16, const int32_t* page_table, const int64_t* cu,
                        const int64_t* past, int64_t N, int64_t B, int64_t max_pages,
                        int64_t num_pages, int64_t page_size, int64_t row_elems);

// cache_write_varlen into an fp8 pool (kernels/attention.h, kKvFp8ScaleBytes): rows [N, vectors *
// n] f32 or bf16, pool [num_pages, page_size, vectors * (n + 4)] bytes; each vector quantized as
// the host's kv_fp8_quantize does, bit for bit (kernels/cuda/kv_fp8.cuh). One warp a vector.
void cache_write_varlen_fp8(cudaStream_t stream, const void* rows, bool rows_bf16, void* pool,
                            const int32_t* page_table, const int64_t* cu, const int64_t* past,
                            int64_t N, int64_t B, int64_t max_pages, int64_t num_pages,
                            int64_t page_size, int64_t vectors, int64_t n);

}  // namespace loom::cuda::launch
