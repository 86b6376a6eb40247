// CUDA twins of kda_chunked_forward and kda_varlen_forward (kernels/kda.h): same contracts, every
// tensor argument on the GPU and contiguous, enqueued on the Exec's stream without synchronising.
//
// Dtypes: q, k, v and out all f32 or all bf16 (bf16: tensor-core products with f32 accumulation;
// f32: CUDA-core f32 arithmetic, for conformance); beta f32 or of q's dtype; g and the states f32.
// Forms, per sequence (the rule of kda_varlen_takes_recurrence):
//  - the token recurrence for sequences of at most kKdaRecurrentMaxTokens rows, and for all of
//    them under batch-invariant numerics (ex.batch_invariant);
//  - the chunked WY/UT form otherwise (kernels/cuda/kda_chunked.cu), when dk <= 128 and dk, dv
//    are multiples of 8 with 16-byte aligned rows; other shapes run the recurrence (dk <= 256).
//  - max_seqlen == 1 with one row per sequence (a decode step): kda_decode_batched, one launch
//    (not under batch-invariant numerics, whose result must not depend on the batch's size).
// The chunked form's temporaries (about 66 KB per 64-token chunk and value head in bf16, twice
// that in f32) come from ex.workspace when there is one, else from a stream-ordered allocation.
#pragma once

#include "core/tensor.h"
#include "kernels/cuda/check.h"
#include "kernels/exec.h"

namespace loom::cuda {

// max_seqlen: an upper bound on every sequence's length known on the host (0: unknown). It picks
// the decode kernel (1 with N == B) and skips the chunked launches when it is at most
// kKdaRecurrentMaxTokens; the result does not otherwise depend on it.
void kda_varlen_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& g, const Tensor& beta, float scale, const Tensor& states,
                        const Tensor& state_slots, const Tensor& cu_seqlens, const Tensor& out,
                        int64_t max_seqlen = 0);

// One sequence (state [Hv, dk, dv]), always the chunked form where the shape allows it.
void kda_chunked_forward(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& g, const Tensor& beta, float scale, const Tensor& state,
                         const Tensor& out);

// As kda_varlen_forward, with the state-pass tile width forced (32 or 64 value columns; 0 picks
// by shape) and the recurrent-form threshold given: for benchmarks and tests.
void kda_varlen_forward_tuned(const Exec& ex, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& g, const Tensor& beta, float scale,
                              const Tensor& states, const Tensor& state_slots,
                              const Tensor& cu_seqlens, const Tensor& out, int64_t max_seqlen,
                              int bv);

}  // namespace loom::cuda
