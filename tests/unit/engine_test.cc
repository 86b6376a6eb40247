// The serving engine end to end on fixture models: greedy outputs equal the reference's and do not
// depend on what else is in the batch, the token budget, preemption or prefix-cache hits; seeded
// sampling is reproducible across batch compositions; every page and slot comes back.
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/sampling/sampler.h"
#include "gtest/gtest.h"
#include "tests/unit/engine_test_support.h"
#include "weights/safetensors.h"

namespace loom {
namespace {

using testing::kFixtures;
using testing::make_engine;
using testing::random_prompt;

struct Collected {
  std::map<int, std::vector<int32_t>> tokens;  // by choice
  std::map<int, FinishReason> finish;
  std::map<int, int> completion_tokens;
};

// Drains a stream; fails the test if a choice gets events after its final one. `taken`: tokens of
// choice 0 the caller already read from the stream.
Collected collect(RequestStream& s, int taken = 0) {
  Collected c;
  while (auto ev = s.next()) {
    EXPECT_FALSE(c.finish.contains(ev->index)) << "event after the final one";
    auto& t = c.tokens[ev->index];
    t.insert(t.end(), ev->token_ids.begin(), ev->token_ids.end());
    if (ev->finish) {
      c.finish[ev->index] = *ev->finish;
      c.completion_tokens[ev->index] = ev->completion_tokens;
    }
  }
  for (auto& [i, t] : c.tokens)
    EXPECT_EQ(static_cast<int>(t.size()) + (i == 0 ? taken : 0), c.completion_tokens[i])
        << "streamed twice or lost";
  return c;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

TEST(Engine, GreedyMatchesFixture) {
  for (const char* fixture : {"kimi_linear_s1", "qwen3_next_s0", "deepseek_v3_s1", "fla_kda_s0"}) {
    auto golden = SafetensorsFile::open(kFixtures + "/" + fixture + "/golden.safetensors");
    ASSERT_TRUE(golden.ok());
    auto engine = make_engine(fixture, {});
    std::vector<std::shared_ptr<RequestStream>> streams;
    std::vector<std::vector<int32_t>> expect;
    for (int i = 0; i < 2; ++i) {
      Tensor ids = *(*golden)->get("input_ids_" + std::to_string(i));
      Tensor g = *(*golden)->get("greedy_tokens_" + std::to_string(i));
      Request r;
      for (int64_t t = 0; t < ids.numel(); ++t) r.prompt.push_back(ids.data<int64_t>()[t]);
      expect.emplace_back();
      for (int64_t t = 0; t < g.numel(); ++t) expect.back().push_back(g.data<int64_t>()[t]);
      r.params = greedy(static_cast<int>(g.numel()));
      streams.push_back(*engine->submit(r));
    }
    for (int i = 0; i < 2; ++i) EXPECT_EQ(collect(*streams[i]).tokens[0], expect[i]) << fixture;
  }
}

// 32 requests of mixed lengths (1 to 700), each greedy; outputs must equal each request run alone.
void batch_invariance(const std::string& fixture, int32_t budget, EngineOptions opt = {}) {
  std::mt19937 rng(17);
  const int vocab = 300;
  std::vector<Request> reqs;
  for (int i = 0; i < 32; ++i) {
    Request r;
    const int len = i == 0 ? 1 : i == 1 ? 700 : std::uniform_int_distribution<int>(1, 700)(rng);
    r.prompt = random_prompt(len, rng, vocab);
    r.params = greedy(6 + i % 5);
    reqs.push_back(r);
  }
  opt.max_num_batched_tokens = budget;
  opt.max_num_seqs = 32;
  std::vector<std::vector<int32_t>> alone;
  {
    auto e = make_engine(fixture, opt);
    for (const Request& r : reqs) alone.push_back(collect(**e->submit(r)).tokens[0]);
  }
  auto e = make_engine(fixture, opt);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const Request& r : reqs) streams.push_back(*e->submit(r));
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(collect(*streams[i]).tokens[0], alone[i]) << "request " << i << " budget " << budget;
}

TEST(Engine, BatchInvarianceBudget16) { batch_invariance("kimi_linear_s1", 16); }
TEST(Engine, BatchInvarianceBudget64) { batch_invariance("kimi_linear_s1", 64); }
TEST(Engine, BatchInvarianceBudget4096) { batch_invariance("kimi_linear_s1", 4096); }
TEST(Engine, BatchInvarianceGatedAttention) { batch_invariance("qwen3_next_s0", 64); }

TEST(Engine, PreemptionKeepsOutputs) {
  std::mt19937 rng(5);
  std::vector<Request> reqs;
  for (int i = 0; i < 12; ++i) {
    Request r;
    r.prompt = random_prompt(100 + 37 * i, rng);
    r.params = greedy(40);
    reqs.push_back(r);
  }
  std::vector<std::vector<int32_t>> expect;
  {
    auto e = make_engine("kimi_linear_s1", {});
    for (const Request& r : reqs) expect.push_back(collect(**e->submit(r)).tokens[0]);
  }
  // A budget of a few pages: requests must be preempted and recomputed to all finish.
  EngineOptions tight;
  tight.enable_prefix_cache = false;
  tight.max_num_seqs = 8;
  const size_t page =
      CacheStore::page_bytes((*Model::load(kFixtures + "/kimi_linear_s1"))->config(), 64);
  const size_t slot =
      CacheStore::slot_bytes((*Model::load(kFixtures + "/kimi_linear_s1"))->config());
  // 9 slots (the scratch slot and one per sequence), 15 pages (the scratch page and 14).
  tight.cache_budget_bytes = static_cast<int64_t>(9 * slot + 15 * page);
  auto e = make_engine("kimi_linear_s1", tight);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const Request& r : reqs) streams.push_back(*e->submit(r));
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(collect(*streams[i]).tokens[0], expect[i]) << i;
  e->wait_idle();
  EXPECT_GT(e->stats().preemptions, 0);
  // The totals count what requests can get: neither scratch page nor scratch slot.
  EXPECT_EQ(e->stats().pages_total, 14);
  EXPECT_EQ(e->stats().slots_total, 8);
  EXPECT_EQ(e->stats().pages_free, e->stats().pages_total);
  EXPECT_EQ(e->stats().slots_free, e->stats().slots_total);
}

TEST(Engine, PrefixHitSameAsMiss) {
  std::mt19937 rng(8);
  const std::vector<int32_t> shared = random_prompt(300, rng);
  std::vector<Request> reqs;
  for (int i = 0; i < 4; ++i) {
    Request r;
    r.prompt = shared;
    const std::vector<int32_t> tail = random_prompt(5 + 40 * i, rng);
    r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
    r.params = greedy(12);
    reqs.push_back(r);
  }
  EngineOptions off;
  off.enable_prefix_cache = false;
  std::vector<std::vector<int32_t>> expect;
  {
    auto e = make_engine("kimi_linear_s1", off);
    for (const Request& r : reqs) expect.push_back(collect(**e->submit(r)).tokens[0]);
  }
  EngineOptions on;
  on.checkpoint_interval = 1;
  auto e = make_engine("kimi_linear_s1", on);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(collect(**e->submit(reqs[i])).tokens[0], expect[i]);
  e->wait_idle();
  EXPECT_GE(e->stats().prefix_hit_tokens, 3 * 256) << "later requests must reuse the shared prefix";
}

TEST(Engine, SeededSamplingIndependentOfBatch) {
  std::mt19937 rng(9);
  Request target;
  target.prompt = random_prompt(90, rng);
  target.params.temperature = 0.9f;
  target.params.top_p = 0.95f;
  target.params.seed = 1234;
  target.params.max_tokens = 15;
  target.params.n = 3;
  std::vector<std::vector<int32_t>> alone;
  {
    auto e = make_engine("kimi_linear_s1", {});
    Collected c = collect(**e->submit(target));
    for (int i = 0; i < 3; ++i) alone.push_back(c.tokens[i]);
  }
  EXPECT_NE(alone[0], alone[1]) << "choices must differ";
  auto e = make_engine("kimi_linear_s1", {});
  std::vector<std::shared_ptr<RequestStream>> noise;
  for (int i = 0; i < 10; ++i) {
    Request r;
    r.prompt = random_prompt(20 + 30 * i, rng);
    r.params.temperature = 1.0f;
    r.params.max_tokens = 20;
    noise.push_back(*e->submit(r));
  }
  Collected c = collect(**e->submit(target));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.tokens[i], alone[i]) << "choice " << i;
  for (auto& s : noise) collect(*s);
}

