// The expert-parallel engine (Engine::create_expert_parallel, loom-server --expert_parallel N): N
// rank loops on thread ranks, each with its own requests, caches and scheduler, the experts split
// over them. Under --deterministic (batch-invariant numerics) a request's tokens and logprobs do
// not depend on what else runs nor on where its experts ran, so every request must come out bit
// for bit as the one-rank engine gives it: over 2 and 3 ranks, both exchanges, with the load
// balancer, with a rank idle (dummy forwards) while the others decode, and session turns. New
// requests go to the rank with the fewest tokens queued plus running; a rank group failure ends
// live requests with its error.
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/expert_parallel_ranks.h"
#include "gtest/gtest.h"
#include "tests/unit/engine_test_support.h"

namespace loom {
namespace {

using testing::append_logprob_bits;
using testing::kFixtures;
using testing::make_engine;
using testing::random_prompt;

// Everything a client sees of choice 0; logprobs as raw bits, so equality is bitwise.
struct Trace {
  std::vector<int32_t> tokens;
  std::vector<uint32_t> logprob_bits;
  std::string error;
  bool operator==(const Trace&) const = default;
};

Trace trace(RequestStream& s) {
  Trace t;
  while (auto ev = s.next()) {
    if (ev->index != 0) continue;
    t.tokens.insert(t.tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
    append_logprob_bits(ev->logprobs, &t.logprob_bits);
    if (!ev->error.empty()) t.error = ev->error;
  }
  return t;
}

Request sampled(std::vector<int32_t> prompt, uint64_t seed, int max_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.params.temperature = 0.8f;
  r.params.seed = seed;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  r.params.logprobs = 2;
  return r;
}

absl::StatusOr<std::unique_ptr<Engine>> make_ep_engine(const std::string& fixture,
                                                       const ExpertParallelOptions& ep,
                                                       const EngineOptions& opt,
                                                       ExpertParallelRanks** ranks_out = nullptr) {
  const std::string dir = kFixtures + "/" + fixture;
  LOOM_ASSIGN_OR_RETURN(const ModelConfig cfg, load_model_config(dir));
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<ExpertParallelRanks> ranks,
                        ExpertParallelRanks::load(cfg, Placement{}, ep, [&](const Placement& p) {
                          return Model::load(dir, cfg, p);
                        }));
  if (ranks_out != nullptr) *ranks_out = ranks.get();
  return Engine::create_expert_parallel(std::move(ranks), nullptr, opt);
}

// The ranks' stats once every rank shows the same step count (5 s at most): each rank publishes its
// stats after its step, so the step that finished the last request may not be published yet when
// wait_idle returns (a rank then read one step behind the others in CI).
std::vector<EngineStats> settled_rank_stats(const Engine& e) {
  std::vector<EngineStats> st = e.rank_stats();
  auto settled = [&] {
    for (const EngineStats& r : st)
      if (r.steps != st[0].steps) return false;
    return true;
  };
  for (int i = 0; i < 500 && !settled(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    st = e.rank_stats();
  }
  return st;
}

// Rank r of N runs the ids r + 1 + k N.
int rank_of(const RequestStream& s, int ranks) { return static_cast<int>((s.id() - 1) % ranks); }

struct Case {
  const char* fixture;
  int ranks;
  ExpertExchange exchange;
  int64_t redundant = 0;  // with the load balancer: redundant copies, re-placing every 2 steps
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(info.param.fixture) + "_" + std::to_string(info.param.ranks) + "_" +
         std::string(expert_exchange_name(info.param.exchange)) +
         (info.param.redundant > 0 ? "_balanced" : "");
}

class EngineExpertParallel : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    std::mt19937 rng(20261202);
    // Prompts of several lengths (a 90-token one is prefilled in chunks under the token budget).
    for (int len : {90, 12, 33, 7, 51, 20})
      requests_.push_back(sampled(random_prompt(len, rng), len, 10));
    opt_.deterministic = true;
    opt_.max_num_batched_tokens = 64;
    // The one-rank engine's traces, once per fixture (every case of a fixture sends the same).
    static std::map<std::string, std::vector<Trace>> reference;
    std::vector<Trace>& ref = reference[GetParam().fixture];
    if (ref.empty()) {
      auto one = make_engine(GetParam().fixture, opt_);
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (const Request& r : requests_) streams.push_back(*one->submit(r));
      for (auto& s : streams) ref.push_back(trace(*s));
    }
    alone_ = ref;
    ASSERT_EQ(alone_[0].tokens.size(), 10u);
  }

