// Engine::update_weights (issue 20, weight sync): the engine serves new parameter values without a
// restart, tags every output with the weight version it was sampled under, and reuses nothing the
// old weights computed: neither cached prefixes (attention pages and linear-state checkpoints:
// the bundled config mixes KDA and MLA layers) nor a session's kept cache. In deterministic mode
// its outputs after the update are bit-identical to a fresh engine built with the new weights.
// An f32 trainer's weights update a bf16 engine through the same rounding the loader applies to a
// checkpoint loaded in bf16; pairs of dtypes that do not convert that way are refused.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/model/native_export.h"
#include "tests/unit/engine_test_support.h"

namespace loom {
namespace {

const std::string kConfig = std::string(LOOM_SOURCE_DIR) + "/weights/default/config.json";

std::unique_ptr<Model> random_model(uint64_t seed, bool writable) {
  Placement p;
  p.trainable = writable;
  auto m = Model::load_random(kConfig, seed, p);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(m).value();
}

std::unique_ptr<Engine> make(std::unique_ptr<Model> model) {
  EngineOptions o;
  o.deterministic = true;
  auto e = Engine::create(std::move(model), nullptr, o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(e).value();
}

struct Generated {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  int64_t version = -1;
  int64_t hit = 0;  // prompt tokens served from a cache (the engine's prefix_hit_tokens delta)
};

Generated generate(Engine& e, std::vector<int32_t> prompt, const std::string& session = "") {
  const int64_t hits_before = e.stats().prefix_hit_tokens;
  Request r;
  r.prompt = std::move(prompt);
  r.session = session;
  r.params.temperature = 0;  // greedy
  r.params.max_tokens = 12;
  r.params.ignore_eos = true;
  r.params.logprobs = 0;
  auto stream = e.submit(std::move(r));
  EXPECT_TRUE(stream.ok()) << stream.status();
  Generated g;
  while (std::optional<RequestOutput> ev = (*stream)->next()) {
    g.tokens.insert(g.tokens.end(), ev->token_ids.begin(), ev->token_ids.end());
    for (const TokenLogprob& lp : ev->logprobs) g.logprobs.push_back(lp.logprob);
    if (g.version < 0) g.version = ev->weight_version;
    EXPECT_EQ(ev->weight_version, g.version);
  }
  e.wait_idle();
  g.hit = e.stats().prefix_hit_tokens - hits_before;
  return g;
}

TEST(EngineWeightUpdate, NewWeightsServeAsAFreshEngineAndNoCacheSurvives) {
  std::mt19937 rng(11);
  const std::vector<int32_t> prompt = testing::random_prompt(200, rng, 256);
  const std::vector<int32_t> turn2 = testing::random_prompt(70, rng, 256);
  std::unique_ptr<Engine> engine = make(random_model(3, /*writable=*/true));
  const std::unique_ptr<Model> trained = random_model(4, /*writable=*/true);  // the "trainer's"

  const Generated before = generate(*engine, prompt);
  EXPECT_EQ(before.version, 0);
  EXPECT_EQ(before.hit, 0);
  // The prompt is cached now (its 3 whole blocks), and a session keeps its cache.
  EXPECT_EQ(generate(*engine, prompt).hit, 192);
  generate(*engine, prompt, "s");
  const Generated kept = generate(*engine, turn2, "s");
  EXPECT_GE(kept.hit, 200);  // the second turn continued the first's kept cache

  auto version = engine->update_weights(trained->parameters());
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1);
  EXPECT_EQ(engine->stats().weight_version, 1);
  EXPECT_EQ(engine->stats().sessions_resident, 0);

  const Generated after = generate(*engine, prompt);
  EXPECT_EQ(after.version, 1);
  EXPECT_EQ(after.hit, 0) << "a prefix cached under the old weights was reused";
  EXPECT_NE(after.tokens, before.tokens) << "the update did not change what the engine generates";

  // A fresh engine with the new weights gives the same bits.
  std::unique_ptr<Engine> fresh = make(random_model(4, /*writable=*/false));
  const Generated reference = generate(*fresh, prompt);
  EXPECT_EQ(after.tokens, reference.tokens);
  EXPECT_EQ(after.logprobs, reference.logprobs);

  // The session's next turn does not continue the cache it kept (computed by the old weights):
  // at most the prompt's blocks, cached just above under the new weights, are reused; and it
  // equals its whole history sent to the fresh engine as one request.
  std::vector<int32_t> history = prompt;
  history.insert(history.end(), before.tokens.begin(), before.tokens.end());
  history.insert(history.end(), turn2.begin(), turn2.end());
  history.insert(history.end(), kept.tokens.begin(), kept.tokens.end());
  const std::vector<int32_t> turn3 = testing::random_prompt(5, rng, 256);
  const Generated resumed = generate(*engine, turn3, "s");
  history.insert(history.end(), turn3.begin(), turn3.end());
  EXPECT_LE(resumed.hit, 192) << "the session continued a cache computed by the old weights";
  EXPECT_EQ(resumed.version, 1);
  const Generated whole = generate(*fresh, history);
  EXPECT_EQ(resumed.tokens, whole.tokens);
  EXPECT_EQ(resumed.logprobs, whole.logprobs);
}

TEST(EngineWeightUpdate, RefusedWhileARequestIsLiveOrTheModelIsReadOnly) {
  std::unique_ptr<Engine> engine = make(random_model(3, /*writable=*/true));
  const std::unique_ptr<Model> trained = random_model(4, /*writable=*/true);
  std::mt19937 rng(5);
  Request r;
  r.prompt = testing::random_prompt(40, rng, 256);
  r.params.max_tokens = 400;
  r.params.ignore_eos = true;
  auto stream = engine->submit(std::move(r));
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_TRUE((*stream)->next().has_value());  // it is live (sampling) now
  auto refused = engine->update_weights(trained->parameters());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  engine->cancel((*stream)->id());
  engine->wait_idle();
  EXPECT_EQ(engine->stats().weight_version, 0);
  auto ok = engine->update_weights(trained->parameters());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, 1);

