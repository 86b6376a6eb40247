// Request validation of the gRPC frontend: every bad prompt or sampling field is INVALID_ARGUMENT
// (or FAILED_PRECONDITION when it needs a tokenizer the model lacks) naming the field; good
// requests map field by field onto the engine's Request; events map onto GenerateResponse.
// Chat: a ChatRequest is refused with the very words HTTP uses for the same conversation, renders
// to the same prompt tokens with a real checkpoint template, and its streamed tool-call deltas,
// split at every byte, reassemble into the call HTTP's response builder returns.
#include "server/grpc_convert.h"

#include <string>

#include "google/protobuf/text_format.h"
#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/chat_request.h"
#include "server/chat_session.h"
#include "server/openai_response.h"
#include "server/request_limits.h"

namespace loom {
namespace {

// The unknown-field set of `m`, to add fields a newer loom.v1 would have.
google::protobuf::UnknownFieldSet* unknown_fields(google::protobuf::Message* m) {
  return m->GetReflection()->MutableUnknownFields(m);
}

constexpr int kVocab = 500;

v1::GenerateRequest ids_request(std::initializer_list<int32_t> ids) {
  v1::GenerateRequest r;
  for (int32_t id : ids) r.mutable_token_ids()->add_ids(id);
  return r;
}

// Expects `req` to be rejected with `code` and a message containing `field`.
void expect_rejected(const v1::GenerateRequest& req, absl::StatusCode code,
                     const std::string& field, const Tokenizer* tok = nullptr,
                     int max_model_len = 0) {
  absl::StatusOr<Request> r = request_from_proto(req, tok, kVocab, max_model_len);
  ASSERT_FALSE(r.ok()) << req.DebugString();
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_NE(r.status().message().find(field), std::string::npos)
      << "message does not name " << field << ": " << r.status();
  // The gRPC status keeps the canonical code (INVALID_ARGUMENT = 3, FAILED_PRECONDITION = 9).
  grpc::Status g = to_grpc_status(r.status());
  EXPECT_EQ(static_cast<int>(g.error_code()), static_cast<int>(code));
  EXPECT_EQ(g.error_message(), std::string(r.status().message()));
}

TEST(GrpcConvert, LogitBias) {
  v1::GenerateRequest req = ids_request({1, 2});
  (*req.mutable_sampling()->mutable_logit_bias())[7] = -100.0f;
  (*req.mutable_sampling()->mutable_logit_bias())[3] = 2.5f;
  absl::StatusOr<Request> r = request_from_proto(req, nullptr, kVocab, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{3, 2.5f}, {7, -100.0f}}));
  v1::GenerateRequest out_of_range = ids_request({1});
  (*out_of_range.mutable_sampling()->mutable_logit_bias())[kVocab] = 1.0f;
  expect_rejected(out_of_range, absl::StatusCode::kInvalidArgument, "logit_bias");
  v1::GenerateRequest too_big = ids_request({1});
  (*too_big.mutable_sampling()->mutable_logit_bias())[4] = 200.0f;
  expect_rejected(too_big, absl::StatusCode::kInvalidArgument, "logit_bias");
}

TEST(GrpcConvert, RejectsBadPrompts) {
  expect_rejected(v1::GenerateRequest(), absl::StatusCode::kInvalidArgument, "prompt");
  expect_rejected(ids_request({}), absl::StatusCode::kInvalidArgument, "token_ids");
  expect_rejected(ids_request({1, kVocab}), absl::StatusCode::kInvalidArgument, "token_ids.ids[1]");
  expect_rejected(ids_request({-1}), absl::StatusCode::kInvalidArgument, "token_ids.ids[0]");
  v1::GenerateRequest text;
  text.set_text("hello");
  expect_rejected(text, absl::StatusCode::kFailedPrecondition, "tokenizer");
  auto tok = Tokenizer::byte_level();
  text.set_text("");
  expect_rejected(text, absl::StatusCode::kInvalidArgument, "text", tok.get());
}

