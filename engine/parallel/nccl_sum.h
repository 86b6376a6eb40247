// The one kernel the NCCL ranks need (nccl_communicator.cc): reduce_scatter's sum in rank order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom {

// out[j] = blocks[0 * n + j] + blocks[1 * n + j] + ... + blocks[(size - 1) * n + j], added in that
// order (the Communicator contract's, so the bits are the thread ranks'), enqueued on `stream`.
cudaError_t sum_blocks_in_rank_order(const float* blocks, int64_t n, int size, float* out,
                                     cudaStream_t stream);

}  // namespace loom
