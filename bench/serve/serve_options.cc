#include "bench/serve/serve_options.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

// --model, --seed, --json and --plot are shared with `offline` (bench/bench_flags.cc).
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(std::string, json);
ABSL_DECLARE_FLAG(std::string, plot);
ABSL_FLAG(std::string, url, "http://127.0.0.1:8000", "Server address (http://host:port[/base]).");
ABSL_FLAG(std::string, api_key, "",
          "Bearer key for servers started with --api_key (default: $LOOM_API_KEY).");
ABSL_FLAG(std::string, concurrency, "1,2,4,8,16,32",
          "Comma-separated concurrency levels: requests kept in flight, one closed loop each.");
ABSL_FLAG(int, requests, 0, "Requests per level; 0: max(4 * concurrency, 16).");
ABSL_FLAG(int, input_len, 128, "Prompt length in tokens (random token ids).");
ABSL_FLAG(int, output_len, 64,
          "Tokens generated per request (sent as max_tokens with ignore_eos, so exact).");
ABSL_FLAG(int, vocab_lo, 0, "Prompt token ids are drawn uniformly from [vocab_lo, vocab_hi).");
ABSL_FLAG(int, vocab_hi, 0,
          "Upper bound (exclusive) of prompt token ids; 0: the server's tokenizer vocabulary "
          "size, `loom_vocab_size` in loom-server's GET /v1/models (other servers: set it).");
ABSL_FLAG(int, warmup, 2, "Requests sent one at a time before the first level and not measured.");
ABSL_FLAG(bool, logprobs, false,
          "Ask for each token's logprob (logprobs: 0), so that every token streams a chunk even "
          "where it decodes to no text (a tokenizer smaller than the model's vocabulary, random "
          "weights): TTFT, ITL and TPOT then cover every request. The server computes the "
          "logprobs too, which costs a little.");
ABSL_FLAG(double, timeout_s, 600,
          "Seconds to wait for the server at any one step (connect: at most 10).");
ABSL_FLAG(std::string, markdown, "", "Append a Markdown section (settings and the table) to FILE.");

namespace loom::bench {
namespace {

constexpr int kMaxConcurrency = 4096;

absl::Status bad(std::string_view flag, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--", absl::string_view(flag.data(), flag.size()),
                                                 ": ", absl::string_view(why.data(), why.size())));
}

// An output file's folder must exist before the benchmark runs, not only when it ends.
absl::Status check_output_path(std::string_view flag, const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) {
    return bad(flag, absl::StrCat("folder `", parent.string(), "` does not exist"));
  }
  return absl::OkStatus();
}

}  // namespace

int requests_for_level(const ServeOptions& options, int concurrency) {
  return options.requests > 0 ? options.requests : std::max(4 * concurrency, 16);
}

absl::StatusOr<std::vector<int>> parse_concurrency_list(std::string_view text) {
  std::vector<int> out;
  std::set<int> seen;
  for (absl::string_view part : absl::StrSplit(absl::string_view(text.data(), text.size()), ',')) {
    part = absl::StripAsciiWhitespace(part);
    int c = 0;
    if (!absl::SimpleAtoi(part, &c) || c < 1 || c > kMaxConcurrency) {
      return bad("concurrency",
                 absl::StrCat("`", part, "` is not an integer in [1, ", kMaxConcurrency, "]"));
    }
    if (!seen.insert(c).second) return bad("concurrency", absl::StrCat("`", c, "` is repeated"));
    out.push_back(c);
  }
  return out;
}

absl::StatusOr<ServeOptions> serve_options_from_flags() {
  ServeOptions o;
  o.url = absl::GetFlag(FLAGS_url);
  o.api_key = absl::GetFlag(FLAGS_api_key);
  if (o.api_key.empty()) {
    if (const char* env = std::getenv("LOOM_API_KEY")) o.api_key = env;
  }
  o.model = absl::GetFlag(FLAGS_model);
  auto levels = parse_concurrency_list(absl::GetFlag(FLAGS_concurrency));
  if (!levels.ok()) return levels.status();
  o.concurrency = *std::move(levels);
  o.requests = absl::GetFlag(FLAGS_requests);
  o.input_len = absl::GetFlag(FLAGS_input_len);
  o.output_len = absl::GetFlag(FLAGS_output_len);
  o.vocab_lo = absl::GetFlag(FLAGS_vocab_lo);
  o.vocab_hi = absl::GetFlag(FLAGS_vocab_hi);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.logprobs = absl::GetFlag(FLAGS_logprobs);
  o.timeout_s = absl::GetFlag(FLAGS_timeout_s);
  o.json_path = absl::GetFlag(FLAGS_json);
  o.markdown_path = absl::GetFlag(FLAGS_markdown);
  o.plot_path = absl::GetFlag(FLAGS_plot);

  if (o.requests < 0) return bad("requests", "must be >= 0 (0: max(4 * concurrency, 16))");
  if (o.input_len < 1) return bad("input_len", "must be >= 1");
  if (o.output_len < 1) return bad("output_len", "must be >= 1");
  if (o.vocab_lo < 0) return bad("vocab_lo", "must be >= 0");
  if (o.vocab_hi < 0) return bad("vocab_hi", "must be >= 0 (0: ask the server)");
  if (o.vocab_hi != 0 && o.vocab_hi <= o.vocab_lo) {
    return bad("vocab_hi", absl::StrCat("must be above --vocab_lo (", o.vocab_lo, ")"));
  }
  if (o.warmup < 0) return bad("warmup", "must be >= 0");
  if (!(o.timeout_s > 0)) return bad("timeout_s", "must be positive");
  if (absl::Status s = check_output_path("json", o.json_path); !s.ok()) return s;
  if (absl::Status s = check_output_path("markdown", o.markdown_path); !s.ok()) return s;
  if (absl::Status s = check_output_path("plot", o.plot_path); !s.ok()) return s;
  return o;
}

}  // namespace loom::bench
