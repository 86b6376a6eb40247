// Conversations the server keeps between turns, for both frontends: HTTP's POST /v1/responses
// (a conversation is reached through its latest stored response id, server/responses_route.h)
// and gRPC's Chat with a session_id (reached through the session id). One mechanism, so the two
// cannot drift:
//
//  * the conversation's messages are kept in a ResponseStore entry (server/response_store.h)
//    under a key (the response id, the gRPC session id), with the engine session holding its
//    tokens;
//  * the stored messages are kept as parsed (server/chat_history.h): a turn parses only its new
//    messages (HTTP: responses_chat_body, gRPC: chat_body_from_proto, then parse_chat_request with
//    the stored history in place) and renders the whole conversation through the chat template,
//    and tokenizes only the text after what the
//    stored entry's ids spell (prepare_chat with the entry's ConversationTokens,
//    server/conversation_tokens.h); when the rendering does not continue that text (a template
//    that drops earlier reasoning, a reply ended by a stop string) it tokenizes the whole
//    rendering. It is submitted as a whole-prompt turn of that engine session
//    (ConversationTurn::apply, Request::session_whole_prompt): the engine continues from the cache
//    it kept when the session's token history is a prefix of the prompt and starts over otherwise
//    (a fork, or a turn encoded whole that differs), so the model sees exactly the tokens of the
//    conversation that it saw in earlier turns, its replies as sampled;
//  * a turn that completes (stop or length) is kept with its reply as the assistant message the
//    template renders next time, and with the prompt's ids and text followed by the reply's ids as
//    sampled (ConversationTurn::record), before the turn's last event goes out, so a client that
//    continues at once finds it. A cancelled or failed turn keeps nothing;
//  * store: false runs the turn on the stored conversation without a session: the engine computes
//    it whole and leaves the session as it was.
//
// The engine's refusals (max_sessions, a session with a turn in progress, the context limit) and
// the admission gate, API key and drain are each frontend's usual path: both map them from the
// same absl::Status codes.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/chat/chat_output_parser.h"
#include "engine/request.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "server/chat_history.h"
#include "server/conversation_tokens.h"
#include "server/openai_request.h"
#include "server/response_store.h"

namespace loom {

// The longest client-given session id (gRPC's ChatRequest.session_id).
inline constexpr size_t kMaxSessionIdBytes = 128;

// InvalidArgument naming `field` unless `id` is 1 to kMaxSessionIdBytes characters of
// A-Z a-z 0-9 . _ : - (ids go into logs, metrics labels never, and error messages: no quoting
// problems, no control characters).
absl::Status check_session_id(std::string_view id, std::string_view field);

// One turn of a kept conversation.
struct ConversationTurn {
  // Where the conversation goes once the turn completes; null: kept nowhere (store: false).
  std::shared_ptr<ResponseStore> store;
  std::string key;      // its key in `store` (a response id, a gRPC session id)
  std::string session;  // the engine session holding its tokens (Request::session)
  // The messages the turn's prompt rendered, no instructions: the stored ones (null: none) and
  // the turn's new ones as parsed (take_new_messages).
  std::shared_ptr<const ChatHistory> history;
  nlohmann::ordered_json new_template_messages = nlohmann::ordered_json::array();
  std::vector<ChatMessage> new_messages;
  // The prompt's text and ids (PreparedChat::prompt) and the tokenizer that decodes the reply;
  // null prompt: the conversation is kept without ids and its next turn encodes it whole.
  std::shared_ptr<const ConversationTokens> prompt;
  std::shared_ptr<const Tokenizer> tokenizer;

  // The turn's new messages out of `parsed` (parse_chat_request with `history` inserted before
  // its message `history_at`): those after the history.
  void take_new_messages(const OpenAiRequest& parsed, size_t history_at);
  // Makes `request` (prepared from the conversation) a whole-prompt turn of `session` when the
  // turn is kept; a turn kept nowhere runs without a session.
  void apply(Request* request) const;
  // The turn completed with `reply` (assistant_message), sampled as `reply_ids` (the stop token
  // included): the conversation and the reply go into `store` under `key` (no-op without a
  // store), with the prompt's ids followed by `reply_ids`. `response_json`: what the store
  // answers for the key (HTTP's GET /v1/responses/{id}); empty for gRPC. The reply is checked
  // as a client's message would be (parse_chat_message), with invalid UTF-8 replaced as a
  // request body's serialization replaces it; a reply that fails (never, for the replies
  // ReplyTranscript builds) keeps nothing, so the conversation cannot be continued.
  void record(nlohmann::ordered_json reply, std::span<const int32_t> reply_ids,
              std::string response_json) const;
};

// A reply as the assistant message the chat template renders in the next turn's history.
// `tool_calls`: OpenAI's [{"id", "type": "function", "function": {"name", "arguments"}}].
nlohmann::ordered_json assistant_message(std::string_view content, std::string_view reasoning,
                                         nlohmann::ordered_json tool_calls);

// Collects one choice's streamed reply (its ChatDeltas, as ChatReplyReader gives them, and the
// ids each event carried) into assistant_message() and the ids as sampled. Not thread-safe; one
// per choice.
class ReplyTranscript {
 public:
  void add(const ChatDelta& delta, std::span<const int32_t> token_ids);
  nlohmann::ordered_json message() const;
  const std::vector<int32_t>& token_ids() const { return token_ids_; }

 private:
  struct Call {
    std::string id, name, arguments;
  };
  std::string content_, reasoning_;
  std::vector<Call> calls_;  // by the parser's call index
  std::vector<int32_t> token_ids_;
};

}  // namespace loom
