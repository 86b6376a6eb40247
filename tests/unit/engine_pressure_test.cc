// Every family through the engine in the default (fast) numerics: greedy outputs under tight
// memory, with the prefix cache on (so preempted requests are recomputed and later ones hit cached
// prefixes at several offsets, one with a tail short enough for the recurrent path right after the
// restore) equal a clean run with no cache and room to spare. Seeded sampling under the same
// pressure is held to bit-identity in engine_deterministic_test.cc.
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine_test_support.h"

namespace loom {
namespace {

using testing::kFixtures;
using testing::make_engine;
using testing::random_prompt;

std::vector<int32_t> tokens_of(RequestStream& s) {
  std::vector<int32_t> t;
  while (auto ev = s.next()) t.insert(t.end(), ev->token_ids.begin(), ev->token_ids.end());
  return t;
}

class EnginePressure : public ::testing::TestWithParam<const char*> {};

TEST_P(EnginePressure, GreedyUnderTightMemoryWithPrefixHitsEqualsCleanRun) {
  const std::string fixture = GetParam();
  std::mt19937 rng(31);
  // Requests share prefixes of 64, 128 and 192 tokens with a base prompt, with tails of 3 (the
  // recurrent path after the restore), 40 and 90 tokens; others are unrelated.
  const std::vector<int32_t> base = random_prompt(260, rng);
  std::vector<Request> reqs;
  auto add = [&](std::vector<int32_t> prompt, int max_tokens) {
    Request r;
    r.prompt = std::move(prompt);
    r.params.temperature = 0;
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    reqs.push_back(std::move(r));
  };
  add(base, 16);
  for (auto [shared, tail] : {std::pair{64, 3}, {128, 40}, {192, 90}, {64, 70}}) {
    std::vector<int32_t> p(base.begin(), base.begin() + shared);
    const std::vector<int32_t> t = random_prompt(tail, rng);
    p.insert(p.end(), t.begin(), t.end());
    add(p, 12 + tail % 7);
  }
  for (int i = 0; i < 7; ++i) add(random_prompt(30 + 37 * i, rng), 10 + i);

  std::vector<std::vector<int32_t>> clean;
  {
    EngineOptions roomy;
    roomy.enable_prefix_cache = false;
    auto e = make_engine(fixture, roomy);
    for (const Request& r : reqs) clean.push_back(tokens_of(**e->submit(r)));
  }
  auto cfg = (*Model::load(kFixtures + "/" + fixture))->config();
  EngineOptions tight;
  tight.checkpoint_interval = 1;
  tight.max_num_seqs = 6;
  tight.max_num_batched_tokens = 96;
  // The scratch slot, one per sequence and as many checkpoints; the scratch page and pages for
  // about two requests.
  tight.cache_budget_bytes =
      static_cast<int64_t>(13 * CacheStore::slot_bytes(cfg) + 13 * CacheStore::page_bytes(cfg, 64));
  auto e = make_engine(fixture, tight);
  // The base first, alone, so its blocks are cached before the sharers arrive.
  EXPECT_EQ(tokens_of(**e->submit(reqs[0])), clean[0]);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t i = 1; i < reqs.size(); ++i) streams.push_back(*e->submit(reqs[i]));
  for (size_t i = 1; i < reqs.size(); ++i)
    EXPECT_EQ(tokens_of(*streams[i - 1]), clean[i]) << "request " << i;
  e->wait_idle();
  const EngineStats st = e->stats();
  EXPECT_GT(st.preemptions, 0) << "the budget must force preemption";
  EXPECT_GE(st.prefix_hit_tokens, 64) << "the sharers must hit the cached base";
  EXPECT_EQ(st.running + st.waiting, 0);
}

INSTANTIATE_TEST_SUITE_P(Families, EnginePressure,
                         ::testing::Values("kimi_linear_s1", "deepseek_v3_s1", "qwen3_next_s0",
                                           "fla_kda_s0"));

}  // namespace
}  // namespace loom
