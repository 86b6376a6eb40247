#include "engine/parallel/collective_post.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace loom {

const char* collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllGather:
      return "all_gather";
    case CollectiveOp::kReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::kAllToAll:
      return "all_to_all";
  }
  return "unknown collective";
}

int64_t collective_row_bytes(const Tensor& t) {
  int64_t n = static_cast<int64_t>(dtype_size(t.dtype()));
  for (int i = 1; i < t.ndim(); ++i) n *= t.dim(i);
  return n;
}

void check_all_gather_shapes(const Tensor& send, const Tensor& recv, int size) {
  LOOM_CHECK(recv.dtype() == send.dtype() &&
                 collective_row_bytes(recv) == collective_row_bytes(send) &&
                 recv.dim(0) == send.dim(0) * size,
             "all_gather: send %s, recv %s over %d ranks", send.describe(), recv.describe(), size);
}

void check_reduce_scatter_shapes(const Tensor& send, const Tensor& recv, int size) {
  LOOM_CHECK(send.dtype() == DType::kF32 && recv.dtype() == DType::kF32 &&
                 collective_row_bytes(recv) == collective_row_bytes(send) &&
                 send.dim(0) == recv.dim(0) * size,
             "reduce_scatter: send %s, recv %s over %d ranks (f32)", send.describe(),
             recv.describe(), size);
}

AllToAllRows check_all_to_all_shapes(const Tensor& send, std::span<const int64_t> send_counts,
                                     const Tensor& recv, std::span<const int64_t> recv_counts,
                                     int size) {
  LOOM_CHECK(
      static_cast<int>(send_counts.size()) == size && static_cast<int>(recv_counts.size()) == size,
      "all_to_all: %d send and %d recv counts over %d ranks", send_counts.size(),
      recv_counts.size(), size);
  AllToAllRows rows;
  for (int q = 0; q < size; ++q) {
    LOOM_CHECK(send_counts[q] >= 0 && recv_counts[q] >= 0, "all_to_all: negative count");
    rows.sent += send_counts[q];
    rows.received += recv_counts[q];
  }
  LOOM_CHECK(recv.dtype() == send.dtype() &&
                 collective_row_bytes(recv) == collective_row_bytes(send) &&
                 rows.sent <= send.dim(0) && rows.received <= recv.dim(0),
             "all_to_all: send %s for %d rows, recv %s for %d rows", send.describe(), rows.sent,
             recv.describe(), rows.received);
  return rows;
}

std::string describe_collective_post(int rank, const CollectivePost& p) {
  return absl::StrCat("rank ", rank, " posted ", collective_op_name(p.op), " #", p.seq, " (",
                      p.send_rows, " rows of ", p.row_bytes, " bytes, ",
                      absl_sv(dtype_name(p.dtype)), ")");
}

std::string collective_mismatch(std::span<const CollectivePost> posts) {
  const int size = static_cast<int>(posts.size());
  const CollectivePost& a = posts[0];
  for (int q = 1; q < size; ++q) {
    const CollectivePost& b = posts[q];
    if (a.op != b.op || a.seq != b.seq || a.dtype != b.dtype || a.row_bytes != b.row_bytes ||
        (a.op != CollectiveOp::kAllToAll &&
         (a.send_rows != b.send_rows || a.recv_rows != b.recv_rows)))
      return absl::StrCat(describe_collective_post(0, a), " but ", describe_collective_post(q, b));
  }
  if (a.op == CollectiveOp::kAllToAll) {
    for (int q = 0; q < size; ++q)
      if (static_cast<int>(posts[q].send_counts.size()) != size ||
          static_cast<int>(posts[q].recv_counts.size()) != size)
        return absl::StrCat("all_to_all #", a.seq, ": rank ", q, " gave ",
                            posts[q].send_counts.size(), " send and ", posts[q].recv_counts.size(),
                            " recv counts for ", size, " ranks");
    for (int q = 0; q < size; ++q)
      for (int r = 0; r < size; ++r)
        if (posts[q].send_counts[r] != posts[r].recv_counts[q])
          return absl::StrCat("all_to_all #", a.seq, ": rank ", q, " sends ",
                              posts[q].send_counts[r], " rows to rank ", r, ", which expects ",
                              posts[r].recv_counts[q]);
  }
  return "";
}

void collective_result(std::span<const CollectivePost> posts, int rank, char* out) {
  const int size = static_cast<int>(posts.size());
  const CollectivePost& mine = posts[rank];
  switch (mine.op) {
    case CollectiveOp::kAllGather: {
      const int64_t block = mine.send_rows * mine.row_bytes;
      for (int q = 0; q < size; ++q)
        if (block > 0) std::memcpy(out + q * block, posts[q].send, block);
      return;
    }
    case CollectiveOp::kReduceScatter: {
      // Rank 0's block, then each later rank's added in order: the rank order of the contract.
      const int64_t n = mine.recv_rows * mine.row_bytes / static_cast<int64_t>(sizeof(float));
      float* sum = reinterpret_cast<float*>(out);
      for (int q = 0; q < size; ++q) {
        const float* in = reinterpret_cast<const float*>(posts[q].send) + rank * n;
        if (q == 0) {
          std::copy(in, in + n, sum);
        } else {
          for (int64_t j = 0; j < n; ++j) sum[j] += in[j];
        }
      }
      return;
    }
    case CollectiveOp::kAllToAll: {
      for (int q = 0; q < size; ++q) {
        int64_t from = 0;  // q's rows for ranks before this one
        for (int r = 0; r < rank; ++r) from += posts[q].send_counts[r];
        const int64_t bytes = mine.recv_counts[q] * mine.row_bytes;
        if (bytes > 0) std::memcpy(out, posts[q].send + from * mine.row_bytes, bytes);
        out += bytes;
      }
      return;
    }
  }
  LOOM_CHECK(false, "collective_result: unknown op %d", static_cast<int>(mine.op));
}

}  // namespace loom
