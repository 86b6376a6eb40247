#include "bench/serve/serve_command.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/serve/level_report.h"
#include "bench/serve/load_level.h"
#include "bench/serve/report_format.h"
#include "bench/serve/server_probe.h"
#include "bench/serve/throughput_plot.h"
#include "clients/cpp/openai_stream.h"

namespace loom::bench {
namespace {

int fail(int code, const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "loom-bench serve: %s\n", message.c_str());
  return code;
}

// Request bodies with distinct random prompts: every request gets fresh ids from one seeded
// stream, so no prompt shares a cached prefix with another and the same seed repeats the run.
class BodyMaker {
 public:
  BodyMaker(const ServeOptions& o, const std::string& model)
      : rng_(o.seed), ids_(o.vocab_lo, o.vocab_hi - 1), input_len_(o.input_len) {
    params_.model = model;
    params_.max_tokens = o.output_len;
    params_.temperature = 0;
    params_.ignore_eos = true;
    params_.logprobs = o.logprobs;
  }

  std::vector<std::string> make(int count) {
    std::vector<std::string> bodies;
    bodies.reserve(count);
    for (int i = 0; i < count; ++i) {
      nlohmann::json ids = nlohmann::json::array();
      for (int t = 0; t < input_len_; ++t) ids.push_back(ids_(rng_));
      bodies.push_back(client::completion_request(params_, std::move(ids), true).dump());
    }
    return bodies;
  }

 private:
  std::mt19937_64 rng_;
  std::uniform_int_distribution<int> ids_;
  int input_len_;
  client::GenerationParams params_;
};

absl::Status write_file(const std::string& path, const std::string& text, bool append) {
  std::ofstream f(path, append ? std::ios::app : std::ios::trunc);
  f << text;
  f.close();
  if (!f) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

void print_errors(const LevelReport& r) {
  for (const ErrorCount& e : r.errors) {
    std::fprintf(stderr, "loom-bench serve:   %lld x %s\n", static_cast<long long>(e.count),
                 e.message.c_str());
  }
}

}  // namespace

int run_serve(ServeOptions options) {
  auto url = client::parse_server_url(options.url);
  if (!url.ok()) return fail(2, absl::StrCat("--url: ", url.status().message()));
  if (!options.plot_path.empty()) {
    if (absl::Status s = check_gnuplot(); !s.ok()) return fail(2, std::string(s.message()));
  }
  client::HttpClientOptions client_options;
  client_options.api_key = options.api_key;
  client_options.read_timeout = absl::Seconds(options.timeout_s);
  client_options.connect_timeout = absl::Seconds(std::min(options.timeout_s, 10.0));
  client::HttpClient probe(*url, client_options);

  auto served = probe_served_model(probe);
  if (!served.ok()) {
    return fail(
        1, absl::StrCat("cannot use the server at ", options.url, ": ", served.status().message()));
  }
  RunInfo info;
  info.model = options.model.empty() ? served->id : options.model;
  info.started_at = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  if (options.vocab_hi == 0) {
    if (!served->vocab_size) {
      return fail(1, absl::StrCat("the server at ", options.url,
                                  " does not say its vocabulary size (loom_vocab_size in "
                                  "/v1/models; not a loom-server?): pass --vocab_hi so prompt "
                                  "token ids stay in range"));
    }
    options.vocab_hi = static_cast<int>(std::min<int64_t>(*served->vocab_size, INT_MAX));
    if (options.vocab_hi <= options.vocab_lo) {
      return fail(2, absl::StrCat("--vocab_lo ", options.vocab_lo,
                                  " leaves no ids below the tokenizer's vocabulary size ",
                                  options.vocab_hi));
    }
  }
  if (served->max_model_len &&
      options.input_len + int64_t{options.output_len} > *served->max_model_len) {
    return fail(2, absl::StrCat("--input_len + --output_len = ",
                                options.input_len + int64_t{options.output_len},
                                " exceeds the server's max_model_len ", *served->max_model_len));
  }
  info.options = options;

  BodyMaker bodies(options, info.model);
  std::fprintf(stderr,
               "loom-bench serve: %s at %s; prompts of %d random ids in [%d, %d), %d output "
               "tokens\n",
               info.model.c_str(), options.url.c_str(), options.input_len, options.vocab_lo,
               options.vocab_hi, options.output_len);
  // Warm-up, one request at a time: a failure here (wrong vocabulary, a rejected field) is
  // reported at once instead of as a table of failures.
  if (options.warmup > 0) {
    client::HttpClient warm(*url, client_options);
    for (const std::string& body : bodies.make(options.warmup)) {
      RequestRecord r = run_stream_request(warm, body);
      if (!r.ok) return fail(1, absl::StrCat("warm-up request failed: ", r.error));
    }
  }

  std::vector<LevelReport> levels;
  int64_t failed = 0;
  for (int c : options.concurrency) {
    const int n = requests_for_level(options, c);
    std::fprintf(stderr, "loom-bench serve: concurrency %d, %d requests ...\n", c, n);
    std::vector<std::string> level_bodies = bodies.make(n);
    levels.push_back(summarize_level(run_level(*url, client_options, c, level_bodies)));
    const LevelReport& r = levels.back();
    failed += r.failed;
    std::fprintf(stderr, "loom-bench serve:   %.2f s, %lld ok (%lld without text), %lld failed\n",
                 r.wall_s, static_cast<long long>(r.ok), static_cast<long long>(r.no_text),
                 static_cast<long long>(r.failed));
    print_errors(r);
  }

  std::printf("%s", format_table(levels).c_str());
  std::fflush(stdout);
  int status = failed > 0 ? 1 : 0;
  if (!options.json_path.empty()) {
    absl::Status s = write_file(options.json_path, report_json(info, levels).dump(2) + "\n",
                                /*append=*/false);
    if (!s.ok()) status = fail(1, std::string(s.message()));
  }
  if (!options.markdown_path.empty()) {
    absl::Status s =
        write_file(options.markdown_path, format_markdown(info, levels), /*append=*/true);
    if (!s.ok()) status = fail(1, std::string(s.message()));
  }
  if (!options.plot_path.empty()) {
    const std::string title =
        absl::StrCat("loom-bench serve: ", info.model, " (", options.input_len, " prompt + ",
                     options.output_len, " output tokens), ", info.started_at);
    if (absl::Status s = write_plot(levels, title, options.plot_path); !s.ok()) {
      status = fail(1, std::string(s.message()));
    }
  }
  if (failed > 0) {
    fail(1, absl::StrCat(failed, " request(s) failed; see the errors above"));
  }
  return status;
}

}  // namespace loom::bench
