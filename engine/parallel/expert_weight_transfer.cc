#include "engine/parallel/expert_weight_transfer.h"

#include <algorithm>
#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/fp8_matrix.h"
#include "core/status.h"

namespace loom {
namespace {

// Where one new slot's weights come from.
struct Move {
  int src = 0;  // the rank holding the expert under the old placement
  int64_t src_slot = 0;
  int dst = 0;  // the rank whose new slot it is
  int64_t dst_slot = 0;
};

int64_t slot_of(const ExpertPlacement& p, int rank, int32_t expert) {
  const std::vector<int32_t>& slots = p.rank_experts[rank];
  const auto it = std::find(slots.begin(), slots.end(), expert);
  LOOM_CHECK(it != slots.end(), "expert %d has no slot on rank %d", expert, rank);
  return it - slots.begin();
}

// Every rank's new slots in rank, then slot order: the same list on every rank.
std::vector<Move> plan_moves(const ExpertPlacement& from, const ExpertPlacement& to) {
  std::vector<Move> moves;
  for (int q = 0; q < to.num_ranks; ++q) {
    const std::vector<int32_t>& slots = to.rank_experts[q];
    for (int64_t s = 0; s < static_cast<int64_t>(slots.size()); ++s) {
      const int32_t e = slots[s];
      int src = q;
      if (!from.holds(q, e)) {
        const std::vector<int32_t>& holders = from.copies[e];
        src = holders[static_cast<size_t>((q + s) % static_cast<int64_t>(holders.size()))];
      }
      moves.push_back({src, slot_of(from, src, e), q, s});
    }
  }
  return moves;
}

// The weights as matrices of one row per slot (values, and an FP8 matrix's block scales): what
// travels.
std::vector<Tensor> slot_rows(const ExpertSlotWeights& w) {
  std::vector<Tensor> rows;
  for (const Tensor* t : {&w.gate, &w.up, &w.down}) {
    const int64_t s = t->dim(0);
    rows.push_back(t->reshape({s, t->numel() / s}));
    if (t->dtype() == DType::kF8E4M3) {
      const Tensor scales = fp8_matrix_scales(*t);
      rows.push_back(scales.reshape({s, scales.numel() / s}));
    }
  }
  return rows;
}

void copy_row(const Tensor& src, int64_t i, const Tensor& dst, int64_t j) {
  dst.slice(0, j, j + 1).copy_from(src.slice(0, i, i + 1));
}

}  // namespace

absl::StatusOr<std::vector<ExpertSlotWeights>> find_expert_slot_weights(const ParameterArena& arena,
                                                                        const ModelConfig& cfg) {
  std::vector<ExpertSlotWeights> layers;
  for (int l = 0; l < cfg.num_layers; ++l) {
    if (cfg.ffns[l] != FfnType::kMoe) continue;
    ExpertSlotWeights w;
    for (auto [name, t] : {std::pair{"gate", &w.gate}, {"up", &w.up}, {"down", &w.down}}) {
      const std::string full = absl::StrCat("layers.", l, ".moe.experts.", name);
      const Tensor* found = arena.find(full);
      if (found == nullptr)
        return absl::InvalidArgumentError(absl::StrCat("the model has no parameter ", full));
      *t = *found;
    }
    if (w.gate.dim(0) != w.up.dim(0) || w.gate.dim(0) != w.down.dim(0))
      return absl::InvalidArgumentError(absl::StrCat("MoE layer ", l, ": expert weights ",
                                                     w.gate.describe(), ", ", w.up.describe(), ", ",
                                                     w.down.describe(), " disagree on the slots"));
    layers.push_back(std::move(w));
  }
  return layers;
}

size_t expert_weight_bytes(const ParameterArena& arena) {
  size_t total = 0;
  for (const ParameterArena::Entry& e : arena.entries()) {
    if (e.name.find(".moe.experts.") == std::string::npos) continue;
    total += e.tensor.dtype() == DType::kF8E4M3 ? fp8_storage_bytes(e.tensor.shape())
                                                : e.tensor.nbytes();
  }
  return total;
}

absl::Status CommunicatorExpertWeightTransfer::apply(const ExpertPlacement& from,
                                                     const ExpertPlacement& to,
                                                     const ExpertSlotWeights& weights) {
  const int n = comm_.size(), me = comm_.rank();
  if (from.num_ranks != n || to.num_ranks != n || from.num_experts != to.num_experts)
    return absl::InvalidArgumentError(absl::StrCat(
        "expert re-placement from ", from.num_experts, " experts over ", from.num_ranks,
        " ranks to ", to.num_experts, " over ", to.num_ranks, ", in a group of ", n));
  for (int q = 0; q < n; ++q)
    if (from.rank_experts[q].size() != to.rank_experts[q].size())
      return absl::InvalidArgumentError(absl::StrCat("expert re-placement changes rank ", q,
                                                     "'s slots from ", from.rank_experts[q].size(),
                                                     " to ", to.rank_experts[q].size()));
  const int64_t slots = static_cast<int64_t>(to.rank_experts[me].size());
  if (weights.gate.dim(0) != slots)
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", me, " holds ", slots, " expert slots but weights ", weights.gate.describe()));
  // Unchanged on every rank (every rank sees the same placements): no collective at all.
  if (from.rank_experts == to.rank_experts) return absl::OkStatus();

  const std::vector<Move> moves = plan_moves(from, to);
  std::vector<int64_t> send_counts(n, 0), recv_counts(n, 0);
  std::vector<const Move*> sends, mine(static_cast<size_t>(slots), nullptr);
  for (const Move& m : moves) {
    if (m.src == me && m.dst != me) {
      ++send_counts[m.dst];
      sends.push_back(&m);  // plan order: by destination rank, then its slot
    }
    if (m.dst == me) {
      mine[m.dst_slot] = &m;
      if (m.src != me) ++recv_counts[m.src];
    }
  }
  // Received rows arrive by source rank, then destination slot: each slot's row in that order.
  std::vector<int64_t> recv_row(static_cast<size_t>(slots), -1);
  {
    std::vector<int64_t> at(n, 0);
    for (int p = 1; p < n; ++p) at[p] = at[p - 1] + recv_counts[p - 1];
    for (int64_t s = 0; s < slots; ++s)
      if (mine[s]->src != me) recv_row[s] = at[mine[s]->src]++;
  }
  int64_t total_send = 0, total_recv = 0;
  for (int q = 0; q < n; ++q) {
    total_send += send_counts[q];
    total_recv += recv_counts[q];
  }
  for (const Tensor& rows : slot_rows(weights)) {
    const int64_t width = rows.dim(1);
    const Tensor send = Tensor::empty({total_send, width}, rows.dtype(), rows.device());
    const Tensor recv = Tensor::empty({total_recv, width}, rows.dtype(), rows.device());
    for (size_t i = 0; i < sends.size(); ++i)
      copy_row(rows, sends[i]->src_slot, send, static_cast<int64_t>(i));
    LOOM_RETURN_IF_ERROR(comm_.all_to_all(send, send_counts, recv, recv_counts));
    // Staged, so that a slot's old weights are still there for the slots that take them.
    const Tensor staged = Tensor::empty({slots, width}, rows.dtype(), rows.device());
    for (int64_t s = 0; s < slots; ++s) {
      if (recv_row[s] >= 0) {
        copy_row(recv, recv_row[s], staged, s);
      } else {
        copy_row(rows, mine[s]->src_slot, staged, s);
      }
    }
    rows.copy_from(staged);
    moved_.bytes += recv.nbytes();
  }
  moved_.experts += total_recv;
  return absl::OkStatus();
}

}  // namespace loom
