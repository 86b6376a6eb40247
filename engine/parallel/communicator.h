// The collectives expert parallelism needs, behind one small interface: ranks that are threads of
// one process (thread_communicator.h: shared memory and barriers, so CI tests the logic without
// GPUs) today, NCCL on GPUs later. The expert dispatcher is written against this interface only.
//
// Contract of every collective (what an NCCL implementation must keep too):
//  - Lockstep: every rank of the group issues the same collectives in the same order, with
//    matching shapes and counts; a rank with no tokens still joins, with zero rows.
//  - Deterministic: the result depends only on the ranks' inputs, never on timing. reduce_scatter
//    sums in rank order 0, 1, ..., size - 1 on every element.
//  - Failure is sticky and group-wide: once a rank aborts (or a collective waits longer than the
//    group's timeout) every pending and later collective of every rank returns that error at once;
//    the output buffers of a failed collective are unspecified. No collective ever hangs.
//  - Buffers are tensors of the communicator's device, contiguous, with rows along dim 0; send and
//    recv never overlap.
// A Communicator belongs to its rank's thread: one thread calls its collectives; abort() and
// status() may be called from anywhere.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace loom {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv [size * n, ...] receives every rank's send [n, ...] in rank order (n the same on every
  // rank: static shapes). Any dtype, the same on every rank.
  virtual absl::Status all_gather(const Tensor& send, const Tensor& recv) = 0;

  // send [size * n, ...] f32 on every rank; recv [n, ...] = the sum over ranks q = 0..size-1, in
  // that order, of block rank() of q's send.
  virtual absl::Status reduce_scatter(const Tensor& send, const Tensor& recv) = 0;

  // send holds send_counts[q] rows for each rank q, grouped in rank order; recv receives
  // recv_counts[q] rows from each rank q, grouped in rank order. recv_counts[q] on this rank must
  // equal send_counts[rank()] on rank q (exchange the counts first: all_gather). Any dtype.
  virtual absl::Status all_to_all(const Tensor& send, std::span<const int64_t> send_counts,
                                  const Tensor& recv, std::span<const int64_t> recv_counts) = 0;

  // Fails the group with `why` (kept if it is the first failure): every rank's pending and later
  // collectives return it. What a rank's driver calls when the rank itself fails.
  virtual void abort(const absl::Status& why) = 0;
  // OK while the group is healthy, else its first failure.
  virtual absl::Status status() const = 0;
};

// The lockstep of a step: every rank says how many tokens it has for the step and learns the sum
// over all ranks (one all_gather). 0: every rank is idle and all skip the step together;
// otherwise every rank runs a forward, one without tokens as an empty batch (its experts still
// serve the others' tokens).
absl::StatusOr<int64_t> lockstep_tokens(Communicator& comm, int64_t tokens);

}  // namespace loom
