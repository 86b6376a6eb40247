#include "engine/parallel/expert_placement.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace loom {
namespace {

// a / b > c / d for non-negative loads and positive copy counts, exactly (no rounding decides a
// placement, so every rank computes the same one).
bool heavier(int64_t a, int64_t b, int64_t c, int64_t d) {
  return static_cast<__int128>(a) * d > static_cast<__int128>(c) * b;
}

}  // namespace

int64_t ExpertPlacement::num_slots() const {
  int64_t n = 0;
  for (const auto& slots : rank_experts) n += static_cast<int64_t>(slots.size());
  return n;
}

bool ExpertPlacement::holds(int rank, int64_t expert) const {
  const auto& c = copies[static_cast<size_t>(expert)];
  return std::binary_search(c.begin(), c.end(), rank);
}

std::vector<int64_t> expert_slot_capacities(int64_t num_slots, int num_ranks) {
  LOOM_CHECK(num_ranks >= 1 && num_slots >= num_ranks, "%d slots over %d ranks", num_slots,
             num_ranks);
  std::vector<int64_t> caps(static_cast<size_t>(num_ranks), num_slots / num_ranks);
  for (int r = 0; r < num_slots % num_ranks; ++r) ++caps[static_cast<size_t>(r)];
  return caps;
}

absl::Status check_redundant_experts(int64_t num_experts, int num_ranks, int64_t redundant) {
  if (num_ranks < 1 || num_experts < num_ranks)
    return absl::InvalidArgumentError(absl::StrCat("expert parallelism over ", num_ranks,
                                                   " ranks needs at least one expert per rank (",
                                                   num_experts, " experts)"));
  if (redundant < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("--redundant_experts ", redundant, ": expected a count >= 0"));
  if (redundant > 0 && num_ranks == 1)
    return absl::InvalidArgumentError(absl::StrCat(
        "--redundant_experts ", redundant,
        ": redundant copies spread load over ranks and one rank already holds every expert"));
  const int64_t most = num_experts * (num_ranks - 1);
  if (redundant > most)
    return absl::InvalidArgumentError(
        absl::StrCat("--redundant_experts ", redundant, ": at most ", most, " (", num_experts,
                     " experts with one copy on each of ", num_ranks,
                     " ranks; more would put two copies of "
                     "one expert on one rank, which serves no token faster)"));
  return absl::OkStatus();
}

ExpertPlacement contiguous_placement(int64_t num_experts, int num_ranks) {
  LOOM_CHECK(check_redundant_experts(num_experts, num_ranks, 0).ok(), "%d experts over %d ranks",
             num_experts, num_ranks);
  ExpertPlacement p;
  p.num_experts = num_experts;
  p.num_ranks = num_ranks;
  p.rank_experts.resize(static_cast<size_t>(num_ranks));
  p.copies.resize(static_cast<size_t>(num_experts));
  const std::vector<int64_t> caps = expert_slot_capacities(num_experts, num_ranks);
  int64_t e = 0;
  for (int r = 0; r < num_ranks; ++r)
    for (int64_t i = 0; i < caps[static_cast<size_t>(r)]; ++i, ++e) {
      p.rank_experts[static_cast<size_t>(r)].push_back(static_cast<int32_t>(e));
      p.copies[static_cast<size_t>(e)].push_back(r);
    }
  return p;
}

