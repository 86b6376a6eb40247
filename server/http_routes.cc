#include "server/http_routes.h"

#include <algorithm>
#include <cctype>
#include <ctime>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "nlohmann/json.hpp"
#include "server/chat_request.h"
#include "server/openai_request.h"
#include "server/readiness.h"
#include "server/responses_route.h"

namespace loom {
namespace {

using json = nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

HttpReply error(int status, std::string message, std::string param = "") {
  return error_reply(make_api_error(status, std::move(message), std::move(param)));
}

constexpr std::string_view kUntrainedNote =
    "this model has random (untrained) weights: its output is meaningless text, useful only to "
    "exercise the API";

// OpenAI's Model object, with Loom's extra fields.
json model_json(const HttpContext& ctx) {
  json model = {{"id", ctx.options.served_model_name},
                {"object", "model"},
                {"created", ctx.started_unix},
                {"owned_by", "loom"},
                {"max_model_len", ctx.engine->max_model_len()},
                {"loom_vocab_size", ctx.tokenizer->vocab_size()},
                {"loom_untrained", ctx.options.untrained}};
  if (ctx.options.untrained) model["loom_note"] = kUntrainedNote;
  return model;
}

HttpReply models(const HttpContext& ctx) {
  return json_reply(200, dump({{"object", "list"}, {"data", json::array({model_json(ctx)})}}));
}

HttpReply model(const HttpContext& ctx, const std::string& id) {
  if (id != ctx.options.served_model_name) {
    ApiError e =
        make_api_error(404,
                       absl::StrCat("The model `", id, "` does not exist (this server serves `",
                                    ctx.options.served_model_name, "`)"),
                       "model");
    e.code = "model_not_found";
    return error_reply(e);
  }
  return json_reply(200, dump(model_json(ctx)));
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "%2F" -> "/" (model ids may hold '/'); malformed escapes stay as they are.
std::string percent_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hex_value(s[i + 1]) >= 0 && hex_value(s[i + 2]) >= 0) {
      out += static_cast<char>(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The host name of a Host header value or --host: port and IPv6 brackets removed, lower case,
// without a trailing dot.
std::string host_name(std::string_view value) {
  std::string_view v = trim(value);
  std::string_view name = v;
  if (!v.empty() && v[0] == '[') {
    const size_t close = v.find(']');
    name = close == std::string_view::npos ? v : v.substr(1, close - 1);
  } else if (const size_t colon = v.find(':');
             colon != std::string_view::npos && v.find(':', colon + 1) == std::string_view::npos) {
    name = v.substr(0, colon);  // one colon: name:port (more: a bare IPv6 address)
  }
  std::string out(name);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

// localhost, ::1 or a dotted quad in 127.0.0.0/8.
bool is_loopback_name(std::string_view name) {
  if (name == "localhost" || name == "::1") return true;
  int octets = 0, value = 0, digits = 0;
  for (size_t i = 0; i <= name.size(); ++i) {
    if (i == name.size() || name[i] == '.') {
      if (digits == 0 || value > 255 || (octets == 0 && value != 127)) return false;
      ++octets;
      value = digits = 0;
    } else if (name[i] >= '0' && name[i] <= '9' && digits < 3) {
      value = value * 10 + (name[i] - '0');
      ++digits;
    } else {
      return false;
    }
  }
  return octets == 4;
}

// GET /ready (server/readiness.h): 200 once every start-up check passed, 503 before and from the
// drain on, with the checks in the body either way.
HttpReply ready_reply(const HttpContext& ctx) {
  const Readiness* readiness = ctx.options.readiness;
  if (ctx.draining && (readiness == nullptr || !readiness->draining())) {
    return json_reply(503, dump({{"status", "draining"},
                                 {"reason", "the server is draining: it takes no new requests"}}));
  }
  if (readiness == nullptr) return json_reply(200, dump({{"status", "ready"}}));
  return json_reply(readiness->ready() ? 200 : 503, readiness->to_json());
}

HttpReply tokenize(const HttpContext& ctx, std::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return error(400, "the request body must be a JSON object");
  std::vector<int32_t> ids;
  if (j.contains("messages")) {
    auto req = parse_chat_request(body);
    if (!req.ok()) return error_reply(api_error_from_status(req.status()));
    auto reqs = build_engine_requests(*req, *ctx.tokenizer, ctx.chat.format,
                                      ctx.engine->max_model_len(), ctx.chat.chat_template.get());
    if (!reqs.ok()) return error_reply(api_error_from_status(reqs.status()));
    ids = (*reqs)[0].prompt;
  } else {
    auto it = j.find("prompt");
    if (it == j.end() || !it->is_string()) return error(400, "prompt: must be a string", "prompt");
    // As /v1/completions does: special tokens count unless the request says otherwise.
    bool parse_special = true;
    if (auto p = j.find("parse_special_tokens"); p != j.end() && !p->is_null()) {
      if (!p->is_boolean()) {
        return error(400, "parse_special_tokens: must be a boolean", "parse_special_tokens");
      }
      parse_special = p->get<bool>();
    }
    ids = ctx.tokenizer->encode(it->get<std::string>(), parse_special);
  }
  return json_reply(200, dump({{"tokens", ids},
                               {"count", ids.size()},
                               {"max_model_len", ctx.engine->max_model_len()}}));
}

HttpReply detokenize(const HttpContext& ctx, std::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return error(400, "the request body must be a JSON object");
  auto it = j.find("tokens");
  if (it == j.end() || !it->is_array()) return error(400, "tokens: must be a list", "tokens");
  std::vector<int32_t> ids;
  for (const json& t : *it) {
    if (!t.is_number_integer()) return error(400, "tokens: must be integers", "tokens");
    int64_t v = t.is_number_unsigned()
                    ? static_cast<int64_t>(std::min<uint64_t>(t.get<uint64_t>(), INT32_MAX))
                    : t.get<int64_t>();
    if (v < 0 || v >= ctx.tokenizer->vocab_size()) {
      return error(400,
                   absl::StrCat("tokens: id out of range [0, ", ctx.tokenizer->vocab_size(), ")"),
                   "tokens");
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  auto text = ctx.tokenizer->decode(ids);
  if (!text.ok()) return error_reply(api_error_from_status(text.status()));
  return json_reply(200, dump({{"prompt", *text}}));
}

RouteResult generate(HttpContext& ctx, std::string_view body, bool chat) {
  RouteResult result;
  const auto received = std::chrono::steady_clock::now();
  auto req = chat ? parse_chat_request(body) : parse_completion_request(body);
  if (!req.ok()) {
    result.reply = error_reply(api_error_from_status(req.status()));
    return result;
  }
  if (auto refused = unknown_model_reply(ctx, req->model)) {
    result.reply = *std::move(refused);
    return result;
  }
  // Chat: rendered and read as every frontend does it (server/chat_request.h).
  absl::StatusOr<std::vector<Request>> requests;
  ChatOutputOptions output;
  if (chat) {
    auto prepared = prepare_chat(*req, *ctx.tokenizer, ctx.chat, ctx.engine->max_model_len());
    if (prepared.ok()) {
      output = prepared->output;
      requests = std::vector<Request>();
      requests->push_back(std::move(prepared->request));
    } else {
      requests = prepared.status();
    }
  } else {
    requests =
        build_engine_requests(*req, *ctx.tokenizer, ctx.chat.format, ctx.engine->max_model_len());
  }
  if (!requests.ok()) {
    result.reply = error_reply(api_error_from_status(requests.status()));
    return result;
  }
  // One admission rule for every frontend (server/admission.h): atomic, so simultaneous
  // requests cannot overshoot --max_queue.
  AdmissionGate::Ticket ticket;
  if (auto refused = admit(ctx, static_cast<int>(requests->size()), &ticket)) {
    result.reply = *std::move(refused);
    return result;
  }
  const uint64_t serial = ctx.next_request.fetch_add(1);
  auto gen = std::make_unique<Generation>();
  gen->ticket = std::move(ticket);
  gen->stream = req->stream;
  gen->received = received;
  for (Request& r : *requests) {
    r.tag = absl::StrCat(chat ? "chat-" : "cmpl-", serial);
    auto stream = ctx.engine->submit(std::move(r));
    if (!stream.ok()) {
      for (auto& s : gen->streams) ctx.engine->cancel(s->id());
      result.reply = error_reply(api_error_from_status(stream.status()));
      return result;
    }
    gen->streams.push_back(std::move(stream).value());
  }
  ResponseContext rc;
  rc.chat = chat;
  rc.stream = req->stream;
  rc.include_usage = req->include_usage;
  rc.logprobs = req->logprobs;
  if (chat) rc.output = output;
  rc.id = absl::StrFormat("%s-%x%08x", chat ? "chatcmpl" : "cmpl", ctx.started_unix, serial);
  rc.created = static_cast<int64_t>(std::time(nullptr));
  rc.model = ctx.options.served_model_name;
  rc.num_prompts = static_cast<int>(gen->streams.size());
  rc.n = req->params.n;
  rc.tokenizer = ctx.tokenizer.get();
  gen->builder = std::make_unique<OpenAiResponseBuilder>(std::move(rc));
  result.generation = std::move(gen);
  return result;
}

}  // namespace

std::optional<HttpReply> unknown_model_reply(const HttpContext& ctx, const std::string& model) {
  if (model.empty() || model == ctx.options.served_model_name) return std::nullopt;
  ApiError e =
      make_api_error(404,
                     absl::StrCat("The model `", model, "` does not exist (this server serves `",
                                  ctx.options.served_model_name, "`)"),
                     "model");
  e.code = "model_not_found";
  return error_reply(e);
}

std::optional<HttpReply> admit(HttpContext& ctx, int requests, AdmissionGate::Ticket* ticket) {
  absl::Status st = ctx.admission->try_acquire(requests, ticket);
  if (st.ok()) return std::nullopt;
  HttpReply reply = error_reply(api_error_from_status(st));
  if (absl::IsResourceExhausted(st))
    reply.headers.push_back({"Retry-After", absl::StrCat(kRetryAfterSeconds)});
  return reply;
}

std::string_view request_path(std::string_view target, std::string_view* authority) {
  std::string_view path = target.substr(0, target.find('?'));
  for (std::string_view scheme : {"http://", "https://"}) {
    if (path.size() >= scheme.size() && iequals(path.substr(0, scheme.size()), scheme)) {
      std::string_view rest = path.substr(scheme.size());
      const size_t slash = rest.find('/');
      *authority = rest.substr(0, slash);
      return slash == std::string_view::npos ? std::string_view("/") : rest.substr(slash);
    }
  }
  return path;
}

bool host_allowed(std::string_view host, std::string_view bind_host,
                  const std::vector<std::string>& allowed_hosts) {
  if (std::find(allowed_hosts.begin(), allowed_hosts.end(), "*") != allowed_hosts.end()) {
    return true;
  }
  const std::string name = host_name(host);
  if (is_loopback_name(name)) return true;
  for (const std::string& allowed : allowed_hosts) {
    if (host_name(allowed) == name) return true;
  }
  return allowed_hosts.empty() && !is_loopback_name(host_name(bind_host));
}

bool is_json_content_type(std::string_view content_type) {
  return iequals(trim(content_type.substr(0, content_type.find(';'))), "application/json");
}

RouteResult handle_request(HttpContext& ctx, const HttpRequestView& request) {
  RouteResult result;
  std::string_view host = request.host;
  const bool has_host = request.has_host || request.target.find("://") != std::string_view::npos;
  std::string_view path = request_path(request.target, &host);
  // Checked first: a page that rebinds its DNS name to this address must learn nothing, not
  // even which routes exist. A request without Host comes from no browser.
  if (has_host && !host_allowed(host, ctx.options.host, ctx.options.allowed_hosts)) {
    ApiError e = make_api_error(
        403, absl::StrCat("the Host '", absl_sv(host.substr(0, 200)),
                          "' is not allowed: this server is bound to a loopback address and only "
                          "answers loopback names (see --allowed_hosts)"));
    e.code = "host_not_allowed";
    result.reply = error_reply(e);
    return result;
  }
  const bool get = request.method == "GET", post = request.method == "POST",
             del = request.method == "DELETE";
  // GET /v1/models/{id}: the id is the rest of the path (served names may contain '/').
  std::string model_id;
  constexpr std::string_view kModelPrefix = "/v1/models/";
  if (path.size() > kModelPrefix.size() && path.substr(0, kModelPrefix.size()) == kModelPrefix) {
    model_id = percent_decode(path.substr(kModelPrefix.size()));
    path = "/v1/models/{id}";
  }
  // GET and DELETE /v1/responses/{id}.
  std::string response_id;
  constexpr std::string_view kResponsePrefix = "/v1/responses/";
  if (path.size() > kResponsePrefix.size() &&
      path.substr(0, kResponsePrefix.size()) == kResponsePrefix) {
    response_id = percent_decode(path.substr(kResponsePrefix.size()));
    path = "/v1/responses/{id}";
  }
  struct Route {
    std::string_view path;
    bool post;
    bool del = false;  // DELETE as well as GET
  };
  static constexpr Route kRoutes[] = {
      {"/v1/completions", true},
      {"/v1/chat/completions", true},
      {"/v1/models", false},
      {"/health", false},
      {"/metrics", false},
      {"/tokenize", true},
      {"/detokenize", true},
      {"/v1/models/{id}", false},
      {"/ready", false},
      {"/v1/responses", true},
      {"/v1/responses/{id}", false, true},
  };
  const Route* route = nullptr;
  for (const Route& r : kRoutes) {
    if (r.path == path) route = &r;
  }
  if (!route) {
    result.reply = error(404, absl::StrCat("no route ", absl_sv(path)));
    return result;
  }
  if ((route->post && !post) || (!route->post && !get && !(route->del && del))) {
    const char* allow = route->post ? "POST" : route->del ? "GET, DELETE" : "GET";
    result.reply = error(405, absl::StrCat(absl_sv(path), " takes ", allow));
    result.reply.headers.push_back({"Allow", allow});
    return result;
  }
  // The key guards everything but the probes a supervisor and a scraper need (the gRPC frontend
  // leaves grpc.health.v1 open likewise).
  if (path != "/health" && path != "/ready" && path != "/metrics" && !ctx.options.api_key.empty()) {
    if (!api_key_matches(request.authorization, ctx.options.api_key)) {
      ApiError e = make_api_error(401, "missing or wrong API key (Authorization: Bearer ...)");
      e.code = "invalid_api_key";
      result.reply = error_reply(e);
      result.reply.headers.push_back({"WWW-Authenticate", "Bearer"});  // RFC 6750
      return result;
    }
  }
  // Every POST route takes JSON. Refusing other types keeps a web page's "simple" cross-origin
  // request (text/plain, form encodings, or none: no CORS preflight) from reaching the engine.
  if (route->post && !is_json_content_type(request.content_type)) {
    result.reply = error(415, "the request body must be JSON: send Content-Type: application/json");
    return result;
  }
  // JSON text cannot hold a raw NUL, but the parser stops at one as if the input ended there.
  if (route->post && request.body.find('\0') != std::string_view::npos) {
    result.reply = error(400, "the request body is not valid JSON (it holds a NUL byte)");
    return result;
  }
  if (path == "/health") {
    result.reply = ctx.draining ? error(503, "draining") : json_reply(200, "{\"status\":\"ok\"}");
    return result;
  }
  if (path == "/ready") {
    result.reply = ready_reply(ctx);
    return result;
  }
  if (path == "/metrics") {
    result.reply.content_type = "text/plain; version=0.0.4; charset=utf-8";
    result.reply.body = ctx.metrics->render(*ctx.engine);
    return result;
  }
  if (ctx.draining) {
    result.reply = error(503, "the server is shutting down");
    return result;
  }
  if (path == "/v1/models")
    result.reply = models(ctx);
  else if (path == "/v1/models/{id}")
    result.reply = model(ctx, model_id);
  else if (path == "/tokenize")
    result.reply = tokenize(ctx, request.body);
  else if (path == "/detokenize")
    result.reply = detokenize(ctx, request.body);
  else if (path == "/v1/responses")
    return create_response(ctx, request.body);
  else if (path == "/v1/responses/{id}")
    result.reply = del ? delete_response(ctx, response_id) : get_response(ctx, response_id);
  else
    return generate(ctx, request.body, path == "/v1/chat/completions");
  return result;
}

}  // namespace loom
