// CPU implementation of kda_chunked_backward (kernels/kda_backward.h; contracts checked there).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace loom::cpu {

// f32 elements of the one scratch tensor kda_chunked_backward carves its memory from, for a
// sequence of T tokens: the state before every chunk of every value head (ceil(T / kKdaChunk)
// states each), each value head's share of dq and dk when value heads share a key head, and one
// set of chunk buffers (independent of T) per thread. Depends on the OpenMP thread count of the
// calling thread, so size it on the thread that calls kda_chunked_backward.
int64_t kda_chunked_backward_scratch_floats(int64_t T, int64_t Hk, int64_t Hv, int64_t dk,
                                            int64_t dv);

// `scratch`: f32, contiguous, at least kda_chunked_backward_scratch_floats(...) elements.
void kda_chunked_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                          const Tensor& beta, float scale, const Tensor& initial_state,
                          const Tensor& d_out, const Tensor& d_final_state, const Tensor& dq,
                          const Tensor& dk, const Tensor& dv, const Tensor& dg, const Tensor& dbeta,
                          const Tensor& d_initial_state, const Tensor& scratch);

}  // namespace loom::cpu