TEST(Engine, CancellationReturnsEverything) {
  EngineOptions opt;
  opt.enable_prefix_cache = false;
  auto e = make_engine("kimi_linear_s1", opt);
  const EngineStats before = e->stats();
  std::mt19937 rng(10);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 16; ++i) {
    Request r;
    r.prompt = random_prompt(50 + 20 * i, rng);
    r.params = greedy(200);
    streams.push_back(*e->submit(r));
  }
  for (int i = 0; i < 16; i += 2) e->cancel(streams[i]->id());
  for (int i = 0; i < 16; ++i) {
    Collected c = collect(*streams[i]);
    if (i % 2 == 1)
      EXPECT_EQ(c.finish[0], FinishReason::kLength);
    else
      EXPECT_TRUE(c.finish[0] == FinishReason::kCancelled || c.finish[0] == FinishReason::kLength);
  }
  e->wait_idle();
  const EngineStats after = e->stats();
  EXPECT_EQ(after.pages_free, before.pages_free);
  EXPECT_EQ(after.slots_free, before.slots_free);
  EXPECT_EQ(after.running + after.waiting, 0);
}

// Waits (bounded) until `pred(stats)` holds; false on timeout.
template <typename Pred>
bool wait_for_stats(Engine& e, Pred pred) {
  for (int i = 0; i < 20000; ++i) {
    if (pred(e.stats())) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  return false;
}

// Cancelling mid-prefill and mid-decode ends the request at once (kCancelled, far fewer tokens
// than asked) and gives back every page and slot; other requests are not disturbed.
TEST(Engine, CancelMidPrefillAndMidDecode) {
  for (bool mid_prefill : {true, false}) {
    SCOPED_TRACE(mid_prefill ? "mid-prefill" : "mid-decode");
    EngineOptions opt;
    opt.enable_prefix_cache = false;
    opt.max_num_batched_tokens = 8;  // a 700-token prompt takes ~88 steps to prefill
    auto e = make_engine("kimi_linear_s1", opt);
    const EngineStats before = e->stats();
    std::mt19937 rng(mid_prefill ? 21 : 22);
    Request victim;
    victim.prompt = random_prompt(mid_prefill ? 700 : 20, rng);
    victim.params = greedy(100);
    Request bystander;
    bystander.prompt = random_prompt(30, rng);
    bystander.params = greedy(12);
    std::vector<int32_t> bystander_alone;
    {
      auto solo = make_engine("kimi_linear_s1", opt);
      bystander_alone = collect(**solo->submit(bystander)).tokens[0];
    }
    auto vs = *e->submit(victim);
    auto bs = *e->submit(bystander);
    int taken = 0;
    if (mid_prefill) {
      ASSERT_TRUE(wait_for_stats(*e, [](const EngineStats& s) { return s.steps >= 3; }));
    } else {
      auto first = vs->next();  // the victim is decoding
      ASSERT_TRUE(first.has_value());
      taken = static_cast<int>(first->token_ids.size());
    }
    e->cancel(vs->id());
    Collected c = collect(*vs, taken);
    EXPECT_EQ(c.finish[0], FinishReason::kCancelled);
    if (mid_prefill) {
      EXPECT_EQ(c.completion_tokens[0], 0) << "cancelled before its prompt was in";
    } else {
      EXPECT_LT(c.completion_tokens[0], 100);
    }
    EXPECT_EQ(collect(*bs).tokens[0], bystander_alone);
    e->wait_idle();
    const EngineStats after = e->stats();
    EXPECT_EQ(after.pages_free, before.pages_free);
    EXPECT_EQ(after.slots_free, before.slots_free);
    EXPECT_EQ(after.finished_cancelled, 1);
    EXPECT_EQ(after.running + after.waiting, 0);
  }
}

// With the prefix cache on, a request cancelled mid-decode leaves a usable cache: the same prompt
// then hits it and gives the clean run's tokens.
TEST(Engine, CancelWithPrefixCacheKeepsTheCacheSound) {
  std::mt19937 rng(23);
  Request r;
  r.prompt = random_prompt(200, rng);
  r.params = greedy(10);
  std::vector<int32_t> clean;
  {
    EngineOptions off;
    off.enable_prefix_cache = false;
    clean = collect(**make_engine("kimi_linear_s1", off)->submit(r)).tokens[0];
  }
  EngineOptions on;
  on.checkpoint_interval = 1;
  auto e = make_engine("kimi_linear_s1", on);
  Request slow = r;
  slow.params = greedy(100);
  auto s = *e->submit(slow);
  auto first = s->next();
  ASSERT_TRUE(first.has_value());
  e->cancel(s->id());
  EXPECT_EQ(collect(*s, static_cast<int>(first->token_ids.size())).finish[0],
            FinishReason::kCancelled);
  e->wait_idle();
  EXPECT_EQ(collect(**e->submit(r)).tokens[0], clean);
  e->wait_idle();
  EXPECT_GE(e->stats().prefix_hit_tokens, 192) << "the cancelled request's blocks were cached";
  EXPECT_EQ(e->stats().running + e->stats().waiting, 0);
}

// The engine's generation re-done outside it: Model::forward in batch-invariant mode (which the
// deterministic engine matches bit for bit, however it batches) and a SamplerState seeded `seed`.
std::vector<int32_t> reference_generation(const Model& model, std::vector<int32_t> prompt,
                                          const SamplingParams& p, uint64_t seed) {
  SequenceCache cache = model.new_cache();
  SamplerState sampler(seed, prompt);
  std::vector<int32_t> out, feed = prompt;
  for (int step = 0; step < p.max_tokens; ++step) {
    ForwardBatch b;
    b.batch_invariant = true;
    b.token_ids = feed;
    SequenceInput in;
    in.num_tokens = static_cast<int64_t>(feed.size());
    in.cache = &cache;
    b.seqs.push_back(in);
    auto logits = model.forward(b);
    EXPECT_TRUE(logits.ok()) << logits.status();
    std::span<float> row(logits->data<float>(), static_cast<size_t>(logits->dim(1)));
    out.push_back(sampler.sample(row, p, {}).token);
    feed = {out.back()};
  }
  return out;
}

// n > 1: choice i samples with seed + i (docs/api.md), including the siblings that restore the
// prompt from the prefix cache (prompts of at least one 64-token block): each choice equals the
// generation re-done outside the engine with that seed. Greedy choices are all equal.
TEST(Engine, NChoicesUseSeedPlusIndex) {
  std::mt19937 rng(24);
  EngineOptions opt;
  opt.deterministic = true;
  auto reference = Model::load(kFixtures + "/kimi_linear_s1");
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (int len : {150, 30}) {
    SCOPED_TRACE(::testing::Message() << "prompt of " << len);
    Request r;
    r.prompt = random_prompt(len, rng);
    r.params.temperature = 0.9f;
    r.params.top_p = 0.95f;
    r.params.seed = 777;
    r.params.max_tokens = 12;
    r.params.ignore_eos = true;
    r.params.n = 3;
    auto e = make_engine("kimi_linear_s1", opt);
    Collected together = collect(**e->submit(r));
    e->wait_idle();
    if (len >= 64) {
      EXPECT_GE(e->stats().prefix_hit_tokens, 2 * 64) << "siblings restored";
    }
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(reference_generation(**reference, r.prompt, r.params, 777 + i), together.tokens[i])
          << "choice " << i;
    }
    EXPECT_NE(together.tokens[0], together.tokens[1]);
    Request g = r;
    g.params = greedy(12);
    g.params.n = 3;
    Collected greedy_n = collect(**e->submit(g));
    EXPECT_EQ(greedy_n.tokens[1], greedy_n.tokens[0]);
    EXPECT_EQ(greedy_n.tokens[2], greedy_n.tokens[0]);
  }
}

