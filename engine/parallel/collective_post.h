// What one rank brings to a collective, and the two things every transport does with the posts of
// all ranks: check that they form one collective (the lockstep contract of communicator.h), and
// compute one rank's result from them. Thread ranks read their peers' posts in shared memory
// (thread_communicator.cc); ranks in other processes send theirs to node 0, which computes every
// rank's result (tcp_communicator.cc). One function computes them, so the transports agree bit
// for bit (reduce_scatter sums in rank order 0..size-1 in both).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/tensor.h"

namespace loom {

enum class CollectiveOp : uint8_t { kAllGather = 1, kReduceScatter = 2, kAllToAll = 3 };
const char* collective_op_name(CollectiveOp op);

struct CollectivePost {
  CollectiveOp op = CollectiveOp::kAllGather;
  uint64_t seq = 0;  // the rank's collective count: ranks in lockstep post the same
  const char* send = nullptr;
  DType dtype = DType::kF32;
  int64_t row_bytes = 0;  // bytes of one row (dims after the first)
  // Rows sent and received (all_to_all: the sums of the counts).
  int64_t send_rows = 0, recv_rows = 0;
  std::span<const int64_t> send_counts, recv_counts;  // all_to_all, one per rank
};

// Bytes of one row of t: its dims after the first.
int64_t collective_row_bytes(const Tensor& t);

// The shapes communicator.h's collectives take, checked the same way by every transport (the
// transport checks where the tensors live). A violation is a caller's bug: it aborts naming the op.
void check_all_gather_shapes(const Tensor& send, const Tensor& recv, int size);
void check_reduce_scatter_shapes(const Tensor& send, const Tensor& recv, int size);
struct AllToAllRows {
  int64_t sent = 0, received = 0;  // the sums of send_counts and recv_counts
};
AllToAllRows check_all_to_all_shapes(const Tensor& send, std::span<const int64_t> send_counts,
                                     const Tensor& recv, std::span<const int64_t> recv_counts,
                                     int size);

// "rank R posted OP #SEQ (N rows of B bytes, DTYPE)".
std::string describe_collective_post(int rank, const CollectivePost& p);

// Why the posts of ranks 0..size-1 (in rank order) cannot run as one collective, or "" when they
// can: another op or sequence number, dtype, row size, row counts (all_gather, reduce_scatter),
// or all_to_all counts that do not pair up (rank q's send_counts[r] != rank r's recv_counts[q]).
std::string collective_mismatch(std::span<const CollectivePost> posts);

// Writes rank `rank`'s result (recv_rows x row_bytes bytes) at `out`, from the matching posts of
// every rank (collective_mismatch empty). out must not overlap any send.
void collective_result(std::span<const CollectivePost> posts, int rank, char* out);

}  // namespace loom
