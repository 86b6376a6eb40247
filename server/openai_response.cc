#include "server/openai_response.h"

#include <utility>

#include "nlohmann/json.hpp"
#include "server/chat_request.h"

namespace loom {
namespace {

using json = nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// The text of one token (invalid UTF-8 repaired) and its raw bytes.
std::string token_text(const Tokenizer* tok, int32_t id) {
  if (!tok) return "";
  auto s = tok->decode(std::span<const int32_t>(&id, 1));
  return s.ok() ? *s : std::string();
}

json token_bytes(const Tokenizer* tok, int32_t id) {
  json arr = json::array();
  if (!tok) return arr;
  if (auto b = tok->token_bytes(id)) {
    for (unsigned char c : *b) arr.push_back(static_cast<int>(c));
  }
  return arr;
}

// Chat logprobs entries ({"token", "logprob", "bytes", "top_logprobs"}) for `lps`.
json chat_logprob_entries(const Tokenizer* tok, const std::vector<TokenLogprob>& lps) {
  json content = json::array();
  for (const TokenLogprob& lp : lps) {
    json top = json::array();
    for (const auto& [id, l] : lp.top) {
      top.push_back(
          {{"token", token_text(tok, id)}, {"logprob", l}, {"bytes", token_bytes(tok, id)}});
    }
    content.push_back({{"token", token_text(tok, lp.token)},
                       {"logprob", lp.logprob},
                       {"bytes", token_bytes(tok, lp.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return content;
}

// Completions logprobs arrays, appended to `lp` ({"tokens", "token_logprobs", "top_logprobs",
// "text_offset"}); `offset` is the running text offset of the choice.
void append_completion_logprobs(const Tokenizer* tok, const std::vector<TokenLogprob>& lps,
                                json* lp, int64_t* offset) {
  for (const TokenLogprob& t : lps) {
    std::string text = token_text(tok, t.token);
    (*lp)["tokens"].push_back(text);
    (*lp)["token_logprobs"].push_back(t.logprob);
    json top = json::object();
    for (const auto& [id, l] : t.top) top[token_text(tok, id)] = l;
    (*lp)["top_logprobs"].push_back(std::move(top));
    (*lp)["text_offset"].push_back(*offset);
    *offset += static_cast<int64_t>(text.size());
  }
}

json empty_completion_logprobs() {
  return {{"tokens", json::array()},
          {"token_logprobs", json::array()},
          {"top_logprobs", json::array()},
          {"text_offset", json::array()}};
}

json tool_calls_json(const std::vector<ToolCall>& calls) {
  json arr = json::array();
  for (const ToolCall& c : calls) {
    arr.push_back({{"id", c.id},
                   {"type", "function"},
                   {"function", {{"name", c.name}, {"arguments", c.arguments_json}}}});
  }
  return arr;
}

json tool_call_deltas_json(const std::vector<ToolCallDelta>& deltas) {
  json arr = json::array();
  for (const ToolCallDelta& d : deltas) {
    json e = {{"index", d.index}};
    json fn = {{"arguments", d.arguments}};
    if (!d.id.empty()) {
      e["id"] = d.id;
      e["type"] = "function";
      fn["name"] = d.name;
    }
    e["function"] = std::move(fn);
    arr.push_back(std::move(e));
  }
  return arr;
}

}  // namespace

struct OpenAiResponseBuilder::Choice {
  std::string text;  // everything generated (non-streaming: parsed at the end)
  std::vector<TokenLogprob> logprobs;
  int completion_tokens = 0;
  bool started = false;  // streaming chat: the role chunk was sent
  bool any_tool_call = false;
  std::optional<FinishReason> finish;
  int64_t text_offset = 0;                  // completions logprobs
  std::unique_ptr<ChatReplyReader> reader;  // streaming chat (the gRPC frontend's reader too)
};

OpenAiResponseBuilder::OpenAiResponseBuilder(ResponseContext ctx)
    : ctx_(std::move(ctx)), prompt_tokens_(ctx_.num_prompts, 0) {
  choices_.reserve(ctx_.num_prompts * ctx_.n);
  for (int i = 0; i < ctx_.num_prompts * ctx_.n; ++i) {
    auto c = std::make_unique<Choice>();
    if (ctx_.stream && ctx_.chat) c->reader = std::make_unique<ChatReplyReader>(ctx_.output);
    choices_.push_back(std::move(c));
  }
}

OpenAiResponseBuilder::~OpenAiResponseBuilder() = default;

int OpenAiResponseBuilder::prompt_tokens() const {
  int sum = 0;
  for (int p : prompt_tokens_) sum += p;
  return sum;
}

int OpenAiResponseBuilder::completion_tokens() const {
  int sum = 0;
  for (const auto& c : choices_) sum += c->completion_tokens;
  return sum;
}

std::vector<std::string> OpenAiResponseBuilder::on_event(int prompt, const RequestOutput& out) {
  const int index = prompt * ctx_.n + out.index;
  if (prompt < 0 || prompt >= ctx_.num_prompts || out.index < 0 || out.index >= ctx_.n) return {};
  Choice& c = *choices_[index];
  if (c.finish) return {};  // one final event per choice; ignore anything after
  c.completion_tokens += static_cast<int>(out.token_ids.size());
  if (out.finish) {
    c.finish = out.finish;
    ++finished_;
    prompt_tokens_[prompt] = std::max(prompt_tokens_[prompt], out.prompt_tokens);
    if (out.completion_tokens > 0) c.completion_tokens = out.completion_tokens;
    if (*out.finish == FinishReason::kError && error_.empty()) {
      error_ = out.error.empty() ? "the engine failed this request" : out.error;
    }
  }
  if (ctx_.stream) {
    auto chunks = stream_event(c, index, out);
    if (out.finish) last_reason_ = chat_finish_reason(*out.finish, c.any_tool_call);
    return chunks;
  }
  c.text += out.text;
  if (ctx_.logprobs) c.logprobs.insert(c.logprobs.end(), out.logprobs.begin(), out.logprobs.end());
  if (out.finish) {
    c.any_tool_call = reads_output() && !parse_chat_output(ctx_.output, c.text).tool_calls.empty();
    last_reason_ = chat_finish_reason(*out.finish, c.any_tool_call);
  }
  return {};
}

std::vector<std::string> OpenAiResponseBuilder::stream_event(Choice& c, int index,
                                                             const RequestOutput& out) {
  std::vector<std::string> chunks;
  auto base = [&]() {
    json j = {{"id", ctx_.id},
              {"object", ctx_.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", ctx_.created},
              {"model", ctx_.model}};
    if (ctx_.include_usage) j["usage"] = nullptr;
    return j;
  };
  if (out.finish && *out.finish == FinishReason::kError) {
    json e = {
        {"error",
         {{"message", error_}, {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}};
    chunks.push_back(dump(e));
    return chunks;
  }
  if (!ctx_.chat) {
    json choice = {
        {"index", index}, {"text", out.text}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
    if (ctx_.logprobs) {
      json lp = empty_completion_logprobs();
      append_completion_logprobs(ctx_.tokenizer, out.logprobs, &lp, &c.text_offset);
      choice["logprobs"] = std::move(lp);
    }
    if (out.finish) choice["finish_reason"] = finish_reason_name(*out.finish);
    if (out.text.empty() && !out.finish && (!ctx_.logprobs || out.logprobs.empty())) return chunks;
    json j = base();
    j["choices"] = json::array({std::move(choice)});
    chunks.push_back(dump(j));
    return chunks;
  }
  // Chat.
  auto chat_chunk = [&](json delta, json logprobs, json finish) {
    json j = base();
    j["choices"] = json::array({{{"index", index},
                                 {"delta", std::move(delta)},
                                 {"logprobs", std::move(logprobs)},
                                 {"finish_reason", std::move(finish)}}});
    return dump(j);
  };
  if (!c.started) {
    c.started = true;
    chunks.push_back(chat_chunk({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr));
  }
  const ChatDelta delta = c.reader->feed(out);
  c.any_tool_call = c.reader->made_tool_calls();
  json lp = nullptr;
  if (ctx_.logprobs && !out.logprobs.empty()) {
    lp = {{"content", chat_logprob_entries(ctx_.tokenizer, out.logprobs)}, {"refusal", nullptr}};
  }
  if (!delta.empty() || !lp.is_null()) {
    json d = json::object();
    // vLLM's field: clients that read reasoning take it from there.
    if (!delta.reasoning.empty()) d["reasoning_content"] = delta.reasoning;
    if (!delta.content.empty() || (delta.tool_calls.empty() && delta.reasoning.empty()))
      d["content"] = delta.content;
    if (!delta.tool_calls.empty()) d["tool_calls"] = tool_call_deltas_json(delta.tool_calls);
    chunks.push_back(chat_chunk(std::move(d), std::move(lp), nullptr));
  }
  if (out.finish) {
    chunks.push_back(chat_chunk(json::object(), nullptr,
                                std::string(chat_finish_reason(*out.finish, c.any_tool_call))));
  }
  return chunks;
}

std::vector<std::string> OpenAiResponseBuilder::stream_tail() const {
  if (!ctx_.include_usage) return {};
  json j = {{"id", ctx_.id},
            {"object", ctx_.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", ctx_.created},
            {"model", ctx_.model},
            {"choices", json::array()},
            {"usage",
             {{"prompt_tokens", prompt_tokens()},
              {"completion_tokens", completion_tokens()},
              {"total_tokens", prompt_tokens() + completion_tokens()}}}};
  return {dump(j)};
}

std::string OpenAiResponseBuilder::final_json() const {
  json choices = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = *choices_[i];
    std::string reason(c.finish ? finish_reason_name(*c.finish)
                                : finish_reason_name(FinishReason::kCancelled));
    if (!ctx_.chat) {
      json lp = nullptr;
      if (ctx_.logprobs) {
        lp = empty_completion_logprobs();
        int64_t offset = 0;
        append_completion_logprobs(ctx_.tokenizer, c.logprobs, &lp, &offset);
      }
      choices.push_back(
          {{"index", i}, {"text", c.text}, {"logprobs", std::move(lp)}, {"finish_reason", reason}});
      continue;
    }
    json message = {{"role", "assistant"}};
    if (reads_output()) {
      ParsedOutput parsed = parse_chat_output(ctx_.output, c.text);
      if (!parsed.tool_calls.empty() && reason == "stop") reason = "tool_calls";
      message["content"] = parsed.content.empty() && !parsed.tool_calls.empty()
                               ? json(nullptr)
                               : json(parsed.content);
      // vLLM's field; null when the reply had no reasoning.
      if (ctx_.output.reasoning) {
        message["reasoning_content"] =
            parsed.reasoning.empty() ? json(nullptr) : json(parsed.reasoning);
      }
      if (!parsed.tool_calls.empty()) message["tool_calls"] = tool_calls_json(parsed.tool_calls);
    } else {
      message["content"] = c.text;
    }
    // OpenAI's schema requires `refusal` (null: Loom never refuses on its own).
    message["refusal"] = nullptr;
    json lp = nullptr;
    if (ctx_.logprobs) {
      lp = {{"content", chat_logprob_entries(ctx_.tokenizer, c.logprobs)}, {"refusal", nullptr}};
    }
    choices.push_back({{"index", i},
                       {"message", std::move(message)},
                       {"logprobs", std::move(lp)},
                       {"finish_reason", reason}});
  }
  json j = {{"id", ctx_.id},
            {"object", ctx_.chat ? "chat.completion" : "text_completion"},
            {"created", ctx_.created},
            {"model", ctx_.model},
            {"choices", std::move(choices)},
            {"usage",
             {{"prompt_tokens", prompt_tokens()},
              {"completion_tokens", completion_tokens()},
              {"total_tokens", prompt_tokens() + completion_tokens()}}}};
  return dump(j);
}

}  // namespace loom