  std::unique_ptr<Engine> served = make(random_model(3, /*writable=*/false));
  auto read_only = served->update_weights(trained->parameters());
  EXPECT_EQ(read_only.status().code(), absl::StatusCode::kFailedPrecondition) << read_only.status();
  EXPECT_NE(read_only.status().message().find("Placement::trainable"), std::string::npos);

  // A source of another shape: refused before anything is written.
  auto other = Model::load_random(std::string(LOOM_FIXTURES_DIR) + "/fla_kda_s0", 1);
  ASSERT_TRUE(other.ok()) << other.status();
  auto mismatch = engine->update_weights((*other)->parameters());
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument) << mismatch.status();
  EXPECT_EQ(engine->stats().weight_version, 1);
}

// The trainer's f32 parameters into an engine holding bf16 matrices (the rollout engine of an RL
// run in bf16): the engine then serves what a fresh bf16 engine loaded from a checkpoint of those
// f32 weights serves (the loader's f32 -> bf16 rounding), token for token and logprob for logprob.
TEST(EngineWeightUpdate, F32SourceUpdatesABf16EngineAsTheLoaderRounds) {
  std::mt19937 rng(12);
  const std::vector<int32_t> prompt = testing::random_prompt(150, rng, 256);
  Placement bf16;
  bf16.dtype = WeightDType::kBF16;
  bf16.writable = true;
  auto served = Model::load_random(kConfig, 3, bf16);
  ASSERT_TRUE(served.ok()) << served.status();
  ASSERT_EQ((*served)->parameters().find("lm_head.weight")->dtype(), DType::kBF16);
  const ParameterArena& engine_params = (*served)->parameters();  // the engine owns it from here
  std::unique_ptr<Engine> engine = make(std::move(served).value());
  const std::unique_ptr<Model> trained = random_model(4, /*writable=*/true);
  const Generated before = generate(*engine, prompt);

  auto version = engine->update_weights(trained->parameters());
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 1);
  const Generated after = generate(*engine, prompt);
  EXPECT_NE(after.tokens, before.tokens) << "the update did not change what the engine generates";

  // The oracle: the f32 weights written as a checkpoint and loaded in bf16 by the loader.
  const std::string dir = std::string(LOOM_TEST_TMPDIR) + "/weight_update_bf16";
  WeightLoader::Record record;
  for (const ParameterArena::Entry& e : trained->parameters().entries())
    record.emplace_back(e.name, e.tensor);
  ASSERT_TRUE(write_native_checkpoint(trained->config(), record, dir).ok());
  auto loaded = Model::load(dir, Placement{.dtype = WeightDType::kBF16});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  // Every engine parameter holds exactly the loaded bits (f32 ones copied, bf16 ones rounded).
  size_t rounded = 0;
  for (const ParameterArena::Entry& e : (*loaded)->parameters().entries()) {
    const Tensor* mine = engine_params.find(e.name);
    ASSERT_NE(mine, nullptr) << e.name;
    ASSERT_EQ(mine->dtype(), e.tensor.dtype()) << e.name;
    ASSERT_EQ(std::memcmp(mine->raw(), e.tensor.raw(), e.tensor.nbytes()), 0) << e.name;
    rounded += e.tensor.dtype() == DType::kBF16;
  }
  EXPECT_GT(rounded, 0u);
  std::unique_ptr<Engine> fresh = make(std::move(loaded).value());
  const Generated reference = generate(*fresh, prompt);
  EXPECT_EQ(after.tokens, reference.tokens);
  EXPECT_EQ(after.logprobs, reference.logprobs);
}

TEST(EngineWeightUpdate, DtypesThatDoNotConvertAreRefused) {
  const std::unique_ptr<Model> trained = random_model(4, /*writable=*/true);
  // A bf16 source into an f32 engine: widening would serve weights the trainer does not hold.
  std::unique_ptr<Engine> f32_engine = make(random_model(3, /*writable=*/true));
  auto bf16_source = Model::load_random(kConfig, 4, Placement{.dtype = WeightDType::kBF16});
  ASSERT_TRUE(bf16_source.ok()) << bf16_source.status();
  auto widened = f32_engine->update_weights((*bf16_source)->parameters());
  EXPECT_EQ(widened.status().code(), absl::StatusCode::kInvalidArgument) << widened.status();
  EXPECT_NE(widened.status().message().find("only the same dtype or f32 into bf16"),
            std::string::npos)
      << widened.status();
  EXPECT_EQ(f32_engine->stats().weight_version, 0);

  // FP8 engine weights: a new value needs new block scales (re-quantization), which is refused.
  Placement fp8;
  fp8.dtype = WeightDType::kFP8;
  fp8.writable = true;
  auto quantized = Model::load_random(kConfig, 3, fp8);
  ASSERT_TRUE(quantized.ok()) << quantized.status();
  std::unique_ptr<Engine> fp8_engine = make(std::move(quantized).value());
  auto refused = fp8_engine->update_weights(trained->parameters());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("re-quantization"), std::string::npos)
      << refused.status();
  EXPECT_EQ(fp8_engine->stats().weight_version, 0);
}

}  // namespace
}  // namespace loom
