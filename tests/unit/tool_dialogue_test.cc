// The synthetic tool-use dialogues (trainer/tool_dialogues.h): deterministic per seed, rendered by
// the engine's chat templates and read back by its tool-call parser, and scored only on the
// assistant turns, whose prompts encode to exactly the training example's prefixes.
#include <random>
#include <string>
#include <vector>

#include "engine/chat/tool_call_parser.h"
#include "engine_test_support.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "trainer/tool_dialogues.h"

namespace loom {
namespace {

constexpr ChatFormat kFormats[] = {ChatFormat::kNative, ChatFormat::kQwen, ChatFormat::kKimi,
                                   ChatFormat::kDeepSeek};

ToolDialogue dialogue_for(uint64_t seed, int max_turns = 3) {
  std::mt19937_64 rng(seed);
  return make_tool_dialogue({.max_turns = max_turns}, rng);
}

TEST(ToolDialogue, DeterministicPerSeed) {
  const auto tok = Tokenizer::byte_level();
  bool some_differ = false;
  for (uint64_t seed = 0; seed < 10; ++seed) {
    auto a = make_tool_dialogue_example(*tok, ChatFormat::kNative, dialogue_for(seed));
    auto b = make_tool_dialogue_example(*tok, ChatFormat::kNative, dialogue_for(seed));
    auto c = make_tool_dialogue_example(*tok, ChatFormat::kNative, dialogue_for(seed + 100));
    ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << a.status();
    EXPECT_EQ(a->tokens, b->tokens);
    EXPECT_EQ(a->loss_mask, b->loss_mask);
    some_differ |= a->tokens != c->tokens;
  }
  EXPECT_TRUE(some_differ);
}

TEST(ToolDialogue, MessagesFollowTheToolProtocol) {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const ToolDialogue d = dialogue_for(seed);
    ASSERT_EQ(d.tools.size(), 2u);
    ASSERT_FALSE(d.messages.empty());
    ASSERT_EQ(d.messages.size() % 4, 0u);
    EXPECT_LE(d.messages.size(), 12u);
    for (size_t i = 0; i < d.messages.size(); i += 4) {
      const ChatMessage &user = d.messages[i], &call = d.messages[i + 1];
      const ChatMessage &result = d.messages[i + 2], &answer = d.messages[i + 3];
      EXPECT_EQ(user.role, "user");
      ASSERT_EQ(call.role, "assistant");
      ASSERT_EQ(call.tool_calls.size(), 1u);
      EXPECT_EQ(result.role, "tool");
      EXPECT_EQ(result.tool_call_id, call.tool_calls[0].id);
      EXPECT_EQ(answer.role, "assistant");
      EXPECT_TRUE(answer.tool_calls.empty());
      // The answer carries the tool's result, and the call's arguments are JSON.
      EXPECT_NE(answer.content.find(result.content), std::string::npos) << answer.content;
      const auto args = nlohmann::json::parse(call.tool_calls[0].arguments_json);
      if (call.tool_calls[0].name == "add") {
        EXPECT_EQ(std::to_string(args["a"].get<int>() + args["b"].get<int>()), result.content);
      } else {
        EXPECT_EQ(call.tool_calls[0].name, "lookup");
        EXPECT_NE(user.content.find(args["name"].get<std::string>()), std::string::npos);
      }
    }
  }
}

// mask[i] = 1 exactly where tokens[i + 1] belongs to an assistant reply: the scored runs decode to
// the replies, in order, and nothing else is scored.
TEST(ToolDialogue, LossMaskCoversExactlyTheAssistantReplies) {
  const auto tok = Tokenizer::byte_level();
  for (ChatFormat format : {ChatFormat::kNative, ChatFormat::kQwen}) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
      const ToolDialogue d = dialogue_for(seed);
      auto turns = tool_dialogue_turns(format, d);
      auto ex = make_tool_dialogue_example(*tok, format, d);
      ASSERT_TRUE(turns.ok() && ex.ok()) << turns.status() << ex.status();
      ASSERT_EQ(ex->tokens.size(), ex->loss_mask.size());
      EXPECT_EQ(ex->loss_mask.back(), 0);
      std::vector<std::string> runs;
      for (size_t i = 0; i + 1 < ex->tokens.size(); ++i) {
        if (!ex->loss_mask[i]) continue;
        if (i == 0 || !ex->loss_mask[i - 1]) runs.emplace_back();
        runs.back() += *tok->decode({&ex->tokens[i + 1], 1});
      }
      ASSERT_EQ(runs.size(), turns->size());
      for (size_t k = 0; k < runs.size(); ++k) EXPECT_EQ(runs[k], (*turns)[k].reply) << k;
      // The whole example is the rendered conversation.
      auto whole = render_chat(format, tool_dialogue_messages(format, d), d.tools,
                               {.add_generation_prompt = false});
      ASSERT_TRUE(whole.ok());
      EXPECT_EQ(*tok->decode(ex->tokens), *whole);
    }
  }
}

