// Helpers shared by the engine tests: engines on fixture models and random prompts.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gtest/gtest.h"

namespace loom::testing {

inline const std::string kFixtures = LOOM_FIXTURES_DIR;

// An engine (no tokenizer) on the fixture model `fixture`; fails the test if it cannot be built.
inline std::unique_ptr<Engine> make_engine(const std::string& fixture, EngineOptions opt) {
  auto model = Model::load(kFixtures + "/" + fixture);
  EXPECT_TRUE(model.ok()) << model.status();
  auto e = Engine::create(std::move(*model), nullptr, opt);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

// `len` ids in [3, vocab): never the fixtures' EOS (2); vocab 300 fits every fixture.
inline std::vector<int32_t> random_prompt(int len, std::mt19937& rng, int vocab = 300) {
  std::uniform_int_distribution<int> d(3, vocab - 1);
  std::vector<int32_t> p(len);
  for (int32_t& t : p) t = d(rng);
  return p;
}

// A float's raw bits, so that comparisons of logprobs are bitwise.
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Appends `logprobs` to `out` as words: each sampled token's logprob bits, then its top entries
// as (id, logprob bits) pairs.
inline void append_logprob_bits(const std::vector<TokenLogprob>& logprobs,
                                std::vector<uint32_t>* out) {
  for (const TokenLogprob& lp : logprobs) {
    out->push_back(float_bits(lp.logprob));
    for (const auto& [id, v] : lp.top) {
      out->push_back(static_cast<uint32_t>(id));
      out->push_back(float_bits(v));
    }
  }
}

}  // namespace loom::testing
