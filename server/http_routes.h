// Route handlers of the HTTP frontend: parse, validate, submit to the engine. Plain replies are
// returned whole; generations come back as a Generation the session drives (stream pump ->
// response builder -> socket). Handlers run on an I/O thread and never block on the engine
// (submit and stats only take the engine's inbox mutex).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/request_stream.h"
#include "server/admission.h"
#include "server/http_context.h"
#include "server/http_response.h"
#include "server/openai_response.h"
#include "server/response_renderer.h"

namespace loom {

struct HttpRequestView {
  std::string_view method;         // "GET", "POST", ...
  std::string_view target;         // origin form (path and query) or absolute form (http://h/p)
  std::string_view authorization;  // the Authorization header, if any
  std::string_view body;
  std::string_view host;          // the Host header, if any
  bool has_host = false;          // HTTP/1.0 clients may send none
  std::string_view content_type;  // the Content-Type header, if any
};

// The path of a request target (RFC 9112 3.2): origin form "/p?q" -> "/p"; absolute form
// "http://authority/p?q" -> "/p" (or "/"), with `*authority` set to the target's authority, which
// then replaces the Host header. Anything else is returned unchanged (no route matches it).
std::string_view request_path(std::string_view target, std::string_view* authority);

// Whether the Host header value `host` (name or address, optional port) may reach this server:
// always when `allowed_hosts` holds "*"; else when the host is a loopback name (localhost,
// 127.0.0.0/8, [::1]) or listed in `allowed_hosts`; and unlisted hosts are only refused when
// `bind_host` is a loopback address or `allowed_hosts` is not empty. Keeps a web page that
// rebinds its DNS name to 127.0.0.1 from driving a local server.
bool host_allowed(std::string_view host, std::string_view bind_host,
                  const std::vector<std::string>& allowed_hosts);

// Whether `content_type` is application/json (any case, parameters such as charset allowed).
bool is_json_content_type(std::string_view content_type);

// A submitted request: its engine streams (one per prompt) and how to render their events.
struct Generation {
  std::unique_ptr<ResponseRenderer> builder;  // OpenAiResponseBuilder or ResponsesBuilder
  std::vector<std::shared_ptr<RequestStream>> streams;
  bool stream = false;
  std::chrono::steady_clock::time_point received;
  AdmissionGate::Ticket ticket;  // counts against --max_queue until the generation is destroyed
  // Streaming: payloads sent (framed by the builder) right after the response head, before any
  // engine event (the Responses API's response.created and response.in_progress).
  std::vector<std::string> stream_head;
};

struct RouteResult {
  HttpReply reply;                         // when generation is null
  std::unique_ptr<Generation> generation;  // a submitted request
};

RouteResult handle_request(HttpContext& ctx, const HttpRequestView& request);

// For the generating routes. A 404 (OpenAI's model_not_found) when `model` is set and is not the
// served model's name.
std::optional<HttpReply> unknown_model_reply(const HttpContext& ctx, const std::string& model);
// The admission gate (server/admission.h) for `requests` engine requests: nullopt and `*ticket`
// held, or the refusal (429 with Retry-After, 503 while draining).
std::optional<HttpReply> admit(HttpContext& ctx, int requests, AdmissionGate::Ticket* ticket);

}  // namespace loom
