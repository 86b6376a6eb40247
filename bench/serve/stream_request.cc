#include "bench/serve/stream_request.h"

#include <chrono>
#include <optional>

#include "absl/status/status.h"
#include "clients/cpp/openai_stream.h"

namespace loom::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

RequestRecord failed(std::string why) {
  RequestRecord r;
  r.error = std::move(why);
  return r;
}

}  // namespace

RequestRecord run_stream_request(client::HttpClient& client, const std::string& body) {
  RequestRecord r;
  absl::Status chunk_error;
  std::optional<client::Usage> usage;
  std::optional<Clock::time_point> last_token;
  bool done = false;
  const Clock::time_point start = Clock::now();
  auto reply = client.post_sse("/v1/completions", body, [&](std::string_view data) {
    // Read the clock before parsing so the JSON work is not charged to the server.
    const Clock::time_point now = Clock::now();
    auto chunk = client::parse_stream_chunk(data, /*chat=*/false);
    if (!chunk.ok()) {
      chunk_error = chunk.status();
      return false;
    }
    if (chunk->done) {
      done = true;
      return false;
    }
    // A token arrived: text, or (with logprobs) a token that decodes to no text yet.
    if (!chunk->text.empty() || chunk->logprob_tokens > 0) {
      if (last_token) {
        r.itl_s.push_back(seconds_between(*last_token, now));
      } else {
        r.ttft_s = seconds_between(start, now);
      }
      last_token = now;
    }
    if (chunk->usage) usage = chunk->usage;
    return true;
  });
  r.e2e_s = seconds_between(start, Clock::now());
  if (!reply.ok()) return failed(std::string(reply.status().message()));
  if (absl::Status s = client::status_from_reply(*reply); !s.ok()) {
    return failed(std::string(s.message()));
  }
  if (!chunk_error.ok()) return failed(std::string(chunk_error.message()));
  if (!done) return failed("the stream ended before [DONE]");
  if (!usage) return failed("the stream had no usage chunk (stream_options.include_usage)");
  r.has_text = last_token.has_value();
  r.output_tokens = usage->completion_tokens;
  r.ok = true;
  return r;
}

}  // namespace loom::bench
