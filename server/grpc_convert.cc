#include "server/grpc_convert.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "google/protobuf/unknown_field_set.h"
#include "nlohmann/json.hpp"
#include "server/chat_session.h"
#include "server/request_limits.h"

namespace loom {
namespace {

// The first unknown field of `m` or of a message set inside it, with its path ("" for `m`).
bool find_unknown_field(const google::protobuf::Message& m, const std::string& path,
                        std::string* where, int* number) {
  const google::protobuf::Reflection* refl = m.GetReflection();
  const google::protobuf::UnknownFieldSet& unknown = refl->GetUnknownFields(m);
  if (!unknown.empty()) {
    *where = path;
    *number = unknown.field(0).number();
    return true;
  }
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  refl->ListFields(m, &fields);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    const std::string sub = path.empty() ? f->name() : absl::StrCat(path, ".", f->name());
    if (f->is_repeated()) {
      for (int i = 0; i < refl->FieldSize(m, f); ++i)
        if (find_unknown_field(refl->GetRepeatedMessage(m, f, i), absl::StrCat(sub, "[", i, "]"),
                               where, number))
          return true;
    } else if (find_unknown_field(refl->GetMessage(m, f), sub, where, number)) {
      return true;
    }
  }
  return false;
}

void add_logprobs(const std::vector<TokenLogprob>& lps,
                  google::protobuf::RepeatedPtrField<v1::TokenLogprob>* out) {
  for (const TokenLogprob& lp : lps) {
    v1::TokenLogprob* l = out->Add();
    l->set_token_id(lp.token);
    l->set_logprob(lp.logprob);
    for (const auto& [token, logprob] : lp.top) {
      v1::TopLogprob* t = l->add_top();
      t->set_token_id(token);
      t->set_logprob(logprob);
    }
  }
}

std::string dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// Copies `s` into `out` (unset optional fields keep SamplingParams' defaults) and validates the
// result: Generate's and Chat's sampling, one definition. `have_tokenizer`: stop strings need one.
absl::Status sampling_from_proto(const v1::SamplingParams& s, bool have_tokenizer, int vocab_size,
                                 SamplingParams* out);

}  // namespace

absl::Status check_no_unknown_fields(const google::protobuf::Message& message) {
  std::string where;
  int number = 0;
  if (!find_unknown_field(message, "", &where, &number)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      where.empty() ? message.GetDescriptor()->full_name() : where, ": unknown field number ",
      number, " (a field of a newer loom.v1 than this server's, which it would ignore)"));
}

absl::StatusOr<Request> request_from_proto(const v1::GenerateRequest& in,
                                           const Tokenizer* tokenizer, int vocab_size,
                                           int max_model_len) {
  LOOM_RETURN_IF_ERROR(check_no_unknown_fields(in));
  Request r;
  switch (in.prompt_case()) {
    case v1::GenerateRequest::kText:
      if (tokenizer == nullptr)
        return absl::FailedPreconditionError(
            "text: this model is served without a tokenizer; send token_ids");
      if (in.text().empty()) return absl::InvalidArgumentError("text: the prompt is empty");
      r.prompt = tokenizer->encode(in.text(), in.parse_special_tokens());
      if (r.prompt.empty())
        return absl::InvalidArgumentError("text: the prompt tokenizes to no tokens");
      break;
    case v1::GenerateRequest::kTokenIds:
      r.prompt.assign(in.token_ids().ids().begin(), in.token_ids().ids().end());
      if (r.prompt.empty()) return absl::InvalidArgumentError("token_ids: the prompt is empty");
      for (size_t i = 0; i < r.prompt.size(); ++i)
        if (r.prompt[i] < 0 || r.prompt[i] >= vocab_size)
          return absl::InvalidArgumentError(absl::StrCat("token_ids.ids[", i, "]: ", r.prompt[i],
                                                         " is outside the vocabulary [0, ",
                                                         vocab_size, ")"));
      break;
    case v1::GenerateRequest::PROMPT_NOT_SET:
      return absl::InvalidArgumentError("prompt: set either text or token_ids");
  }

  LOOM_RETURN_IF_ERROR(
      sampling_from_proto(in.sampling(), tokenizer != nullptr, vocab_size, &r.params));
  const SamplingParams& p = r.params;
  if (max_model_len > 0 &&
      static_cast<int64_t>(r.prompt.size()) + p.max_tokens > static_cast<int64_t>(max_model_len))
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (", r.prompt.size(), " tokens) + sampling.max_tokens (", p.max_tokens,
                     ") exceeds the model's max_model_len ", max_model_len));
  r.priority = in.priority();
  r.tag = in.request_id();
  return r;
}