ExpertPlacement balanced_placement(std::span<const int64_t> load, int num_ranks,
                                   int64_t redundant) {
  const int64_t num_experts = static_cast<int64_t>(load.size());
  const absl::Status valid = check_redundant_experts(num_experts, num_ranks, redundant);
  LOOM_CHECK(valid.ok(), "balanced_placement: %s", valid.ToString());
  for (int64_t e = 0; e < num_experts; ++e)
    LOOM_CHECK(load[e] >= 0, "balanced_placement: load[%d] = %d", e, load[e]);

  // 1. Replication: each extra copy to the expert with the most load per copy.
  std::vector<int64_t> n_copies(static_cast<size_t>(num_experts), 1);
  for (int64_t k = 0; k < redundant; ++k) {
    int64_t best = -1;
    for (int64_t e = 0; e < num_experts; ++e) {
      if (n_copies[e] >= num_ranks) continue;
      if (best < 0 || heavier(load[e], n_copies[e], load[best], n_copies[best])) best = e;
    }
    ++n_copies[best];  // exists: redundant <= num_experts * (num_ranks - 1)
  }

  // 2. Packing, heaviest copy first. An expert's copies weigh the same, so they are placed one
  // after another and the "not on a rank that holds it" preference sees all of them.
  std::vector<int64_t> order(static_cast<size_t>(num_experts));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return heavier(load[a], n_copies[a], load[b], n_copies[b]);
  });
  ExpertPlacement p;
  p.num_experts = num_experts;
  p.num_ranks = num_ranks;
  p.rank_experts.resize(static_cast<size_t>(num_ranks));
  p.copies.resize(static_cast<size_t>(num_experts));
  std::vector<int64_t> free_slots = expert_slot_capacities(num_experts + redundant, num_ranks);
  std::vector<double> rank_load(static_cast<size_t>(num_ranks), 0.0);
  for (const int64_t e : order) {
    const double share = static_cast<double>(load[e]) / static_cast<double>(n_copies[e]);
    auto& holders = p.copies[static_cast<size_t>(e)];
    for (int64_t c = 0; c < n_copies[e]; ++c) {
      int pick = -1, fallback = -1;
      for (int r = 0; r < num_ranks; ++r) {
        if (free_slots[r] == 0) continue;
        if (fallback < 0 || rank_load[r] < rank_load[fallback]) fallback = r;
        if (std::find(holders.begin(), holders.end(), r) != holders.end()) continue;
        if (pick < 0 || rank_load[r] < rank_load[pick]) pick = r;
      }
      if (pick < 0) pick = fallback;  // every rank with room holds e: a second copy there
      --free_slots[pick];
      rank_load[pick] += share;
      holders.push_back(pick);
      p.rank_experts[static_cast<size_t>(pick)].push_back(static_cast<int32_t>(e));
    }
    std::sort(holders.begin(), holders.end());
  }
  for (auto& slots : p.rank_experts) std::sort(slots.begin(), slots.end());
  return p;
}

absl::Status check_placement(const ExpertPlacement& p) {
  if (p.num_ranks < 1 || static_cast<int64_t>(p.rank_experts.size()) != p.num_ranks ||
      static_cast<int64_t>(p.copies.size()) != p.num_experts)
    return absl::InternalError(absl::StrCat("placement of ", p.num_experts, " experts over ",
                                            p.num_ranks, " ranks has ", p.rank_experts.size(),
                                            " rank lists and ", p.copies.size(), " copy lists"));
  const std::vector<int64_t> caps = expert_slot_capacities(p.num_slots(), p.num_ranks);
  std::vector<int64_t> seen(static_cast<size_t>(p.num_experts), 0);
  for (int r = 0; r < p.num_ranks; ++r) {
    const auto& slots = p.rank_experts[r];
    if (static_cast<int64_t>(slots.size()) != caps[r])
      return absl::InternalError(
          absl::StrCat("rank ", r, " holds ", slots.size(), " slots, its capacity is ", caps[r]));
    for (const int32_t e : slots) {
      if (e < 0 || e >= p.num_experts)
        return absl::InternalError(absl::StrCat("rank ", r, " holds expert ", e));
      ++seen[e];
      const auto& c = p.copies[e];
      if (std::count(c.begin(), c.end(), r) != std::count(slots.begin(), slots.end(), e))
        return absl::InternalError(
            absl::StrCat("expert ", e, ": copies and rank ", r, "'s slots disagree"));
    }
  }
  for (int64_t e = 0; e < p.num_experts; ++e) {
    const auto& c = p.copies[e];
    if (c.empty() || static_cast<int64_t>(c.size()) > p.num_ranks ||
        static_cast<int64_t>(c.size()) != seen[e] || !std::is_sorted(c.begin(), c.end()))
      return absl::InternalError(absl::StrCat("expert ", e, " has ", c.size(), " copies (", seen[e],
                                              " slots; expected 1..", p.num_ranks, ")"));
  }
  return absl::OkStatus();
}