// With a tokenizer: text deltas concatenate to the detokenized tokens, and a stop string cuts the
// text exactly before itself without ever streaming a prefix of it.
TEST(Engine, TextAndStopStrings) {
  auto model = Model::load(kFixtures + "/kimi_linear_s1");  // vocab 500 >= 260 byte-level ids
  ASSERT_TRUE(model.ok());
  std::shared_ptr<const Tokenizer> tok = Tokenizer::byte_level();
  auto engine = Engine::create(std::move(*model), tok, {});
  ASSERT_TRUE(engine.ok()) << engine.status();
  Request r;
  r.prompt = tok->encode("Loom serves hybrid models.");
  r.params = greedy(60);
  r.params.logprobs = 2;
  std::string text;
  std::vector<int32_t> ids;
  int logprob_events = 0;
  auto s = *(*engine)->submit(r);
  while (auto ev = s->next()) {
    text += ev->text;
    ids.insert(ids.end(), ev->token_ids.begin(), ev->token_ids.end());
    for (const TokenLogprob& lp : ev->logprobs) {
      ++logprob_events;
      EXPECT_LE(lp.logprob, 0.0f);
      ASSERT_EQ(lp.top.size(), 2u);
      EXPECT_EQ(lp.top[0].first, lp.token) << "greedy picks the top logprob";
    }
  }
  EXPECT_EQ(logprob_events, 60);
  // Ids above 259 decode to nothing useful for a byte tokenizer: keep those that are bytes.
  std::vector<int32_t> bytes;
  for (int32_t id : ids)
    if (id < 260) bytes.push_back(id);
  EXPECT_EQ(text, *tok->decode(bytes));
  ASSERT_GE(text.size(), 6u) << "the untrained model produced too little text to test stops";
  // A stop string taken from the middle of the output.
  const std::string stop = text.substr(text.size() / 2, 3);
  const std::string expect = text.substr(0, text.find(stop));
  r.params.stop = {stop};
  r.params.logprobs = -1;
  std::string stopped;
  std::optional<FinishReason> reason;
  auto s2 = *(*engine)->submit(r);
  while (auto ev = s2->next()) {
    stopped += ev->text;
    EXPECT_EQ(stopped, expect.substr(0, stopped.size())) << "streamed text past the stop point";
    if (ev->finish) reason = ev->finish;
  }
  EXPECT_EQ(stopped, expect);
  EXPECT_EQ(reason, FinishReason::kStop);
}

