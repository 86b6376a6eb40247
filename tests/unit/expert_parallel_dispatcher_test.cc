// ExpertParallelDispatcher over thread ranks against a LocalExpertDispatcher holding every expert
// over the concatenation of the ranks' tokens (rank order): on random routings, with uneven
// expert ranges, ranks without tokens and a rank on a dummy step, both exchanges must give every
// token's output, its gate weights' gradient and its input gradient bit for bit (the dispatcher's
// determinism contract: each expert sees the same rows in the same order, each slot's result
// comes back unchanged, and the token's sum runs in top-k order).
#include "engine/parallel/expert_parallel_dispatcher.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/parallel/local_expert_dispatcher.h"
#include "engine/parallel/thread_communicator.h"
#include "kernels/moe.h"

namespace loom {
namespace {

Tensor random_tensor(Shape shape, std::mt19937& rng, float scale = 1.0f) {
  Tensor t = Tensor::empty(shape);
  std::normal_distribution<float> dist(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

TEST(ExpertRangeOfRank, FirstRanksHoldOneMore) {
  for (int64_t e = 1; e <= 20; ++e)
    for (int n = 1; n <= e; ++n) {
      int64_t next = 0;
      for (int r = 0; r < n; ++r) {
        const ExpertRange range = expert_range_of_rank(e, r, n);
        EXPECT_EQ(range.begin, next);
        EXPECT_EQ(range.count(), e / n + (r < e % n ? 1 : 0)) << e << " over " << n;
        next = range.end;
      }
      EXPECT_EQ(next, e);
    }
  EXPECT_EQ(expert_range_of_rank(8, 2, 3), (ExpertRange{6, 8}));
}

struct Case {
  int ranks;
  int64_t experts, top_k, dim, inter;
  std::vector<int64_t> tokens;  // per rank
  int dummy_rank = -1;          // a rank on a dummy step (its tokens are fillers)
};

// One MoE layer's routed path, forward and backward, over the ranks and against one rank.
void check_case(const Case& c, ExpertExchange exchange, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << expert_exchange_name(exchange) << ", " << c.ranks << " ranks, "
                                  << c.experts << " experts, top-" << c.top_k << ", seed " << seed);
  std::mt19937 rng(seed);
  const int64_t e = c.experts, k = c.top_k, d = c.dim, inter = c.inter;
  const Tensor w_gate = random_tensor({e, inter, d}, rng, 0.3f),
               w_up = random_tensor({e, inter, d}, rng, 0.3f),
               w_down = random_tensor({e, d, inter}, rng, 0.3f);
  // Per rank: x, distinct expert ids per token, gate weights, d_out, and d_x's prior contents.
  std::vector<Tensor> xs, ids, wts, d_outs, d_x0;
  for (int r = 0; r < c.ranks; ++r) {
    const int64_t t = c.tokens[r];
    xs.push_back(random_tensor({t, d}, rng));
    ids.push_back(Tensor::empty({t, k}, DType::kI32));
    wts.push_back(Tensor::empty({t, k}));
    std::vector<int32_t> perm(static_cast<size_t>(e));
    std::iota(perm.begin(), perm.end(), 0);
    std::uniform_real_distribution<float> u(0.05f, 1.0f);
    for (int64_t i = 0; i < t; ++i) {
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t j = 0; j < k; ++j) {
        ids[r].data<int32_t>()[i * k + j] = perm[j];
        wts[r].data<float>()[i * k + j] = u(rng);
      }
    }
    d_outs.push_back(random_tensor({t, d}, rng));
    d_x0.push_back(random_tensor({t, d}, rng));
  }

  // One rank holding every expert, over the real tokens in rank order (a dummy rank's are not).
  int64_t total = 0;
  std::vector<int64_t> first(c.ranks);
  for (int r = 0; r < c.ranks; ++r) {
    first[r] = total;
    if (r != c.dummy_rank) total += c.tokens[r];
  }
  auto concat = [&](const std::vector<Tensor>& parts, int64_t cols, DType dtype) {
    Tensor all = Tensor::empty({total, cols}, dtype);
    for (int r = 0; r < c.ranks; ++r)
      if (r != c.dummy_rank && parts[r].nbytes() > 0)
        std::memcpy(static_cast<char*>(all.raw()) + first[r] * cols * dtype_size(dtype),
                    parts[r].raw(), parts[r].nbytes());
    return all;
  };
  const Tensor x_all = concat(xs, d, DType::kF32), ids_all = concat(ids, k, DType::kI32),
               w_all = concat(wts, k, DType::kF32), d_out_all = concat(d_outs, d, DType::kF32),
               d_x_all = concat(d_x0, d, DType::kF32);
  Workspace ref_ws(Device::kCpu);
  Exec ref_ex;
  ref_ex.workspace = &ref_ws;
  LocalExpertDispatcher local(e);
  const Dispatched ref = local.dispatch(ref_ex, x_all, ids_all, w_all, ref_ws);
  Tensor y_ref = Tensor::empty(ref.rows.shape());
  moe_grouped_swiglu(ref_ex, ref.rows, ref.offsets, w_gate, w_up, w_down, y_ref);
  Tensor out_ref = Tensor::empty({total, d});
  local.combine(ref_ex, y_ref, ref, out_ref);
  Tensor d_y_ref = Tensor::empty(y_ref.shape()), d_w_ref = Tensor::empty({total, k});
  local.combine_backward(ref_ex, y_ref, ref, d_out_all, d_y_ref, d_w_ref);
  // The rows' gradient: a function of each row's own y and d_y, so any misrouted row shows.
  for (int64_t i = 0; i < d_y_ref.numel(); ++i)
    d_y_ref.data<float>()[i] += 0.5f * y_ref.data<float>()[i];
  local.dispatch_backward(ref_ex, d_y_ref, ref, d_x_all);

  std::vector<Tensor> outs(c.ranks), d_ws(c.ranks);
  const absl::Status st =
      run_thread_ranks(c.ranks, absl::Seconds(10), [&](Communicator& comm) -> absl::Status {
        const int r = comm.rank();
        ExpertParallelDispatcher ep(comm, e, exchange);
        const ExpertRange mine = ep.owned();
        const Tensor g = w_gate.slice(0, mine.begin, mine.end),
                     u = w_up.slice(0, mine.begin, mine.end),
                     dn = w_down.slice(0, mine.begin, mine.end);
        Workspace ws(Device::kCpu);
        Exec ex;
        ex.workspace = &ws;
        ep.set_dummy_step(r == c.dummy_rank);
        const Dispatched dd = ep.dispatch(ex, xs[r], ids[r], wts[r], ws);
        Tensor y = Tensor::empty(dd.rows.shape());
        moe_grouped_swiglu(ex, dd.rows, dd.offsets, g, u, dn, y);
        outs[r] = Tensor::empty({c.tokens[r], d});
        ep.combine(ex, y, dd, outs[r]);
        ep.set_dummy_step(false);
        // Training has no dummy steps: with one, only the forward is compared (every rank skips
        // the backward's collectives alike).
        if (c.dummy_rank >= 0) return comm.status();
        Tensor d_y = Tensor::empty(y.shape());
        d_ws[r] = Tensor::empty({c.tokens[r], k});
        ep.combine_backward(ex, y, dd, d_outs[r], d_y, d_ws[r]);
        for (int64_t i = 0; i < d_y.numel(); ++i) d_y.data<float>()[i] += 0.5f * y.data<float>()[i];
        ep.dispatch_backward(ex, d_y, dd, d_x0[r]);
        return comm.status();
      });
  ASSERT_TRUE(st.ok()) << st;
  for (int r = 0; r < c.ranks; ++r) {
    const int64_t t = c.tokens[r];
    if (r == c.dummy_rank) {
      for (int64_t i = 0; i < outs[r].numel(); ++i)
        ASSERT_EQ(outs[r].data<float>()[i], 0.0f) << "dummy rank's filler output";
      continue;
    }
    auto same = [&](const Tensor& got, const Tensor& all, int64_t cols, const char* what) {
      if (t == 0) return;
      EXPECT_EQ(std::memcmp(got.raw(), all.data<float>() + first[r] * cols, got.nbytes()), 0)
          << what << " of rank " << r << " differs from one rank's";
    };
    same(outs[r], out_ref, d, "out");
    if (c.dummy_rank >= 0) continue;
    same(d_ws[r], d_w_ref, k, "d_weights");
    same(d_x0[r], d_x_all, d, "d_x");
  }
}

TEST(ExpertParallelDispatcher, BitIdenticalToOneRankOnRandomRoutings) {
  std::mt19937 rng(2024);
  int cases = 0;
  for (ExpertExchange exchange : {ExpertExchange::kAllGather, ExpertExchange::kAllToAll}) {
    for (int trial = 0; trial < 16; ++trial) {
      Case c;
      c.ranks = 1 + trial % 4;
      c.experts = c.ranks + static_cast<int64_t>(rng() % 9);  // often uneven over the ranks
      c.top_k = 1 + static_cast<int64_t>(rng() % std::min<int64_t>(c.experts, 4));
      c.dim = 8 + static_cast<int64_t>(rng() % 3) * 8;
      c.inter = 4 + static_cast<int64_t>(rng() % 3) * 6;
      for (int r = 0; r < c.ranks; ++r) c.tokens.push_back(static_cast<int64_t>(rng() % 40));
      if (c.ranks > 1 && trial % 3 == 0) c.tokens[rng() % c.ranks] = 0;  // a rank without tokens
      check_case(c, exchange, 100 + trial);
      ++cases;
    }
  }
  EXPECT_EQ(cases, 32);
}

TEST(ExpertParallelDispatcher, DummyStepSendsNothing) {
  for (ExpertExchange exchange : {ExpertExchange::kAllGather, ExpertExchange::kAllToAll}) {
    check_case({.ranks = 3,
                .experts = 8,
                .top_k = 2,
                .dim = 16,
                .inter = 10,
                .tokens = {17, 1, 5},
                .dummy_rank = 1},
               exchange, 7);
    check_case({.ranks = 2,
                .experts = 5,
                .top_k = 3,
                .dim = 8,
                .inter = 4,
                .tokens = {1, 30},
                .dummy_rank = 0},
               exchange, 8);
  }
}

TEST(ExpertParallelDispatcher, EveryRankWithoutTokens) {
  for (ExpertExchange exchange : {ExpertExchange::kAllGather, ExpertExchange::kAllToAll})
    check_case({.ranks = 3, .experts = 7, .top_k = 2, .dim = 8, .inter = 4, .tokens = {0, 0, 0}},
               exchange, 9);
}

// A failed group leaves combine's output zero and returns at once instead of hanging: the rank's
// driver reads the failure from comm.status().
TEST(ExpertParallelDispatcher, FailedGroupGivesZerosNotAHang) {
  const absl::Status st =
      run_thread_ranks(2, absl::Seconds(30), [](Communicator& comm) -> absl::Status {
        if (comm.rank() == 1) return absl::UnavailableError("rank lost");
        std::mt19937 rng(3);
        ExpertParallelDispatcher ep(comm, 4, ExpertExchange::kAllToAll);
        Workspace ws(Device::kCpu);
        Exec ex;
        ex.workspace = &ws;
        const Tensor x = random_tensor({3, 8}, rng);
        Tensor ids = Tensor::empty({3, 1}, DType::kI32), w = Tensor::full({3, 1}, 1.0f);
        for (int i = 0; i < 3; ++i) ids.data<int32_t>()[i] = i;
        const Dispatched d = ep.dispatch(ex, x, ids, w, ws);
        EXPECT_EQ(d.rows.dim(0), 0);
        Tensor out = Tensor::full({3, 8}, 5.0f);
        ep.combine(ex, Tensor::empty({0, 8}), d, out);
        for (int64_t i = 0; i < out.numel(); ++i) EXPECT_EQ(out.data<float>()[i], 0.0f);
        return comm.status();
      });
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_EQ(st.message(), "rank 1: rank lost");
}

}  // namespace
}  // namespace loom
