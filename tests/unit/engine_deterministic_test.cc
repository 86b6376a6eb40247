// The engine's deterministic (batch-invariant) mode on every family: a seeded request's tokens and
// logprobs are bit-identical alone and under load, with its prompt chunked at other places, with
// prefix-cache hits at several offsets (including a tail short enough for the recurrent path) and
// with preemption by recompute. Greedy outputs still equal the reference's.
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine_test_support.h"
#include "weights/safetensors.h"

namespace loom {
namespace {

using testing::kFixtures;
using testing::make_engine;
using testing::random_prompt;

// Everything a client sees of choice 0, with logprobs as raw bits so equality is bitwise.
struct Trace {
  std::vector<int32_t> tokens;
  std::vector<uint32_t> logprob_bits;  // sampled token's logprob, then the top-3 (id, bits)
  bool operator==(const Trace&) const = default;
};

// Where two traces part: for failure messages.
std::string first_difference(const Trace& a, const Trace& b) {
  size_t i = 0;
  while (i < a.tokens.size() && i < b.tokens.size() && a.tokens[i] == b.tokens[i]) ++i;
  size_t j = 0;
  while (j < a.logprob_bits.size() && j < b.logprob_bits.size() &&
         a.logprob_bits[j] == b.logprob_bits[j])
    ++j;
  return "tokens equal up to " + std::to_string(i) + " of " + std::to_string(a.tokens.size()) +
         "/" + std::to_string(b.tokens.size()) + ", logprob words up to " + std::to_string(j) +
         " of " + std::to_string(a.logprob_bits.size());
}

// Appends one event of choice 0 to `t`.
void append(const RequestOutput& ev, Trace* t) {
  t->tokens.insert(t->tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
  testing::append_logprob_bits(ev.logprobs, &t->logprob_bits);
}

// Drains the stream into a trace of choice 0, after `t` (events already read).
Trace trace(RequestStream& s, Trace t = {}) {
  while (auto ev = s.next())
    if (ev->index == 0) append(*ev, &t);
  return t;
}

Request sampled(std::vector<int32_t> prompt, uint64_t seed, int max_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.params.temperature = 0.8f;
  r.params.top_p = 0.95f;
  r.params.seed = seed;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  r.params.logprobs = 3;
  return r;
}

std::vector<Request> noise_requests(int count, std::mt19937& rng) {
  std::vector<Request> out;
  for (int i = 0; i < count; ++i) {
    Request r;
    r.prompt = random_prompt(std::uniform_int_distribution<int>(1, 260)(rng), rng);
    r.params.temperature = 1.0f;
    r.params.max_tokens = std::uniform_int_distribution<int>(1, 24)(rng);
    r.params.ignore_eos = true;
    out.push_back(std::move(r));
  }
  return out;
}

class DeterministicEngine : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    std::mt19937 rng(20261130);
    // Targets: a 150-token prompt, then prompts that share its first 128 and 64 tokens (prefix
    // hits at two offsets; the 6-token tail after 64 takes the recurrent path by default too).
    const std::vector<int32_t> base = random_prompt(150, rng);
    std::vector<int32_t> p1(base.begin(), base.begin() + 128), p2(base.begin(), base.begin() + 64);
    const std::vector<int32_t> t1 = random_prompt(37, rng), t2 = random_prompt(6, rng);
    p1.insert(p1.end(), t1.begin(), t1.end());
    p2.insert(p2.end(), t2.begin(), t2.end());
    targets_ = {sampled(base, 7, 24), sampled(p1, 8, 20), sampled(p2, 9, 20)};
    noise_ = noise_requests(14, rng);
    EngineOptions solo;
    solo.deterministic = true;
    for (const Request& r : targets_) {
      auto e = make_engine(GetParam(), solo);  // a fresh engine each: no hit, no neighbour
      alone_.push_back(trace(**e->submit(r)));
    }
    ASSERT_EQ(alone_[0].tokens.size(), 24u);
  }

