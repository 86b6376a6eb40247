// Reasoning split off the start of a generation (engine/chat/reasoning_parser.h), alone and
// chained with the tool-call parser (ChatOutputParser): expected splits derived by hand from the
// rules in docs/chat.md, each checked one-shot and streamed at every split point and byte by byte
// (the stream never retracts, so equality also proves no partial marker leaked out early).
#include "engine/chat/reasoning_parser.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/chat/chat_output_parser.h"
#include "tests/unit/chat_output_test_support.h"

namespace loom {
namespace {

ReasoningSplit stream_split(std::string_view text, bool starts_inside,
                            const std::vector<size_t>& cuts) {
  ReasoningStreamParser parser(starts_inside);
  ReasoningSplit out;
  auto add = [&](const ReasoningSplit& d) {
    // Reasoning comes first: once answer text is out, no more reasoning may follow.
    if (!out.answer.empty()) EXPECT_TRUE(d.reasoning.empty()) << text;
    out.reasoning += d.reasoning;
    out.answer += d.answer;
  };
  size_t prev = 0;
  for (size_t cut : cuts) {
    add(parser.feed(text.substr(prev, cut - prev)));
    prev = cut;
  }
  add(parser.feed(text.substr(prev)));
  add(parser.finish());
  return out;
}

void check_split(std::string_view text, bool starts_inside, std::string_view reasoning,
                 std::string_view answer) {
  const std::string what =
      std::string(starts_inside ? "inside: " : "outside: ") + std::string(text);
  const ReasoningSplit one_shot = split_reasoning(text, starts_inside);
  EXPECT_EQ(one_shot.reasoning, reasoning) << what;
  EXPECT_EQ(one_shot.answer, answer) << what;
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const ReasoningSplit s = stream_split(text, starts_inside, {cut});
    EXPECT_EQ(s.reasoning, reasoning) << what << " split at " << cut;
    EXPECT_EQ(s.answer, answer) << what << " split at " << cut;
  }
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  const ReasoningSplit bytes = stream_split(text, starts_inside, every);
  EXPECT_EQ(bytes.reasoning, reasoning) << what << " byte by byte";
  EXPECT_EQ(bytes.answer, answer) << what << " byte by byte";
}

TEST(ReasoningParser, StartsOutsideNeedsLeadingThink) {
  check_split("<think>plan</think>answer", false, "plan", "answer");
  check_split("<think></think>answer", false, "", "answer");
  check_split("answer <think>x</think>", false, "", "answer <think>x</think>");
  check_split(" <think>a</think>b", false, "", " <think>a</think>b");  // not at the start
  check_split("<thinking>a</think>", false, "", "<thinking>a</think>");
  check_split("<thin", false, "", "<thin");  // ends before it could be decided
  check_split("", false, "", "");
}

TEST(ReasoningParser, StartsInsideUntilFirstEnd) {
  check_split("plan</think>answer", true, "plan", "answer");
  check_split("</think>", true, "", "");
  check_split("a</think>b</think>c", true, "a", "b</think>c");  // one block, at the start
  check_split("<think>x</think>y", true, "<think>x", "y");
  check_split("思考 🤔</think>\n\n答案", true, "思考 🤔", "\n\n答案");
  check_split("", true, "", "");
}

// Cut off (max_tokens) before </think>: everything so far is reasoning, a partial marker too.
TEST(ReasoningParser, NoEndBeforeTheEnd) {
  check_split("still thinking </thi", true, "still thinking </thi", "");
  check_split("<think>still thinking", false, "still thinking", "");
  check_split("<think>", false, "", "");
}

TEST(ReasoningParser, StreamsEarlyAndHoldsPartialMarkers) {
  ReasoningStreamParser p(/*starts_inside=*/false);
  ReasoningSplit d = p.feed("<thi");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.answer, "");
  d = p.feed("nk>ab</th");
  EXPECT_EQ(d.reasoning, "ab");  // "</th" held back
  d = p.feed("ink>c");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.answer, "c");
  d = p.finish();
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.answer, "");
}