  ExpertParallelOptions ep() const {
    ExpertParallelOptions o;
    o.ranks = GetParam().ranks;
    o.exchange = GetParam().exchange;
    o.timeout = absl::Seconds(60);
    if (GetParam().redundant > 0)
      o.balance = {.redundant_experts = GetParam().redundant, .interval_steps = 2};
    return o;
  }

  std::vector<Request> requests_;
  std::vector<Trace> alone_;
  EngineOptions opt_;
};

// Every request at once: spread over the ranks, each request bit-identical to one rank's.
TEST_P(EngineExpertParallel, SpreadRequestsMatchOneRank) {
  const int n = GetParam().ranks;
  auto e = make_ep_engine(GetParam().fixture, ep(), opt_);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ((*e)->num_ranks(), n);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const Request& r : requests_) streams.push_back(*(*e)->submit(r));
  std::vector<int> per_rank(n, 0);
  for (size_t i = 0; i < streams.size(); ++i) {
    ++per_rank[rank_of(*streams[i], n)];
    const Trace t = trace(*streams[i]);
    EXPECT_TRUE(t == alone_[i]) << "request " << i << " on rank " << rank_of(*streams[i], n) << ": "
                                << t.tokens.size() << " tokens, error '" << t.error << "'";
  }
  (*e)->wait_idle();
  const std::vector<EngineStats> st = settled_rank_stats(**e);
  for (int r = 0; r < n; ++r) {
    EXPECT_GT(per_rank[r], 0) << "rank " << r << " got no request";
    EXPECT_EQ(st[r].steps, st[0].steps) << "the ranks step in lockstep";
  }
  std::printf("%s over %d ranks: requests per rank", GetParam().fixture, n);
  for (int c : per_rank) std::printf(" %d", c);
  std::printf(", %lld lockstep steps", static_cast<long long>(st[0].steps));
  if (auto b = (*e)->expert_load_balance())
    std::printf(", expert load balance %.3f after %lld re-placements", *b,
                static_cast<long long>((*e)->expert_replacements()));
  std::printf("\n");
  if (GetParam().redundant > 0) {
    EXPECT_GT((*e)->expert_replacements(), 0);
  }
}

// One request decodes alone on rank 0 while the others idle (dummy forwards); a second one
// arrives on rank 1 while the first decodes; the last rank never gets one.
TEST_P(EngineExpertParallel, IdleRankWhileOthersDecode) {
  const int n = GetParam().ranks;
  auto e = make_ep_engine(GetParam().fixture, ep(), opt_);
  ASSERT_TRUE(e.ok()) << e.status();
  auto first = *(*e)->submit(requests_[0]);
  EXPECT_EQ(rank_of(*first, n), 0);
  auto ev = first->next();  // the prompt is in: the first decodes while the second arrives
  ASSERT_TRUE(ev.has_value());
  auto second = *(*e)->submit(requests_[1]);
  EXPECT_EQ(rank_of(*second, n), 1) << "rank 0 holds 91 tokens, rank 1 none";
  Trace t0 = trace(*first);
  t0.tokens.insert(t0.tokens.begin(), ev->token_ids.begin(), ev->token_ids.end());
  std::vector<uint32_t> head;
  append_logprob_bits(ev->logprobs, &head);
  t0.logprob_bits.insert(t0.logprob_bits.begin(), head.begin(), head.end());
  EXPECT_TRUE(t0 == alone_[0]);
  EXPECT_TRUE(trace(*second) == alone_[1]);
  (*e)->wait_idle();
  const std::vector<EngineStats> st = settled_rank_stats(**e);
  if (n > 2) {
    EXPECT_EQ(st[n - 1].prompt_tokens, 0) << "the last rank only ran dummy steps";
  }
  for (int r = 0; r < n; ++r) EXPECT_EQ(st[r].steps, st[0].steps);
  EXPECT_GE(st[0].steps, 10);
  // Idle ranks wait: the group runs no step without work.
  const int64_t steps = st[0].steps;
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ((*e)->rank_stats()[0].steps, steps);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineExpertParallel,
                         ::testing::Values(Case{"kimi_linear_s1", 2, ExpertExchange::kAllGather},
                                           Case{"kimi_linear_s1", 3, ExpertExchange::kAllToAll},
                                           Case{"deepseek_v3_s1", 3, ExpertExchange::kAllGather},
                                           Case{"qwen3_next_s0", 2, ExpertExchange::kAllToAll},
                                           Case{"kimi_linear_s1", 2, ExpertExchange::kAllToAll, 2},
                                           Case{"deepseek_v3_s1", 3, ExpertExchange::kAllGather,
                                                3}),
                         case_name);

