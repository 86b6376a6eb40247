#include "clients/cpp/openai_stream.h"

#include "gtest/gtest.h"

namespace loom::client {
namespace {

using json = nlohmann::json;

TEST(OpenAiStream, RequestBodiesCarryOnlyWhatWasSet) {
  GenerationParams p;
  json bare = completion_request(p, "hi", /*stream=*/false);
  EXPECT_EQ(bare, json({{"prompt", "hi"}}));

  p.model = std::string(1, 'm');  // not = "m": GCC 12 -O3 warns falsely (-Wrestrict, PR 105329)
  p.max_tokens = 5;
  p.temperature = 0.0;
  p.top_p = 0.5;
  p.top_k = 3;
  p.seed = 42;
  p.stop = {"a", "b"};
  p.ignore_eos = true;
  json full = chat_request(p, {{"system", "s"}, {"user", "u"}}, /*stream=*/true);
  EXPECT_EQ(full["model"], "m");
  EXPECT_EQ(full["max_tokens"], 5);
  EXPECT_EQ(full["temperature"], 0.0);
  EXPECT_EQ(full["top_p"], 0.5);
  EXPECT_EQ(full["top_k"], 3);
  EXPECT_EQ(full["seed"], 42u);
  EXPECT_EQ(full["stop"], json({"a", "b"}));
  EXPECT_EQ(full["ignore_eos"], true);
  EXPECT_EQ(full["stream"], true);
  EXPECT_EQ(full["stream_options"]["include_usage"], true);
  EXPECT_EQ(full["messages"],
            json::parse(R"([{"role":"system","content":"s"},{"role":"user","content":"u"}])"));
  EXPECT_FALSE(full.contains("prompt"));

  json ids = completion_request(GenerationParams{}, json({1, 2, 3}), false);
  EXPECT_EQ(ids["prompt"], json({1, 2, 3}));
  EXPECT_FALSE(ids.contains("logprobs"));

  // Logprobs: the sampled token's alone (completions' 0; chat's true).
  GenerationParams lp;
  lp.logprobs = true;
  EXPECT_EQ(completion_request(lp, "hi", true)["logprobs"], 0);
  EXPECT_EQ(chat_request(lp, {{"user", "u"}}, true)["logprobs"], true);
  EXPECT_FALSE(full.contains("logprobs"));
}

TEST(OpenAiStream, ParsesCompletionAndChatChunks) {
  auto c = parse_stream_chunk(
      R"({"id":"x","object":"text_completion","choices":[{"index":0,"text":"He","logprobs":null,"finish_reason":null}],"usage":null})",
      false);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->text, "He");
  EXPECT_EQ(c->finish_reason, "");
  EXPECT_FALSE(c->usage.has_value());
  EXPECT_FALSE(c->done);

  auto d = parse_stream_chunk(
      R"({"choices":[{"index":0,"delta":{"role":"assistant","content":"llo"},"finish_reason":"length"}]})",
      true);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->text, "llo");
  EXPECT_EQ(d->finish_reason, "length");

  auto u = parse_stream_chunk(
      R"({"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}})",
      true);
  ASSERT_TRUE(u.ok());
  ASSERT_TRUE(u->usage.has_value());
  EXPECT_EQ(u->usage->prompt_tokens, 7);
  EXPECT_EQ(u->usage->completion_tokens, 3);
  EXPECT_EQ(u->text, "");

  // Usage fields of another type count as absent rather than throwing.
  auto odd = parse_stream_chunk(
      R"({"choices":[],"usage":{"prompt_tokens":null,"completion_tokens":"3"}})", false);
  ASSERT_TRUE(odd.ok());
  ASSERT_TRUE(odd->usage.has_value());
  EXPECT_EQ(odd->usage->prompt_tokens, 0);
  EXPECT_EQ(odd->usage->completion_tokens, 0);

  auto done = parse_stream_chunk("[DONE]", false);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->done);

  // A tool-call delta has null content: no text, no error.
  auto tool = parse_stream_chunk(
      R"({"choices":[{"index":0,"delta":{"content":null,"tool_calls":[]}}]})", true);
  ASSERT_TRUE(tool.ok());
  EXPECT_EQ(tool->text, "");
  EXPECT_EQ(tool->logprob_tokens, 0);

  // With logprobs, tokens that decode to no text still arrive: counted from the logprobs lists.
  auto lp = parse_stream_chunk(
      R"({"choices":[{"index":0,"text":"","logprobs":{"tokens":["",""],"token_logprobs":[-1.5,-0.25],"top_logprobs":null,"text_offset":[3,3]},"finish_reason":null}]})",
      false);
  ASSERT_TRUE(lp.ok()) << lp.status();
  EXPECT_EQ(lp->text, "");
  EXPECT_EQ(lp->logprob_tokens, 2);
  auto chat_lp = parse_stream_chunk(
      R"({"choices":[{"index":0,"delta":{"content":""},"logprobs":{"content":[{"token":"","logprob":-2.0,"bytes":[],"top_logprobs":[]}],"refusal":null}}]})",
      true);
  ASSERT_TRUE(chat_lp.ok()) << chat_lp.status();
  EXPECT_EQ(chat_lp->logprob_tokens, 1);
  // A logprobs field of another shape counts no token rather than failing.
  auto odd_lp = parse_stream_chunk(R"({"choices":[{"index":0,"text":"a","logprobs":[1]}]})", false);
  ASSERT_TRUE(odd_lp.ok());
  EXPECT_EQ(odd_lp->logprob_tokens, 0);
}

TEST(OpenAiStream, ErrorsAndGarbageAreErrors) {
  auto e =
      parse_stream_chunk(R"({"error":{"message":"engine failed","type":"server_error"}})", false);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("engine failed"), std::string_view::npos);
  EXPECT_FALSE(parse_stream_chunk("{not json", false).ok());
  EXPECT_FALSE(parse_stream_chunk("[1,2]", false).ok());
  EXPECT_FALSE(parse_completion(R"({"choices":[]})", false).ok());
}

TEST(OpenAiStream, ParsesWholeReplies) {
  auto c = parse_completion(
      R"({"choices":[{"index":0,"message":{"role":"assistant","content":"hey"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":2}})",
      true);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->text, "hey");
  EXPECT_EQ(c->finish_reason, "stop");
  EXPECT_EQ(c->usage.prompt_tokens, 4);
  EXPECT_EQ(c->usage.completion_tokens, 2);
}

}  // namespace
}  // namespace loom::client
