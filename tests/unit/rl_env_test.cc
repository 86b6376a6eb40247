// The RL environments (trainer/rl/environment.h): an episode played from the oracle's
// demonstration, its assistant turns written by the native chat template and read back by the
// server's tool-call parser (engine/chat/tool_call_parser.h), earns reward 1, and each tool result
// equals the demonstration's; wrong or missing answers earn 0; the same seed gives the same
// episode; the calculator and search tools and the answer extraction on their own.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "engine/chat/chat_template.h"
#include "engine/chat/tool_call_parser.h"
#include "trainer/rl/arithmetic_env.h"
#include "trainer/rl/environment.h"
#include "trainer/rl/retrieval_env.h"
#include "trainer/tool_dialogues.h"

namespace loom {
namespace {

// The model's text for messages[k] (an assistant turn) as the native template writes it after
// messages[0, k), parsed back the way loom-server parses a reply.
ChatMessage reply_through_parser(const std::vector<ChatMessage>& messages, size_t k,
                                 const std::vector<ToolDefinition>& tools) {
  const std::vector<ChatMessage> before(messages.begin(), messages.begin() + k);
  const std::vector<ChatMessage> with(messages.begin(), messages.begin() + k + 1);
  auto prompt = render_chat(ChatFormat::kNative, before, tools, {.add_generation_prompt = true});
  auto whole = render_chat(ChatFormat::kNative, with, tools, {.add_generation_prompt = false});
  auto marker = end_of_turn_marker(ChatFormat::kNative);
  EXPECT_TRUE(prompt.ok() && whole.ok() && marker.ok());
  EXPECT_TRUE(whole->starts_with(*prompt));
  std::string text = whole->substr(prompt->size());
  text = text.substr(0, text.find(*marker));
  const ParsedOutput parsed = parse_tool_calls(default_tool_call_syntax(ChatFormat::kNative), text);
  return {.role = "assistant", .content = parsed.content, .tool_calls = parsed.tool_calls};
}

// Plays the demonstration through the parser; returns the reward.
double play_demonstration(Environment& env, uint64_t seed, int* tool_turns) {
  const EnvReset start = env.reset(seed);
  const std::vector<ChatMessage> demo = env.demonstration();
  EXPECT_EQ(env.reward(), 0.0);
  *tool_turns = 0;
  for (size_t k = start.messages.size(); k < demo.size(); ++k) {
    if (demo[k].role != "assistant") continue;
    const ChatMessage reply = reply_through_parser(demo, k, start.tools);
    EXPECT_EQ(reply.tool_calls.size(), demo[k].tool_calls.size());
    const EnvStep step = env.step(reply);
    if (reply.tool_calls.empty()) {
      EXPECT_TRUE(step.done);
      break;
    }
    ++*tool_turns;
    EXPECT_FALSE(step.done);
    EXPECT_EQ(env.reward(), 0.0);  // no reward for calling tools
    EXPECT_EQ(step.messages.size(), reply.tool_calls.size());
    // The environment's result is the demonstration's next message.
    EXPECT_EQ(step.messages[0].role, "tool");
    EXPECT_EQ(step.messages[0].content, demo[k + 1].content);
  }
  return env.reward();
}

TEST(ArithmeticEnv, DemonstrationThroughTheParserEarnsOne) {
  ArithmeticEnvOptions o;
  o.operands = 3;
  o.ops = "+-*";
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    ArithmeticEnv env(o);
    int tool_turns = 0;
    EXPECT_EQ(play_demonstration(env, seed, &tool_turns), 1.0) << seed;
    EXPECT_EQ(tool_turns, 2) << seed;  // one calculator call per operation
  }
}

TEST(ArithmeticEnv, OnlyTheRightFinalAnswerEarns) {
  ArithmeticEnv env({});
  const EnvReset a = env.reset(5);
  const std::vector<ChatMessage> demo = env.demonstration();
  const std::string right = demo.back().content;                       // "The answer is N."
  EXPECT_EQ(env.reset(5).messages[0].content, a.messages[0].content);  // same seed, same question
  EXPECT_NE(env.reset(6).messages[0].content, a.messages[0].content);
  env.reset(5);
  EXPECT_TRUE(env.step({.role = "assistant", .content = "I do not know."}).done);
  EXPECT_EQ(env.reward(), 0.0);
  // After done, nothing changes.
  EXPECT_TRUE(env.step({.role = "assistant", .content = right}).done);
  EXPECT_EQ(env.reward(), 0.0);
  env.reset(5);
  env.step({.role = "assistant", .content = right + " Or 1."});  // the last integer counts
  EXPECT_EQ(env.reward(), 0.0);
  env.reset(5);
  env.step({.role = "assistant", .content = right});
  EXPECT_EQ(env.reward(), 1.0);
}

// The direct-answer warm-start demonstration: the opening messages and the final answer, no tool
// traffic, and played through the parser it earns the same reward as the whole demonstration.
TEST(ArithmeticEnv, DirectAnswerDemonstrationSkipsTheTools) {
  ArithmeticEnvOptions o;
  o.operands = 3;
  o.ops = "+-*";
  ArithmeticEnv env(o);
  RetrievalEnv retrieval({.records = 20});
  for (Environment* e : std::initializer_list<Environment*>{&env, &retrieval}) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      const EnvReset start = e->reset(seed);
      const std::vector<ChatMessage> demo = e->demonstration();
      const std::vector<ChatMessage> direct = direct_answer_demonstration(demo);
      ASSERT_EQ(direct.size(), start.messages.size() + 1) << seed;
      for (size_t k = 0; k < start.messages.size(); ++k) {
        EXPECT_EQ(direct[k].role, start.messages[k].role);
        EXPECT_EQ(direct[k].content, start.messages[k].content);
      }
      EXPECT_EQ(direct.back().role, "assistant");
      EXPECT_TRUE(direct.back().tool_calls.empty());
      EXPECT_EQ(direct.back().content, demo.back().content);
      const ChatMessage reply = reply_through_parser(direct, direct.size() - 1, start.tools);
      EXPECT_TRUE(e->step(reply).done);
      EXPECT_EQ(e->reward(), 1.0) << seed;
    }
  }
  EXPECT_TRUE(direct_answer_demonstration({}).empty());
}

