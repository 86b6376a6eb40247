// CUDA batched KDA / Gated DeltaNet decode over a state slot pool (kernels/cuda/kda_decode.cu).
// Every tensor argument on the GPU, contiguous; enqueued on the Exec's stream without
// synchronising.
#pragma once

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/exec.h"

namespace loom::cuda {

// One token for each of B sequences, the recurrence of cpu::kda_recurrent_forward with T = 1 on
// each sequence's own state:
//   q, k [B, Hk, dk] (l2-normalised by the caller), v [B, Hv, dv], g [B, Hv, dk] (KDA) or
//   [B, Hv, 1] (GDN, one decay per head), beta [B, Hv], out [B, Hv, dv];
//   q, k, v and out all f32 or all bf16 (arithmetic in f32 either way), beta f32 or of their
//   dtype, g f32;
//   state_pool [num_slots, Hv, dk, dv] f32, state_slots i32 [B]: sequence b reads and updates
//   state_pool[state_slots[b]] in place; no other slot is touched.
// Hv a multiple of Hk (value head h reads key head h / (Hv / Hk)); dk <= 256; any dv.
// Non-negative slots must be distinct within a call. A negative slot marks a padding row (its out
// row is zero, no state is touched); a slot >= num_slots writes a NaN out row and touches no
// state (slots live on the device, so they are not checked on the host).
void kda_decode_batched(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& g, const Tensor& beta, float scale, const Tensor& state_pool,
                        const Tensor& state_slots, const Tensor& out);

}  // namespace loom::cuda
