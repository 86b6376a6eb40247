// Generated turns read back: for every assistant message with tool calls in the conversations of
// ../shared/fixtures/chat_templates/<name>/cases.json, the text the real template writes for that
// turn (what a model trained on it generates) must parse, in the syntax probed from the same
// template, into exactly that message: its tool calls (names, arguments as JSON values, Kimi's
// ids), its content and its reasoning. One-shot, and streamed at every split point and byte by
// byte, accumulating to the same result.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/chat/chat_output_parser.h"
#include "engine/chat/chat_template_probe.h"
#include "engine/chat/checkpoint_chat_template.h"
#include "nlohmann/json.hpp"
#include "tests/unit/chat_output_test_support.h"
#include "tests/unit/engine_test_support.h"

namespace loom {
namespace {

using json = nlohmann::ordered_json;

const std::filesystem::path kTemplates =
    std::filesystem::path(testing::kFixtures) / "chat_templates";

struct Fixture {
  const char* name;
  // What closes an assistant turn: the model's stop token, which the engine does not return as
  // text (plus the newline Qwen's template writes after it).
  const char* end_of_turn;
};

json read_cases(const std::string& name) {
  std::ifstream in(kTemplates / name / "cases.json");
  std::ostringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

json slice(const json& messages, size_t n) {
  json out = json::array();
  for (size_t i = 0; i < n; ++i) out.push_back(messages[i]);
  return out;
}

std::string string_or_empty(const json& message, const char* key) {
  return message.contains(key) && message[key].is_string() ? message[key].get<std::string>() : "";
}

class GeneratedTurns : public ::testing::TestWithParam<Fixture> {};

TEST_P(GeneratedTurns, ParseBackToTheMessage) {
  const Fixture& fixture = GetParam();
  auto t = CheckpointChatTemplate::load(kTemplates / fixture.name);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::optional<ToolCallSyntax> syntax = probe_tool_call_syntax(*t);
  ASSERT_TRUE(syntax.has_value());
  const bool reasoning = template_renders_reasoning(*t);
  const json cases = read_cases(fixture.name);
  int turns = 0;
  for (const json& c : cases["cases"]) {
    const json& messages = c["messages"];
    for (size_t k = 0; k < messages.size(); ++k) {
      const json& m = messages[k];
      if (m["role"] != "assistant" || !m.contains("tool_calls") || m["tool_calls"].empty()) {
        continue;
      }
      SCOPED_TRACE(std::string(fixture.name) + "/" + c["name"].get<std::string>() + " message " +
                   std::to_string(k));
      ChatTemplateInput before;
      before.messages = slice(messages, k);
      before.tools = c["tools"];
      before.kwargs = c["kwargs"];
      before.add_generation_prompt = true;
      ChatTemplateInput with = before;
      with.messages = slice(messages, k + 1);
      with.add_generation_prompt = false;
      auto prompt = t->apply(before);
      auto conversation = t->apply(with);
      ASSERT_TRUE(prompt.ok()) << prompt.status();
      ASSERT_TRUE(conversation.ok()) << conversation.status();
      // The generated text is what the conversation adds to the prompt.
      std::string generated;
      if (conversation->starts_with(*prompt)) {
        generated = conversation->substr(prompt->size());
      } else {
        // DeepSeek-V3.1 with thinking=true only: its generation prompt opens "<think>", but the
        // same turn in history is written with the reasoning dropped, "<｜Assistant｜></think>...".
        // A model generates that "</think>" itself after its reasoning (empty here), so the
        // generated text is the history's after the prompt without its "<think>".
        EXPECT_EQ(std::string(fixture.name), "deepseek_v3_1");
        ASSERT_TRUE(prompt->ends_with(kThinkBegin)) << *prompt;
        const std::string opened = prompt->substr(0, prompt->size() - kThinkBegin.size());
        ASSERT_TRUE(conversation->starts_with(opened)) << *conversation;
        generated = conversation->substr(opened.size());
        ASSERT_TRUE(generated.starts_with(kThinkEnd)) << generated;
      }
      const size_t end = generated.rfind(fixture.end_of_turn);
      ASSERT_NE(end, std::string::npos) << generated;
      EXPECT_EQ(
          generated.find_first_not_of("\n", end + std::string_view(fixture.end_of_turn).size()),
          std::string::npos)
          << generated;
      generated.resize(end);

      ChatOutputOptions options;
      options.reasoning = reasoning;
      options.starts_in_reasoning = prompt_opens_reasoning(*prompt);
      options.tool_calls = syntax;
      const ParsedOutput got = testing::parse_checking_splits(options, generated);

      EXPECT_EQ(got.content, string_or_empty(m, "content")) << generated;
      EXPECT_EQ(got.reasoning, string_or_empty(m, "reasoning_content")) << generated;
      ASSERT_EQ(got.tool_calls.size(), m["tool_calls"].size()) << generated;
      for (size_t i = 0; i < got.tool_calls.size(); ++i) {
        const json& want = m["tool_calls"][i];
        const json& fn = want["function"];
        EXPECT_EQ(got.tool_calls[i].name, fn["name"].get<std::string>());
        const json want_args = fn["arguments"].is_string()
                                   ? json::parse(fn["arguments"].get<std::string>())
                                   : fn["arguments"];
        const json got_args = json::parse(got.tool_calls[i].arguments_json, nullptr, false);
        EXPECT_EQ(got_args, want_args) << got.tool_calls[i].arguments_json;
        // Kimi's ids are the model's own; the other syntaxes carry none (Loom numbers them).
        EXPECT_EQ(got.tool_calls[i].id, *syntax == ToolCallSyntax::kKimi
                                            ? want["id"].get<std::string>()
                                            : "call_" + std::to_string(i));
      }
      ++turns;
    }
  }
  std::printf("%s: %d assistant tool-call turns parsed back (%s syntax%s)\n", fixture.name, turns,
              std::string(tool_call_syntax_name(*syntax)).c_str(), reasoning ? ", reasoning" : "");
  EXPECT_GE(turns, 6);  // every fixture has at least six such turns
}

// kimi_k2 is not here: its template writes no tool calls (chat_template_probe_test checks that
// it gets no syntax), and its cases have no assistant tool-call turn.
INSTANTIATE_TEST_SUITE_P(Templates, GeneratedTurns,
                         ::testing::Values(Fixture{"kimi_k2_thinking", "<|im_end|>"},
                                           Fixture{"kimi_k2_5", "<|im_end|>"},
                                           Fixture{"deepseek_v3", "<｜end▁of▁sentence｜>"},
                                           Fixture{"deepseek_v3_1", "<｜end▁of▁sentence｜>"},
                                           Fixture{"qwen3_next", "<|im_end|>"}),
                         [](const ::testing::TestParamInfo<Fixture>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace loom
