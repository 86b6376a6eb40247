// Tool-call parsing: one-shot results per syntax, and the streaming parser checked against the
// one-shot one for every split point, byte-by-byte feeding and random multi-splits. Because the
// stream never retracts anything, equality also proves no partial marker leaked into content.
#include "engine/chat/tool_call_parser.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tests/unit/chat_output_test_support.h"

namespace loom {
namespace {

struct Expected {
  std::string content;
  std::vector<ToolCall> calls;
};

void expect_parsed(const ParsedOutput& got, const Expected& want, const std::string& what) {
  EXPECT_EQ(got.content, want.content) << what;
  ASSERT_EQ(got.tool_calls.size(), want.calls.size()) << what;
  for (size_t i = 0; i < want.calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].id, want.calls[i].id) << what << " call " << i;
    EXPECT_EQ(got.tool_calls[i].name, want.calls[i].name) << what << " call " << i;
    EXPECT_EQ(got.tool_calls[i].arguments_json, want.calls[i].arguments_json)
        << what << " call " << i;
  }
}

// The tool-call parser fed `text` cut at `cuts`, checking the delta protocol
// (tests/unit/chat_output_test_support.h).
ParsedOutput stream(ToolCallSyntax f, const std::string& text, const std::vector<size_t>& cuts) {
  ToolCallStreamParser parser(f);
  return testing::feed_checking_deltas(parser, text, cuts);
}

void check_all_splits(ToolCallSyntax f, const std::string& text, const Expected& want) {
  const ParsedOutput one_shot = parse_tool_calls(f, text);
  expect_parsed(one_shot, want, "one-shot: " + text);
  // Every single split point.
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    expect_parsed(stream(f, text, {cut}), want, "split at " + std::to_string(cut) + ": " + text);
  }
  // Byte by byte.
  std::vector<size_t> all;
  for (size_t i = 1; i < text.size(); ++i) all.push_back(i);
  expect_parsed(stream(f, text, all), want, "byte by byte: " + text);
  // Random multi-splits.
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<size_t> cuts;
    for (size_t i = 1; i < text.size(); ++i) {
      if (rng() % 5 == 0) cuts.push_back(i);
    }
    expect_parsed(stream(f, text, cuts), want, "random split: " + text);
  }
}

// --- Kimi (vLLM kimi_k2_tool_parser.py format) ---

TEST(ToolCallParserKimi, TextThenTwoCalls) {
  check_all_splits(
      ToolCallSyntax::kKimi,
      "Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
      "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>"
      "functions.get_time:1<|tool_call_argument_begin|> {\"tz\": \"CET\"} <|tool_call_end|>"
      "<|tool_calls_section_end|>",
      {"Let me check.",
       {{"functions.get_weather:0", "get_weather", "{\"city\": \"Paris\"}"},
        {"functions.get_time:1", "get_time", "{\"tz\": \"CET\"}"}}});
}

TEST(ToolCallParserKimi, PlainTextWithLookalikes) {
  check_all_splits(ToolCallSyntax::kKimi, "a <|tool_x|> b <|tool_calls_section_beg c <|im_end",
                   {"a <|tool_x|> b <|tool_calls_section_beg c <|im_end", {}});
}

TEST(ToolCallParserKimi, TextAfterCallsAndUnicode) {
  check_all_splits(
      ToolCallSyntax::kKimi,
      "天气<|tool_calls_section_begin|><|tool_call_begin|>functions.查询:0"
      "<|tool_call_argument_begin|>{\"城市\": \"北京\"}<|tool_call_end|>"
      "<|tool_calls_section_end|>\n\n好的 🙂",
      {"天气\n\n好的 🙂", {{"functions.查询:0", "查询", "{\"城市\": \"北京\"}"}}});
}

TEST(ToolCallParserKimi, MalformedIdDegradesToContent) {
  check_all_splits(
      ToolCallSyntax::kKimi,
      "x<|tool_calls_section_begin|><|tool_call_begin|>bad id<|tool_call_argument_begin|>"
      "{}<|tool_call_end|><|tool_calls_section_end|>",
      {"x<|tool_call_begin|>bad id<|tool_call_argument_begin|>{}<|tool_call_end|>", {}});
}

TEST(ToolCallParserKimi, UnterminatedHeaderDegradesToContent) {
  check_all_splits(ToolCallSyntax::kKimi,
                   "Hi<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_arg",
                   {"Hi<|tool_call_begin|>functions.f:0<|tool_call_arg", {}});
}

TEST(ToolCallParserKimi, TruncatedArgumentsKeepTheCall) {
  check_all_splits(ToolCallSyntax::kKimi,
                   "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
                   "<|tool_call_argument_begin|>{\"a\": 1",
                   {"", {{"functions.f:0", "f", "{\"a\": 1"}}});
}

