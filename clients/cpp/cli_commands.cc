#include "clients/cpp/cli_commands.h"

#include <chrono>
#include <istream>
#include <ostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace loom::client {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

struct Outcome {
  std::string text;
  std::string finish_reason;
  Usage usage;
  double ttft_ms = -1;  // streamed replies only
  double total_ms = 0;
};

void print_usage_line(const Outcome& o, const CliIo& io) {
  std::string line =
      absl::StrFormat("[finish %s | prompt %d tokens | completion %d tokens | %.0f ms",
                      o.finish_reason.empty() ? "?" : o.finish_reason, o.usage.prompt_tokens,
                      o.usage.completion_tokens, o.total_ms);
  if (o.ttft_ms >= 0) {
    absl::StrAppendFormat(&line, " | first token %.0f ms", o.ttft_ms);
    if (o.usage.completion_tokens > 1 && o.total_ms > o.ttft_ms) {
      absl::StrAppendFormat(&line, " | %.1f tokens/s after it",
                            (o.usage.completion_tokens - 1) * 1000.0 / (o.total_ms - o.ttft_ms));
    }
  }
  *io.err << line << "]\n";
}

// Sends one generation request, printing text to `io.out` as it arrives (or the raw JSON).
absl::StatusOr<Outcome> generate(HttpClient& client, const GenerateOptions& options, bool chat,
                                 const json& body, const CliIo& io) {
  const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
  const bool stream = options.stream && !options.raw;
  Outcome o;
  const Clock::time_point start = Clock::now();
  if (!stream) {
    auto reply = client.post_json(path, body.dump());
    if (!reply.ok()) return reply.status();
    if (absl::Status s = status_from_reply(*reply); !s.ok()) return s;
    auto c = parse_completion(reply->body, chat);
    if (!c.ok()) return c.status();
    o.total_ms = ms_since(start);
    o.text = c->text;
    o.finish_reason = c->finish_reason;
    o.usage = c->usage;
    *io.out << (options.raw ? reply->body : o.text) << "\n" << std::flush;
    return o;
  }
  absl::Status chunk_status;
  auto reply = client.post_sse(path, body.dump(), [&](std::string_view data) {
    auto chunk = parse_stream_chunk(data, chat);
    if (!chunk.ok()) {
      chunk_status = chunk.status();
      return false;
    }
    if (!chunk->text.empty()) {
      if (o.ttft_ms < 0) o.ttft_ms = ms_since(start);
      o.text += chunk->text;
      *io.out << chunk->text << std::flush;
    }
    if (!chunk->finish_reason.empty()) o.finish_reason = chunk->finish_reason;
    if (chunk->usage) o.usage = *chunk->usage;
    return !chunk->done;
  });
  if (!reply.ok()) return reply.status();
  if (absl::Status s = status_from_reply(*reply); !s.ok()) return s;
  if (!chunk_status.ok()) return chunk_status;
  if (o.finish_reason.empty()) {
    return absl::DataLossError("the stream ended before the reply finished");
  }
  o.total_ms = ms_since(start);
  *io.out << "\n" << std::flush;
  return o;
}

}  // namespace

absl::Status run_complete(HttpClient& client, const GenerateOptions& options,
                          const std::string& prompt, const CliIo& io) {
  const bool stream = options.stream && !options.raw;
  auto o = generate(client, options, /*chat=*/false,
                    completion_request(options.params, prompt, stream), io);
  if (!o.ok()) return o.status();
  if (options.show_usage) print_usage_line(*o, io);
  return absl::OkStatus();
}

