#include "engine/parallel/expert_parallel_dispatcher.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/moe.h"

namespace loom {
namespace {

// Adding -0.0f leaves every float as it is (x + -0 = x, -0 + -0 = -0, NaN stays NaN): what a rank
// puts in the reduce-scatter for the slots it did not compute, so the sum is the computing rank's
// bits whatever the rank order.
constexpr float kNeutral = -0.0f;

int64_t row_bytes_of(const Tensor& t) { return t.dim(0) > 0 ? t.nbytes() / t.dim(0) : 0; }

// dst[0, src rows) = src, the rows after it zero: a rank's block of a static-shape collective.
void copy_padded(const Tensor& src, const Tensor& dst) {
  const int64_t row = static_cast<int64_t>(dtype_size(dst.dtype())) *
                      (dst.numel() / std::max<int64_t>(dst.dim(0), 1));
  const int64_t used = src.dim(0) * row, all = dst.dim(0) * row;
  if (used > 0) std::memcpy(dst.raw(), src.raw(), used);
  if (all > used) std::memset(static_cast<char*>(dst.raw()) + used, 0, all - used);
}

// Moves the first counts[q] rows of each rank's block of `all` [N * cap, ...] together, in rank
// order, and returns them as [sum counts, ...]. Blocks only move down, so front to back is safe.
Tensor compact(const Tensor& all, const int64_t* counts, int n, int64_t cap) {
  const int64_t row = row_bytes_of(all);
  char* base = static_cast<char*>(all.raw());
  int64_t at = 0;
  for (int q = 0; q < n; ++q) {
    if (at != q * cap && counts[q] > 0)
      std::memmove(base + at * row, base + q * cap * row, counts[q] * row);
    at += counts[q];
  }
  return all.slice(0, 0, at);
}

// dst[j] = src[map[j]] for j < map's length, or kNeutral everywhere in the row for map[j] = -1.
void gather_rows(const Tensor& src, const int32_t* map, int64_t count, const Tensor& dst) {
  const int64_t d = dst.dim(1);
  const float* s = src.data<float>();
  float* o = dst.data<float>();
  for (int64_t j = 0; j < count; ++j) {
    if (map[j] >= 0) {
      std::memcpy(o + j * d, s + static_cast<int64_t>(map[j]) * d, d * sizeof(float));
    } else {
      std::fill(o + j * d, o + (j + 1) * d, kNeutral);
    }
  }
}

void check_f32_host(const Exec& ex, const char* op, std::initializer_list<const Tensor*> ts) {
  LOOM_CHECK(ex.device.is_cpu(), "ExpertParallelDispatcher::%s runs on the host (thread ranks)",
             op);
  for (const Tensor* t : ts)
    LOOM_CHECK(t->device().is_cpu() && t->dtype() == DType::kF32 && t->is_contiguous(),
               "ExpertParallelDispatcher::%s: %s (host, f32, contiguous)", op, t->describe());
}

}  // namespace

absl::StatusOr<ExpertExchange> parse_expert_exchange(std::string_view name) {
  if (name == "all_gather") return ExpertExchange::kAllGather;
  if (name == "all_to_all") return ExpertExchange::kAllToAll;
  return absl::InvalidArgumentError(
      absl::StrCat("expert exchange '", absl_sv(name), "': expected all_gather or all_to_all"));
}

std::string_view expert_exchange_name(ExpertExchange exchange) {
  return exchange == ExpertExchange::kAllGather ? "all_gather" : "all_to_all";
}

ExpertRange expert_range_of_rank(int64_t num_experts, int rank, int size) {
  LOOM_CHECK(size >= 1 && size <= num_experts && rank >= 0 && rank < size,
             "expert range of rank %d of %d over %d experts (every rank needs one)", rank, size,
             num_experts);
  const int64_t base = num_experts / size, extra = num_experts % size;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

ExpertParallelDispatcher::ExpertParallelDispatcher(Communicator& comm, int64_t num_experts,
                                                   ExpertExchange exchange)
    : comm_(comm),
      num_experts_(num_experts),
      exchange_(exchange),
      owned_(expert_range_of_rank(num_experts, comm.rank(), comm.size())) {}

ExpertParallelDispatcher::ExpertParallelDispatcher(Communicator& comm, ExpertLoadBalancer& balancer,
                                                   int layer, ExpertExchange exchange)
    : comm_(comm),
      num_experts_(balancer.num_experts()),
      exchange_(exchange),
      owned_{0,
             static_cast<int64_t>(balancer.placement(layer).rank_experts.at(comm.rank()).size())},
      balancer_(&balancer),
      layer_(layer) {
  LOOM_CHECK(layer >= 0 && layer < balancer.num_layers() &&
                 balancer.placement(layer).num_ranks == comm.size(),
             "ExpertParallelDispatcher: layer %d of a balancer of %d layers over %d ranks, %d here",
             layer, balancer.num_layers(), balancer.placement(0).num_ranks, comm.size());
}

int ExpertParallelDispatcher::destination(int64_t expert, int64_t t, int rank) const {
  if (balancer_ == nullptr) return owner_of(expert);
  return route_expert(balancer_->placement(layer_), expert, t, rank);
}

std::vector<int32_t> ExpertParallelDispatcher::slot_of_expert() const {
  // The first slot of each expert this rank holds (a repeated expert's later slots serve none).
  std::vector<int32_t> slot(static_cast<size_t>(num_experts_), -1);
  const std::vector<int32_t>& held = balancer_->placement(layer_).rank_experts[comm_.rank()];
  for (int64_t s = static_cast<int64_t>(held.size()) - 1; s >= 0; --s)
    slot[held[s]] = static_cast<int32_t>(s);
  return slot;
}

int ExpertParallelDispatcher::owner_of(int64_t expert) const {
  // Inverse of expert_range_of_rank: the first `extra` ranks hold base + 1 experts.
  const int n = comm_.size();
  const int64_t base = num_experts_ / n, extra = num_experts_ % n;
  const int64_t split = extra * (base + 1);
  return static_cast<int>(expert < split ? expert / (base + 1) : extra + (expert - split) / base);
}

Dispatched ExpertParallelDispatcher::failed(const Tensor& weights, int64_t d, Workspace& ws) const {
  Dispatched out;
  out.rows = ws.take({0, d});
  out.offsets = ws.take_zeros({owned_.count() + 1}, DType::kI32);
  out.weights = weights;
  return out;
}

Dispatched ExpertParallelDispatcher::dispatch(const Exec& ex, const Tensor& x,
                                              const Tensor& expert_ids, const Tensor& weights,
                                              Workspace& ws) {
  check_f32_host(ex, "dispatch", {&x, &weights});
  LOOM_CHECK(x.ndim() == 2 && expert_ids.ndim() == 2 && expert_ids.dtype() == DType::kI32 &&
                 expert_ids.dim(0) == x.dim(0) && weights.shape() == expert_ids.shape(),
             "ExpertParallelDispatcher::dispatch: x %s expert_ids %s weights %s", x.describe(),
             expert_ids.describe(), weights.describe());
  const int32_t* ids = expert_ids.data<int32_t>();
  for (int64_t j = 0; j < expert_ids.numel(); ++j)
    LOOM_CHECK(ids[j] >= 0 && ids[j] < num_experts_, "expert_ids[%d] = %d outside [0, %d)", j,
               ids[j], num_experts_);
  if (balancer_ != nullptr) {
    // Before routing: layer 0 may open a step with a new placement (a collective on every rank).
    balancer_->begin_layer(layer_);
    if (!dummy()) balancer_->count(layer_, ids, expert_ids.numel());
  }
  if (dummy()) {
    const Tensor none = x.slice(0, 0, 0), no_ids = expert_ids.slice(0, 0, 0),
                 no_weights = weights.slice(0, 0, 0);
    return exchange_ == ExpertExchange::kAllGather
               ? dispatch_all_gather(none, no_ids, no_weights, ws)
               : dispatch_all_to_all(none, no_ids, no_weights, ws);
  }
  return exchange_ == ExpertExchange::kAllGather ? dispatch_all_gather(x, expert_ids, weights, ws)
                                                 : dispatch_all_to_all(x, expert_ids, weights, ws);
}

Dispatched ExpertParallelDispatcher::dispatch_all_gather(const Tensor& x, const Tensor& expert_ids,
                                                         const Tensor& weights, Workspace& ws) {
  const int n = comm_.size();
  const int64_t t = x.dim(0), d = x.dim(1), k = expert_ids.dim(1);
  Dispatched out;
  out.weights = weights;
  out.peer_counts = ws.take({n}, DType::kI64);
  int64_t mine = t;
  if (!comm_.all_gather(Tensor::wrap(&mine, {1}, DType::kI64), out.peer_counts).ok())
    return failed(weights, d, ws);
  const int64_t* tokens = out.peer_counts.data<int64_t>();
  const int64_t cap = *std::max_element(tokens, tokens + n);

  // Every rank sends `cap` rows (static shapes); padding rows are dropped after the gather.
  Tensor x_pad = ws.take({cap, d}), ids_pad = ws.take({cap, k}, DType::kI32);
  copy_padded(x, x_pad);
  copy_padded(expert_ids, ids_pad);
  Tensor x_all = ws.take({n * cap, d}), ids_all = ws.take({n * cap, k}, DType::kI32);
  if (!comm_.all_gather(x_pad, x_all).ok() || !comm_.all_gather(ids_pad, ids_all).ok())
    return failed(weights, d, ws);
  x_all = compact(x_all, tokens, n, cap);
  ids_all = compact(ids_all, tokens, n, cap);

  // Balanced, a rank holds its slots (copies of experts) and computes only the gathered slots
  // routed to it: their ids become its local slots, the others' the slot count, one past the
  // owned slots, which moe_permute skips (so their moved_rows are -1 and the reduce-scatter takes
  // those slots from their own rank).
  int64_t id_limit = num_experts_;
  if (balancer_ != nullptr) {
    const std::vector<int32_t> slot = slot_of_expert();
    int32_t* gathered = ids_all.data<int32_t>();
    int64_t g = 0;
    for (int q = 0; q < n; ++q)
      for (int64_t tq = 0; tq < tokens[q]; ++tq)
        for (int64_t i = 0; i < k; ++i, ++g)
          gathered[g] = destination(gathered[g], tq, q) == comm_.rank()
                            ? slot[gathered[g]]
                            : static_cast<int32_t>(owned_.count());
    id_limit = owned_.count() + 1;
  }
  int64_t owned_slots = 0;
  for (int64_t j = 0; j < ids_all.numel(); ++j)
    owned_slots += owned_.contains(ids_all.data<int32_t>()[j]);
  out.rows = ws.take({owned_slots, d});
  out.offsets = ws.take({owned_.count() + 1}, DType::kI32);
  out.moved_rows = ws.take(ids_all.shape(), DType::kI32);
  moe_permute(host_exec(), x_all, ids_all, owned_.begin, id_limit, out.offsets, out.moved_rows,
              out.rows);
  out.row_of_slot = ws.take({t, k}, DType::kI32);
  for (int64_t j = 0; j < t * k; ++j) out.row_of_slot.data<int32_t>()[j] = static_cast<int32_t>(j);
  out.send_back = ws.take({n * cap * k, d});
  out.recv_back = ws.take({cap * k, d});
  return out;
}

Dispatched ExpertParallelDispatcher::dispatch_all_to_all(const Tensor& x, const Tensor& expert_ids,
                                                         const Tensor& weights, Workspace& ws) {
  const int n = comm_.size();
  const int64_t t = x.dim(0), d = x.dim(1), k = expert_ids.dim(1);
  Dispatched out;
  out.weights = weights;
  // The slots grouped by destination rank, slot order within (moe_permute with ranks for experts).
  Tensor dest = ws.take({t, k}, DType::kI32), send_offsets = ws.take({n + 1}, DType::kI32);
  const int32_t* ids = expert_ids.data<int32_t>();
  for (int64_t j = 0; j < t * k; ++j)
    dest.data<int32_t>()[j] = destination(ids[j], j / std::max<int64_t>(k, 1), comm_.rank());
  Tensor x_send = ws.take({t * k, d});
  out.row_of_slot = ws.take({t, k}, DType::kI32);
  moe_permute(host_exec(), x, dest, 0, n, send_offsets, out.row_of_slot, x_send);
  Tensor ids_send = ws.take({t * k, 1}, DType::kI32);
  for (int64_t j = 0; j < t * k; ++j)
    ids_send.data<int32_t>()[out.row_of_slot.data<int32_t>()[j]] = ids[j];

  // Counts: row 0 sent to each rank, row 1 received from each (from the all-gathered matrix).
  out.peer_counts = ws.take({2, n}, DType::kI64);
  int64_t* sent = out.peer_counts.data<int64_t>();
  int64_t* received = sent + n;
  for (int q = 0; q < n; ++q)
    sent[q] = send_offsets.data<int32_t>()[q + 1] - send_offsets.data<int32_t>()[q];
  Tensor matrix = ws.take({n, n}, DType::kI64);
  if (!comm_.all_gather(out.peer_counts.select(0).reshape({1, n}), matrix).ok())
    return failed(weights, d, ws);
  int64_t r_in = 0;
  for (int q = 0; q < n; ++q) {
    received[q] = matrix.data<int64_t>()[q * n + comm_.rank()];
    r_in += received[q];
  }
  const std::span<const int64_t> sent_span(sent, n), received_span(received, n);

  Tensor x_recv = ws.take({r_in, d}), ids_recv = ws.take({r_in, 1}, DType::kI32);
  if (!comm_.all_to_all(x_send, sent_span, x_recv, received_span).ok() ||
      !comm_.all_to_all(ids_send, sent_span, ids_recv, received_span).ok())
    return failed(weights, d, ws);
  // Received in (source rank, slot) order: each expert's rows come out in the order one rank
  // holding every expert would give them. Balanced, the experts become this rank's slots.
  int64_t id_limit = num_experts_;
  if (balancer_ != nullptr) {
    const std::vector<int32_t> slot = slot_of_expert();
    int32_t* received_ids = ids_recv.data<int32_t>();
    for (int64_t j = 0; j < r_in; ++j) {
      LOOM_CHECK(slot[received_ids[j]] >= 0, "rank %d got a row of expert %d, holding no copy",
                 comm_.rank(), received_ids[j]);
      received_ids[j] = slot[received_ids[j]];
    }
    id_limit = owned_.count();
  }
  out.rows = ws.take({r_in, d});
  out.offsets = ws.take({owned_.count() + 1}, DType::kI32);
  out.moved_rows = ws.take({r_in, 1}, DType::kI32);
  moe_permute(host_exec(), x_recv, ids_recv, owned_.begin, id_limit, out.offsets, out.moved_rows,
              out.rows);
  out.send_back = ws.take({r_in, d});
  out.recv_back = ws.take({t * k, d});
  return out;
}

bool ExpertParallelDispatcher::return_rows(const Tensor& rows, const Dispatched& d) {
  const int n = comm_.size();
  const int64_t k = d.weights.dim(1);
  if (exchange_ == ExpertExchange::kAllGather) {
    // Each gathered slot's row at its token's place in its rank's block, kNeutral elsewhere.
    const int64_t* tokens = d.peer_counts.data<int64_t>();
    const int64_t cap = d.recv_back.dim(0) / std::max<int64_t>(k, 1);
    const int32_t* moved = d.moved_rows.data<int32_t>();
    for (int q = 0; q < n; ++q) {
      const Tensor block = d.send_back.slice(0, q * cap * k, (q + 1) * cap * k);
      gather_rows(rows, moved, tokens[q] * k, block);
      const Tensor pad = block.slice(0, tokens[q] * k, cap * k);
      std::fill(pad.data<float>(), pad.data<float>() + pad.numel(), kNeutral);
      moved += tokens[q] * k;
    }
    return comm_.reduce_scatter(d.send_back, d.recv_back).ok();
  }
  const int64_t* sent = d.peer_counts.data<int64_t>();
  gather_rows(rows, d.moved_rows.data<int32_t>(), d.send_back.dim(0), d.send_back);
  return comm_
      .all_to_all(d.send_back, std::span<const int64_t>(sent + n, n), d.recv_back,
                  std::span<const int64_t>(sent, n))
      .ok();
}

void ExpertParallelDispatcher::combine(const Exec& ex, const Tensor& y, const Dispatched& d,
                                       const Tensor& out) {
  check_f32_host(ex, "combine", {&y, &out});
  auto zero = [&] { std::fill(out.data<float>(), out.data<float>() + out.numel(), 0.0f); };
  if (!comm_.status().ok()) return zero();
  // The rows dispatch sent (all but a dummy step's filler rows, which get zeros).
  const int64_t sent_tokens = d.weights.dim(0);
  if (sent_tokens < out.dim(0)) {
    const Tensor filler = out.slice(0, sent_tokens, out.dim(0));
    std::fill(filler.data<float>(), filler.data<float>() + filler.numel(), 0.0f);
  }
  if (!return_rows(y, d)) return zero();
  moe_unpermute_combine(host_exec(), d.recv_back, d.row_of_slot, d.weights,
                        out.slice(0, 0, sent_tokens));
}

void ExpertParallelDispatcher::combine_backward(const Exec& ex, const Tensor& y,
                                                const Dispatched& d, const Tensor& d_out,
                                                const Tensor& d_y, const Tensor& d_weights) {
  check_f32_host(ex, "combine_backward", {&y, &d_out, &d_y, &d_weights});
  LOOM_CHECK(ex.workspace != nullptr,
             "ExpertParallelDispatcher::combine_backward needs a workspace");
  Workspace& ws = *ex.workspace;
  const Workspace::Mark scope(ws);
  auto zero = [&] {
    std::fill(d_weights.data<float>(), d_weights.data<float>() + d_weights.numel(), 0.0f);
  };
  if (!comm_.status().ok()) return zero();
  const int n = comm_.size();
  const int64_t t = d_out.dim(0), dim = d_out.dim(1), k = d.weights.dim(1);
  if (exchange_ == ExpertExchange::kAllGather) {
    // Every rank's d_out and gate weights, as x and the ids went; this rank's experts' share of
    // d_y and of the gate weights' gradient, returned to the tokens' ranks by a reduce-scatter
    // (kNeutral for the slots of other ranks' experts).
    const int64_t* tokens = d.peer_counts.data<int64_t>();
    const int64_t cap = d.recv_back.dim(0) / std::max<int64_t>(k, 1);
    Tensor g_pad = ws.take({cap, dim}), w_pad = ws.take({cap, k});
    copy_padded(d_out, g_pad);
    copy_padded(d.weights, w_pad);
    Tensor g_all = ws.take({n * cap, dim}), w_all = ws.take({n * cap, k});
    if (!comm_.all_gather(g_pad, g_all).ok() || !comm_.all_gather(w_pad, w_all).ok()) return zero();
    g_all = compact(g_all, tokens, n, cap);
    w_all = compact(w_all, tokens, n, cap);
    Tensor dw_all = ws.take(w_all.shape());
    moe_unpermute_combine_backward(host_exec(), y, d.moved_rows, w_all, g_all, d_y, dw_all);
    Tensor dw_send = ws.take({n * cap, k}), dw_recv = ws.take({cap, k});
    std::fill(dw_send.data<float>(), dw_send.data<float>() + dw_send.numel(), kNeutral);
    const int32_t* moved = d.moved_rows.data<int32_t>();
    int64_t g = 0;
    for (int q = 0; q < n; ++q)
      for (int64_t j = 0; j < tokens[q] * k; ++j, ++g)
        if (moved[g] >= 0) dw_send.data<float>()[q * cap * k + j] = dw_all.data<float>()[g];
    if (!comm_.reduce_scatter(dw_send, dw_recv).ok()) return zero();
    std::copy(dw_recv.data<float>(), dw_recv.data<float>() + t * k, d_weights.data<float>());
    return;
  }
  // All-to-all: each slot's d_out row and gate weight go where its row went.
  const int64_t* sent = d.peer_counts.data<int64_t>();
  const std::span<const int64_t> sent_span(sent, n), received_span(sent + n, n);
  const int64_t r_in = d.moved_rows.dim(0);
  const int32_t* slot_row = d.row_of_slot.data<int32_t>();
  Tensor g_send = ws.take({t * k, dim}), w_send = ws.take({t * k, 1});
  for (int64_t j = 0; j < t * k; ++j) {
    std::memcpy(g_send.data<float>() + static_cast<int64_t>(slot_row[j]) * dim,
                d_out.data<float>() + (j / k) * dim, dim * sizeof(float));
    w_send.data<float>()[slot_row[j]] = d.weights.data<float>()[j];
  }
  Tensor g_recv = ws.take({r_in, dim}), w_recv = ws.take({r_in, 1});
  if (!comm_.all_to_all(g_send, sent_span, g_recv, received_span).ok() ||
      !comm_.all_to_all(w_send, sent_span, w_recv, received_span).ok())
    return zero();
  // The local backward with the received rows for tokens and one choice each: the same products
  // and dot products, so the same bits.
  Tensor dw_recv = ws.take({r_in, 1}), dw_back = ws.take({t * k, 1});
  moe_unpermute_combine_backward(host_exec(), y, d.moved_rows, w_recv, g_recv, d_y, dw_recv);
  if (!comm_.all_to_all(dw_recv, received_span, dw_back, sent_span).ok()) return zero();
  for (int64_t j = 0; j < t * k; ++j)
    d_weights.data<float>()[j] = dw_back.data<float>()[slot_row[j]];
}

void ExpertParallelDispatcher::dispatch_backward(const Exec& ex, const Tensor& d_rows,
                                                 const Dispatched& d, const Tensor& d_x) {
  check_f32_host(ex, "dispatch_backward", {&d_rows, &d_x});
  LOOM_CHECK(ex.workspace != nullptr,
             "ExpertParallelDispatcher::dispatch_backward needs a workspace");
  if (!comm_.status().ok()) return;  // d_x keeps what it had: the driver discards the step
  Workspace& ws = *ex.workspace;
  const Workspace::Mark scope(ws);
  const int64_t t = d_x.dim(0), k = d.weights.dim(1);
  // The rows' gradients go back as the outputs did (send_back / recv_back are free again), then
  // each token adds its slots' in top-k order (moe_permute_backward, as the local dispatcher).
  if (!return_rows(d_rows, d)) return;
  moe_permute_backward(host_exec(), d.recv_back.slice(0, 0, t * k), d.row_of_slot, d_x);
}

}  // namespace loom