// Each bad request is refused with InvalidArgument naming what is wrong, and nothing is queued.
TEST(Engine, RejectsBadRequests) {
  auto e = make_engine("kimi_linear_s1", {});
  auto expect_refused = [&](const Request& r, const std::string& names) {
    auto s = e->submit(r);
    ASSERT_FALSE(s.ok()) << "accepted; expected a refusal naming " << names;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
    EXPECT_NE(s.status().message().find(names), std::string::npos)
        << s.status() << " does not name " << names;
  };
  Request r;
  expect_refused(r, "prompt is empty");
  r.prompt = {1, 2, 100000};
  expect_refused(r, "prompt token 100000 at position 2");
  r.prompt = {1, 2, 3};
  r.params.top_p = 2;
  expect_refused(r, "top_p");
  r.params = SamplingParams();
  r.params.temperature = -1;
  expect_refused(r, "temperature");
  r.params = SamplingParams();
  r.params.stop = {"x"};
  expect_refused(r, "stop strings need a tokenizer");
  r.params = SamplingParams();
  r.params.stop_token_ids = {500};
  expect_refused(r, "stop_token_ids");
  r.params = SamplingParams();
  r.params.logit_bias = {{-1, 1.0f}};
  expect_refused(r, "logit_bias");
  r.params = SamplingParams();
  r.params.n = 17;
  expect_refused(r, "n");
  r.params = SamplingParams();
  r.params.max_tokens = 1 << 30;
  expect_refused(r, "context limit");
  e->wait_idle();
  EXPECT_EQ(e->stats().running + e->stats().waiting, 0);
}

}  // namespace
}  // namespace loom

namespace loom {
namespace {

// --kv_dtype bf16 on the CPU: the same budget holds twice the pages, and greedy outputs still do
// not depend on the batch (each cached value is rounded once, whatever else is in the step), on
// the MLA and the GQA families.
TEST(Engine, Bf16KvPagesOnTheCpu) {
  EngineOptions opt;
  opt.cache_budget_bytes = int64_t{8} << 20;
  opt.kv_dtype = DType::kBF16;
  const int64_t bf16_pages = make_engine("kimi_linear_s1", opt)->stats().pages_total;
  opt.kv_dtype = DType::kF32;
  const int64_t f32_pages = make_engine("kimi_linear_s1", opt)->stats().pages_total;
  EXPECT_NEAR(static_cast<double>(bf16_pages) / f32_pages, 2.0, 0.1);
  EngineOptions bf16;
  bf16.kv_dtype = DType::kBF16;
  batch_invariance("kimi_linear_s1", 64, bf16);
  batch_invariance("qwen3_next_s0", 64, bf16);
}

}  // namespace
}  // namespace loom