// Each assistant turn's prompt, encoded as loom-server encodes prompts, is exactly the example's
// tokens before that turn's reply: what the model sees at evaluation is what it trained on.
TEST(ToolDialogue, TurnPromptsAreTheExamplesPrefixes) {
  auto qwen = Tokenizer::from_file(testing::kFixtures + "/tokenizer_qwen/tokenizer.json");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  const auto bytes = Tokenizer::byte_level();
  for (const Tokenizer* tok : {bytes.get(), qwen->get()}) {
    for (ChatFormat format : kFormats) {
      for (uint64_t seed = 0; seed < 10; ++seed) {
        const ToolDialogue d = dialogue_for(seed);
        auto turns = tool_dialogue_turns(format, d);
        ASSERT_TRUE(turns.ok()) << chat_format_name(format) << ": " << turns.status();
        auto ex = make_tool_dialogue_example(*tok, format, d);
        ASSERT_TRUE(ex.ok()) << ex.status();
        for (const ToolDialogueTurn& t : *turns) {
          const std::vector<int32_t> prompt = encode_chat_prompt(*tok, t.prompt);
          ASSERT_LT(prompt.size(), ex->tokens.size());
          EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), ex->tokens.begin()))
              << chat_format_name(format) << " seed " << seed << " message " << t.message;
          EXPECT_EQ(ex->loss_mask[prompt.size() - 1], 1);  // the first reply token is scored
          if (prompt.size() >= 2) {
            EXPECT_EQ(ex->loss_mask[prompt.size() - 2], 0);
          }
        }
      }
    }
  }
}

// Each reply, cut at the format's end-of-turn marker, reads back through the engine's tool-call
// parser (the format's default syntax) as the message it renders, and scores as right.
TEST(ToolDialogue, RepliesRoundTripThroughTheToolCallParser) {
  for (ChatFormat format : kFormats) {
    auto marker = end_of_turn_marker(format);
    ASSERT_TRUE(marker.ok()) << marker.status();
    const ToolCallSyntax syntax = default_tool_call_syntax(format);
    for (uint64_t seed = 0; seed < 20; ++seed) {
      const ToolDialogue d = dialogue_for(seed);
      auto turns = tool_dialogue_turns(format, d);
      ASSERT_TRUE(turns.ok()) << chat_format_name(format) << ": " << turns.status();
      for (const ToolDialogueTurn& t : *turns) {
        const ChatMessage& m = d.messages[t.message];
        const std::string_view reply = cut_at_marker(t.reply, *marker);
        ASSERT_NE(reply.size(), t.reply.size()) << "no " << *marker << " in " << t.reply;
        const ParsedOutput out = parse_tool_calls(syntax, reply);
        if (m.tool_calls.empty()) {
          EXPECT_TRUE(out.tool_calls.empty());
          EXPECT_EQ(out.content, m.content);
          EXPECT_TRUE(answer_turn_correct(syntax, reply, m.content));
        } else {
          ASSERT_EQ(out.tool_calls.size(), 1u) << reply;
          EXPECT_EQ(out.tool_calls[0].name, m.tool_calls[0].name);
          EXPECT_EQ(nlohmann::json::parse(out.tool_calls[0].arguments_json),
                    nlohmann::json::parse(m.tool_calls[0].arguments_json));
          EXPECT_TRUE(tool_call_turn_correct(syntax, reply, m.tool_calls[0]));
        }
      }
    }
  }
}