TEST(ToolCallParserKimi, WhitespaceInsideSectionDropped) {
  check_all_splits(ToolCallSyntax::kKimi,
                   "A\n<|tool_calls_section_begin|>\n<|tool_call_begin|>functions.f:0"
                   "<|tool_call_argument_begin|>{}<|tool_call_end|>\n<|tool_calls_section_end|>\n",
                   {"A", {{"functions.f:0", "f", "{}"}}});
}

// --- DeepSeek-V3 (vLLM deepseekv3_tool_parser.py format) ---

TEST(ToolCallParserDeepSeek, TextThenTwoCalls) {
  check_all_splits(
      ToolCallSyntax::kDeepSeekV3,
      "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
      "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
      "get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      {"Sure.",
       {{"call_0", "get_weather", "{\"city\": \"Paris\"}"}, {"call_1", "get_time", "{}"}}});
}

TEST(ToolCallParserDeepSeek, BackticksInsideArguments) {
  check_all_splits(ToolCallSyntax::kDeepSeekV3,
                   "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>run\n```json\n"
                   "{\"code\": \"```\\nx\\n```\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                   {"", {{"call_0", "run", "{\"code\": \"```\\nx\\n```\"}"}}});
}

// Found by tool_call_fuzz: a call closed by a bare <｜tool▁call▁end｜> (no "\n```") must not leak
// a split end marker into the arguments.
TEST(ToolCallParserDeepSeek, BareCallEnd) {
  check_all_splits(ToolCallSyntax::kDeepSeekV3,
                   "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n"
                   "{\"a\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                   {"", {{"call_0", "f", "{\"a\": 1}"}}});
}

TEST(ToolCallParserDeepSeek, MissingSeparatorDegrades) {
  check_all_splits(ToolCallSyntax::kDeepSeekV3,
                   "a<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather\n```json\n{}\n```"
                   "<｜tool▁call▁end｜><｜tool▁calls▁end｜>b",
                   {"a<｜tool▁call▁begin｜>get_weather\n```json\n{}\n```<｜tool▁call▁end｜>b", {}});
}

TEST(ToolCallParserDeepSeek, UnicodeAndUnterminatedSecondCall) {
  check_all_splits(
      ToolCallSyntax::kDeepSeekV3,
      "好<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>搜索\n```json\n"
      "{\"q\": \"東京\"}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f",
      {"好<｜tool▁call▁begin｜>function<｜tool▁sep｜>f",
       {{"call_0", "搜索", "{\"q\": \"東京\"}"}}});
}

// --- DeepSeek-V3.1 (its chat_template.jinja; vLLM deepseekv31_tool_parser.py) ---

TEST(ToolCallParserDeepSeekV31, TextThenTwoCalls) {
  check_all_splits(
      ToolCallSyntax::kDeepSeekV31,
      "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
      "{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>"
      "{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      {"Sure.",
       {{"call_0", "get_weather", "{\"city\": \"Paris\"}"}, {"call_1", "get_time", "{}"}}});
}

TEST(ToolCallParserDeepSeekV31, TextAfterCallsAndUnicode) {
  check_all_splits(ToolCallSyntax::kDeepSeekV31,
                   "天气<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>查询<｜tool▁sep｜>"
                   "{\"城市\": \"北京\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>\n好的",
                   {"天气\n好的", {{"call_0", "查询", "{\"城市\": \"北京\"}"}}});
}