TEST(GrpcConvert, RejectsBadSampling) {
  struct Case {
    const char* field;
    void (*set)(v1::SamplingParams*);
  };
  const Case cases[] = {
      {"temperature", [](v1::SamplingParams* s) { s->set_temperature(-1.0f); }},
      {"temperature", [](v1::SamplingParams* s) { s->set_temperature(2.5f); }},  // HTTP's cap too
      {"presence_penalty", [](v1::SamplingParams* s) { s->set_presence_penalty(2.5f); }},
      {"top_k", [](v1::SamplingParams* s) { s->set_top_k(-2); }},
      {"top_p", [](v1::SamplingParams* s) { s->set_top_p(1.5f); }},
      {"top_p", [](v1::SamplingParams* s) { s->set_top_p(0.0f); }},
      {"min_p", [](v1::SamplingParams* s) { s->set_min_p(-0.1f); }},
      {"repetition_penalty", [](v1::SamplingParams* s) { s->set_repetition_penalty(0.0f); }},
      {"max_tokens", [](v1::SamplingParams* s) { s->set_max_tokens(0); }},
      {"min_tokens", [](v1::SamplingParams* s) { s->set_min_tokens(-1); }},
      {"logprobs", [](v1::SamplingParams* s) { s->set_logprobs(-1); }},
      {"logprobs", [](v1::SamplingParams* s) { s->set_logprobs(kMaxLogprobs + 1); }},
      {"n", [](v1::SamplingParams* s) { s->set_n(0); }},
      {"n", [](v1::SamplingParams* s) { s->set_n(kMaxN + 1); }},
      {"stop_token_ids", [](v1::SamplingParams* s) { s->add_stop_token_ids(kVocab); }},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest req = ids_request({1, 2, 3});
    c.set(req.mutable_sampling());
    SCOPED_TRACE(req.sampling().DebugString());
    expect_rejected(req, absl::StatusCode::kInvalidArgument, c.field);
  }
  // Stop strings: too many or too long (with a tokenizer), or no tokenizer at all.
  auto tok = Tokenizer::byte_level();
  v1::GenerateRequest many = ids_request({1});
  // std::string, not "x": GCC 12 -O3 warns falsely on the inlined const char* overload (PR 105329).
  for (int i = 0; i <= kMaxStopStrings; ++i) many.mutable_sampling()->add_stop(std::string("x"));
  expect_rejected(many, absl::StatusCode::kInvalidArgument, "stop", tok.get());
  v1::GenerateRequest longer = ids_request({1});
  longer.mutable_sampling()->add_stop(std::string(kMaxStopStringBytes + 1, 'a'));
  expect_rejected(longer, absl::StatusCode::kInvalidArgument, "stop", tok.get());
  v1::GenerateRequest no_tok = ids_request({1});
  no_tok.mutable_sampling()->add_stop("x");
  expect_rejected(no_tok, absl::StatusCode::kFailedPrecondition, "stop");
  // Over max_model_len.
  v1::GenerateRequest too_long = ids_request({1, 2, 3});
  too_long.mutable_sampling()->set_max_tokens(8);
  expect_rejected(too_long, absl::StatusCode::kInvalidArgument, "max_model_len", nullptr, 10);
  too_long.mutable_sampling()->set_max_tokens(7);
  EXPECT_TRUE(request_from_proto(too_long, nullptr, kVocab, 10).ok());
}

// Fields a newer client sets that this server does not know: INVALID_ARGUMENT naming the field
// number and the message holding it, at the top level, in sampling, in token_ids and in a
// logit_bias map entry.
TEST(GrpcConvert, RejectsUnknownFields) {
  v1::GenerateRequest top = ids_request({1});
  unknown_fields(&top)->AddVarint(99, 1);
  expect_rejected(top, absl::StatusCode::kInvalidArgument,
                  "loom.v1.GenerateRequest: unknown field number 99");
  v1::GenerateRequest sampling = ids_request({1});
  unknown_fields(sampling.mutable_sampling())->AddFixed32(17, 3);
  expect_rejected(sampling, absl::StatusCode::kInvalidArgument,
                  "sampling: unknown field number 17");
  v1::GenerateRequest ids = ids_request({1});
  unknown_fields(ids.mutable_token_ids())->AddVarint(2, 5);
  expect_rejected(ids, absl::StatusCode::kInvalidArgument, "token_ids: unknown field number 2");
  // Through the wire format, as a server receives it: an unknown field inside sampling.
  v1::GenerateRequest wire = ids_request({1});
  wire.mutable_sampling()->set_max_tokens(2);
  std::string bytes = wire.SerializeAsString();
  bytes += std::string("\x1a\x03\xa8\x06\x01", 5);  // field 3 (sampling) again: {101: 1}
  v1::GenerateRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  EXPECT_EQ(parsed.sampling().max_tokens(), 2);  // the two sampling records merge
  expect_rejected(parsed, absl::StatusCode::kInvalidArgument, "sampling: unknown field number 101");
  // Known fields only: accepted.
  v1::GenerateRequest fine = ids_request({1});
  (*fine.mutable_sampling()->mutable_logit_bias())[3] = 1.0f;
  EXPECT_TRUE(request_from_proto(fine, nullptr, kVocab, 0).ok());
}

