// Route handlers of the HTTP frontend: parse, validate, submit to the engine. Plain replies are
// returned whole; generations come back as a Generation the session drives (stream pump ->
// response builder -> socket). Handlers run on an I/O thread and never block on the engine
// (submit and stats only take the engine's inbox mutex).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/request_stream.h"
#include "server/http_context.h"
#include "server/http_response.h"
#include "server/openai_response.h"

namespace loom {

struct HttpRequestView {
  std::string_view method;         // "GET", "POST", ...
  std::string_view target;         // path and query
  std::string_view authorization;  // the Authorization header, if any
  std::string_view body;
};

// A submitted request: its engine streams (one per prompt) and how to render their events.
struct Generation {
  std::unique_ptr<OpenAiResponseBuilder> builder;
  std::vector<std::shared_ptr<RequestStream>> streams;
  bool stream = false;
  std::chrono::steady_clock::time_point received;
};

struct RouteResult {
  HttpReply reply;                         // when generation is null
  std::unique_ptr<Generation> generation;  // a submitted request
};

RouteResult handle_request(HttpContext& ctx, const HttpRequestView& request);

}  // namespace loom
