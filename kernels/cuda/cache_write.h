// CUDA twin of cache_write_varlen (kernels/attention.h): same contract, every tensor argument on
// the GPU and contiguous (page_table, cu_seqlens and past_lens too), one kernel launch on the
// Exec's stream without synchronising. The values of cu_seqlens, past_lens and page_table stay on
// the device and are not checked here (the CPU twin checks them on the host); a row whose position
// lies past the page table or on a page outside the pool is not written. Pool and rows may each be
// f32 or bf16 (same dtype: a copy; bf16 rows widen exactly into an f32 pool; f32 rows round to
// nearest even into a bf16 pool), or the pool fp8 (kKvFp8ScaleBytes' format: each vector
// quantized bit for bit as the CPU's kv_fp8_quantize does, from f32 or bf16 rows).
#pragma once

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/exec.h"

namespace loom::cuda {

void cache_write_varlen(const Exec& ex, const Tensor& pool, const Tensor& page_table,
                        const Tensor& cu_seqlens, const Tensor& past_lens, const Tensor& rows);

}  // namespace loom::cuda