TEST(GrpcConvert, StopTokenIdsAreLimited) {
  v1::GenerateRequest req = ids_request({1});
  for (int i = 0; i < kMaxStopTokenIds; ++i) req.mutable_sampling()->add_stop_token_ids(i);
  absl::StatusOr<Request> r = request_from_proto(req, nullptr, kVocab, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->params.stop_token_ids.size(), static_cast<size_t>(kMaxStopTokenIds));
  req.mutable_sampling()->add_stop_token_ids(kMaxStopTokenIds);
  expect_rejected(req, absl::StatusCode::kInvalidArgument, "sampling.stop_token_ids");
}

TEST(GrpcConvert, MapsEveryField) {
  auto tok = Tokenizer::byte_level();
  v1::GenerateRequest req;
  req.set_text("hi<|im_end|>");
  req.set_parse_special_tokens(true);
  req.set_priority(3);
  req.set_request_id("abc");
  v1::SamplingParams* s = req.mutable_sampling();
  s->set_temperature(0.5f);
  s->set_top_k(7);
  s->set_top_p(0.9f);
  s->set_min_p(0.05f);
  s->set_repetition_penalty(1.1f);
  s->set_presence_penalty(0.2f);
  s->set_frequency_penalty(0.3f);
  s->set_seed(42);
  s->set_max_tokens(9);
  s->set_min_tokens(2);
  s->set_ignore_eos(true);
  s->add_stop_token_ids(5);
  s->add_stop("zz");
  s->set_logprobs(3);
  s->set_n(2);
  absl::StatusOr<Request> r = request_from_proto(req, tok.get(), kVocab, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompt, (std::vector<int32_t>{'h', 'i', 258}));  // <|im_end|> as one token
  const SamplingParams& p = r->params;
  EXPECT_EQ(p.temperature, 0.5f);
  EXPECT_EQ(p.top_k, 7);
  EXPECT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.min_p, 0.05f);
  EXPECT_EQ(p.repetition_penalty, 1.1f);
  EXPECT_EQ(p.presence_penalty, 0.2f);
  EXPECT_EQ(p.frequency_penalty, 0.3f);
  EXPECT_EQ(p.seed, std::optional<uint64_t>(42));
  EXPECT_EQ(p.max_tokens, 9);
  EXPECT_EQ(p.min_tokens, 2);
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.stop_token_ids, std::vector<int32_t>{5});
  EXPECT_EQ(p.stop, std::vector<std::string>{"zz"});
  EXPECT_EQ(p.logprobs, 3);
  EXPECT_EQ(p.n, 2);
  EXPECT_EQ(r->priority, 3);
  EXPECT_EQ(r->tag, "abc");

  // Without parse_special_tokens the marker is plain text; unset fields keep the defaults.
  v1::GenerateRequest plain;
  plain.set_text("hi<|im_end|>");
  r = request_from_proto(plain, tok.get(), kVocab, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->prompt.size(), std::string("hi<|im_end|>").size());
  const SamplingParams def;
  EXPECT_EQ(r->params.temperature, def.temperature);
  EXPECT_EQ(r->params.top_p, def.top_p);
  EXPECT_EQ(r->params.max_tokens, def.max_tokens);
  EXPECT_EQ(r->params.logprobs, -1);
  EXPECT_EQ(r->params.n, 1);
  EXPECT_FALSE(r->params.seed.has_value());
}

