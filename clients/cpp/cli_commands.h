// The commands of loom-cli, each a function of its options, the client and the streams it writes
// to, so tests can run them without a process per call.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "clients/cpp/http_client.h"
#include "clients/cpp/openai_stream.h"

namespace loom::client {

struct CliIo {
  std::istream* in;   // chat turns when interactive
  std::ostream* out;  // generated text, token ids, JSON
  std::ostream* err;  // prompts, usage lines, diagnostics
  bool interactive;   // `in` is a terminal: print a prompt before each turn
};

struct GenerateOptions {
  GenerationParams params;
  bool stream = true;
  bool show_usage = false;  // a line on `err` per reply: finish reason, tokens, timings
  bool raw = false;         // print the server's JSON instead of text (forces stream = false)
  std::string system;       // chat: an optional system message first
};

// One completion of `prompt`.
absl::Status run_complete(HttpClient& client, const GenerateOptions& options,
                          const std::string& prompt, const CliIo& io);

// One chat turn with `message`; when `message` is empty, a conversation read line by line from
// `io.in` (`/reset` forgets the history, `/exit` or end of input ends it).
absl::Status run_chat(HttpClient& client, const GenerateOptions& options,
                      const std::string& message, const CliIo& io);

// Token ids of `text`, one line, space separated.
absl::Status run_tokenize(HttpClient& client, const std::string& text, const CliIo& io);
// Text of token ids given as decimal strings.
absl::Status run_detokenize(HttpClient& client, const std::vector<std::string>& ids,
                            const CliIo& io);
// Served model ids, one per line.
absl::Status run_models(HttpClient& client, const CliIo& io);
// OK when GET /health answers 200.
absl::Status run_health(HttpClient& client, const CliIo& io);

}  // namespace loom::client
