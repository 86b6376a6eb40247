// The bundled default model: its config parses, its synthetic weights are deterministic, and an
// engine serves it with the byte-level tokenizer: finite logits, greedy tokens equal to direct
// forwards of the model, text equal to their decoding.
#include <algorithm>
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
  // Greedy generation re-done with direct forwards of the twin model: the engine must produce
  // exactly those 16 tokens (ignore_eos), and its text must be their decoding.
  const int steps = 16;
  std::vector<int32_t> expect;
  {
    SequenceCache c = (*b)->new_cache();
    std::vector<int32_t> feed = prompt;
    for (int i = 0; i < steps; ++i) {
      ForwardBatch batch;
      batch.token_ids = feed;
      batch.seqs.push_back({.num_tokens = static_cast<int64_t>(feed.size()), .cache = &c});
      absl::StatusOr<Tensor> l = (*b)->forward(batch);
      ASSERT_TRUE(l.ok()) << l.status();
      const float* row = l->data<float>();
      expect.push_back(static_cast<int32_t>(std::max_element(row, row + l->dim(1)) - row));
      feed = {expect.back()};
    }
  }
  auto engine = Engine::create(std::move(*a), tok, {});
  ASSERT_TRUE(engine.ok()) << engine.status();
  Request r;
  r.prompt = prompt;
  r.params.max_tokens = steps;
  r.params.temperature = 0;
  r.params.ignore_eos = true;
  auto s = *(*engine)->submit(r);
  std::vector<int32_t> ids;
  std::string text;
  while (auto ev = s->next()) {
    ids.insert(ids.end(), ev->token_ids.begin(), ev->token_ids.end());
    text += ev->text;
  }
  EXPECT_EQ(ids, expect);
  EXPECT_EQ(text, *tok->decode(ids));
}

}  // namespace
}  // namespace loom
