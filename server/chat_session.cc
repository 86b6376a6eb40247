#include "server/chat_session.h"

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace loom {

using ojson = nlohmann::ordered_json;

absl::Status check_session_id(std::string_view id, std::string_view field) {
  if (id.empty() || id.size() > kMaxSessionIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(field), ": must be 1 to ",
                                                   kMaxSessionIdBytes, " characters (got ",
                                                   id.size(), ")"));
  }
  for (const char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(std::string(field), ": may hold only A-Z a-z 0-9 . _ : - (found byte ",
                       static_cast<int>(static_cast<unsigned char>(c)), ")"));
    }
  }
  return absl::OkStatus();
}

void ConversationTurn::apply(Request* request) const {
  if (!store) return;
  request->session = session;
  request->session_whole_prompt = true;
}

void ConversationTurn::take_new_messages(const OpenAiRequest& parsed, size_t history_at) {
  const size_t begin = history_at + (history ? history->size() : 0);
  new_template_messages = ojson::array();
  new_messages.clear();
  for (size_t i = begin; i < parsed.messages.size(); ++i) {
    new_template_messages.push_back(parsed.template_messages[i]);
    new_messages.push_back(parsed.messages[i]);
  }
}

void ConversationTurn::record(ojson reply, std::span<const int32_t> reply_ids,
                              std::string response_json) const {
  if (!store) return;
  // What a request carrying the reply as history would hold: its serialization replaces invalid
  // UTF-8 (a reply cut inside a character), and the chat parser checks and converts it.
  ojson clean = ojson::parse(reply.dump(-1, ' ', false, ojson::error_handler_t::replace), nullptr,
                             /*allow_exceptions=*/false);
  const size_t index = (history ? history->size() : 0) + new_messages.size();
  absl::StatusOr<ChatMessage> converted =
      parse_chat_message(clean, absl::StrCat("messages[", index, "]"));
  if (!converted.ok()) return;
  ojson template_messages = new_template_messages;
  template_messages.push_back(std::move(clean));
  std::vector<ChatMessage> messages = new_messages;
  messages.push_back(*std::move(converted));
  ResponseStore::Entry entry;
  entry.session = session;
  entry.messages = ChatHistory::append(history, std::move(template_messages), std::move(messages));
  entry.response_json = std::move(response_json);
  if (prompt && tokenizer) {
    if (std::optional<ConversationTokens> after =
            conversation_after_reply(*prompt, reply_ids, *tokenizer))
      entry.tokens = std::make_shared<const ConversationTokens>(*std::move(after));
  }
  store->put(key, std::move(entry), absl::Now());
}

ojson assistant_message(std::string_view content, std::string_view reasoning, ojson tool_calls) {
  ojson reply = {{"role", "assistant"}, {"content", content}};
  if (!reasoning.empty()) reply["reasoning_content"] = reasoning;
  if (!tool_calls.empty()) reply["tool_calls"] = std::move(tool_calls);
  return reply;
}

void ReplyTranscript::add(const ChatDelta& delta, std::span<const int32_t> token_ids) {
  token_ids_.insert(token_ids_.end(), token_ids.begin(), token_ids.end());
  content_ += delta.content;
  reasoning_ += delta.reasoning;
  for (const ToolCallDelta& d : delta.tool_calls) {
    if (d.index >= calls_.size()) {
      calls_.resize(d.index + 1);
      // A call's first delta names it; the id the parser gave, else OpenAI's call_<index>.
      calls_[d.index].id = d.id.empty() ? absl::StrCat("call_", d.index) : d.id;
      calls_[d.index].name = d.name;
    }
    calls_[d.index].arguments += d.arguments;
  }
}

ojson ReplyTranscript::message() const {
  ojson calls = ojson::array();
  for (const Call& c : calls_) {
    if (c.name.empty()) continue;  // an index the parser skipped: no call
    calls.push_back({{"id", c.id},
                     {"type", "function"},
                     {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return assistant_message(content_, reasoning_, std::move(calls));
}

}  // namespace loom