std::vector<double> expert_rank_loads(const ExpertPlacement& p, std::span<const int64_t> load) {
  LOOM_CHECK(static_cast<int64_t>(load.size()) == p.num_experts, "%d loads for %d experts",
             load.size(), p.num_experts);
  std::vector<double> out(static_cast<size_t>(p.num_ranks), 0.0);
  for (int64_t e = 0; e < p.num_experts; ++e) {
    const auto& c = p.copies[e];
    const double share = static_cast<double>(load[e]) / static_cast<double>(c.size());
    for (const int32_t r : c) out[r] += share;
  }
  return out;
}

double expert_load_balance(const ExpertPlacement& p, std::span<const int64_t> load) {
  const std::vector<double> loads = expert_rank_loads(p, load);
  const double most = *std::max_element(loads.begin(), loads.end());
  if (most <= 0.0) return 1.0;
  const double mean = std::accumulate(loads.begin(), loads.end(), 0.0) / loads.size();
  return mean / most;
}

int route_expert(const ExpertPlacement& p, int64_t expert, int64_t token_index, int my_rank) {
  const auto& c = p.copies[static_cast<size_t>(expert)];
  if (std::binary_search(c.begin(), c.end(), my_rank)) return my_rank;
  return c[static_cast<size_t>((token_index + my_rank) % static_cast<int64_t>(c.size()))];
}

ExpertLoadWindow::ExpertLoadWindow(int num_layers, int64_t num_experts, int steps)
    : num_layers_(num_layers), num_experts_(num_experts), steps_(steps) {
  LOOM_CHECK(num_layers >= 1 && num_experts >= 1 && steps >= 1,
             "ExpertLoadWindow: %d layers, %d experts, %d steps", num_layers, num_experts, steps);
  ring_.assign(static_cast<size_t>(steps) * num_layers * num_experts, 0);
  sums_.assign(static_cast<size_t>(num_layers) * num_experts, 0);
}

int64_t* ExpertLoadWindow::step_counts(int step, int layer) {
  return ring_.data() + (static_cast<size_t>(step) * num_layers_ + layer) * num_experts_;
}

void ExpertLoadWindow::add(int layer, int64_t expert, int64_t count) {
  LOOM_CHECK(layer >= 0 && layer < num_layers_ && expert >= 0 && expert < num_experts_,
             "ExpertLoadWindow::add: layer %d expert %d", layer, expert);
  step_counts(current_, layer)[expert] += count;
  sums_[static_cast<size_t>(layer) * num_experts_ + expert] += count;
}

void ExpertLoadWindow::next_step() {
  current_ = (current_ + 1) % steps_;
  if (held_ == steps_) {
    // The ring slot the new step reuses held the oldest step: it leaves the sums.
    for (int l = 0; l < num_layers_; ++l) {
      int64_t* old = step_counts(current_, l);
      int64_t* sum = sums_.data() + static_cast<size_t>(l) * num_experts_;
      for (int64_t e = 0; e < num_experts_; ++e) sum[e] -= old[e];
      std::fill(old, old + num_experts_, 0);
    }
  } else {
    ++held_;
  }
}

std::span<const int64_t> ExpertLoadWindow::sum(int layer) const {
  LOOM_CHECK(layer >= 0 && layer < num_layers_, "ExpertLoadWindow::sum: layer %d", layer);
  return {sums_.data() + static_cast<size_t>(layer) * num_experts_,
          static_cast<size_t>(num_experts_)};
}

}  // namespace loom
