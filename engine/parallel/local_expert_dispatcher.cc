#include "engine/parallel/local_expert_dispatcher.h"

#include "core/status.h"
#include "kernels/moe.h"

namespace loom {

LocalExpertDispatcher::LocalExpertDispatcher(int64_t num_experts)
    : LocalExpertDispatcher(num_experts, ExpertRange{0, num_experts}) {}

LocalExpertDispatcher::LocalExpertDispatcher(int64_t num_experts, ExpertRange owned)
    : num_experts_(num_experts), owned_(owned) {
  LOOM_CHECK(num_experts >= 1, "LocalExpertDispatcher: %d experts", num_experts);
  LOOM_CHECK(owned.begin >= 0 && owned.begin < owned.end && owned.end <= num_experts,
             "LocalExpertDispatcher: experts [%d, %d) of %d", owned.begin, owned.end, num_experts);
}

Dispatched LocalExpertDispatcher::dispatch(const Exec& ex, const Tensor& x,
                                           const Tensor& expert_ids, const Tensor& weights,
                                           Workspace& ws) {
  LOOM_CHECK(x.ndim() == 2 && expert_ids.ndim() == 2,
             "LocalExpertDispatcher::dispatch: x %s expert_ids %s", x.describe().c_str(),
             expert_ids.describe().c_str());
  const int64_t t = x.dim(0), k = expert_ids.dim(1);
  Dispatched d;
  // The slots routed to owned experts stay here (all T * K of them when every expert is owned);
  // the rows are sized for all, the kept ones end at offsets[owned().count()]. They keep x's
  // dtype: moe_permute copies bf16 rows as bits, and the grouped GEMMs read them directly.
  d.rows = ws.take({t * k, x.dim(1)}, x.dtype());
  d.offsets = ws.take({owned_.count() + 1}, DType::kI32);
  d.row_of_slot = ws.take({t, k}, DType::kI32);
  d.weights = weights;
  moe_permute(ex, x, expert_ids, owned_.begin, num_experts_, d.offsets, d.row_of_slot, d.rows);
  return d;
}

void LocalExpertDispatcher::combine(const Exec& ex, const Tensor& y, const Dispatched& d,
                                    const Tensor& out) {
  moe_unpermute_combine(ex, y, d.row_of_slot, d.weights, out);
}

void LocalExpertDispatcher::combine_add(const Exec& ex, const Tensor& y, const Dispatched& d,
                                        const Tensor& out, const Tensor& addend) {
  moe_unpermute_combine(ex, y, d.row_of_slot, d.weights, out, addend);
}

void LocalExpertDispatcher::combine_backward(const Exec& ex, const Tensor& y, const Dispatched& d,
                                             const Tensor& d_out, const Tensor& d_y,
                                             const Tensor& d_weights) {
  moe_unpermute_combine_backward(ex, y, d.row_of_slot, d.weights, d_out, d_y, d_weights);
}

void LocalExpertDispatcher::dispatch_backward(const Exec& ex, const Tensor& d_rows,
                                              const Dispatched& d, const Tensor& d_x) {
  moe_permute_backward(ex, d_rows, d.row_of_slot, d_x);
}

}  // namespace loom
