// loom-bench: load generator for a running server, and the engine without one.
//
//   loom-bench serve --url http://127.0.0.1:8000 [--concurrency 1,2,4,8,16,32] [--requests N]
//                    [--input_len 128] [--output_len 64] [--json F] [--markdown F] [--plot F.png]
//   loom-bench offline --model DIR [--random_weights SEED] [--device cuda] [--batches 1,8,64,256]
//                      [--context 4096] [--prefill 8192,32768] [--long_context 131072,1000000]
//
// Kernel micro-benchmarks are loom-bench-kernels; the engine without a server, loom-bench-engine.
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "bench/offline/offline_bench.h"
#ifdef LOOM_BENCH_SERVE
#include "bench/serve/serve_command.h"
#include "bench/serve/serve_options.h"
#endif

namespace {

constexpr const char* kUsage =
    "measures a running OpenAI-compatible server.\n\n"
    "usage: loom-bench serve [--url http://127.0.0.1:8000] [--concurrency 1,2,4,8,16,32]\n"
    "                        [--requests N] [--input_len 128] [--output_len 64] [--seed S]\n"
    "                        [--warmup 2] [--json FILE] [--markdown FILE] [--plot FILE.png]\n\n"
    "Each concurrency level is a closed loop: that many workers send streaming completions\n"
    "(random token-id prompts, ignore_eos, temperature 0) back to back until the level's\n"
    "requests are done. Reports throughput and TTFT / ITL / TPOT / end-to-end percentiles;\n"
    "exits non-zero when any request failed.\n\n"
    "loom-bench offline --model DIR [--random_weights SEED] [--device cpu|cuda] [--batches ...]\n"
    "    [--context 4096] [--decode_steps 64] [--prefill 8192,32768] [--long_context ...]\n"
    "    [--json FILE] [--plot FILE.png]\n"
    "runs the engine in this process (no server): decode time per output token and tokens/s at\n"
    "each batch over --context-token prompts, time to first token of each --prefill prompt, and\n"
    "both at each --long_context, each beside its roofline from a copy and a GEMM measured in the\n"
    "same run (the model's active bytes per step; its FLOPs per prompt).\n"
    "loom-bench offline --replot REPORT.json --plot FILE.png draws the plot of a report written\n"
    "by --json elsewhere (a GPU machine without gnuplot), running nothing.\n\n"
    "Other benchmarks: loom-bench-kernels (CPU kernels), loom-bench-engine (engine throughput\n"
    "at several concurrencies).";

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return file.find("bench/serve/") != absl::string_view::npos ||
           file.find("bench/bench_flags") != absl::string_view::npos ||
           file.find("bench/offline/") != absl::string_view::npos;
  };
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() >= 2 && std::string(positional[1]) == "offline") {
    if (positional.size() > 2) {
      std::fprintf(stderr, "loom-bench offline: unexpected argument `%s` (settings are flags)\n",
                   positional[2]);
      return 2;
    }
    auto options = loom::bench::offline_options_from_flags();
    if (!options.ok()) {
      std::fprintf(stderr, "loom-bench offline: %s\n",
                   std::string(options.status().message()).c_str());
      return 2;
    }
    return loom::bench::run_offline(*options);
  }
  if (positional.size() < 2 || std::string(positional[1]) != "serve") {
    const std::string got = positional.size() < 2
                                ? "no subcommand given"
                                : "unknown subcommand `" + std::string(positional[1]) + "`";
    std::fprintf(stderr,
                 "loom-bench: %s; the subcommands are `serve` (a running server under load) and "
                 "`offline` (the engine without a server, beside its roofline). Kernel "
                 "micro-benchmarks: loom-bench-kernels; engine throughput at several "
                 "concurrencies: loom-bench-engine. --help lists the flags.\n",
                 got.c_str());
    return 2;
  }
  if (positional.size() > 2) {
    std::fprintf(stderr, "loom-bench serve: unexpected argument `%s` (settings are flags)\n",
                 positional[2]);
    return 2;
  }
#ifdef LOOM_BENCH_SERVE
  // A server that closes a stream early must not kill the load generator with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  auto options = loom::bench::serve_options_from_flags();
  if (!options.ok()) {
    std::fprintf(stderr, "loom-bench serve: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  return loom::bench::run_serve(*std::move(options));
#else
  std::fprintf(stderr,
               "loom-bench serve: this build has no HTTP client (configured with LOOM_SERVER off "
               "or without gRPC); `offline` works\n");
  return 2;
#endif
}
