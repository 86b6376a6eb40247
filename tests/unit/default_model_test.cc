// The bundled default model: its config parses, its synthetic weights are deterministic, and an
// engine serves it with the byte-level tokenizer (finite logits, text that round-trips).
#include <cmath>
#include <fstream>
#include <sstream>

#include "engine/engine.h"
#include "gtest/gtest.h"

namespace loom {
namespace {

ModelConfig default_config() {
  std::ifstream in(std::string(LOOM_SOURCE_DIR) + "/weights/default/config.json");
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<ModelConfig> c = parse_model_config(ss.str());
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(DefaultModel, DeterministicAndServable) {
  const ModelConfig cfg = default_config();
  EXPECT_EQ(cfg.vocab_size, Tokenizer::byte_level()->vocab_size());
  auto a = Model::load(cfg, WeightLoader::synthetic(cfg, 1));
  auto b = Model::load(cfg, WeightLoader::synthetic(cfg, 1));
  ASSERT_TRUE(a.ok() && b.ok()) << a.status();
  std::shared_ptr<const Tokenizer> tok = Tokenizer::byte_level();
  const std::vector<int32_t> prompt = tok->encode("Hello, Loom!");
  std::vector<Tensor> logits;
  for (auto* m : {a->get(), b->get()}) {
    SequenceCache c = m->new_cache();
    ForwardBatch batch;
    batch.token_ids = prompt;
    batch.seqs.push_back({.num_tokens = static_cast<int64_t>(prompt.size()),
                          .logits = LogitsMode::kAll,
                          .cache = &c});
    absl::StatusOr<Tensor> l = m->forward(batch);
    ASSERT_TRUE(l.ok()) << l.status();
    logits.push_back(*l);
  }
  for (int64_t i = 0; i < logits[0].numel(); ++i) {
    ASSERT_TRUE(std::isfinite(logits[0].data<float>()[i]));
    ASSERT_EQ(logits[0].data<float>()[i], logits[1].data<float>()[i]);
  }
  auto engine = Engine::create(std::move(*a), tok, {});
  ASSERT_TRUE(engine.ok()) << engine.status();
  Request r;
  r.prompt = prompt;
  r.params.max_tokens = 16;
  r.params.seed = 3;
  auto s = *(*engine)->submit(r);
  int tokens = 0;
  while (auto ev = s->next()) tokens += static_cast<int>(ev->token_ids.size());
  EXPECT_GE(tokens, 1);
}

}  // namespace
}  // namespace loom