namespace {

absl::Status sampling_from_proto(const v1::SamplingParams& s, bool have_tokenizer, int vocab_size,
                                 SamplingParams* out) {
  SamplingParams& p = *out;
  if (s.has_temperature()) p.temperature = s.temperature();
  if (s.has_top_k()) p.top_k = s.top_k();
  if (s.has_top_p()) p.top_p = s.top_p();
  if (s.has_min_p()) p.min_p = s.min_p();
  if (s.has_repetition_penalty()) p.repetition_penalty = s.repetition_penalty();
  if (s.has_presence_penalty()) p.presence_penalty = s.presence_penalty();
  if (s.has_frequency_penalty()) p.frequency_penalty = s.frequency_penalty();
  if (s.has_seed()) p.seed = s.seed();
  if (s.has_max_tokens()) p.max_tokens = s.max_tokens();
  p.min_tokens = s.min_tokens();
  p.ignore_eos = s.ignore_eos();
  if (s.stop_token_ids_size() > kMaxStopTokenIds)
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.stop_token_ids: ", s.stop_token_ids_size(), " ids, at most ", kMaxStopTokenIds));
  p.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  p.stop.assign(s.stop().begin(), s.stop().end());
  for (const auto& [id, bias] : s.logit_bias()) p.logit_bias.emplace_back(id, bias);
  std::sort(p.logit_bias.begin(), p.logit_bias.end());  // map order is unspecified
  if (s.has_logprobs()) {
    if (s.logprobs() < 0)
      return absl::InvalidArgumentError(absl::StrCat("sampling.logprobs: ", s.logprobs(),
                                                     " is negative (leave it unset for none)"));
    p.logprobs = s.logprobs();
  }
  if (s.has_n()) p.n = s.n();
  if (!p.stop.empty() && !have_tokenizer)
    return absl::FailedPreconditionError(
        "sampling.stop: stop strings need a tokenizer, and this model is served without one");
  if (absl::Status st = p.validate(vocab_size); !st.ok())
    return absl::InvalidArgumentError(absl::StrCat("sampling.", st.message()));
  return absl::OkStatus();
}

}  // namespace

nlohmann::ordered_json chat_messages_from_proto(const v1::ChatRequest& in) {
  using ojson = nlohmann::ordered_json;
  ojson messages = ojson::array();
  for (const v1::ChatMessage& m : in.messages()) {
    ojson msg = ojson::object();
    msg["role"] = m.role();
    if (m.has_content()) msg["content"] = m.content();
    if (!m.name().empty()) msg["name"] = m.name();
    if (m.has_tool_call_id()) msg["tool_call_id"] = m.tool_call_id();
    if (m.tool_calls_size() > 0) {
      ojson calls = ojson::array();
      for (const v1::ToolCall& c : m.tool_calls()) {
        ojson call = ojson::object();
        if (!c.id().empty()) call["id"] = c.id();
        call["type"] = "function";
        call["function"] = {{"name", c.name()}, {"arguments", c.arguments()}};
        calls.push_back(std::move(call));
      }
      msg["tool_calls"] = std::move(calls);
    }
    if (m.has_reasoning_content()) msg["reasoning_content"] = m.reasoning_content();
    messages.push_back(std::move(msg));
  }
  return messages;
}

absl::StatusOr<std::string> chat_body_from_proto(const v1::ChatRequest& in,
                                                 const nlohmann::ordered_json& history) {
  using ojson = nlohmann::ordered_json;
  auto text = [](const std::string& s) { return dump(ojson(s)); };
  // The body as /v1/chat/completions would have it, fields in the order HTTP clients write them.
  // Schemas and kwargs are JSON text already and go in verbatim (their key order is what the
  // template prints); json::accept checks each is one JSON value first, without recursion.
  ojson messages = history;
  for (ojson& m : chat_messages_from_proto(in)) messages.push_back(std::move(m));
  std::string body = absl::StrCat("{\"messages\":", dump(messages));
  if (in.tools_size() > 0) {
    body += ",\"tools\":[";
    for (int i = 0; i < in.tools_size(); ++i) {
      const v1::Tool& t = in.tools(i);
      if (i > 0) body += ",";
      absl::StrAppend(&body, "{\"type\":\"function\",\"function\":{\"name\":", text(t.name()));
      if (!t.description().empty())
        absl::StrAppend(&body, ",\"description\":", text(t.description()));
      if (!t.parameters().empty()) {
        if (!ojson::accept(t.parameters()))
          return absl::InvalidArgumentError(absl::StrCat(
              "tools[", i, "].parameters: is not JSON text (a JSON Schema object, as JSON)"));
        absl::StrAppend(&body, ",\"parameters\":", t.parameters());
      }
      body += "}}";
    }
    body += "]";
  }
  switch (in.tool_choice_case()) {
    case v1::ChatRequest::kToolChoiceMode:
      absl::StrAppend(&body, ",\"tool_choice\":", text(in.tool_choice_mode()));
      break;
    case v1::ChatRequest::kToolChoiceFunction:
      absl::StrAppend(
          &body, ",\"tool_choice\":",
          dump(ojson{{"type", "function"}, {"function", {{"name", in.tool_choice_function()}}}}));
      break;
    case v1::ChatRequest::TOOL_CHOICE_NOT_SET:
      break;
  }
  if (!in.chat_template_kwargs().empty()) {
    if (!ojson::accept(in.chat_template_kwargs()))
      return absl::InvalidArgumentError(
          "chat_template_kwargs: is not JSON text (an object of the template's switches)");
    absl::StrAppend(&body, ",\"chat_template_kwargs\":", in.chat_template_kwargs());
  }
  body += "}";
  return body;
}

