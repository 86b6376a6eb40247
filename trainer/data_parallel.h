// Data parallelism of the trainer: N replicas of the model, one per rank, each running its share
// of every batch, whose gradients are summed over the ranks before the update so that every
// replica applies the same one (TrainStep::set_data_parallel). The ranks are threads of one
// process: CPU ranks over shared memory (engine/parallel/thread_communicator.h), GPU ranks over
// NCCL (engine/parallel/nccl_communicator.h), one GPU each.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "engine/parallel/communicator.h"

namespace loom {

// The examples [begin, end) of a batch of `batch` that rank `rank` of `size` runs: consecutive
// equal shares in rank order (batch a multiple of size).
struct RankShare {
  size_t begin = 0, end = 0;
};
RankShare rank_share(size_t batch, int rank, int size);

// flat [size * n] f32 on the communicator's device becomes the sum over the ranks of every rank's
// flat, the same bits on every rank (reduce_scatter sums in rank order, then all_gather). `part`
// is scratch of [n] f32 on that device, allocated here when it is undefined or misshapen.
absl::Status all_reduce_sum(Communicator& comm, const Tensor& flat, Tensor& part);

// The element-wise sum over the ranks, in rank order, of every rank's `values` (the same length on
// every rank): a step's statistics and expert counts. `device` is the communicator's device; host
// values travel there and back.
absl::StatusOr<std::vector<double>> sum_over_ranks(Communicator& comm,
                                                   std::span<const double> values, Device device);

}  // namespace loom
