// The expert load balancer driving ExpertParallelDispatcher over thread ranks: with redundant
// copies and placements recomputed every few steps from skewed routing, every step's outputs
// must equal one rank holding every expert over the concatenation of the ranks' tokens, bit for
// bit under batch-invariant numerics (each row computed alone, so splitting an expert's rows over
// its copies changes nothing) and within f32 GEMM rounding under the default numerics; and the
// recomputed placement must balance the skewed load better than the contiguous ranges. Each rank
// holds only its slots' weights, moved between ranks at each re-placement: afterwards every slot
// must hold its expert's weights bit for bit.
#include "engine/parallel/expert_load_balancer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/parallel/expert_dispatcher_binding.h"
#include "engine/parallel/expert_parallel_dispatcher.h"
#include "engine/parallel/local_expert_dispatcher.h"
#include "engine/parallel/thread_communicator.h"
#include "kernels/moe.h"
#include "weights/weight_loader.h"

namespace loom {
namespace {

Tensor random_tensor(Shape shape, std::mt19937& rng, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape);
  std::normal_distribution<float> dist(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

struct Run {
  int ranks;
  int64_t experts, top_k;
  int layers, steps;
  ExpertBalanceOptions options;
  bool batch_invariant;
};

// Per step and layer each rank routes its tokens to distinct experts drawn with Zipf-like
// popularity (expert 0 hottest), so the contiguous ranges leave rank 0 the busiest.
void check_run(const Run& run, ExpertExchange exchange, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << expert_exchange_name(exchange) << ", " << run.ranks
                                  << " ranks, " << run.experts << " experts, top-" << run.top_k
                                  << ", K " << run.options.redundant_experts << ", interval "
                                  << run.options.interval_steps << ", batch invariant "
                                  << run.batch_invariant);
  std::mt19937 rng(seed);
  const int64_t e = run.experts, k = run.top_k, d = 16, inter = 12;
  std::vector<Tensor> w_gate, w_up, w_down;  // per layer, every expert
  for (int l = 0; l < run.layers; ++l) {
    w_gate.push_back(random_tensor({e, inter, d}, rng, 0.3f));
    w_up.push_back(random_tensor({e, inter, d}, rng, 0.3f));
    w_down.push_back(random_tensor({e, d, inter}, rng, 0.3f));
  }
  std::vector<double> popularity(static_cast<size_t>(e));
  for (int64_t x = 0; x < e; ++x) popularity[x] = 1.0 / static_cast<double>(x + 1);
  std::discrete_distribution<int32_t> pick(popularity.begin(), popularity.end());
  // [step][layer][rank]: x, ids, gate weights; a rank may have no tokens in a step.
  struct Input {
    Tensor x, ids, w;
  };
  std::vector<std::vector<std::vector<Input>>> in(run.steps);
  for (int s = 0; s < run.steps; ++s) {
    in[s].resize(run.layers);
    for (int l = 0; l < run.layers; ++l)
      for (int r = 0; r < run.ranks; ++r) {
        const int64_t t = (s + r) % 4 == 3 ? 0 : 8 + static_cast<int64_t>(rng() % 24);
        Input i{random_tensor({t, d}, rng), Tensor::empty({t, k}, DType::kI32),
                Tensor::empty({t, k})};
        for (int64_t tok = 0; tok < t; ++tok) {
          std::vector<int32_t> chosen;
          while (static_cast<int64_t>(chosen.size()) < k) {
            const int32_t x = pick(rng);
            if (std::find(chosen.begin(), chosen.end(), x) == chosen.end()) chosen.push_back(x);
          }
          for (int64_t j = 0; j < k; ++j) {
            i.ids.data<int32_t>()[tok * k + j] = chosen[j];
            i.w.data<float>()[tok * k + j] = 0.1f + 0.05f * static_cast<float>(j);
          }
        }
        in[s][l].push_back(std::move(i));
      }
  }

  // One rank holding every expert over the ranks' tokens in rank order.
  Exec ref_ex;
  ref_ex.batch_invariant = run.batch_invariant;
  std::vector<std::vector<Tensor>> ref(run.steps, std::vector<Tensor>(run.layers));
  for (int s = 0; s < run.steps; ++s)
    for (int l = 0; l < run.layers; ++l) {
      int64_t total = 0;
      for (const Input& i : in[s][l]) total += i.x.dim(0);
      Tensor x = Tensor::empty({total, d}), ids = Tensor::empty({total, k}, DType::kI32),
             w = Tensor::empty({total, k});
      int64_t at = 0;
      for (const Input& i : in[s][l]) {
        const int64_t t = i.x.dim(0);
        if (t == 0) continue;
        std::memcpy(x.data<float>() + at * d, i.x.raw(), i.x.nbytes());
        std::memcpy(ids.data<int32_t>() + at * k, i.ids.raw(), i.ids.nbytes());
        std::memcpy(w.data<float>() + at * k, i.w.raw(), i.w.nbytes());
        at += t;
      }
      Workspace ws(Device::kCpu);
      LocalExpertDispatcher local(e);
      const Dispatched dd = local.dispatch(ref_ex, x, ids, w, ws);
      Tensor y = Tensor::empty(dd.rows.shape());
      moe_grouped_swiglu(ref_ex, dd.rows, dd.offsets, w_gate[l], w_up[l], w_down[l], y);
      ref[s][l] = Tensor::empty({total, d});
      local.combine(ref_ex, y, dd, ref[s][l]);
    }

  // [step][layer][rank] outputs of the ranks; the balance rank 0's balancer saw.
  std::vector<std::vector<std::vector<Tensor>>> got(
      run.steps, std::vector<std::vector<Tensor>>(run.layers, std::vector<Tensor>(run.ranks)));
  ExpertLoadBalancer::Balance balance;
  std::vector<std::vector<ExpertPlacement>> final_placements(run.ranks);
  std::vector<int64_t> moved(run.ranks, 0);  // expert weights each rank received
  const absl::Status st =
      run_thread_ranks(run.ranks, absl::Seconds(20), [&](Communicator& comm) -> absl::Status {
        const int r = comm.rank();
        ExpertLoadBalancer balancer(comm, run.layers, e, run.options);
        // The rank's slots of every layer, as a model loaded with load_slots() holds them.
        const std::vector<int32_t> load_slots = balancer.load_slots();
        const int64_t slots = static_cast<int64_t>(load_slots.size());
        std::vector<ExpertSlotWeights> mine(run.layers);
        for (int l = 0; l < run.layers; ++l) {
          mine[l] = {Tensor::empty({slots, inter, d}), Tensor::empty({slots, inter, d}),
                     Tensor::empty({slots, d, inter})};
          for (int64_t x = 0; x < slots; ++x) {
            copy_expert_rows(w_gate[l], load_slots[x], mine[l].gate, x, 1);
            copy_expert_rows(w_up[l], load_slots[x], mine[l].up, x, 1);
            copy_expert_rows(w_down[l], load_slots[x], mine[l].down, x, 1);
          }
        }
        LOOM_RETURN_IF_ERROR(balancer.attach_weights(
            mine, std::make_unique<CommunicatorExpertWeightTransfer>(comm)));
        // The per-layer dispatchers as a model's load would get them, in layer order.
        std::vector<std::shared_ptr<ExpertDispatcher>> layers;
        {
          const ScopedExpertDispatcher bind(balancer.dispatcher_factory(exchange));
          for (int l = 0; l < run.layers; ++l) {
            auto dl = expert_dispatcher_for_layer(e, ExpertRange{0, slots});
            if (!dl.ok()) return dl.status();
            layers.push_back(*dl);
          }
          // One layer more than the balancer was made for is refused.
          if (expert_dispatcher_for_layer(e, ExpertRange{0, slots}).ok())
            return absl::InternalError("a layer beyond num_layers was accepted");
        }
        Workspace ws(Device::kCpu);
        Exec ex;
        ex.workspace = &ws;
        ex.batch_invariant = run.batch_invariant;
        for (int s = 0; s < run.steps; ++s)
          for (int l = 0; l < run.layers; ++l) {
            const Workspace::Mark mark(ws);
            const Input& i = in[s][l][r];
            const Dispatched dd = layers[l]->dispatch(ex, i.x, i.ids, i.w, ws);
            // The rows arrive grouped by this rank's slots, computed with its slot weights
            // (moved by the balancer at each re-placement).
            if (dd.offsets.numel() != slots + 1)
              return absl::InternalError(absl::StrCat(
                  "rank ", r, ": offsets ", dd.offsets.describe(), " for ", slots, " slots"));
            Tensor y = Tensor::empty(dd.rows.shape());
            moe_grouped_swiglu(ex, dd.rows, dd.offsets, mine[l].gate, mine[l].up, mine[l].down, y);
            got[s][l][r] = Tensor::empty({i.x.dim(0), d});
            layers[l]->combine(ex, y, dd, got[s][l][r]);
          }
        if (r == 0) balance = balancer.balance();
        for (int l = 0; l < run.layers; ++l) final_placements[r].push_back(balancer.placement(l));
        // After the last re-placement each slot holds its expert's weights, bit for bit.
        for (int l = 0; l < run.layers; ++l)
          for (int64_t x = 0; x < slots; ++x) {
            const int32_t want = balancer.placement(l).rank_experts[r][x];
            for (auto [full, slot] : {std::pair{&w_gate[l], &mine[l].gate},
                                      {&w_up[l], &mine[l].up},
                                      {&w_down[l], &mine[l].down}}) {
              const int64_t row = full->numel() / e;
              if (std::memcmp(full->data<float>() + want * row, slot->data<float>() + x * row,
                              row * sizeof(float)) != 0)
                return absl::InternalError(absl::StrCat("rank ", r, " layer ", l, " slot ", x,
                                                        " does not hold expert ", want));
            }
          }
        moved[r] = balancer.weights_moved().experts;
        return comm.status();
      });
  ASSERT_TRUE(st.ok()) << st;

  double worst = 0;
  for (int s = 0; s < run.steps; ++s)
    for (int l = 0; l < run.layers; ++l) {
      int64_t at = 0;
      for (int r = 0; r < run.ranks; ++r) {
        const Tensor& o = got[s][l][r];
        for (int64_t j = 0; j < o.numel(); ++j) {
          const float a = o.data<float>()[j], b = ref[s][l].data<float>()[at * d + j];
          if (run.batch_invariant) {
            ASSERT_EQ(std::memcmp(&a, &b, sizeof(float)), 0)
                << "step " << s << " layer " << l << " rank " << r << " element " << j;
          }
          worst = std::max(worst, std::abs(static_cast<double>(a) - b));
        }
        at += o.dim(0);
      }
    }
  // Default numerics: an expert's rows split over copies go through GEMMs of other row counts,
  // which may round differently (a few f32 ulps of outputs of magnitude ~1).
  EXPECT_LT(worst, 1e-4);
  // Every rank computed the same placements.
  for (int r = 1; r < run.ranks; ++r)
    for (int l = 0; l < run.layers; ++l)
      EXPECT_EQ(final_placements[r][l].copies, final_placements[0][l].copies);
  for (int l = 0; l < run.layers; ++l) EXPECT_TRUE(check_placement(final_placements[0][l]).ok());
  if (run.options.interval_steps > 0) {
    EXPECT_EQ(balance.replacements, (run.steps - 1) / run.options.interval_steps);
    int64_t moved_all = 0;
    for (const int64_t m : moved) moved_all += m;
    std::printf(
        "%s R=%d E=%ld K=%ld: balance over the last window: contiguous %.3f, in use %.3f, "
        "recomputed %.3f (max |diff| vs one rank %.2e); %ld expert weights moved between ranks\n",
        std::string(expert_exchange_name(exchange)).c_str(), run.ranks, static_cast<long>(e),
        static_cast<long>(run.options.redundant_experts), balance.contiguous, balance.before,
        balance.after, worst, static_cast<long>(moved_all));
    // Skewed load moves the hot experts' copies away from the initial placement.
    EXPECT_GT(moved_all, 0);
    // Zipf routing piles the hot low ids on rank 0 under the contiguous ranges; the placement
    // computed from the window, and the one that was in use over it (computed from the previous
    // window of the same distribution), both spread it.
    EXPECT_GT(balance.after, balance.contiguous);
    EXPECT_GT(balance.before, balance.contiguous);
  }
}

TEST(ExpertLoadBalancer, MatchesOneRankWithCopiesAndReplacement) {
  for (ExpertExchange exchange : {ExpertExchange::kAllGather, ExpertExchange::kAllToAll})
    for (const bool invariant : {true, false}) {
      check_run({.ranks = 2,
                 .experts = 8,
                 .top_k = 2,
                 .layers = 2,
                 .steps = 7,
                 .options = {.redundant_experts = 2, .interval_steps = 2},
                 .batch_invariant = invariant},
                exchange, 11);
      // Experts that do not divide over the ranks, slots that do not either (16 + 5 over 3).
      check_run({.ranks = 3,
                 .experts = 16,
                 .top_k = 4,
                 .layers = 3,
                 .steps = 9,
                 .options = {.redundant_experts = 5, .interval_steps = 3, .window_steps = 2},
                 .batch_invariant = invariant},
                exchange, 12);
    }
}

TEST(ExpertLoadBalancer, ReplacementWithoutCopiesAndCopiesWithoutReplacement) {
  for (ExpertExchange exchange : {ExpertExchange::kAllGather, ExpertExchange::kAllToAll}) {
    check_run({.ranks = 3,
               .experts = 8,
               .top_k = 2,
               .layers = 2,
               .steps = 6,
               .options = {.redundant_experts = 0, .interval_steps = 1},
               .batch_invariant = true},
              exchange, 13);
    check_run({.ranks = 4,
               .experts = 8,
               .top_k = 3,
               .layers = 1,
               .steps = 3,
               .options = {.redundant_experts = 8},
               .batch_invariant = true},
              exchange, 14);
  }
}

TEST(ExpertLoadBalancer, RefusesBadOptions) {
  EXPECT_TRUE(
      check_expert_balance_options({.redundant_experts = 4, .interval_steps = 10}, 16, 4).ok());
  EXPECT_FALSE(check_expert_balance_options({.redundant_experts = -1}, 16, 4).ok());
  EXPECT_FALSE(check_expert_balance_options({.redundant_experts = 16 * 3 + 1}, 16, 4).ok());
  EXPECT_FALSE(check_expert_balance_options({.interval_steps = -2}, 16, 4).ok());
  EXPECT_FALSE(check_expert_balance_options({.interval_steps = 2, .window_steps = -1}, 16, 4).ok());
  EXPECT_FALSE(check_expert_balance_options({.window_steps = 4}, 16, 4).ok());
  EXPECT_FALSE(check_expert_balance_options({.interval_steps = 4}, 16, 1).ok());
  EXPECT_FALSE(check_expert_balance_options({.redundant_experts = 2}, 16, 1).ok());
  const absl::Status why = check_expert_balance_options({.redundant_experts = -3}, 16, 4);
  EXPECT_NE(why.message().find("--redundant_experts -3"), std::string_view::npos) << why;
}

TEST(ExpertLoadBalancer, FactoryRefusesAPartialExpertRange) {
  const absl::Status st =
      run_thread_ranks(2, absl::Seconds(10), [&](Communicator& comm) -> absl::Status {
        ExpertLoadBalancer balancer(comm, 1, 8, {.redundant_experts = 2});
        const ScopedExpertDispatcher bind(balancer.dispatcher_factory(ExpertExchange::kAllToAll));
        const auto dl = expert_dispatcher_for_layer(8, expert_range_of_rank(8, comm.rank(), 2));
        if (dl.ok() || dl.status().message().find("expert_slots") == std::string_view::npos)
          return absl::InternalError(
              absl::StrCat("expected a refusal, got ", dl.status().ToString()));
        return absl::OkStatus();
      });
  EXPECT_TRUE(st.ok()) << st;
}

}  // namespace
}  // namespace loom
