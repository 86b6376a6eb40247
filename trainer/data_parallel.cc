#include "trainer/data_parallel.h"

#include <algorithm>
#include <bit>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace loom {

RankShare rank_share(size_t batch, int rank, int size) {
  LOOM_CHECK(size >= 1 && rank >= 0 && rank < size && batch % static_cast<size_t>(size) == 0,
             "rank_share: rank %d of %d, batch %zu", rank, size, batch);
  const size_t share = batch / static_cast<size_t>(size);
  return {share * static_cast<size_t>(rank), share * static_cast<size_t>(rank + 1)};
}

absl::Status all_reduce_sum(Communicator& comm, const Tensor& flat, Tensor& part) {
  const int64_t size = comm.size();
  if (flat.ndim() != 1 || flat.dtype() != DType::kF32 || flat.numel() % size != 0)
    return absl::InternalError(
        absl::StrCat("all_reduce_sum: ", flat.describe(), " is not f32 [", size, " * n]"));
  const int64_t n = flat.numel() / size;
  if (!part.defined() || part.numel() != n || part.device() != flat.device())
    part = Tensor::empty({n}, DType::kF32, flat.device());
  LOOM_RETURN_IF_ERROR(comm.reduce_scatter(flat, part));
  return comm.all_gather(part, flat);
}

absl::StatusOr<std::vector<double>> sum_over_ranks(Communicator& comm,
                                                   std::span<const double> values, Device device) {
  const int64_t m = static_cast<int64_t>(values.size()), size = comm.size();
  // all_gather copies bytes: the doubles travel as the bits of i64s (there is no f64 tensor).
  Tensor mine = Tensor::zeros({std::max<int64_t>(m, 1)}, DType::kI64);
  for (int64_t i = 0; i < m; ++i) mine.data<int64_t>()[i] = std::bit_cast<int64_t>(values[i]);
  Tensor all = Tensor::empty({size * mine.numel()}, DType::kI64, device);
  LOOM_RETURN_IF_ERROR(comm.all_gather(device.is_cpu() ? mine : mine.to(device), all));
  const Tensor host = device.is_cpu() ? all : all.to(Device::kCpu);
  std::vector<double> sum(values.size(), 0.0);
  for (int64_t r = 0; r < size; ++r)
    for (int64_t i = 0; i < m; ++i)
      sum[i] += std::bit_cast<double>(host.data<int64_t>()[r * mine.numel() + i]);
  return sum;
}

}  // namespace loom