  std::vector<Request> targets_, noise_;
  std::vector<Trace> alone_;
};

// Under load, with an odd token budget that cuts every prompt at other places, and prefix hits.
TEST_P(DeterministicEngine, SameUnderLoadAndPrefixHits) {
  EngineOptions opt;
  opt.deterministic = true;
  opt.max_num_batched_tokens = 37;
  opt.checkpoint_interval = 1;
  auto e = make_engine(GetParam(), opt);
  std::vector<std::shared_ptr<RequestStream>> noise;
  for (size_t i = 0; i < noise_.size() / 2; ++i) noise.push_back(*e->submit(noise_[i]));
  auto first = *e->submit(targets_[0]);
  // The shared blocks are cached once the first target's prompt is in: wait for its first token.
  auto ev = first->next();
  ASSERT_TRUE(ev.has_value());
  for (size_t i = noise_.size() / 2; i < noise_.size(); ++i) noise.push_back(*e->submit(noise_[i]));
  auto second = *e->submit(targets_[1]);
  auto third = *e->submit(targets_[2]);
  ASSERT_EQ(ev->index, 0);
  Trace t0;
  append(*ev, &t0);
  t0 = trace(*first, std::move(t0));
  EXPECT_TRUE(t0 == alone_[0]) << "target 0 differs under load: "
                               << first_difference(t0, alone_[0]);
  const Trace t1 = trace(*second), t2 = trace(*third);
  EXPECT_TRUE(t1 == alone_[1]) << "target 1 (prefix hit at 128) differs: "
                               << first_difference(t1, alone_[1]);
  EXPECT_TRUE(t2 == alone_[2]) << "target 2 (prefix hit at 64) differs: "
                               << first_difference(t2, alone_[2]);
  for (auto& s : noise) trace(*s);
  e->wait_idle();
  EXPECT_GE(e->stats().prefix_hit_tokens, 128 + 64) << "the targets must hit the prefix cache";
}

// Under memory pressure: requests are preempted and recomputed; the targets' outputs stay exact.
TEST_P(DeterministicEngine, SameUnderPreemption) {
  auto cfg = (*Model::load(kFixtures + "/" + GetParam()))->config();
  EngineOptions opt;
  opt.deterministic = true;
  opt.max_num_seqs = 8;
  opt.max_num_batched_tokens = 64;
  // Slots: the scratch slot, one per live sequence, and as many prefix-cache checkpoints; pages:
  // the scratch page and 12.
  opt.cache_budget_bytes =
      static_cast<int64_t>(17 * CacheStore::slot_bytes(cfg) + 13 * CacheStore::page_bytes(cfg, 64));
  auto e = make_engine(GetParam(), opt);
  std::vector<std::shared_ptr<RequestStream>> noise, targets;
  for (size_t i = 0; i < noise_.size(); ++i) {
    noise.push_back(*e->submit(noise_[i]));
    if (i % 5 == 0) targets.push_back(*e->submit(targets_[i / 5]));
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    const Trace t = trace(*targets[i]);
    EXPECT_TRUE(t == alone_[i]) << "target " << i
                                << " differs under preemption: " << first_difference(t, alone_[i]);
  }
  for (auto& s : noise) trace(*s);
  e->wait_idle();
  EXPECT_GT(e->stats().preemptions, 0);  // (pages stay in the prefix cache: no free-count check)
}

// The mode changes rounding, not results: greedy continuations still equal the reference's.
TEST_P(DeterministicEngine, GreedyMatchesFixture) {
  auto golden = SafetensorsFile::open(kFixtures + "/" + GetParam() + "/golden.safetensors");
  ASSERT_TRUE(golden.ok());
  EngineOptions opt;
  opt.deterministic = true;
  auto e = make_engine(GetParam(), opt);
  for (int i = 0; i < 2; ++i) {
    Tensor ids = *(*golden)->get("input_ids_" + std::to_string(i));
    Tensor g = *(*golden)->get("greedy_tokens_" + std::to_string(i));
    Request r;
    for (int64_t t = 0; t < ids.numel(); ++t) r.prompt.push_back(ids.data<int64_t>()[t]);
    std::vector<int32_t> expect;
    for (int64_t t = 0; t < g.numel(); ++t) expect.push_back(g.data<int64_t>()[t]);
    r.params.temperature = 0;
    r.params.max_tokens = static_cast<int>(g.numel());
    r.params.ignore_eos = true;
    EXPECT_EQ(trace(**e->submit(r)).tokens, expect) << "prompt " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, DeterministicEngine,
                         ::testing::Values("kimi_linear_s1", "deepseek_v3_s1", "qwen3_next_s0",
                                           "fla_kda_s0"));

}  // namespace
}  // namespace loom