// New requests go to the rank with the fewest tokens queued plus running: a 200-token prompt on
// rank 0, then 30-token ones on rank 1 until it holds more, then rank 0 again. (max_tokens 200
// keeps every request running while they are submitted; a step adds at most one token to each.)
TEST(EngineExpertParallelLoad, SpreadsByQueuedPlusRunningTokens) {
  ExpertParallelOptions ep;
  ep.ranks = 2;
  EngineOptions opt;
  auto e = make_ep_engine("kimi_linear_s1", ep, opt);
  ASSERT_TRUE(e.ok()) << e.status();
  std::mt19937 rng(7);
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<int> ranks;
  for (int len : {200, 30, 30, 30, 30, 30, 100, 30}) {
    streams.push_back(*(*e)->submit(sampled(random_prompt(len, rng), 1, 200)));
    ranks.push_back(rank_of(*streams.back(), 2));
  }
  EXPECT_EQ(ranks, (std::vector<int>{0, 1, 1, 1, 1, 1, 1, 0}));
  EXPECT_GE((*e)->rank_load_tokens(0), 230);
  EXPECT_GE((*e)->rank_load_tokens(1), 250);
  for (auto& s : streams) (*e)->cancel(s->id());
  (*e)->wait_idle();
  EXPECT_EQ((*e)->rank_load_tokens(0), 0) << "a finished request leaves no load behind";
  EXPECT_EQ((*e)->rank_load_tokens(1), 0);
  EXPECT_EQ((*e)->stats().finished_cancelled, 8);
}

// A session's turns stay on its rank, and equal the one-rank engine's turns.
TEST(EngineExpertParallelSessions, TurnsStayOnTheirRank) {
  std::mt19937 rng(11);
  const std::vector<int32_t> a1 = random_prompt(40, rng), a2 = random_prompt(9, rng),
                             b1 = random_prompt(15, rng), b2 = random_prompt(6, rng);
  auto turn = [](const char* session, const std::vector<int32_t>& p, uint64_t seed) {
    Request r = sampled(p, seed, 6);
    r.session = session;
    return r;
  };
  EngineOptions opt;
  opt.deterministic = true;
  auto one = make_engine("kimi_linear_s1", opt);
  const Trace ref_a1 = trace(**one->submit(turn("a", a1, 1)));
  const Trace ref_b1 = trace(**one->submit(turn("b", b1, 2)));
  const Trace ref_a2 = trace(**one->submit(turn("a", a2, 3)));
  const Trace ref_b2 = trace(**one->submit(turn("b", b2, 4)));
  ExpertParallelOptions ep;
  ep.ranks = 2;
  auto e = make_ep_engine("kimi_linear_s1", ep, opt);
  ASSERT_TRUE(e.ok()) << e.status();
  auto s_a1 = *(*e)->submit(turn("a", a1, 1));
  auto s_b1 = *(*e)->submit(turn("b", b1, 2));  // rank 0 holds session a's 40 tokens
  EXPECT_TRUE(trace(*s_a1) == ref_a1);
  EXPECT_TRUE(trace(*s_b1) == ref_b1);
  // Rank 1 is empty now, yet a's next turn goes back to rank 0, where its history is kept.
  int64_t continued = -1;
  auto s_a2 = *(*e)->submit(turn("a", a2, 3), &continued);
  EXPECT_GT(continued, 40);
  auto s_b2 = *(*e)->submit(turn("b", b2, 4));
  EXPECT_EQ(rank_of(*s_a1, 2), 0);
  EXPECT_EQ(rank_of(*s_b1, 2), 1);
  EXPECT_EQ(rank_of(*s_a2, 2), 0);
  EXPECT_EQ(rank_of(*s_b2, 2), 1);
  EXPECT_TRUE(trace(*s_a2) == ref_a2);
  EXPECT_TRUE(trace(*s_b2) == ref_b2);
  (*e)->wait_idle();
  EXPECT_EQ((*e)->stats().sessions, 2);
  EXPECT_TRUE((*e)->delete_session("b").ok());
  EXPECT_EQ((*e)->delete_session("b").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*e)->stats().sessions, 1);
}

