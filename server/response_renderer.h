// ResponseRenderer: what the HTTP session needs from a generation's response builder, so that
// one session loop drives every generating route: the completions and chat builder
// (OpenAiResponseBuilder, chunks framed as `data:` lines ending with [DONE]) and the Responses
// API's (ResponsesBuilder, named `event:` lines and no [DONE]). Not thread-safe: one per request.
#pragma once

#include <string>
#include <vector>

#include "engine/request.h"
#include "server/sse_writer.h"

namespace loom {

class ResponseRenderer {
 public:
  virtual ~ResponseRenderer() = default;
  // Consumes one event of prompt `prompt`'s engine request; streaming: the payloads it produces.
  virtual std::vector<std::string> on_event(int prompt, const RequestOutput& out) = 0;
  // Streaming, after every choice finished: the last payloads.
  virtual std::vector<std::string> stream_tail() const = 0;
  // Non-streaming, after every choice finished: the response body.
  virtual std::string final_json() const = 0;
  virtual const std::string& error() const = 0;  // empty: none; else the caller answers 500
  virtual int prompt_tokens() const = 0;
  virtual int completion_tokens() const = 0;
  virtual const std::string& last_finish_reason() const = 0;
  // SSE framing of one payload, and the stream's last bytes.
  virtual std::string sse_frame(const std::string& payload) const { return sse_event(payload); }
  virtual std::string sse_end() const { return sse_done(); }
};

}  // namespace loom