absl::Status check_chat_session_fields(const v1::ChatRequest& in) {
  if (in.session_id().empty()) {
    if (in.session_must_exist())
      return absl::InvalidArgumentError("session_must_exist: needs session_id");
    if (in.has_store()) return absl::InvalidArgumentError("store: needs session_id");
    return absl::OkStatus();
  }
  return check_session_id(in.session_id(), "session_id");
}

absl::StatusOr<OpenAiRequest> chat_request_from_proto(const v1::ChatRequest& in, int vocab_size,
                                                      const ChatHistory* history) {
  LOOM_RETURN_IF_ERROR(check_no_unknown_fields(in));
  LOOM_RETURN_IF_ERROR(check_chat_session_fields(in));
  LOOM_ASSIGN_OR_RETURN(const std::string body, chat_body_from_proto(in));
  LOOM_ASSIGN_OR_RETURN(OpenAiRequest r, parse_chat_request(body, history, 0));
  // Stop strings are matched on text, which a chat request always has (prepare_chat needs the
  // tokenizer): the server refuses Chat without one before it gets here.
  LOOM_RETURN_IF_ERROR(
      sampling_from_proto(in.sampling(), /*have_tokenizer=*/true, vocab_size, &r.params));
  const v1::SamplingParams& s = in.sampling();
  r.max_tokens.reset();
  if (s.has_max_tokens()) r.max_tokens = s.max_tokens();
  // build_engine_requests sets params.logprobs from these.
  r.logprobs = s.has_logprobs();
  r.top_logprobs = s.has_logprobs() ? s.logprobs() : 0;
  r.priority = in.priority();
  r.parse_special_tokens = in.parse_special_tokens();
  r.stream = true;
  return r;
}

void response_from_output(const RequestOutput& out, v1::GenerateResponse* resp) {
  resp->Clear();
  resp->set_index(out.index);
  resp->mutable_token_ids()->Add(out.token_ids.begin(), out.token_ids.end());
  resp->set_text(out.text);
  add_logprobs(out.logprobs, resp->mutable_logprobs());
  if (out.finish) {
    resp->set_finish_reason(finish_reason_to_proto(*out.finish));
    resp->set_error(out.error);
    resp->mutable_usage()->set_prompt_tokens(out.prompt_tokens);
    resp->mutable_usage()->set_completion_tokens(out.completion_tokens);
  }
}

void chat_response_from_output(const RequestOutput& out, const ChatDelta& delta,
                               bool made_tool_calls, v1::ChatResponse* resp) {
  resp->Clear();
  resp->set_index(out.index);
  resp->set_content(delta.content);
  resp->set_reasoning_content(delta.reasoning);
  for (const ToolCallDelta& d : delta.tool_calls) {
    v1::ToolCallDelta* t = resp->add_tool_calls();
    t->set_index(static_cast<int32_t>(d.index));
    t->set_id(d.id);
    t->set_name(d.name);
    t->set_arguments(d.arguments);
  }
  resp->mutable_token_ids()->Add(out.token_ids.begin(), out.token_ids.end());
  add_logprobs(out.logprobs, resp->mutable_logprobs());
  if (out.finish) {
    resp->set_finish_reason(*out.finish == FinishReason::kStop && made_tool_calls
                                ? v1::FINISH_REASON_TOOL_CALLS
                                : finish_reason_to_proto(*out.finish));
    resp->set_error(out.error);
    resp->mutable_usage()->set_prompt_tokens(out.prompt_tokens);
    resp->mutable_usage()->set_completion_tokens(out.completion_tokens);
  }
}

v1::FinishReason finish_reason_to_proto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

grpc::Status to_grpc_status(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace loom