TEST(GrpcConvert, MapsOutputs) {
  RequestOutput out;
  out.index = 1;
  out.token_ids = {7, 8};
  out.text = "ab";
  out.logprobs = {{7, -0.5f, {{7, -0.5f}, {9, -1.5f}}}, {8, -0.25f, {}}};
  v1::GenerateResponse resp;
  response_from_output(out, &resp);
  EXPECT_EQ(resp.index(), 1);
  ASSERT_EQ(resp.token_ids_size(), 2);
  EXPECT_EQ(resp.token_ids(1), 8);
  EXPECT_EQ(resp.text(), "ab");
  ASSERT_EQ(resp.logprobs_size(), 2);
  EXPECT_EQ(resp.logprobs(0).top_size(), 2);
  EXPECT_EQ(resp.logprobs(0).top(1).token_id(), 9);
  EXPECT_EQ(resp.logprobs(1).logprob(), -0.25f);
  EXPECT_EQ(resp.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  EXPECT_FALSE(resp.has_usage());

  out.finish = FinishReason::kLength;
  out.prompt_tokens = 4;
  out.completion_tokens = 9;
  response_from_output(out, &resp);
  EXPECT_EQ(resp.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(resp.usage().prompt_tokens(), 4);
  EXPECT_EQ(resp.usage().completion_tokens(), 9);
}

const std::string kTemplates = std::string(LOOM_FIXTURES_DIR) + "/chat_templates";

v1::ChatRequest chat_proto(const std::string& text) {
  v1::ChatRequest r;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &r)) << text;
  return r;
}