absl::Status run_chat(HttpClient& client, const GenerateOptions& options,
                      const std::string& message, const CliIo& io) {
  const bool stream = options.stream && !options.raw;
  std::vector<ChatMessage> history;
  auto reset = [&] {
    history.clear();
    if (!options.system.empty()) history.push_back({"system", options.system});
  };
  reset();
  auto turn = [&](const std::string& text) -> absl::Status {
    history.push_back({"user", text});
    auto o =
        generate(client, options, /*chat=*/true, chat_request(options.params, history, stream), io);
    if (!o.ok()) {
      history.pop_back();  // the turn did not happen; the user may retry it
      return o.status();
    }
    history.push_back({"assistant", o->text});
    if (options.show_usage) print_usage_line(*o, io);
    return absl::OkStatus();
  };
  if (!message.empty()) return turn(message);

  std::string line;
  while (true) {
    if (io.interactive) *io.err << "> " << std::flush;
    if (!std::getline(*io.in, line)) break;
    const std::string text(absl::StripAsciiWhitespace(line));
    if (text.empty()) continue;
    if (text == "/exit" || text == "/quit") break;
    if (text == "/reset") {
      reset();
      if (io.interactive) *io.err << "(history cleared)\n";
      continue;
    }
    absl::Status s = turn(text);
    if (!s.ok()) {
      // A conversation survives a failed turn (a 429, a too-long prompt); a script does not.
      if (!io.interactive) return s;
      *io.err << "error: " << s.message() << "\n";
    }
  }
  return absl::OkStatus();
}

absl::Status run_tokenize(HttpClient& client, const std::string& text, const CliIo& io) {
  auto reply =
      json_object_of(client.post_json("/tokenize", json{{"prompt", text}}.dump()), "/tokenize");
  if (!reply.ok()) return reply.status();
  const json& j = *reply;
  if (!j.contains("tokens") || !j["tokens"].is_array()) {
    return absl::DataLossError("/tokenize reply has no `tokens` list");
  }
  std::vector<int64_t> ids;
  for (const json& t : j["tokens"]) {
    if (!t.is_number_integer())
      return absl::DataLossError("/tokenize reply: a token is not an integer");
    ids.push_back(t.get<int64_t>());
  }
  *io.out << absl::StrJoin(ids, " ") << "\n";
  return absl::OkStatus();
}

absl::Status run_detokenize(HttpClient& client, const std::vector<std::string>& ids,
                            const CliIo& io) {
  json tokens = json::array();
  for (const std::string& s : ids) {
    int64_t v;
    if (!absl::SimpleAtoi(s, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("detokenize: `", s, "` is not a token id"));
    }
    tokens.push_back(v);
  }
  auto reply = json_object_of(client.post_json("/detokenize", json{{"tokens", tokens}}.dump()),
                              "/detokenize");
  if (!reply.ok()) return reply.status();
  const json& j = *reply;
  if (!j.contains("prompt") || !j["prompt"].is_string()) {
    return absl::DataLossError("/detokenize reply has no `prompt` string");
  }
  *io.out << j["prompt"].get<std::string>() << "\n";
  return absl::OkStatus();
}

absl::Status run_models(HttpClient& client, const CliIo& io) {
  auto reply = json_object_of(client.get("/v1/models"), "/v1/models");
  if (!reply.ok()) return reply.status();
  const json& j = *reply;
  if (!j.contains("data") || !j["data"].is_array()) {
    return absl::DataLossError("/v1/models reply has no `data` list");
  }
  for (const json& m : j["data"]) {
    if (!m.is_object() || !m.contains("id") || !m["id"].is_string()) continue;
    *io.out << m["id"].get<std::string>();
    if (m.contains("loom_note") && m["loom_note"].is_string()) {
      *io.out << "\t" << m["loom_note"].get<std::string>();
    }
    *io.out << "\n";
  }
  return absl::OkStatus();
}

absl::Status run_health(HttpClient& client, const CliIo& io) {
  auto reply = client.get("/health");
  if (!reply.ok()) return reply.status();
  if (absl::Status s = status_from_reply(*reply); !s.ok()) return s;
  *io.out << "ok\n";
  return absl::OkStatus();
}

}  // namespace loom::client