// The arguments are verbatim up to the end marker: no code fence to drop, no trimming.
TEST(ToolCallParserDeepSeekV31, ArgumentsVerbatimAndTruncated) {
  check_all_splits(
      ToolCallSyntax::kDeepSeekV31,
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>run<｜tool▁sep｜> {\"code\": \"```\"}\n"
      "<｜tool▁call▁end｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": [1,",
      {"", {{"call_0", "run", " {\"code\": \"```\"}\n"}, {"call_1", "f", "{\"a\": [1,"}}});
}

TEST(ToolCallParserDeepSeekV31, NameWithNewlineDegrades) {
  check_all_splits(ToolCallSyntax::kDeepSeekV31,
                   "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>bad\nname<｜tool▁sep｜>{}"
                   "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                   {"<｜tool▁call▁begin｜>bad\nname<｜tool▁sep｜>{}<｜tool▁call▁end｜>", {}});
}

// The two DeepSeek syntaxes share their markers, not their call layout: a V3.1 call has no
// "\n```json\n" header end for V3's parser, so it degrades to content there.
TEST(ToolCallParserDeepSeekV31, V31CallsAreNotV3Calls) {
  check_all_splits(ToolCallSyntax::kDeepSeekV3,
                   "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
                   "<｜tool▁calls▁end｜>",
                   {"<｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>", {}});
}

// --- Qwen3 / Hermes (vLLM hermes_tool_parser.py format) ---

TEST(ToolCallParserQwen, TextThenTwoCalls) {
  check_all_splits(
      ToolCallSyntax::kQwen,
      "I'll check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
      "\"arguments\": {}}\n</tool_call>",
      {"I'll check.",
       {{"call_0", "get_weather", "{\"city\": \"Paris\"}"}, {"call_1", "get_time", "{}"}}});
}

// The "\n" Qwen's template writes between content and the first call is dropped; a reply without
// calls keeps its trailing whitespace, and a call that degrades keeps the blank before it.
TEST(ToolCallParserQwen, WhitespaceBeforeTheFirstCall) {
  check_all_splits(ToolCallSyntax::kQwen,
                   "Hi \n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
                   {"Hi", {{"call_0", "f", "{}"}}});
  check_all_splits(ToolCallSyntax::kQwen, "Hi \n", {"Hi \n", {}});
  check_all_splits(ToolCallSyntax::kQwen, "Hi \n<tool_call>nope</tool_call>",
                   {"Hi \n<tool_call>nope</tool_call>", {}});
}

TEST(ToolCallParserQwen, TrickyArgumentStringsAndTrailingText) {
  check_all_splits(
      ToolCallSyntax::kQwen,
      "<tool_call>{\"name\":\"q\",\"arguments\":{\"s\":\"a}b\\\"c{\",\"n\":[1,{\"x\":2}]}}"
      "</tool_call> done ✓",
      {" done ✓", {{"call_0", "q", "{\"s\":\"a}b\\\"c{\",\"n\":[1,{\"x\":2}]}"}}});
}

TEST(ToolCallParserQwen, KeysOutOfOrderUseJsonFallback) {
  check_all_splits(ToolCallSyntax::kQwen,
                   "<tool_call>\n{\"arguments\": {\"a\": 1}, \"name\": \"f\"}\n</tool_call>",
                   {"", {{"call_0", "f", "{\"a\": 1}"}}});
}

TEST(ToolCallParserQwen, MalformedDegradesToContent) {
  check_all_splits(ToolCallSyntax::kQwen, "<tool_call>not json</tool_call> ok </tool_call>",
                   {"<tool_call>not json</tool_call> ok </tool_call>", {}});
}

TEST(ToolCallParserQwen, UnterminatedHeaderDegradesToContent) {
  check_all_splits(ToolCallSyntax::kQwen, "x <tool_call>\n{\"name\": \"f",
                   {"x <tool_call>\n{\"name\": \"f", {}});
}

TEST(ToolCallParserQwen, ScalarAndStringArguments) {
  check_all_splits(
      ToolCallSyntax::kQwen,
      "<tool_call>{\"name\": \"a\", \"arguments\": 42}</tool_call><tool_call>{\"name\": "
      "\"b\", \"arguments\": \"x\\\"y\"}</tool_call>",
      {"", {{"call_0", "a", "42"}, {"call_1", "b", "\"x\\\"y\""}}});
}

TEST(ToolCallParserQwen, TruncatedArgumentsKeepTheCall) {
  check_all_splits(ToolCallSyntax::kQwen,
                   "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1,",
                   {"", {{"call_0", "f", "{\"a\": [1,"}}});
}

// --- Native ---

TEST(ToolCallParserNative, CallsAndText) {
  check_all_splits(ToolCallSyntax::kNative,
                   "Hi<|tool_call|>get_weather<|tool_args|>{\"city\":\"Paris\"}<|tool_call_end|>"
                   "<|tool_call|>bad name<|tool_args|>{}<|tool_call_end|>",
                   {"Hi<|tool_call|>bad name<|tool_args|>{}<|tool_call_end|>",
                    {{"call_0", "get_weather", "{\"city\":\"Paris\"}"}}});
}

// Streaming emits the name before the arguments end, and argument fragments as they arrive.
TEST(ToolCallParser, SyntaxNamesAndFamilyDefaults) {
  EXPECT_EQ(tool_call_syntax_name(ToolCallSyntax::kDeepSeekV31), "deepseek_v3.1");
  EXPECT_EQ(default_tool_call_syntax(ChatFormat::kKimi), ToolCallSyntax::kKimi);
  EXPECT_EQ(default_tool_call_syntax(ChatFormat::kDeepSeek), ToolCallSyntax::kDeepSeekV3);
  EXPECT_EQ(default_tool_call_syntax(ChatFormat::kQwen), ToolCallSyntax::kQwen);
  EXPECT_EQ(default_tool_call_syntax(ChatFormat::kNative), ToolCallSyntax::kNative);
}

TEST(ToolCallParser, StreamsEarly) {
  ToolCallStreamParser p(ToolCallSyntax::kQwen);
  ChatDelta d = p.feed("Hi <tool_");
  EXPECT_EQ(d.content, "Hi");  // "<tool_" held back, and the blank until a call drops it
  d = p.feed("call>\n{\"name\": \"f\", \"arguments\": {\"a\":");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "f");
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"a\":");
  d = p.feed(" 1");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, " 1");
  EXPECT_TRUE(d.tool_calls[0].name.empty());
}

}  // namespace
}  // namespace loom