// A ChatRequest and the /v1/chat/completions body that says the same thing must be accepted or
// refused alike, with the same code and message.
TEST(GrpcChat, RefusesWithHttpsWords) {
  struct Case {
    const char* proto;  // text format
    const char* body;   // the HTTP body
    const char* names;  // what the message must name
  };
  const Case cases[] = {
      {R"(messages { role: "robot" content: "hi" })",
       R"({"messages": [{"role": "robot", "content": "hi"}]})", "messages[0].role"},
      {R"(messages { role: "user" content: "hi" } messages { role: "tool" content: "22C" })",
       R"({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "22C"}]})",
       "messages[1].tool_call_id"},
      {R"(messages { role: "user" })", R"({"messages": [{"role": "user"}]})",
       "messages[0].content"},
      {R"(messages { role: "user" content: "x" tool_calls { name: "f" arguments: "{}" } })",
       R"({"messages": [{"role": "user", "content": "x", "tool_calls": [{"type": "function",
          "function": {"name": "f", "arguments": "{}"}}]}]})",
       "messages[0].tool_calls"},
      {R"(messages { role: "user" content: "x" reasoning_content: "r" })",
       R"({"messages": [{"role": "user", "content": "x", "reasoning_content": "r"}]})",
       "messages[0].reasoning_content"},
      {"", R"({"messages": []})", "messages"},
      // Bad tool schemas: parameters not an object, no name.
      {R"(messages { role: "user" content: "x" } tools { name: "f" parameters: "[1, 2]" })",
       R"({"messages": [{"role": "user", "content": "x"}],
          "tools": [{"type": "function", "function": {"name": "f", "parameters": [1, 2]}}]})",
       "tools"},
      {R"(messages { role: "user" content: "x" } tools { description: "d" })",
       R"({"messages": [{"role": "user", "content": "x"}],
          "tools": [{"type": "function", "function": {"name": "", "description": "d"}}]})",
       "tools"},
      // tool_choice: only auto and none.
      {R"(messages { role: "user" content: "x" } tools { name: "f" } tool_choice_mode: "required")",
       R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
          "tools": [{"type": "function", "function": {"name": "f"}}]})",
       "tool_choice"},
      {R"(messages { role: "user" content: "x" } tools { name: "f" }
          tool_choice_function: "nope")",
       R"({"messages": [{"role": "user", "content": "x"}],
          "tool_choice": {"type": "function", "function": {"name": "nope"}},
          "tools": [{"type": "function", "function": {"name": "f"}}]})",
       "tool_choice"},
      {R"(messages { role: "user" content: "x" } chat_template_kwargs: "[1]")",
       R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": [1]})",
       "chat_template_kwargs"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.proto);
    absl::StatusOr<OpenAiRequest> http = parse_chat_request(c.body);
    absl::StatusOr<OpenAiRequest> grpc = chat_request_from_proto(chat_proto(c.proto), kVocab);
    ASSERT_FALSE(http.ok()) << c.body;
    ASSERT_FALSE(grpc.ok());
    EXPECT_EQ(grpc.status(), http.status());
    EXPECT_EQ(grpc.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(grpc.status().message().find(c.names), std::string::npos) << grpc.status();
    EXPECT_EQ(static_cast<int>(to_grpc_status(grpc.status()).error_code()),
              static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  }
  // What only gRPC can send: schema or kwargs text that is not JSON, named by its gRPC field.
  auto bad_json = chat_request_from_proto(
      chat_proto(R"(messages { role: "user" content: "x" } tools { name: "f" parameters: "{" })"),
      kVocab);
  EXPECT_EQ(bad_json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_json.status().message().find("tools[0].parameters"), std::string::npos);
  bad_json = chat_request_from_proto(
      chat_proto(R"(messages { role: "user" content: "x" } chat_template_kwargs: "{,}")"), kVocab);
  EXPECT_NE(bad_json.status().message().find("chat_template_kwargs"), std::string::npos);
  // Generate's sampling checks, with Generate's words.
  auto hot = chat_request_from_proto(
      chat_proto(R"(messages { role: "user" content: "x" } sampling { temperature: 3 })"), kVocab);
  EXPECT_EQ(hot.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(hot.status().message().find("sampling.temperature"), std::string::npos);
  // Unknown fields, as in Generate.
  v1::ChatRequest newer = chat_proto(R"(messages { role: "user" content: "x" })");
  unknown_fields(newer.mutable_messages(0))->AddVarint(42, 1);
  auto refused = chat_request_from_proto(newer, kVocab);
  EXPECT_NE(refused.status().message().find("messages[0]: unknown field number 42"),
            std::string::npos)
      << refused.status();
}

// A conversation with tools, a tool call and its result renders to the same prompt tokens over
// both frontends with Qwen3-Next's own template (which prints the schema with tojson, key order
// and all), and the sampling fields land where Generate puts them.
TEST(GrpcChat, RendersAsHttpWithTheCheckpointTemplate) {
  auto tok = Tokenizer::byte_level();
  auto chat =
      load_chat_setup(kTemplates + "/qwen3_next", "qwen3_next", ReasoningParser::kAuto, tok.get());
  ASSERT_TRUE(chat.ok()) << chat.status();
  ASSERT_TRUE(chat->chat_template != nullptr);
  EXPECT_EQ(chat->end_of_turn_stop, "");  // a checkpoint's template: its tokenizer's specials
  const char* schema =
      R"({"type": "object", "required": ["tz"], "properties": {"tz": {"type": "string", "maxLength": 8}}})";
  v1::ChatRequest proto = chat_proto(R"(
      messages { role: "system" content: "Be brief." }
      messages { role: "user" content: "Time in Paris?" }
      messages { role: "assistant" tool_calls { id: "call_0" name: "get_time"
                 arguments: "{\"tz\": \"CET\"}" } }
      messages { role: "tool" tool_call_id: "call_0" content: "12:00" }
      tools { name: "get_time" description: "The current time." }
      tool_choice_mode: "auto"
      sampling { temperature: 0 seed: 7 max_tokens: 5 logprobs: 2 }
      priority: 3)");
  proto.mutable_tools(0)->set_parameters(schema);
  const std::string body = absl::StrCat(R"({"messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Time in Paris?"},
      {"role": "assistant", "tool_calls": [{"id": "call_0", "type": "function",
       "function": {"name": "get_time", "arguments": "{\"tz\": \"CET\"}"}}]},
      {"role": "tool", "tool_call_id": "call_0", "content": "12:00"}],
      "tools": [{"type": "function", "function": {"name": "get_time",
                 "description": "The current time.", "parameters": )",
                                        schema, R"(}}],
      "tool_choice": "auto", "temperature": 0, "seed": 7, "max_tokens": 5, "logprobs": true,
      "top_logprobs": 2, "priority": 3})");
  auto grpc_req = chat_request_from_proto(proto, kVocab);
  ASSERT_TRUE(grpc_req.ok()) << grpc_req.status();
  auto http_req = parse_chat_request(body);
  ASSERT_TRUE(http_req.ok()) << http_req.status();
  // The same conversation (messages' keys may come in another order; the tools' schema keys
  // keep theirs, which the template prints).
  EXPECT_EQ(grpc_req->template_tools, http_req->template_tools);
  EXPECT_EQ(nlohmann::json::parse(grpc_req->template_messages.dump()),
            nlohmann::json::parse(http_req->template_messages.dump()));
  auto g = prepare_chat(*grpc_req, *tok, *chat, 0);
  auto h = prepare_chat(*http_req, *tok, *chat, 0);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(g->request.prompt, h->request.prompt);
  auto text = tok->decode(g->request.prompt);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find(R"("name": "get_time")"), std::string::npos) << *text;
  EXPECT_NE(text->find(R"("required": ["tz"], "properties")"), std::string::npos) << *text;
  EXPECT_NE(text->find("12:00"), std::string::npos);
  ASSERT_TRUE(g->output.tool_calls.has_value());
  EXPECT_EQ(*g->output.tool_calls, ToolCallSyntax::kQwen);
  EXPECT_EQ(g->request.params.temperature, 0.0f);
  EXPECT_EQ(g->request.params.seed, h->request.params.seed);
  EXPECT_EQ(g->request.params.max_tokens, 5);
  EXPECT_EQ(g->request.params.logprobs, 2);
  EXPECT_EQ(h->request.params.logprobs, 2);
  EXPECT_EQ(g->request.priority, 3);
  // tool_choice none: the template still sees the tools, the reply is not parsed for calls.
  proto.set_tool_choice_mode("none");
  auto none = prepare_chat(*chat_request_from_proto(proto, kVocab), *tok, *chat, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->output.tool_calls.has_value());
  // No max_tokens: the context left, capped, as HTTP chat does.
  proto.mutable_sampling()->clear_max_tokens();
  auto left = prepare_chat(*chat_request_from_proto(proto, kVocab), *tok, *chat, 1000);
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left->request.params.max_tokens, 1000 - static_cast<int>(left->request.prompt.size()));
}