TEST(ReasoningParser, PromptOpensReasoning) {
  EXPECT_TRUE(prompt_opens_reasoning("<｜User｜>hi<｜Assistant｜><think>"));
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<think> \n\t"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_middle|><think></think>"));
  EXPECT_FALSE(prompt_opens_reasoning("<｜Assistant｜></think>"));
  EXPECT_FALSE(prompt_opens_reasoning("think>"));
  EXPECT_FALSE(prompt_opens_reasoning(" \n"));
  EXPECT_FALSE(prompt_opens_reasoning(""));
}

// Content and tool calls are parsed only after the reasoning: markers inside it are reasoning.
TEST(ChatOutputParser, ToolCallsOnlyAfterReasoning) {
  ChatOutputOptions options;
  options.reasoning = true;
  options.tool_calls = ToolCallSyntax::kKimi;
  const std::string text =
      "<think>call f? <|tool_calls_section_begin|>no</think>Sure.<|tool_calls_section_begin|>"
      "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": 1}<|tool_call_end|>"
      "<|tool_calls_section_end|>";
  const ParsedOutput got = testing::parse_checking_splits(options, text);
  EXPECT_EQ(got.reasoning, "call f? <|tool_calls_section_begin|>no");
  EXPECT_EQ(got.content, "Sure.");
  ASSERT_EQ(got.tool_calls.size(), 1u);
  EXPECT_EQ(got.tool_calls[0].id, "functions.f:0");
  EXPECT_EQ(got.tool_calls[0].name, "f");
  EXPECT_EQ(got.tool_calls[0].arguments_json, "{\"a\": 1}");
}

TEST(ChatOutputParser, StartsInsideWithDeepSeekV31Calls) {
  ChatOutputOptions options;
  options.reasoning = true;
  options.starts_in_reasoning = true;
  options.tool_calls = ToolCallSyntax::kDeepSeekV31;
  const ParsedOutput got = testing::parse_checking_splits(
      options,
      "need the time</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  EXPECT_EQ(got.reasoning, "need the time");
  EXPECT_EQ(got.content, "");
  ASSERT_EQ(got.tool_calls.size(), 1u);
  EXPECT_EQ(got.tool_calls[0].id, "call_0");
  EXPECT_EQ(got.tool_calls[0].name, "get_time");
  EXPECT_EQ(got.tool_calls[0].arguments_json, "{}");
}

// Cut off inside the reasoning: no content, no calls, even if the reasoning spells one.
TEST(ChatOutputParser, CutOffInsideReasoning) {
  ChatOutputOptions options;
  options.reasoning = true;
  options.starts_in_reasoning = true;
  options.tool_calls = ToolCallSyntax::kQwen;
  const ParsedOutput got = testing::parse_checking_splits(
      options, "maybe <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call> or not");
  EXPECT_EQ(got.reasoning,
            "maybe <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call> or not");
  EXPECT_EQ(got.content, "");
  EXPECT_TRUE(got.tool_calls.empty());
}

// Reasoning off (--reasoning_parser=none, or a template without </think>): the block is content.
TEST(ChatOutputParser, ReasoningOffKeepsTheBlockInContent) {
  ChatOutputOptions options;
  options.tool_calls = ToolCallSyntax::kQwen;
  const ParsedOutput got = testing::parse_checking_splits(
      options, "<think>x</think>Hi<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
  EXPECT_EQ(got.reasoning, "");
  EXPECT_EQ(got.content, "<think>x</think>Hi");
  ASSERT_EQ(got.tool_calls.size(), 1u);
  EXPECT_EQ(got.tool_calls[0].name, "f");
}

// Reasoning without tools: the rest is content verbatim, tool-call markers included.
TEST(ChatOutputParser, ReasoningWithoutToolCalls) {
  ChatOutputOptions options;
  options.reasoning = true;
  const ParsedOutput got =
      testing::parse_checking_splits(options, "<think>a</think><tool_call>{}</tool_call>");
  EXPECT_EQ(got.reasoning, "a");
  EXPECT_EQ(got.content, "<tool_call>{}</tool_call>");
  EXPECT_TRUE(got.tool_calls.empty());
}

}  // namespace
}  // namespace loom
