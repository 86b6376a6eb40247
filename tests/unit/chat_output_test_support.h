// Shared by the tests of the chat output parsers: feeds a text to ChatOutputParser cut at given
// offsets, checking the delta protocol as it goes, and checks that every way of cutting it
// accumulates to the one-shot parse_chat_output result.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

#include "engine/chat/chat_output_parser.h"

namespace loom::testing {

inline void expect_same_output(const ParsedOutput& got, const ParsedOutput& want,
                               const std::string& what) {
  EXPECT_EQ(got.reasoning, want.reasoning) << what;
  EXPECT_EQ(got.content, want.content) << what;
  ASSERT_EQ(got.tool_calls.size(), want.tool_calls.size()) << what;
  for (size_t i = 0; i < want.tool_calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].id, want.tool_calls[i].id) << what << " call " << i;
    EXPECT_EQ(got.tool_calls[i].name, want.tool_calls[i].name) << what << " call " << i;
    EXPECT_EQ(got.tool_calls[i].arguments_json, want.tool_calls[i].arguments_json)
        << what << " call " << i;
  }
}

// Feeds `text` cut at `cuts` (sorted offsets) to `parser` (a ChatOutputParser or a
// ToolCallStreamParser) and checks the delta protocol as it goes: a call's first delta names it and
// carries its id; later deltas of a call only add arguments; indices only grow.
template <typename StreamParser>
ParsedOutput feed_checking_deltas(StreamParser& parser, std::string_view text,
                                  const std::vector<size_t>& cuts) {
  ParsedOutput out;
  auto apply = [&](const ChatDelta& d) {
    out.reasoning += d.reasoning;
    out.content += d.content;
    for (const ToolCallDelta& tc : d.tool_calls) {
      if (tc.index >= out.tool_calls.size()) {
        EXPECT_EQ(tc.index, out.tool_calls.size()) << "calls start in order";
        EXPECT_FALSE(tc.name.empty()) << "first delta of a call carries its name";
        EXPECT_FALSE(tc.id.empty()) << "first delta of a call carries its id";
      } else {
        EXPECT_TRUE(tc.name.empty()) << "name is sent once";
        EXPECT_EQ(tc.index + 1, out.tool_calls.size()) << "only the last call grows";
      }
      ChatDelta one;
      one.tool_calls.push_back(tc);
      accumulate_delta(one, &out);
    }
  };
  size_t prev = 0;
  for (size_t cut : cuts) {
    apply(parser.feed(text.substr(prev, cut - prev)));
    prev = cut;
  }
  apply(parser.feed(text.substr(prev)));
  apply(parser.finish());
  return out;
}

// The chat output parser fed `text` cut at `cuts`, checked as above.
inline ParsedOutput stream_chat_output(const ChatOutputOptions& options, std::string_view text,
                                       const std::vector<size_t>& cuts) {
  ChatOutputParser parser(options);
  return feed_checking_deltas(parser, text, cuts);
}

// The one-shot result, after checking that the stream cut at every single offset, and fed one
// byte at a time, accumulates to it.
inline ParsedOutput parse_checking_splits(const ChatOutputOptions& options, std::string_view text) {
  const ParsedOutput one_shot = parse_chat_output(options, text);
  const std::string shown(text.substr(0, 200));
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    expect_same_output(stream_chat_output(options, text, {cut}), one_shot,
                       "split at " + std::to_string(cut) + ": " + shown);
  }
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  expect_same_output(stream_chat_output(options, text, every), one_shot, "byte by byte: " + shown);
  return one_shot;
}

}  // namespace loom::testing
