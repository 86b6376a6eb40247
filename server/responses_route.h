// The Responses API routes of the HTTP frontend: POST /v1/responses, GET and DELETE
// /v1/responses/{id}. handle_request (http_routes.h) checks the host, API key, content type and
// drain first, as for every route; these parse, look up the stored conversation, and submit
// through the same chat preparation (server/chat_request.h) and admission gate as
// /v1/chat/completions.
//
// A stored response maps to an engine session (Request::session), kept as gRPC sessions are
// (server/chat_session.h). Each turn renders the whole
// conversation (the previous responses' messages and the new input) through the chat template
// and tokenizes it, and submits it as a whole-prompt session turn
// (Request::session_whole_prompt): when the session's token history (the previous prompt and
// every token the model generated) is a prefix of those tokens, the engine continues from the
// cache it kept and computes only the rest; when it is not (the template renders a past reply
// differently from the tokens the model produced, a fork from an older response, other
// instructions), the session starts over from the rendered prompt. Either way the model sees
// exactly the tokens /v1/chat/completions would give it for the same messages.
#pragma once

#include <string>
#include <string_view>

#include "server/http_context.h"
#include "server/http_routes.h"

namespace loom {

RouteResult create_response(HttpContext& ctx, std::string_view body);
HttpReply get_response(HttpContext& ctx, const std::string& id);
HttpReply delete_response(HttpContext& ctx, const std::string& id);

}  // namespace loom
