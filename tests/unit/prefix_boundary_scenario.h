// A prefix-cache scenario both backends run (tests/unit/engine_prefix_boundary_test.cc on the CPU,
// tests/gpu/model_prefix_cache_cuda_test.cc on the GPU): the hits other engines got wrong. Pages
// of 16 tokens, a linear-state checkpoint every 2 pages (32 tokens), --deterministic. Request A's
// prompt ends d tokens past the checkpoint at 64 (d = 1, 2, 5, 10; its prefill, cut by a 48-token
// budget, also passes the one at 32); request B shares A's first 64 tokens and continues
// differently, so it hits the checkpoint at 64, not A's end (NaN logits after such hits in vLLM):
// its linear states come from the snapshot, its first 64 positions from A's pages, on every layer
// type (a missing KDA snapshot restored garbage in SGLang). In deterministic mode a hit changes
// no bit: B on the caching engine must equal B on an engine without a prefix cache.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gtest/gtest.h"

namespace loom {

struct PrefixBoundaryResult {
  size_t worst_differences = 0;  // tokens or logprobs of B differing in any bit, or non-finite
  int64_t min_hit_tokens = INT64_MAX;  // the smallest prefix hit of the four B requests
};

namespace prefix_boundary {

struct Trace {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

inline Trace run(Engine& e, std::vector<int32_t> prompt, int32_t max_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  r.params.logprobs = 0;
  Trace t;
  auto s = e.submit(r);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return t;
  while (auto ev = (*s)->next()) {
    EXPECT_NE(ev->finish, FinishReason::kError) << ev->error;
    t.tokens.insert(t.tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
    for (const TokenLogprob& lp : ev->logprobs) t.logprobs.push_back(lp.logprob);
  }
  return t;
}

inline size_t differences(const Trace& a, const Trace& b) {
  size_t d = a.tokens.size() > b.tokens.size() ? a.tokens.size() - b.tokens.size()
                                               : b.tokens.size() - a.tokens.size();
  for (size_t i = 0; i < std::min(a.tokens.size(), b.tokens.size()); ++i)
    d += a.tokens[i] != b.tokens[i];
  for (size_t i = 0; i < std::min(a.logprobs.size(), b.logprobs.size()); ++i)
    d += std::memcmp(&a.logprobs[i], &b.logprobs[i], sizeof(float)) != 0 ||
         !std::isfinite(a.logprobs[i]);
  return d;
}

}  // namespace prefix_boundary

// Runs the scenario on two engines built from `load()` (the same model twice). `ids(n)`: n prompt
// token ids clear of the model's special tokens.
inline PrefixBoundaryResult run_prefix_boundary_scenario(
    const std::function<std::unique_ptr<Model>()>& load,
    const std::function<std::vector<int32_t>(int64_t)>& ids, const std::string& name) {
  using prefix_boundary::run;
  EngineOptions opt;
  opt.deterministic = true;
  opt.cache_budget_bytes = int64_t{64} << 20;
  opt.page_size = 16;
  opt.checkpoint_interval = 2;
  opt.max_num_batched_tokens = 48;
  PrefixBoundaryResult out;
  auto caching = Engine::create(load(), nullptr, opt);
  EXPECT_TRUE(caching.ok()) << caching.status();
  EngineOptions plain_opt = opt;
  plain_opt.enable_prefix_cache = false;
  auto plain = Engine::create(load(), nullptr, plain_opt);
  EXPECT_TRUE(plain.ok()) << plain.status();
  if (!caching.ok() || !plain.ok()) return {SIZE_MAX, 0};
  for (int d : {1, 2, 5, 10}) {
    const std::vector<int32_t> a_prompt = ids(64 + d);
    std::vector<int32_t> b_prompt(a_prompt.begin(), a_prompt.begin() + 64);
    const std::vector<int32_t> tail = ids(7);
    b_prompt.insert(b_prompt.end(), tail.begin(), tail.end());
    EXPECT_EQ(run(**caching, a_prompt, 4).tokens.size(), 4u);
    (*caching)->wait_idle();
    const int64_t before = (*caching)->stats().prefix_hit_tokens;
    const prefix_boundary::Trace hit = run(**caching, b_prompt, 8);
    (*caching)->wait_idle();
    const int64_t gained = (*caching)->stats().prefix_hit_tokens - before;
    const prefix_boundary::Trace fresh = run(**plain, b_prompt, 8);
    EXPECT_EQ(fresh.tokens.size(), 8u);
    const size_t diff = prefix_boundary::differences(hit, fresh);
    std::printf("INFO %s d=%d: request B hit %lld tokens, %zu differences\n", name.c_str(), d,
                static_cast<long long>(gained), diff);
    out.worst_differences = std::max(out.worst_differences, diff);
    out.min_hit_tokens = std::min(out.min_hit_tokens, gained);
  }
  return out;
}

}  // namespace loom
