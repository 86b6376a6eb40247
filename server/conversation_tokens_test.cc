// Continuing a kept conversation (server/conversation_tokens.h, prepare_chat with `continues`):
// over random multi-turn conversations, rendered with the fixture chat templates and the built-in
// ones and encoded with the fixture tokenizers, a continued turn's ids equal the encoding of the
// whole rendering whenever that encoding begins with the kept ids (the oracle: prepare_chat
// without `continues`), spell the rendering in every continued turn, and only the new text (from
// the special token at the seam) reaches the tokenizer.
#include "server/conversation_tokens.h"

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/chat_request.h"
#include "server/chat_setup.h"
#include "server/openai_request.h"

namespace loom {
namespace {

using ojson = nlohmann::ordered_json;

std::string fixture(const std::string& name) { return std::string(LOOM_FIXTURES_DIR) + "/" + name; }

std::shared_ptr<const Tokenizer> load_tokenizer(const std::string& name) {
  if (name == "byte_level") return Tokenizer::byte_level();
  auto tok = Tokenizer::from_dir(fixture(name));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return std::shared_ptr<const Tokenizer>(*std::move(tok));
}

// Random message text: words, spaces and newlines in runs, digits, punctuation, accented, CJK
// and 4-byte characters, and now and then a special token's spelling (plain text in a message).
std::string random_text(std::mt19937_64& rng, int max_pieces) {
  static const char* const pieces[] = {
      "hello",       " world",   "  ",   "\n",         "\n\n",       " ",
      "\t",          "123",      "4567", ".",          ",",          "!?",
      "é",           "naïve",    "中文", "字",         "🙂",       "token",
      "ization",     " the",     "The",  "{\"a\": 1}", "<|im_end|>", "<|im_start|>",
      "<|im_user|>", "</think>", "'s",   " 's",        "  x",        "ab\r\n"};
  std::uniform_int_distribution<int> n_dist(1, max_pieces);
  std::uniform_int_distribution<size_t> p_dist(0, std::size(pieces) - 1);
  std::string s;
  const int n = n_dist(rng);
  for (int i = 0; i < n; ++i) s += pieces[p_dist(rng)];
  return s;
}

struct Combo {
  const char* name;
  const char* templ;  // a chat_templates fixture, or "" for the built-in `format`
  ChatFormat format;
  const char* tokenizer;  // a fixture folder or "byte_level"
  const char* end_turn;   // what the simulated model samples to end its reply
  bool continues;         // the template renders earlier replies as sampled (continuing expected)
};

class ContinuationTest : public ::testing::TestWithParam<Combo> {};

TEST_P(ContinuationTest, ContinuedTurnsEqualTheWholeEncoding) {
  const Combo& combo = GetParam();
  const auto tok = load_tokenizer(combo.tokenizer);
  ChatSetup chat;
  chat.format = combo.format;
  if (combo.templ[0] != '\0') {
    auto t = CheckpointChatTemplate::load(fixture(std::string("chat_templates/") + combo.templ));
    ASSERT_TRUE(t.ok()) << t.status();
    chat.chat_template = std::make_shared<const CheckpointChatTemplate>(*std::move(t));
  }
  const std::optional<int32_t> end_id = tok->token_id(combo.end_turn);
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << combo.name << " seed " << seed);
  std::mt19937_64 rng(seed);
  int turns = 0, continued = 0, equal_checks = 0;
  for (int conv = 0; conv < 12; ++conv) {
    ojson messages = ojson::array();
    if (rng() % 2) messages.push_back({{"role", "system"}, {"content", random_text(rng, 4)}});
    std::shared_ptr<const ConversationTokens> kept;
    const int n_turns = 2 + static_cast<int>(rng() % 5);
    for (int t = 0; t < n_turns; ++t) {
      messages.push_back({{"role", "user"}, {"content", random_text(rng, 12)}});
      const ojson body = {{"model", "m"}, {"messages", messages}};
      auto req = parse_chat_request(body.dump());
      ASSERT_TRUE(req.ok()) << req.status();
      auto whole = prepare_chat(*req, *tok, chat, 0);
      ASSERT_TRUE(whole.ok()) << whole.status();
      auto turn = prepare_chat(*req, *tok, chat, 0, kept.get(), /*keep_prompt=*/true);
      ASSERT_TRUE(turn.ok()) << turn.status();
      const std::string& rendered = turn->prompt->text;
      const std::vector<int32_t>& ids = turn->request.prompt;
      const std::vector<int32_t>& oracle = whole->request.prompt;
      EXPECT_EQ(whole->encoded_bytes, rendered.size());
      if (kept) {
        ++turns;
        const bool oracle_continues =
            oracle.size() >= kept->tokens.size() &&
            std::equal(kept->tokens.begin(), kept->tokens.end(), oracle.begin());
        if (oracle_continues) {
          ++equal_checks;
          EXPECT_EQ(ids, oracle) << "turn " << t << " of:\n" << rendered;
        }
        if (turn->continued) {
          ++continued;
          ASSERT_GE(ids.size(), kept->tokens.size());
          EXPECT_TRUE(std::equal(kept->tokens.begin(), kept->tokens.end(), ids.begin()));
          EXPECT_EQ(*tok->decode(ids), rendered);
          // Only the new text and the special token before it were encoded: counted here at the
          // encoder, and as prepare_chat reported it.
          size_t counted = 0;
          const auto again = split_conversation(
              *kept, rendered, *tok, [](size_t, size_t) { return true; },
              [&](size_t begin) {
                counted += rendered.size() - begin;
                RenderedChat r;
                r.text = rendered;
                r.markup_ranges = {{0, rendered.size()}};
                return encode_chat_text(*req, *tok, r, begin);
              });
          EXPECT_TRUE(again.has_value());
          const size_t fresh = rendered.size() - kept->text.size();
          EXPECT_EQ(turn->encoded_bytes, counted);
          EXPECT_LE(counted, fresh + 16);  // + the seam's special token (<|im_end|>: 10 bytes)
          EXPECT_GE(counted, fresh);
        } else {
          EXPECT_EQ(ids, oracle);  // not continued: the whole rendering, encoded
        }
      }
      // The model's reply: usually its canonical encoding and the end-of-turn token; sometimes
      // character by character (ids that re-encode differently) or cut by max_tokens.
      const std::string content = random_text(rng, 10);
      std::vector<int32_t> reply;
      const int kind = static_cast<int>(rng() % 6);
      if (kind == 1) {
        for (size_t i = 0; i < content.size();) {
          size_t len = 1;
          const unsigned char c = static_cast<unsigned char>(content[i]);
          if (c >= 0xF0)
            len = 4;
          else if (c >= 0xE0)
            len = 3;
          else if (c >= 0xC0)
            len = 2;
          const auto piece = tok->encode(content.substr(i, len), /*allow_special=*/false);
          reply.insert(reply.end(), piece.begin(), piece.end());
          i += len;
        }
      } else {
        reply = tok->encode(content, /*allow_special=*/false);
      }
      if (kind != 2 && end_id) reply.push_back(*end_id);
      auto after = conversation_after_reply(*turn->prompt, reply, *tok);
      ASSERT_TRUE(after.has_value());
      kept = std::make_shared<const ConversationTokens>(*std::move(after));
      messages.push_back({{"role", "assistant"}, {"content", content}});
    }
  }
  if (combo.continues) {
    // Not vacuous: most turns continued and the whole encoding was compared.
    EXPECT_GE(continued * 2, turns) << continued << " of " << turns;
    EXPECT_GE(equal_checks * 4, turns) << equal_checks << " of " << turns;
  } else {
    EXPECT_EQ(continued, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Templates, ContinuationTest,
    ::testing::Values(
        Combo{"qwen3_next_qwen", "qwen3_next", ChatFormat::kQwen, "tokenizer_qwen", "<|im_end|>",
              true},
        Combo{"qwen3_next_gpt2", "qwen3_next", ChatFormat::kQwen, "tokenizer_gpt2", "<|im_end|>",
              true},
        Combo{"qwen3_next_bytes", "qwen3_next", ChatFormat::kQwen, "byte_level", "<|im_end|>",
              true},
        Combo{"kimi_k2_tiktoken", "kimi_k2", ChatFormat::kKimi, "tokenizer_tiktoken_kimi",
              "<|im_end|>", true},
        // These render an earlier reply as "<think></think>" + its content, which is not the
        // text sampled here: never continued, always whole.
        Combo{"kimi_k2_5_tiktoken", "kimi_k2_5", ChatFormat::kKimi, "tokenizer_tiktoken_kimi",
              "<|im_end|>", false},
        Combo{"kimi_k2_thinking_tiktoken", "kimi_k2_thinking", ChatFormat::kKimi,
              "tokenizer_tiktoken_kimi", "<|im_end|>", false},
        Combo{"builtin_qwen", "", ChatFormat::kQwen, "tokenizer_qwen", "<|im_end|>", true},
        Combo{"builtin_kimi_bytes", "", ChatFormat::kKimi, "byte_level", "<|im_end|>", true},
        // No special token of the template's in this tokenizer (<|end|>, <｜end▁of▁sentence｜>):
        // never continued, always whole.
        Combo{"builtin_native_bytes", "", ChatFormat::kNative, "byte_level", "<|end|>", false},
        Combo{"deepseek_v3_qwen", "deepseek_v3", ChatFormat::kDeepSeek, "tokenizer_qwen",
              "<｜end▁of▁sentence｜>", false}),
    [](const ::testing::TestParamInfo<Combo>& info) { return std::string(info.param.name); });

// A kept text that the new rendering does not continue, or with nothing new: not continued.
TEST(SplitConversation, RefusesTextThatDoesNotContinue) {
  const auto tok = Tokenizer::byte_level();
  const int32_t im_end = *tok->token_id("<|im_end|>");
  ConversationTokens kept;
  kept.text = "ab<|im_end|>";
  kept.tokens = {'a', 'b', im_end};
  const auto encode = [&](size_t begin) {
    return tok->encode(std::string_view("ab<|im_end|>\ncd").substr(begin));
  };
  const auto anywhere = [](size_t, size_t) { return true; };
  EXPECT_FALSE(split_conversation(kept, "ax<|im_end|>\ncd", *tok, anywhere, encode));
  EXPECT_FALSE(split_conversation(kept, "ab<|im_end|>", *tok, anywhere, encode));
  // The seam's token outside the template's markup (request text): not continued.
  EXPECT_FALSE(split_conversation(
      kept, "ab<|im_end|>\ncd", *tok, [](size_t, size_t) { return false; }, encode));
  size_t bytes = 0;
  const auto ok = split_conversation(kept, "ab<|im_end|>\ncd", *tok, anywhere, encode, &bytes);
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(*ok, (std::vector<int32_t>{'a', 'b', im_end, '\n', 'c', 'd'}));
  EXPECT_EQ(bytes, std::string_view("<|im_end|>\ncd").size());
}

}  // namespace
}  // namespace loom
