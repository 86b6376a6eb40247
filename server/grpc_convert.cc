#include "server/grpc_convert.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "google/protobuf/unknown_field_set.h"
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

  const v1::SamplingParams& s = in.sampling();
  SamplingParams& p = r.params;
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
  if (!p.stop.empty() && tokenizer == nullptr)
    return absl::FailedPreconditionError(
        "sampling.stop: stop strings need a tokenizer, and this model is served without one");
  if (absl::Status st = p.validate(vocab_size); !st.ok())
    return absl::InvalidArgumentError(absl::StrCat("sampling.", st.message()));
  if (max_model_len > 0 &&
      static_cast<int64_t>(r.prompt.size()) + p.max_tokens > static_cast<int64_t>(max_model_len))
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (", r.prompt.size(), " tokens) + sampling.max_tokens (", p.max_tokens,
                     ") exceeds the model's max_model_len ", max_model_len));
  r.priority = in.priority();
  r.tag = in.request_id();
  return r;
}

void response_from_output(const RequestOutput& out, v1::GenerateResponse* resp) {
  resp->Clear();
  resp->set_index(out.index);
  resp->mutable_token_ids()->Add(out.token_ids.begin(), out.token_ids.end());
  resp->set_text(out.text);
  for (const TokenLogprob& lp : out.logprobs) {
    v1::TokenLogprob* l = resp->add_logprobs();
    l->set_token_id(lp.token);
    l->set_logprob(lp.logprob);
    for (const auto& [token, logprob] : lp.top) {
      v1::TopLogprob* t = l->add_top();
      t->set_token_id(token);
      t->set_logprob(logprob);
    }
  }
  if (out.finish) {
    resp->set_finish_reason(finish_reason_to_proto(*out.finish));
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
