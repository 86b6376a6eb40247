// loom-cli: talk to a running loom-server (or any OpenAI-compatible server) from a terminal.
//
//   loom-cli chat "Hello"               one chat turn, streamed
//   loom-cli chat                       a conversation read from stdin (/reset, /exit)
//   loom-cli complete "Once upon"       a text completion
//   loom-cli tokenize "some text"       token ids
//   loom-cli detokenize 1 2 3           text of token ids
//   loom-cli models | health
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "clients/cpp/cli_commands.h"

ABSL_FLAG(std::string, url, "http://127.0.0.1:8000", "Server address (http://host:port[/base]).");
ABSL_FLAG(std::string, api_key, "",
          "Bearer key for servers started with --api-key (default: $LOOM_API_KEY).");
ABSL_FLAG(double, timeout_s, 600, "Seconds to wait for the server at any one step.");
ABSL_FLAG(std::string, model, "", "Model name to send (default: left out; the server's model).");
ABSL_FLAG(int64_t, max_tokens, -1, "Tokens to generate at most (-1: the server's default).");
ABSL_FLAG(double, temperature, -1, "Sampling temperature, 0 = greedy (-1: server default).");
ABSL_FLAG(double, top_p, -1, "Nucleus sampling mass in (0, 1] (-1: server default).");
ABSL_FLAG(int64_t, top_k, -1, "Sample among the k most likely tokens (-1: server default).");
ABSL_FLAG(int64_t, seed, -1, "Sampling seed for reproducible output (-1: none).");
ABSL_FLAG(std::vector<std::string>, stop, {}, "Comma-separated stop strings.");
ABSL_FLAG(bool, ignore_eos, false, "Keep generating past end-of-sequence (up to max_tokens).");
ABSL_FLAG(std::string, system, "", "chat: a system message to start the conversation with.");
ABSL_FLAG(bool, stream, true, "Print text as it is generated (--nostream: when complete).");
ABSL_FLAG(bool, usage, false, "After each reply, print finish reason, token counts, timings.");
ABSL_FLAG(bool, raw, false, "Print the server's JSON reply instead of the text (no streaming).");

namespace {

using loom::client::CliIo;
using loom::client::GenerateOptions;

constexpr const char* kUsage =
    "talks to a loom-server.\n\n"
    "usage: loom-cli [flags] COMMAND [ARGS]\n\n"
    "commands:\n"
    "  chat [MESSAGE...]     one chat turn; without MESSAGE a conversation read from stdin\n"
    "                        (/reset clears the history, /exit or end of input ends it)\n"
    "  complete PROMPT...    a text completion of PROMPT\n"
    "  tokenize TEXT...      token ids of TEXT\n"
    "  detokenize ID...      text of the token ids\n"
    "  models                served models\n"
    "  health                exit status 0 when the server is healthy\n\n"
    "Try --helpfull for every flag; generation flags: --max_tokens --temperature --top_p --top_k\n"
    "--seed --stop --ignore_eos --system --nostream --usage --raw --model.";

const std::vector<std::string> kGenerationFlags = {
    "model", "max_tokens", "temperature", "top_p",  "top_k", "seed",
    "stop",  "ignore_eos", "system",      "stream", "usage", "raw"};

bool flag_was_changed(const std::string& name) {
  const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
  return f != nullptr && f->CurrentValue() != f->DefaultValue();
}

int fail(const std::string& message) {
  std::cerr << "loom-cli: " << message << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return file.find("loom_cli_main") != absl::string_view::npos;
  };
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() < 2) return fail(absl::StrCat("no command given\n", kUsage));
  const std::string command = positional[1];
  std::vector<std::string> args(positional.begin() + 2, positional.end());

  const bool generates = command == "chat" || command == "complete";
  if (!generates && command != "tokenize" && command != "detokenize" && command != "models" &&
      command != "health") {
    return fail(absl::StrCat("unknown command `", command, "`\n", kUsage));
  }
  // Flags that do not apply to the command are refused rather than silently ignored.
  for (const std::string& name : kGenerationFlags) {
    bool applies = generates && (name != "system" || command == "chat");
    if (!applies && flag_was_changed(name)) {
      return fail(absl::StrCat("--", name, " does not apply to `", command, "`"));
    }
  }
  if ((command == "complete" || command == "tokenize") && args.empty()) {
    return fail(absl::StrCat("`", command, "` needs text"));
  }
  if (command == "detokenize" && args.empty()) return fail("`detokenize` needs token ids");
  if ((command == "models" || command == "health") && !args.empty()) {
    return fail(absl::StrCat("`", command, "` takes no arguments"));
  }

  auto url = loom::client::parse_server_url(absl::GetFlag(FLAGS_url));
  if (!url.ok()) return fail(std::string(url.status().message()));
  loom::client::HttpClientOptions client_options;
  client_options.api_key = absl::GetFlag(FLAGS_api_key);
  if (client_options.api_key.empty()) {
    if (const char* env = std::getenv("LOOM_API_KEY")) client_options.api_key = env;
  }
  const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (!(timeout_s > 0)) return fail("--timeout_s must be positive");
  client_options.read_timeout = absl::Seconds(timeout_s);
  client_options.connect_timeout = absl::Seconds(std::min(timeout_s, 10.0));
  loom::client::HttpClient client(*url, client_options);

  GenerateOptions gen;
  gen.params.model = absl::GetFlag(FLAGS_model);
  if (int64_t v = absl::GetFlag(FLAGS_max_tokens); v != -1) gen.params.max_tokens = v;
  if (double v = absl::GetFlag(FLAGS_temperature); v != -1) gen.params.temperature = v;
  if (double v = absl::GetFlag(FLAGS_top_p); v != -1) gen.params.top_p = v;
  if (int64_t v = absl::GetFlag(FLAGS_top_k); v != -1) gen.params.top_k = v;
  if (int64_t v = absl::GetFlag(FLAGS_seed); v != -1) {
    if (v < 0) return fail("--seed must be >= 0 (or -1 for none)");
    gen.params.seed = static_cast<uint64_t>(v);
  }
  gen.params.stop = absl::GetFlag(FLAGS_stop);
  gen.params.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  gen.system = absl::GetFlag(FLAGS_system);
  gen.stream = absl::GetFlag(FLAGS_stream);
  gen.show_usage = absl::GetFlag(FLAGS_usage);
  gen.raw = absl::GetFlag(FLAGS_raw);
  // Out-of-range values (a negative max_tokens, temperature 9) are the server's to judge: it
  // answers 400 with the field named, which loom-cli prints.

  CliIo io{&std::cin, &std::cout, &std::cerr, static_cast<bool>(isatty(STDIN_FILENO))};
  const std::string text = absl::StrJoin(args, " ");
  absl::Status status;
  if (command == "chat") {
    status = loom::client::run_chat(client, gen, text, io);
  } else if (command == "complete") {
    status = loom::client::run_complete(client, gen, text, io);
  } else if (command == "tokenize") {
    status = loom::client::run_tokenize(client, text, io);
  } else if (command == "detokenize") {
    status = loom::client::run_detokenize(client, args, io);
  } else if (command == "models") {
    status = loom::client::run_models(client, io);
  } else {
    status = loom::client::run_health(client, io);
  }
  if (!status.ok()) {
    std::cout << std::flush;
    std::cerr << "loom-cli: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