// max_sessions counts every rank's sessions.
TEST(EngineExpertParallelSessions, MaxSessionsOverAllRanks) {
  EngineOptions opt;
  opt.max_sessions = 2;
  ExpertParallelOptions ep;
  ep.ranks = 2;
  auto e = make_ep_engine("kimi_linear_s1", ep, opt);
  ASSERT_TRUE(e.ok()) << e.status();
  std::mt19937 rng(3);
  for (const char* name : {"x", "y"}) {
    Request r = sampled(random_prompt(8, rng), 1, 2);
    r.session = name;
    trace(**(*e)->submit(std::move(r)));
  }
  Request r = sampled(random_prompt(8, rng), 1, 2);
  r.session = "z";
  EXPECT_EQ((*e)->submit(std::move(r)).status().code(), absl::StatusCode::kResourceExhausted);
}

// A failed rank group (one rank aborts) ends the live requests with its error, at once, and new
// requests are refused with it; the engine shuts down without hanging.
TEST(EngineExpertParallelFailure, GroupFailureEndsRequests) {
  ExpertParallelOptions ep;
  ep.ranks = 2;
  ep.timeout = absl::Seconds(30);
  ExpertParallelRanks* ranks = nullptr;
  auto e = make_ep_engine("kimi_linear_s1", ep, EngineOptions{}, &ranks);
  ASSERT_TRUE(e.ok()) << e.status();
  std::mt19937 rng(5);
  auto s = *(*e)->submit(sampled(random_prompt(20, rng), 1, 1000));
  ASSERT_TRUE(s->next().has_value());
  ranks->abort(absl::InternalError("rank 1 lost its device"));
  const absl::Time start = absl::Now();
  const Trace t = trace(*s);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_NE(t.error.find("rank 1 lost its device"), std::string::npos) << t.error;
  auto refused = (*e)->submit(sampled(random_prompt(5, rng), 1, 2));
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("expert-parallel ranks failed"), std::string::npos)
      << refused.status();
  (*e)->shutdown();
}

TEST(ExpertParallelRanksCheck, RefusesBadRankCounts) {
  auto cfg = load_model_config(kFixtures + "/kimi_linear_s1");  // 12 experts
  ASSERT_TRUE(cfg.ok());
  const Device cpu = Device::kCpu;
  for (int n : {0, -1, 13}) {
    ExpertParallelOptions o;
    o.ranks = n;
    const absl::Status st = check_expert_parallel(*cfg, cpu, o);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << n << ": " << st;
  }
  ExpertParallelOptions o;
  o.ranks = 12;
  EXPECT_TRUE(check_expert_parallel(*cfg, cpu, o).ok());
  o.ranks = 2;
  const absl::Status gpu = check_expert_parallel(*cfg, Device::cuda(0), o);
  EXPECT_EQ(gpu.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(gpu.message().find("NCCL"), std::string::npos) << gpu;
  o.balance.redundant_experts = 2;
  o.ranks = 1;
  EXPECT_EQ(check_expert_parallel(*cfg, cpu, o).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace loom
