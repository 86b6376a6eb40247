#include "server/http_routes.h"

#include <ctime>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/core/status.h"
#include "nlohmann/json.hpp"
#include "server/openai_request.h"

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

HttpReply models(const HttpContext& ctx) {
  json model = {{"id", ctx.options.served_model_name},
                {"object", "model"},
                {"created", ctx.started_unix},
                {"owned_by", "loom"},
                {"max_model_len", ctx.engine->max_model_len()},
                {"loom_vocab_size", ctx.tokenizer->vocab_size()},
                {"loom_untrained", ctx.options.untrained}};
  if (ctx.options.untrained) model["loom_note"] = kUntrainedNote;
  return json_reply(200, dump({{"object", "list"}, {"data", json::array({model})}}));
}

HttpReply tokenize(const HttpContext& ctx, std::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return error(400, "the request body must be a JSON object");
  std::vector<int32_t> ids;
  if (j.contains("messages")) {
    auto req = parse_chat_request(body);
    if (!req.ok()) return error_reply(api_error_from_status(req.status()));
    auto reqs =
        build_engine_requests(*req, *ctx.tokenizer, ctx.format, ctx.engine->max_model_len());
    if (!reqs.ok()) return error_reply(api_error_from_status(reqs.status()));
    ids = (*reqs)[0].prompt;
  } else {
    auto it = j.find("prompt");
    if (it == j.end() || !it->is_string()) return error(400, "prompt: must be a string", "prompt");
    ids = ctx.tokenizer->encode(it->get<std::string>(), /*allow_special=*/true);
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
  if (!req->model.empty() && req->model != ctx.options.served_model_name) {
    ApiError e = make_api_error(
        404,
        absl::StrCat("The model `", req->model, "` does not exist (this server serves `",
                     ctx.options.served_model_name, "`)"),
        "model");
    e.code = "model_not_found";
    result.reply = error_reply(e);
    return result;
  }
  auto requests =
      build_engine_requests(*req, *ctx.tokenizer, ctx.format, ctx.engine->max_model_len());
  if (!requests.ok()) {
    result.reply = error_reply(api_error_from_status(requests.status()));
    return result;
  }
  if (ctx.engine->stats().waiting >= ctx.options.max_queue) {
    result.reply = error(429, absl::StrCat("the server's queue is full (", ctx.options.max_queue,
                                           " requests waiting); retry later"));
    return result;
  }
  const uint64_t serial = ctx.next_request.fetch_add(1);
  auto gen = std::make_unique<Generation>();
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
  rc.parse_tools = req->parse_tools();
  rc.format = ctx.format;
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

RouteResult handle_request(HttpContext& ctx, const HttpRequestView& request) {
  std::string_view path = request.target.substr(0, request.target.find('?'));
  const bool get = request.method == "GET", post = request.method == "POST";
  struct Route {
    std::string_view path;
    bool post;
  };
  static constexpr Route kRoutes[] = {
      {"/v1/completions", true}, {"/v1/chat/completions", true},
      {"/v1/models", false},     {"/health", false},
      {"/metrics", false},       {"/tokenize", true},
      {"/detokenize", true},
  };
  const Route* route = nullptr;
  for (const Route& r : kRoutes) {
    if (r.path == path) route = &r;
  }
  RouteResult result;
  if (!route) {
    result.reply = error(404, absl::StrCat("no route ", absl_sv(path)));
    return result;
  }
  if ((route->post && !post) || (!route->post && !get)) {
    result.reply = error(405, absl::StrCat(absl_sv(path), " takes ", route->post ? "POST" : "GET"));
    result.reply.headers.push_back({"Allow", route->post ? "POST" : "GET"});
    return result;
  }
  if (path.substr(0, 4) == "/v1/" && !ctx.options.api_key.empty()) {
    std::string expected = absl::StrCat("Bearer ", ctx.options.api_key);
    if (request.authorization != expected) {
      ApiError e = make_api_error(401, "missing or wrong API key (Authorization: Bearer ...)");
      e.code = "invalid_api_key";
      result.reply = error_reply(e);
      return result;
    }
  }
  if (path == "/health") {
    result.reply = ctx.draining ? error(503, "draining") : json_reply(200, "{\"status\":\"ok\"}");
    return result;
  }
  if (path == "/metrics") {
    result.reply.content_type = "text/plain; version=0.0.4; charset=utf-8";
    result.reply.body = ctx.metrics->render(ctx.engine->stats());
    return result;
  }
  if (ctx.draining) {
    result.reply = error(503, "the server is shutting down");
    return result;
  }
  if (path == "/v1/models")
    result.reply = models(ctx);
  else if (path == "/tokenize")
    result.reply = tokenize(ctx, request.body);
  else if (path == "/detokenize")
    result.reply = detokenize(ctx, request.body);
  else
    return generate(ctx, request.body, path == "/v1/chat/completions");
  return result;
}

}  // namespace loom
