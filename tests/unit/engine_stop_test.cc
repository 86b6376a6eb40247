// How a choice ends, through the engine with a real (tiny byte-level BPE) tokenizer: a stopping
// token (EOS, a stop id) is reported but its text is never output; min_tokens holds EOS back; a
// stop string ends the text even when the detokenizer still holds an incomplete character; text
// held back for a partial stop-string match is output when max_tokens ends the choice.
// logit_bias forces the tokens, so the untrained fixture model's preferences do not matter.
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/tiny_bpe.h"

namespace loom {
namespace {

using json = nlohmann::json;
const std::string kFixtures = LOOM_FIXTURES_DIR;

// Ids 0..255 are the bytes; id 256 is "y" followed by 0xC3, the lead byte of a two-byte character.
constexpr int32_t kYLead = 256;
constexpr int32_t kEos = 2;  // kimi_linear_s1's eos_token_id

std::shared_ptr<const Tokenizer> tiny_tokenizer() {
  const json merges = json::array({json::array({"y", testing::byte_char(0xC3)})});
  auto tok = Tokenizer::from_json(testing::tiny_tokenizer(merges, json::array(), nullptr).dump());
  EXPECT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(*(*tok)->token_id("y" + testing::byte_char(0xC3)), kYLead);
  return std::shared_ptr<const Tokenizer>(std::move(*tok));
}

struct Outcome {
  std::string text;
  std::vector<int32_t> ids;
  FinishReason finish = FinishReason::kNone;
  int completion_tokens = 0;
};

class EngineStop : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = tiny_tokenizer();
    auto model = Model::load(kFixtures + "/kimi_linear_s1");  // vocabulary of 500 ids
    ASSERT_TRUE(model.ok()) << model.status();
    auto e = Engine::create(std::move(*model), tok_, {});
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }

  Outcome run(SamplingParams p) {
    Request r;
    r.prompt = tok_->encode("Loom stops here.");
    r.params = std::move(p);
    auto s = engine_->submit(r);
    EXPECT_TRUE(s.ok()) << s.status();
    Outcome o;
    while (auto ev = (*s)->next()) {
      o.text += ev->text;
      o.ids.insert(o.ids.end(), ev->token_ids.begin(), ev->token_ids.end());
      if (ev->finish) {
        o.finish = *ev->finish;
        o.completion_tokens = ev->completion_tokens;
      }
    }
    return o;
  }

  // Greedy with `token` forced (every step, unless masked).
  static SamplingParams forcing(int32_t token, int max_tokens) {
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = max_tokens;
    p.logit_bias = {{token, 100.0f}};
    return p;
  }

  std::shared_ptr<const Tokenizer> tok_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineStop, EosIsReportedButItsTextIsNotOutput) {
  const Outcome o = run(forcing(kEos, 8));
  EXPECT_EQ(o.finish, FinishReason::kStop);
  EXPECT_EQ(o.ids, std::vector<int32_t>{kEos});
  EXPECT_EQ(o.completion_tokens, 1);
  EXPECT_EQ(o.text, "") << "the EOS token's text (byte 0x02 here, <|im_end|> in a chat model)";
}

TEST_F(EngineStop, StopTokenIdIsReportedButItsTextIsNotOutput) {
  SamplingParams p = forcing('q', 8);
  p.stop_token_ids = {'q'};
  const Outcome o = run(p);
  EXPECT_EQ(o.finish, FinishReason::kStop);
  EXPECT_EQ(o.ids, std::vector<int32_t>{'q'});
  EXPECT_EQ(o.text, "");
}

TEST_F(EngineStop, MinTokensHoldsEosBack) {
  // Only 'a', 'b', 'c' and EOS may be sampled; EOS is forced as soon as min_tokens allows it.
  SamplingParams p = forcing(kEos, 20);
  p.min_tokens = 4;
  for (int32_t id = 0; id < 500; ++id)
    if (id != kEos && id != 'a' && id != 'b' && id != 'c') p.logit_bias.push_back({id, -100.0f});
  const Outcome o = run(p);
  EXPECT_EQ(o.finish, FinishReason::kStop);
  ASSERT_EQ(o.ids.size(), 5u);
  EXPECT_EQ(o.ids.back(), kEos);
  EXPECT_EQ(o.completion_tokens, 5);
  const std::vector<int32_t> before(o.ids.begin(), o.ids.end() - 1);
  EXPECT_EQ(o.text, *tok_->decode(before));
  EXPECT_EQ(o.text.size(), 4u);
}

TEST_F(EngineStop, StopStringEndsTextEvenWithAnIncompleteCharacterPending) {
  // Token 256 is "y" + 0xC3: the stop string "y" completes while 0xC3 waits for its second byte;
  // that byte must not come out (as U+FFFD) after the stop.
  SamplingParams p = forcing(kYLead, 8);
  p.stop = {"y"};
  const Outcome o = run(p);
  EXPECT_EQ(o.finish, FinishReason::kStop);
  EXPECT_EQ(o.text, "");
}

TEST_F(EngineStop, MaxTokensInsideAPartialStopStringOutputsTheHeldText) {
  SamplingParams p = forcing('y', 3);
  p.stop = {"yz"};  // every "y" could start the stop string: held back until the end
  const Outcome o = run(p);
  EXPECT_EQ(o.finish, FinishReason::kLength);
  EXPECT_EQ(o.text, "yyy");
}

TEST_F(EngineStop, EosAfterHeldTextOutputsTheHeldText) {
  // Step 1: 'y' (+100) beats EOS (+80) and is held back (it could start "yz"). Step 2: the
  // repetition penalty halves 'y' to about +50, so EOS ends the choice; the held "y" is the
  // client's text, EOS's is not. (Margins of 20 logits dwarf the untrained model's own.)
  SamplingParams p = forcing('y', 8);
  p.logit_bias.push_back({kEos, 80.0f});
  p.repetition_penalty = 2.0f;
  p.stop = {"yz"};
  const Outcome o = run(p);
  EXPECT_EQ(o.finish, FinishReason::kStop);
  EXPECT_EQ(o.ids, (std::vector<int32_t>{'y', kEos}));
  EXPECT_EQ(o.text, "y");
}

// A tokenizer may be larger than the model's embedding only by special tokens (Kimi's reserve 258
// special ids, Kimi-K2's embedding covers 256): regular tokens past it mean a mismatched pair.
TEST(EngineTokenizer, OnlySpecialTokensMayLiePastTheModelsVocabulary) {
  for (bool special : {true, false}) {
    json added = json::array();
    for (int i = 0; i < 300; ++i)  // ids 256..555 against the model's 500
      added.push_back({{"content", "<|t" + std::to_string(i) + "|>"}, {"special", special}});
    auto tok = Tokenizer::from_json(testing::tiny_tokenizer(json::array(), added, nullptr).dump());
    ASSERT_TRUE(tok.ok()) << tok.status();
    auto model = Model::load(kFixtures + "/kimi_linear_s1");
    ASSERT_TRUE(model.ok());
    auto e =
        Engine::create(std::move(*model), std::shared_ptr<const Tokenizer>(std::move(*tok)), {});
    EXPECT_EQ(e.ok(), special) << e.status();
    if (!special) EXPECT_NE(e.status().message().find("token 500"), std::string_view::npos);
  }
}

}  // namespace
}  // namespace loom