// A reply with text, then two tool calls, in Qwen's syntax: streamed over gRPC in pieces cut at
// every byte, the ChatResponse deltas reassemble into the content and calls HTTP's builder returns
// for the whole reply, and the choice finishes with TOOL_CALLS ("tool_calls" over HTTP).
TEST(GrpcChat, ToolCallDeltasReassembleToHttpsCalls) {
  const std::string reply =
      "Let me look.<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_date\", \"arguments\": {}}\n</tool_call>";
  ChatOutputOptions output;
  output.tool_calls = ToolCallSyntax::kQwen;
  // HTTP, not streamed.
  ResponseContext rc;
  rc.chat = true;
  rc.output = output;
  OpenAiResponseBuilder http(rc);
  RequestOutput whole;
  whole.text = reply;
  whole.finish = FinishReason::kStop;
  http.on_event(0, whole);
  const nlohmann::json message = nlohmann::json::parse(http.final_json())["choices"][0];
  ASSERT_EQ(message["finish_reason"], "tool_calls");
  const nlohmann::json& calls = message["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u);
  for (size_t cut = 0; cut <= reply.size(); ++cut) {
    SCOPED_TRACE(cut);
    ChatReplyReader reader(output);
    std::string content;
    std::vector<v1::ToolCall> got;
    v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
    for (int part = 0; part < 2; ++part) {
      RequestOutput ev;
      ev.text = part == 0 ? reply.substr(0, cut) : reply.substr(cut);
      if (part == 1) ev.finish = FinishReason::kStop;
      v1::ChatResponse resp;
      const ChatDelta delta = reader.feed(ev);  // before made_tool_calls()
      chat_response_from_output(ev, delta, reader.made_tool_calls(), &resp);
      content += resp.content();
      for (const v1::ToolCallDelta& d : resp.tool_calls()) {
        if (d.index() == static_cast<int>(got.size())) {
          ASSERT_FALSE(d.id().empty());
          got.emplace_back();
          got.back().set_id(d.id());
          got.back().set_name(d.name());
        }
        ASSERT_LT(d.index(), static_cast<int>(got.size()));
        got[d.index()].mutable_arguments()->append(d.arguments());
      }
      finish = resp.finish_reason();
    }
    EXPECT_EQ(content, message["message"]["content"].get<std::string>());
    ASSERT_EQ(got.size(), calls.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].id(), calls[i]["id"].get<std::string>());
      EXPECT_EQ(got[i].name(), calls[i]["function"]["name"].get<std::string>());
      EXPECT_EQ(got[i].arguments(), calls[i]["function"]["arguments"].get<std::string>());
    }
    EXPECT_EQ(finish, v1::FINISH_REASON_TOOL_CALLS);
  }
  // Without tools parsed the same text is all content, and the finish is plain STOP.
  ChatReplyReader plain(ChatOutputOptions{});
  v1::ChatResponse resp;
  const ChatDelta delta = plain.feed(whole);
  chat_response_from_output(whole, delta, plain.made_tool_calls(), &resp);
  EXPECT_EQ(resp.content(), reply);
  EXPECT_EQ(resp.tool_calls_size(), 0);
  EXPECT_EQ(resp.finish_reason(), v1::FINISH_REASON_STOP);
}

