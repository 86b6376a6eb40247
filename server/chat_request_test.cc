// prepare_chat's stop at the end of turn: a chat reply of a model whose tokenizer spells the
// template's end-of-turn marker as text (the byte-level tokenizer of loom-trainer's models) stops
// there; one whose tokenizer has the marker as a special token is left to its EOS ids.
#include "server/chat_request.h"

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/sampling/sampling_params.h"
#include "gtest/gtest.h"
#include "server/chat_setup.h"
#include "server/openai_request.h"

namespace loom {
namespace {

// An empty folder (no chat template: the family's built-in one is used).
const std::string kNoTemplate = [] {
  const auto dir =
      std::filesystem::temp_directory_path() / absl::StrCat("chat_request_test.", ::getpid());
  std::filesystem::create_directories(dir);
  return dir.string();
}();

TEST(ChatEndOfTurn, ByteLevelTokenizerStopsAtTheNativeMarker) {
  auto tok = Tokenizer::byte_level();
  auto chat = load_chat_setup(kNoTemplate, "loom", ReasoningParser::kAuto, tok.get());
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->end_of_turn_stop, "<|end|>");
  auto none = load_chat_setup(kNoTemplate, "loom", ReasoningParser::kAuto, nullptr);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->end_of_turn_stop, "");  // served without a tokenizer: no stop strings at all
}

TEST(ChatEndOfTurn, SpecialTokenMarkerIsNoStopString) {
  auto tok = Tokenizer::from_dir(std::string(LOOM_FIXTURES_DIR) + "/tokenizer_qwen");
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto chat = load_chat_setup(kNoTemplate, "qwen3_next", ReasoningParser::kAuto, tok->get());
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->end_of_turn_stop, "");  // <|im_end|> is one special token there
  // The byte-level tokenizer has <|im_end|> among its four special tokens, but not DeepSeek's
  // end of sentence.
  auto bytes = Tokenizer::byte_level();
  auto qwen = load_chat_setup(kNoTemplate, "qwen3_next", ReasoningParser::kAuto, bytes.get());
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->end_of_turn_stop, "");
  auto spelled = load_chat_setup(kNoTemplate, "deepseek_v3", ReasoningParser::kAuto, bytes.get());
  ASSERT_TRUE(spelled.ok()) << spelled.status();
  auto marker = end_of_turn_marker(ChatFormat::kDeepSeek);
  ASSERT_TRUE(marker.ok()) << marker.status();
  EXPECT_FALSE(marker->empty());
  EXPECT_EQ(spelled->end_of_turn_stop, *marker);
}

TEST(ChatEndOfTurn, PrepareChatAddsTheStopOnce) {
  auto tok = Tokenizer::byte_level();
  auto chat = load_chat_setup(kNoTemplate, "loom", ReasoningParser::kAuto, tok.get());
  ASSERT_TRUE(chat.ok()) << chat.status();
  auto prepare = [&](const std::string& stop_json) {
    auto req = parse_chat_request(
        absl::StrCat(R"({"model": "m", "messages": [{"role": "user", "content": "hi"}])",
                     stop_json.empty() ? "" : absl::StrCat(R"(, "stop": )", stop_json), "}"));
    EXPECT_TRUE(req.ok()) << req.status();
    return prepare_chat(*req, *tok, *chat, 4096);
  };
  auto plain = prepare("");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->request.params.stop, std::vector<std::string>{"<|end|>"});
  auto own = prepare(R"(["zz", "<|end|>"])");
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->request.params.stop, (std::vector<std::string>{"zz", "<|end|>"}));
  std::string full = "[";
  for (int i = 0; i < kMaxStopStrings; ++i) absl::StrAppend(&full, i ? ", " : "", "\"s", i, "\"");
  auto too_many = prepare(full + "]");
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.status().message().find("end of turn \"<|end|>\""), std::string::npos)
      << too_many.status();
}

}  // namespace
}  // namespace loom