TEST(ToolDialogue, EndOfTurnMarkers) {
  EXPECT_EQ(*end_of_turn_marker(ChatFormat::kNative), "<|end|>");
  EXPECT_EQ(*end_of_turn_marker(ChatFormat::kQwen), "<|im_end|>");
  EXPECT_EQ(*end_of_turn_marker(ChatFormat::kKimi), "<|im_end|>");
}

TEST(ToolDialogue, ScoringRejectsWrongAndMalformedCalls) {
  const ToolCall add{"call_0", "add", R"({"a": 3, "b": 4})"};
  const ToolCallSyntax s = ToolCallSyntax::kNative;
  EXPECT_TRUE(tool_call_turn_correct(
      s, R"(<|tool_call|>add<|tool_args|>{"a": 3, "b": 4}<|tool_call_end|>)", add));
  // Key order and spacing do not matter: the arguments compare as JSON values.
  EXPECT_TRUE(tool_call_turn_correct(
      s, R"(<|tool_call|>add<|tool_args|>{"b":4,"a":3}<|tool_call_end|>)", add));
  EXPECT_FALSE(tool_call_turn_correct(
      s, R"(<|tool_call|>add<|tool_args|>{"a": 3, "b": 5}<|tool_call_end|>)", add));
  EXPECT_FALSE(tool_call_turn_correct(
      s, R"(<|tool_call|>lookup<|tool_args|>{"a": 3, "b": 4}<|tool_call_end|>)", add));
  EXPECT_FALSE(tool_call_turn_correct(
      s, R"(<|tool_call|>add<|tool_args|>{"a": 3, "b": <|tool_call_end|>)", add));
  EXPECT_FALSE(tool_call_turn_correct(
      s, R"(<|tool_call|>add <|tool_args|>{"a": 3, "b": 4}<|tool_call_end|>)", add));
  EXPECT_FALSE(tool_call_turn_correct(s, R"(add({"a": 3, "b": 4}))", add));
  EXPECT_FALSE(tool_call_turn_correct(
      s,
      R"(<|tool_call|>add<|tool_args|>{"a": 3, "b": 4}<|tool_call_end|><|tool_call|>add<|tool_args|>{"a": 3, "b": 4}<|tool_call_end|>)",
      add));
  EXPECT_FALSE(tool_call_turn_correct(s, "", add));
  EXPECT_TRUE(answer_turn_correct(s, "3 plus 4 is 7.", "3 plus 4 is 7."));
  EXPECT_FALSE(answer_turn_correct(s, "3 plus 4 is 8.", "3 plus 4 is 7."));
  EXPECT_FALSE(answer_turn_correct(s, R"(<|tool_call|>add<|tool_args|>{}<|tool_call_end|>)", ""));
  EXPECT_EQ(cut_at_marker("abc<|end|>\n", "<|end|>"), "abc");
  EXPECT_EQ(cut_at_marker("abc", "<|end|>"), "abc");
}

TEST(ToolDialogue, OptionsValidate) {
  EXPECT_TRUE(ToolDialogueOptions{}.validate().ok());
  EXPECT_NE(ToolDialogueOptions{.max_turns = 0}.validate().message().find("max_turns"),
            std::string::npos);
  EXPECT_NE(ToolDialogueOptions{.registry_size = 0}.validate().message().find("registry_size"),
            std::string::npos);
}

}  // namespace
}  // namespace loom
