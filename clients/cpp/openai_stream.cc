#include "clients/cpp/openai_stream.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace loom::client {
namespace {

using json = nlohmann::json;

json common_fields(const GenerationParams& p, bool stream) {
  json j = json::object();
  if (!p.model.empty()) j["model"] = p.model;
  if (p.max_tokens) j["max_tokens"] = *p.max_tokens;
  if (p.temperature) j["temperature"] = *p.temperature;
  if (p.top_p) j["top_p"] = *p.top_p;
  if (p.top_k) j["top_k"] = *p.top_k;
  if (p.seed) j["seed"] = *p.seed;
  if (!p.stop.empty()) j["stop"] = p.stop;
  if (p.ignore_eos) j["ignore_eos"] = true;
  if (stream) {
    j["stream"] = true;
    j["stream_options"] = {{"include_usage", true}};
  }
  return j;
}

absl::StatusOr<json> parse_object(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return absl::DataLossError(
        absl::StrCat("server sent something that is not a JSON object: ",
                     absl::string_view(text.data(), std::min<size_t>(text.size(), 200))));
  }
  if (j.contains("error")) {
    const json& e = j["error"];
    std::string message = e.is_object() && e.contains("message") && e["message"].is_string()
                              ? e["message"].get<std::string>()
                              : e.dump();
    return absl::InternalError(absl::StrCat("server error: ", message));
  }
  return j;
}

// choices[0] when present and an object.
const json* first_choice(const json& j) {
  auto it = j.find("choices");
  if (it == j.end() || !it->is_array() || it->empty() || !(*it)[0].is_object()) return nullptr;
  return &(*it)[0];
}

std::string string_or_empty(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::optional<Usage> usage_of(const json& j) {
  auto it = j.find("usage");
  if (it == j.end() || !it->is_object()) return std::nullopt;
  // Not value(): it throws when a field is present with another type (null, a string).
  auto count = [&](const char* key) -> int64_t {
    auto f = it->find(key);
    return f != it->end() && f->is_number_integer() ? f->get<int64_t>() : 0;
  };
  Usage u;
  u.prompt_tokens = count("prompt_tokens");
  u.completion_tokens = count("completion_tokens");
  return u;
}

}  // namespace

json completion_request(const GenerationParams& params, json prompt, bool stream) {
  json j = common_fields(params, stream);
  j["prompt"] = std::move(prompt);
  if (params.logprobs) j["logprobs"] = 0;
  return j;
}

json chat_request(const GenerationParams& params, const std::vector<ChatMessage>& messages,
                  bool stream) {
  json j = common_fields(params, stream);
  if (params.logprobs) j["logprobs"] = true;
  json m = json::array();
  for (const ChatMessage& msg : messages)
    m.push_back({{"role", msg.role}, {"content", msg.content}});
  j["messages"] = std::move(m);
  return j;
}

absl::StatusOr<StreamChunk> parse_stream_chunk(std::string_view data, bool chat) {
  StreamChunk out;
  if (data == "[DONE]") {
    out.done = true;
    return out;
  }
  auto parsed = parse_object(data);
  if (!parsed.ok()) return parsed.status();
  const json& j = *parsed;
  out.usage = usage_of(j);
  if (const json* c = first_choice(j)) {
    if (chat) {
      auto d = c->find("delta");
      if (d != c->end() && d->is_object()) out.text = string_or_empty(*d, "content");
    } else {
      out.text = string_or_empty(*c, "text");
    }
    out.finish_reason = string_or_empty(*c, "finish_reason");
    auto lp = c->find("logprobs");
    if (lp != c->end() && lp->is_object()) {
      auto list = lp->find(chat ? "content" : "tokens");
      if (list != lp->end() && list->is_array()) out.logprob_tokens = std::ssize(*list);
    }
  }
  return out;
}

absl::StatusOr<Completion> parse_completion(std::string_view body, bool chat) {
  auto parsed = parse_object(body);
  if (!parsed.ok()) return parsed.status();
  const json* c = first_choice(*parsed);
  if (c == nullptr) return absl::DataLossError("reply has no choices");
  Completion out;
  if (chat) {
    auto m = c->find("message");
    if (m != c->end() && m->is_object()) out.text = string_or_empty(*m, "content");
  } else {
    out.text = string_or_empty(*c, "text");
  }
  out.finish_reason = string_or_empty(*c, "finish_reason");
  if (auto u = usage_of(*parsed)) out.usage = *u;
  return out;
}

}  // namespace loom::client
