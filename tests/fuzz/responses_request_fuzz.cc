// Fuzzes the Responses API request parser (server/responses_request.h): any bytes as a
// POST /v1/responses body; when accepted, the chat body of the turn with no history and with a
// stored one, through HTTP's chat parser and the translation into engine requests with the
// byte-level tokenizer and every chat format; the error mapping; and the session-id check both
// frontends share (server/chat_session.h) on the body's bytes. Nothing may crash, hang or leak;
// accepted requests must satisfy what the parser promises.
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "server/chat_session.h"
#include "server/openai_error.h"
#include "server/openai_request.h"
#include "server/responses_request.h"

namespace {

using ojson = nlohmann::ordered_json;

const loom::Tokenizer& tokenizer() {
  static const auto* tok = loom::Tokenizer::byte_level().release();
  return *tok;
}

// A stored conversation as a previous turn leaves it: a user message and the reply, with a call.
const ojson& history() {
  static const ojson* h = new ojson(ojson::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
    {"role": "assistant", "content": "It is sunny."}])"));
  return *h;
}

void refused(const absl::Status& st) {
  loom::ApiError e = loom::api_error_from_status(st);
  LOOM_CHECK(e.http_status == 400, "parser error mapped to %d", e.http_status);
  (void)loom::api_error_json(e);
}

void exercise_chat(const std::string& body, loom::ChatFormat format, bool must_parse) {
  absl::StatusOr<loom::OpenAiRequest> chat = loom::parse_chat_request(body);
  // parse_responses_request checks its chat body parses: with no history it must.
  LOOM_CHECK(chat.ok() || !must_parse, "accepted Responses body gave a refused chat body: %s",
             std::string(chat.status().message()).c_str());
  if (!chat.ok()) return refused(chat.status());
  LOOM_CHECK(chat->chat && !chat->messages.empty());
  LOOM_CHECK(!chat->max_tokens || *chat->max_tokens >= 1);
  auto built = loom::build_engine_requests(*chat, tokenizer(), format, 4096);
  if (!built.ok()) return (void)loom::api_error_json(loom::api_error_from_status(built.status()));
  for (const loom::Request& r : *built) {
    LOOM_CHECK(!r.prompt.empty());
    LOOM_CHECK(r.params.max_tokens >= 1);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1 << 16)) return 0;
  std::string_view body(reinterpret_cast<const char*>(data), size);
  const loom::ChatFormat format = static_cast<loom::ChatFormat>(size % 4);

  // The session-id rule on a prefix of the bytes: accepted ids are what it promises.
  const std::string_view id = body.substr(0, size % (loom::kMaxSessionIdBytes + 8));
  if (loom::check_session_id(id, "session_id").ok()) {
    LOOM_CHECK(!id.empty() && id.size() <= loom::kMaxSessionIdBytes);
    for (const char c : id)
      LOOM_CHECK(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' ||
                 c == '-');
  }

  absl::StatusOr<loom::ResponsesRequest> req = loom::parse_responses_request(body);
  if (!req.ok()) {
    refused(req.status());
    return 0;
  }
  LOOM_CHECK(req->input_messages.is_array() && !req->input_messages.empty());
  LOOM_CHECK(req->chat_fields.is_object() && !req->chat_fields.contains("messages"));
  LOOM_CHECK(!req->max_output_tokens || *req->max_output_tokens >= 1);
  LOOM_CHECK(!req->previous_response_id || !req->previous_response_id->empty());
  exercise_chat(loom::responses_chat_body(*req, ojson::array()), format, /*must_parse=*/true);
  exercise_chat(loom::responses_chat_body(*req, history()), format, /*must_parse=*/false);
  return 0;
}
