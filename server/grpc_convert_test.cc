// Request validation of the gRPC frontend: every bad prompt or sampling field is INVALID_ARGUMENT
// (or FAILED_PRECONDITION when it needs a tokenizer the model lacks) naming the field; good
// requests map field by field onto the engine's Request; events map onto GenerateResponse.
#include "server/grpc_convert.h"

#include <string>

#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"
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

}  // namespace
}  // namespace loom
