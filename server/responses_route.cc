#include "server/responses_route.h"

#include <ctime>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "core/status.h"
#include "server/chat_request.h"
#include "server/chat_session.h"
#include "server/openai_error.h"
#include "server/openai_request.h"
#include "server/responses_builder.h"
#include "server/responses_request.h"

namespace loom {
namespace {

using ojson = nlohmann::ordered_json;

// OpenAI's answer for an id it does not hold (unknown, expired, deleted or never stored).
HttpReply not_found(const std::string& id, const char* param) {
  ApiError e = make_api_error(
      404,
      absl::StrCat("Response with id '", id.substr(0, 200),
                   "' not found (unknown, expired, deleted, or created with store: false)"),
      param);
  e.code = param[0] != '\0' ? "previous_response_not_found" : "not_found";
  return error_reply(e);
}

// The fields of the Response object that repeat the request, as OpenAI echoes them.
ojson echo(const ResponsesRequest& req) {
  ojson e = ojson::object();
  e["instructions"] = req.instructions ? ojson(*req.instructions) : ojson(nullptr);
  e["max_output_tokens"] = req.max_output_tokens ? ojson(*req.max_output_tokens) : ojson(nullptr);
  e["parallel_tool_calls"] = true;
  e["previous_response_id"] =
      req.previous_response_id ? ojson(*req.previous_response_id) : ojson(nullptr);
  e["reasoning"] = {{"effort", nullptr}, {"summary", nullptr}};
  e["store"] = req.store;
  e["temperature"] = req.temperature ? ojson(*req.temperature) : ojson(1.0);
  e["text"] = {{"format", {{"type", "text"}}}};
  e["tool_choice"] = req.tool_choice;
  e["tools"] = req.tools;
  e["top_p"] = req.top_p ? ojson(*req.top_p) : ojson(1.0);
  e["truncation"] = "disabled";
  e["metadata"] = req.metadata;
  return e;
}

}  // namespace

RouteResult create_response(HttpContext& ctx, std::string_view body) {
  RouteResult result;
  const auto received = std::chrono::steady_clock::now();
  auto req = parse_responses_request(body);
  if (!req.ok()) {
    result.reply = error_reply(api_error_from_status(req.status()));
    return result;
  }
  const std::string model = req->chat_fields.value("model", std::string());
  if (auto refused = unknown_model_reply(ctx, model)) {
    result.reply = *std::move(refused);
    return result;
  }
  const uint64_t serial = ctx.next_request.fetch_add(1);
  const std::string id = absl::StrFormat("resp_%x%08x", ctx.started_unix, serial);
  // The conversation so far: the previous response's messages, its reply included.
  std::shared_ptr<const ChatHistory> history;
  std::shared_ptr<const ConversationTokens> history_tokens;  // what the model saw of `history`
  std::string session = absl::StrCat("responses:", id);
  if (req->previous_response_id) {
    auto previous = ctx.responses->get(*req->previous_response_id, absl::Now());
    if (!previous) {
      result.reply = not_found(*req->previous_response_id, "previous_response_id");
      return result;
    }
    history = std::move(previous->messages);
    history_tokens = std::move(previous->tokens);
    session = std::move(previous->session);
  }
  // Only this turn's messages are parsed: the stored ones were checked when they came in and are
  // kept parsed (server/chat_history.h). They go after the instructions.
  const size_t history_at = req->instructions ? 1 : 0;
  auto chat =
      parse_chat_request(responses_chat_body(*req, ojson::array()), history.get(), history_at);
  if (!chat.ok()) {
    result.reply = error_reply(api_error_from_status(chat.status()));
    return result;
  }
  // Instructions render before the history, so with instructions the kept text is no prefix and
  // the whole rendering is encoded (a turn with the same instructions as the last continues).
  auto prepared = prepare_chat(*chat, *ctx.tokenizer, ctx.chat, ctx.engine->max_model_len(),
                               history_tokens.get(), /*keep_prompt=*/req->store);
  if (!prepared.ok()) {
    result.reply = error_reply(api_error_from_status(prepared.status()));
    return result;
  }
  // Only a stored response can be continued, so only it needs a session. store: false with a
  // previous response computes the whole conversation and leaves the session as it was.
  ConversationTurn kept;
  if (req->store) {
    kept.store = ctx.responses;
    kept.key = id;
    kept.session = std::move(session);
    kept.history = std::move(history);
    kept.take_new_messages(*chat, history_at);
    kept.prompt = prepared->prompt;
    kept.tokenizer = ctx.tokenizer;
  }
  Request request = std::move(prepared->request);
  request.tag = absl::StrCat("resp-", serial);
  kept.apply(&request);
  AdmissionGate::Ticket ticket;
  if (auto refused = admit(ctx, 1, &ticket)) {
    result.reply = *std::move(refused);
    return result;
  }
  auto stream = ctx.engine->submit(std::move(request));
  if (!stream.ok()) {
    result.reply = error_reply(api_error_from_status(stream.status()));
    return result;
  }
  ResponsesTurn turn;
  turn.id = id;
  turn.created_at = static_cast<int64_t>(std::time(nullptr));
  turn.model = ctx.options.served_model_name;
  turn.output = prepared->output;
  turn.echo = echo(*req);
  turn.kept = std::move(kept);
  auto builder = std::make_unique<ResponsesBuilder>(std::move(turn), req->stream);
  auto gen = std::make_unique<Generation>();
  gen->ticket = std::move(ticket);
  gen->stream = req->stream;
  gen->received = received;
  if (req->stream) gen->stream_head = builder->stream_head();
  gen->streams.push_back(std::move(stream).value());
  gen->builder = std::move(builder);
  result.generation = std::move(gen);
  return result;
}

HttpReply get_response(HttpContext& ctx, const std::string& id) {
  auto entry = ctx.responses->get(id, absl::Now());
  if (!entry) return not_found(id, "");
  return json_reply(200, entry->response_json);
}

HttpReply delete_response(HttpContext& ctx, const std::string& id) {
  std::string session;
  bool latest = false;
  if (!ctx.responses->erase(id, absl::Now(), &session, &latest)) return not_found(id, "");
  // The session holds this response's conversation only while no later turn continued it; then
  // its tokens and kept cache go too. (NotFound: expired already, nothing to free.)
  if (latest) (void)ctx.engine->delete_session(session);
  ojson reply = {{"id", id}, {"object", "response"}, {"deleted", true}};
  return json_reply(200, reply.dump());
}

}  // namespace loom
