// The tool-call syntax and reasoning probed from real checkpoint templates
// (../shared/fixtures/chat_templates) and from small hand-written ones: each template must get
// the syntax its assistant turns are written in (the expectations are read off the templates'
// sources), and templates that write no parseable call must get none (the caller then falls
// back to the family's syntax).
#include "engine/chat/chat_template_probe.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <string>

#include "tests/unit/engine_test_support.h"

namespace loom {
namespace {

const std::filesystem::path kTemplates =
    std::filesystem::path(testing::kFixtures) / "chat_templates";

struct Expectation {
  const char* name;
  std::optional<ToolCallSyntax> syntax;
  bool reasoning;
};

class ChatTemplateProbe : public ::testing::TestWithParam<Expectation> {};

TEST_P(ChatTemplateProbe, FixtureTemplate) {
  const Expectation& want = GetParam();
  auto t = CheckpointChatTemplate::load(kTemplates / want.name);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::optional<ToolCallSyntax> got = probe_tool_call_syntax(*t);
  ASSERT_EQ(got.has_value(), want.syntax.has_value())
      << (got ? tool_call_syntax_name(*got) : "none");
  if (want.syntax) {
    EXPECT_EQ(tool_call_syntax_name(*got), tool_call_syntax_name(*want.syntax));
  }
  EXPECT_EQ(template_renders_reasoning(*t), want.reasoning);
}

INSTANTIATE_TEST_SUITE_P(
    Templates, ChatTemplateProbe,
    ::testing::Values(
        // Kimi-K2-Instruct prints assistant content only, never its tool calls: no syntax (the
        // server falls back to the kimi family's).
        Expectation{"kimi_k2", std::nullopt, false},
        // <think>{reasoning}</think>{content}<|tool_calls_section_begin|>...
        Expectation{"kimi_k2_thinking", ToolCallSyntax::kKimi, true},
        Expectation{"kimi_k2_5", ToolCallSyntax::kKimi, true},
        // function<｜tool▁sep｜>NAME\n```json\nARGS\n```
        Expectation{"deepseek_v3", ToolCallSyntax::kDeepSeekV3, false},
        // NAME<｜tool▁sep｜>ARGS; its generation prompt ends in </think> (thinking off)
        Expectation{"deepseek_v3_1", ToolCallSyntax::kDeepSeekV31, true},
        // Qwen3-Next-Instruct: <tool_call> JSON, and no thinking
        Expectation{"qwen3_next", ToolCallSyntax::kQwen, false}),
    [](const ::testing::TestParamInfo<Expectation>& info) { return std::string(info.param.name); });

std::optional<ToolCallSyntax> probe_source(const std::string& source) {
  auto t = CheckpointChatTemplate::create(source, nullptr, "test template");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? probe_tool_call_syntax(*t) : std::nullopt;
}

// A minimal template writing calls in Loom's native syntax: found from the template alone.
TEST(ChatTemplateProbeSynthetic, NativeSyntax) {
  const std::string source =
      "{%- for m in messages %}{% if m.role == 'user' %}U:{{ m.content }}\n"
      "{% else %}A:{{ m.content }}{% for c in m.tool_calls %}<|tool_call|>{{ c.function.name }}"
      "<|tool_args|>{{ c.function.arguments }}<|tool_call_end|>{% endfor %}\n{% endif %}"
      "{% endfor -%}{% if add_generation_prompt %}A:{% endif %}";
  const auto got = probe_source(source);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, ToolCallSyntax::kNative);
}

// Calls printed as plain JSON objects, which no syntax's markers enclose: none.
TEST(ChatTemplateProbeSynthetic, UnknownLayoutGivesNone) {
  EXPECT_FALSE(probe_source("{% for m in messages %}{{ m.content }}{% for c in m.tool_calls %}"
                            "{{ c.function | tojson }}{% endfor %}{% endfor %}")
                   .has_value());
}

// Only one call written (a template that keeps the first): not exactly the probe's calls.
TEST(ChatTemplateProbeSynthetic, DroppedCallGivesNone) {
  EXPECT_FALSE(probe_source("{% for m in messages %}{{ m.content }}{% if m.tool_calls %}"
                            "<tool_call>\n{\"name\": \"{{ m.tool_calls[0].function.name }}\", "
                            "\"arguments\": {{ m.tool_calls[0].function.arguments }}}\n"
                            "</tool_call>{% endif %}{% endfor %}")
                   .has_value());
}

// A template that refuses the probe conversation: none, and no reasoning.
TEST(ChatTemplateProbeSynthetic, FailingTemplateGivesNone) {
  auto t = CheckpointChatTemplate::create(
      "{% if messages | length > 1 %}{{ raise_exception('one message only') }}{% endif %}"
      "</think>",
      nullptr, "test template");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(probe_tool_call_syntax(*t).has_value());
  EXPECT_FALSE(template_renders_reasoning(*t));
}

}  // namespace
}  // namespace loom
