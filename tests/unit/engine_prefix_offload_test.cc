// The prefix cache's host tier (EngineOptions::prefix_offload_bytes) on every family, in
// deterministic mode: request A caches a 4-block prefix; an unrelated request B needs every page
// (and, with linear layers, A's checkpoint slot), so A's blocks are evicted to the tier; request A'
// shares A's prefix and gets exactly those 4 pages (and the checkpoint) copied back, not
// recomputed. A' gives bit-identical tokens and logprobs to a fresh engine without any cache, and
// the same as when the tier is off (dropped, recomputed) or too small to keep the blocks (dropped
// by its budget, recomputed).
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/model/cache_store.h"
#include "gtest/gtest.h"
#include "tests/unit/engine_test_support.h"

namespace loom {
namespace {

using testing::append_logprob_bits;
using testing::kFixtures;
using testing::make_engine;
using testing::random_prompt;

struct Trace {
  std::vector<int32_t> tokens;
  std::vector<uint32_t> logprob_bits;
  int32_t cached_tokens = 0;
};

Trace run(Engine& e, std::vector<int32_t> prompt, uint64_t seed, int max_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.params.temperature = 0.8f;
  r.params.top_p = 0.95f;
  r.params.seed = seed;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  r.params.logprobs = 3;
  Trace t;
  auto stream = *e.submit(r);
  while (auto ev = stream->next()) {
    t.tokens.insert(t.tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
    append_logprob_bits(ev->logprobs, &t.logprob_bits);
    if (ev->finish) t.cached_tokens = ev->cached_tokens;
  }
  return t;
}

class EnginePrefixOffload : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    std::mt19937 rng(20261204);
    prefix_ = random_prompt(4 * 64, rng);
    a_ = prefix_;
    const std::vector<int32_t> tail_a = random_prompt(20, rng);
    a_.insert(a_.end(), tail_a.begin(), tail_a.end());
    b_ = random_prompt(7 * 64 + 10, rng);
    a2_ = prefix_;
    const std::vector<int32_t> tail_a2 = random_prompt(30, rng);
    a2_.insert(a2_.end(), tail_a2.begin(), tail_a2.end());
    cfg_ = (*Model::load(kFixtures + "/" + GetParam()))->config();
    linear_ = CacheStore::slot_bytes(cfg_) > 0;
  }

  // One sequence at a time; 3 slots (scratch, the live one, one checkpoint) and 9 pages (scratch
  // and 8): B's 458 + 2 positions take every page, and its checkpoint A's slot.
  EngineOptions tight(int64_t prefix_offload_bytes) const {
    EngineOptions opt;
    opt.deterministic = true;
    opt.max_num_seqs = 1;
    opt.prefix_offload_bytes = prefix_offload_bytes;
    opt.cache_budget_bytes = static_cast<int64_t>(3 * CacheStore::slot_bytes(cfg_) +
                                                  9 * CacheStore::page_bytes(cfg_, 64));
    return opt;
  }

  Trace fresh_a2() const {
    EngineOptions opt;
    opt.deterministic = true;
    opt.enable_prefix_cache = false;
    auto e = make_engine(GetParam(), opt);
    return run(*e, a2_, 7, 6);
  }

  // A, then B, then A' on `e`; returns A'.
  Trace scenario(Engine& e) const {
    run(e, a_, 5, 4);
    run(e, b_, 6, 2);
    return run(e, a2_, 7, 6);
  }

  std::vector<int32_t> prefix_, a_, b_, a2_;
  ModelConfig cfg_;
  bool linear_ = false;
};

TEST_P(EnginePrefixOffload, RestoredPrefixIsBitIdenticalAndNotRecomputed) {
  const Trace want = fresh_a2();
  auto e = make_engine(GetParam(), tight(int64_t{1} << 30));
  const Trace got = scenario(*e);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.logprob_bits, want.logprob_bits) << "logprobs must be bit-identical";
  e->wait_idle();
  const EngineStats st = e->stats();
  EXPECT_EQ(got.cached_tokens, 4 * 64) << "A' reuses the 4 blocks instead of recomputing them";
  EXPECT_EQ(st.prefix_offload_hits, 1);
  EXPECT_EQ(st.prefix_restored_pages, 4) << "exactly A's 4 pages come back";
  EXPECT_EQ(st.prefix_restored_checkpoints, linear_ ? 1 : 0);
  EXPECT_GE(st.prefix_offloads, 4 + (linear_ ? 1 : 0));
  EXPECT_EQ(st.prefix_offload_lost, 0);
  EXPECT_GT(st.prefix_offload_bytes, 0) << "B's evicted blocks are in the tier";
  EXPECT_EQ(st.running + st.waiting, 0);
}

TEST_P(EnginePrefixOffload, DroppedBlocksAreRecomputedToTheSameResult) {
  const Trace want = fresh_a2();
  {
    auto e = make_engine(GetParam(), tight(0));  // no tier: evicted blocks are dropped
    const Trace got = scenario(*e);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.logprob_bits, want.logprob_bits);
    EXPECT_EQ(got.cached_tokens, 0) << "A's blocks were dropped";
    EXPECT_EQ(e->stats().prefix_offloads, 0);
  }
  // A tier of two pages: it drops what it cannot hold, and what is left cannot serve A' whole.
  auto e =
      make_engine(GetParam(), tight(2 * static_cast<int64_t>(CacheStore::page_bytes(cfg_, 64))));
  const Trace got = scenario(*e);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.logprob_bits, want.logprob_bits);
  e->wait_idle();
  const EngineStats st = e->stats();
  EXPECT_GT(st.prefix_offload_lost, 0) << "the budget dropped blocks";
  EXPECT_LT(got.cached_tokens, 4 * 64);
  EXPECT_EQ(st.prefix_restored_pages * 64, got.cached_tokens) << "restored what it reused";
}

INSTANTIATE_TEST_SUITE_P(Families, EnginePrefixOffload,
                         ::testing::Values("kimi_linear_s1", "deepseek_v3_s1", "qwen3_next_s0",
                                           "fla_kda_s0"));

}  // namespace
}  // namespace loom