// Session fields: checked before any work, naming the field; a session turn's body is the stored
// conversation followed by the new messages, and what the session keeps of the turn is exactly
// the new messages as the body has them.
TEST(GrpcChat, SessionFields) {
  auto refused = [](const char* text, const char* names) {
    absl::StatusOr<OpenAiRequest> r = chat_request_from_proto(chat_proto(text), 1000);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(r.status().message().find(names), std::string::npos) << r.status();
  };
  refused(R"(messages { role: "user" content: "x" } session_id: "a b")", "session_id");
  refused(R"(messages { role: "user" content: "x" } session_id: "caf\303\251")", "session_id");
  refused(R"(messages { role: "user" content: "x" } store: false)", "store");
  refused(R"(messages { role: "user" content: "x" } session_must_exist: true)",
          "session_must_exist");
  const std::string long_id(kMaxSessionIdBytes + 1, 'a');
  v1::ChatRequest too_long = chat_proto(R"(messages { role: "user" content: "x" })");
  too_long.set_session_id(long_id);
  EXPECT_EQ(check_chat_session_fields(too_long).code(), absl::StatusCode::kInvalidArgument);
  too_long.set_session_id(long_id.substr(1));
  EXPECT_TRUE(check_chat_session_fields(too_long).ok());
  EXPECT_TRUE(check_session_id("sess_1.a:B-2", "session_id").ok());

  const v1::ChatRequest turn = chat_proto(
      R"(messages { role: "tool" content: "sunny" tool_call_id: "call_0" }
         session_id: "s1" session_must_exist: true store: true)");
  const nlohmann::ordered_json history = nlohmann::ordered_json::parse(R"([
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function",
        "function": {"name": "get_weather", "arguments": "{}"}}]}])");
  absl::StatusOr<std::string> body = chat_body_from_proto(turn, history);
  ASSERT_TRUE(body.ok()) << body.status();
  const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(*body)["messages"];
  ASSERT_EQ(messages.size(), 3u);
  EXPECT_EQ(messages[0], history[0]);
  EXPECT_EQ(messages[1], history[1]);
  EXPECT_EQ(messages[2], chat_messages_from_proto(turn)[0]);
  EXPECT_EQ(messages[2]["tool_call_id"], "call_0");
  // The session's turn parses only the new message, the stored ones kept parsed: the same
  // request as parsing the whole body.
  std::vector<ChatMessage> converted;
  for (const nlohmann::ordered_json& m : history)
    converted.push_back(*parse_chat_message(m, "messages"));
  const auto kept = ChatHistory::append(nullptr, history, converted);
  absl::StatusOr<OpenAiRequest> parsed = chat_request_from_proto(turn, 1000, kept.get());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  absl::StatusOr<OpenAiRequest> whole = parse_chat_request(*body);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(parsed->messages.size(), 3u);
  EXPECT_EQ(parsed->template_messages, whole->template_messages);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(parsed->messages[i].role, whole->messages[i].role);
    EXPECT_EQ(parsed->messages[i].content, whole->messages[i].content);
    EXPECT_EQ(parsed->messages[i].tool_call_id, whole->messages[i].tool_call_id);
    EXPECT_EQ(parsed->messages[i].tool_calls.size(), whole->messages[i].tool_calls.size());
  }
  // The session fields change nothing in the body.
  v1::ChatRequest plain = turn;
  plain.clear_session_id();
  plain.clear_session_must_exist();
  plain.clear_store();
  EXPECT_EQ(chat_body_from_proto(plain, history).value(), *body);
}

}  // namespace
}  // namespace loom