TEST(ArithmeticEnv, Calculator) {
  EXPECT_EQ(ArithmeticEnv::calculate(R"({"a": 12, "op": "+", "b": 34})"), "46");
  EXPECT_EQ(ArithmeticEnv::calculate(R"({"a": 2, "op": "*", "b": -3})"), "-6");
  EXPECT_EQ(ArithmeticEnv::calculate(R"({"a": 2, "op": "-", "b": 30})"), "-28");
  EXPECT_EQ(ArithmeticEnv::calculate(R"({"a": 2, "op": "/", "b": 3})"),
            "error: 'op' must be +, - or *");
  EXPECT_EQ(ArithmeticEnv::calculate(R"({"a": "2", "op": "+", "b": 3})"),
            "error: 'a' must be an integer");
  EXPECT_EQ(ArithmeticEnv::calculate("not json"), "error: the arguments are not a JSON object");
  EXPECT_EQ(ArithmeticEnv::calculate(R"({"a": 9223372036854775807, "op": "+", "b": 1})"),
            "error: the result does not fit in 64 bits");
  ArithmeticEnv env({});
  env.reset(1);
  const EnvStep s = env.step({.role = "assistant", .tool_calls = {{"c1", "weather", "{}"}}});
  ASSERT_EQ(s.messages.size(), 1u);
  EXPECT_EQ(s.messages[0].content, "error: unknown tool 'weather'");
  EXPECT_EQ(s.messages[0].tool_call_id, "c1");
}

TEST(RetrievalEnv, DemonstrationThroughTheParserEarnsOne) {
  RetrievalEnvOptions o;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    RetrievalEnv env(o);
    int tool_turns = 0;
    EXPECT_EQ(play_demonstration(env, seed, &tool_turns), 1.0) << seed;
    EXPECT_EQ(tool_turns, 1) << seed;
    // A long document (a record and its filler per name) that the prompt does not contain.
    EXPECT_EQ(env.document().size(), static_cast<size_t>(o.records * (1 + o.filler)));
    const std::string answer = env.demonstration().back().content;
    const std::string code =
        answer.substr(answer.rfind(' ') + 1, answer.size() - answer.rfind(' ') - 2);
    EXPECT_EQ(env.reset(seed).messages.back().content.find(code), std::string::npos);
  }
}

TEST(RetrievalEnv, SearchAndRewards) {
  RetrievalEnv env({.records = 50, .filler = 1, .max_results = 2});
  env.reset(3);
  EXPECT_EQ(env.search(R"({"query": "zzzzqqq"})"), "no match");
  EXPECT_EQ(env.search(R"({"q": 1})"), "error: the arguments must be {\"query\": string}");
  // The demonstration's search returns the record holding the answer.
  const std::vector<ChatMessage> demo = env.demonstration();
  const std::string found = env.search(demo[demo.size() - 3].tool_calls[0].arguments_json);
  int64_t code = 0;
  ASSERT_TRUE(last_integer(demo.back().content, &code));
  EXPECT_NE(found.find(std::to_string(code)), std::string::npos);
  env.step({.role = "assistant", .content = std::to_string(code + 1)});
  EXPECT_EQ(env.reward(), 0.0);
  env.reset(3);
  env.step({.role = "assistant", .content = std::to_string(code)});
  EXPECT_EQ(env.reward(), 1.0);
}

TEST(Environment, FactoryAndAnswerExtraction) {
  EXPECT_TRUE(make_environment({.name = "arithmetic"}).ok());
  EXPECT_TRUE(make_environment({.name = "retrieval"}).ok());
  EXPECT_FALSE(make_environment({.name = "chess"}).ok());
  EnvironmentConfig bad;
  bad.arithmetic.ops = "/";
  EXPECT_NE(make_environment(bad).status().message().find("env.arithmetic.ops"), std::string::npos);
  int64_t v = 0;
  EXPECT_TRUE(last_integer("The answer is -42.", &v));
  EXPECT_EQ(v, -42);
  EXPECT_TRUE(last_integer("7 then 19", &v));
  EXPECT_EQ(v, 19);
  EXPECT_FALSE(last_integer("none", &v));
  EXPECT_FALSE(last_integer("1234567890123456789", &v));  // 19 digits
}

}  // namespace
}  // namespace loom
