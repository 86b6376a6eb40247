#include "bench/offline/offline_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <thread>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/offline/roofline.h"
#include "core/workspace.h"
#include "engine/engine.h"
#include "engine/model/cache_store.h"
#include "engine/model/model.h"
#include "engine/model/random_weights.h"
#include "kernels/exec.h"
#include "kernels/gemm.h"
#include "nlohmann/json.hpp"

// Shared with `loom-bench serve` (bench/serve/serve_options.cc), where they are defined.
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, json);
ABSL_DECLARE_FLAG(std::string, plot);
ABSL_DECLARE_FLAG(uint64_t, seed);

ABSL_FLAG(std::string, random_weights, "",
          "offline: random weights from this seed for the config.json at --model (no checkpoint)");
ABSL_FLAG(std::string, device, "cpu", "offline: cpu, cuda or cuda:N");
ABSL_FLAG(std::string, weight_dtype, "auto", "offline: weight matrices: auto, f32, bf16 or fp8");
ABSL_FLAG(std::string, act_dtype, "auto", "offline: activations: auto, f32 or bf16");
ABSL_FLAG(std::string, kv_dtype, "auto",
          "offline: KV pages: auto (the activations'), f32, bf16 or fp8 (the server's)");
ABSL_FLAG(std::string, batches, "1,8,64,256", "offline: decode batch sizes");
ABSL_FLAG(int64_t, context, 4096, "offline: prompt tokens of each decoding sequence");
ABSL_FLAG(int64_t, decode_steps, 64, "offline: tokens timed per sequence after its first");
ABSL_FLAG(std::string, prefill, "8192,32768", "offline: prompt lengths timed to first token");
ABSL_FLAG(std::string, long_context, "",
          "offline: context lengths (e.g. 131072,1000000) timed to first token and per token");
ABSL_FLAG(int64_t, long_decode_steps, 16, "offline: tokens timed after a long prompt");
ABSL_FLAG(int64_t, max_num_batched_tokens, 8192, "offline: the engine's token budget per step");
ABSL_FLAG(bool, cuda_graphs, true, "offline: decode steps as CUDA graph replays (the server's)");
ABSL_FLAG(int64_t, cache_budget_mb, 0,
          "offline: KV pages + state slots, MiB (0: derived on a GPU, 1024 on the CPU)");
ABSL_FLAG(std::string, replot, "",
          "offline: run nothing; draw --plot from a report an earlier run wrote with --json "
          "(e.g. on a GPU machine without gnuplot)");

namespace loom::bench {
namespace {

using Clock = std::chrono::steady_clock;

absl::StatusOr<std::vector<int64_t>> int_list(const char* flag, const std::string& text,
                                              int64_t lo) {
  std::vector<int64_t> out;
  if (text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < lo)
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": `", part, "` is not an integer >= ", lo));
    out.push_back(v);
  }
  return out;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Ceilings measured here, in this process, before the model: what the roofline divides by.
struct Ceilings {
  double copy_bytes_per_s = 0;  // a large device-to-device (or host memcpy) copy, read + write
  double gemm_flops_per_s = 0;  // a square GEMM in the model's matrix dtype
};

// Waits for everything enqueued on the device (a 4-byte read of `t`).
void sync(const Exec& ex, const Tensor& t) {
  float x = 0;
  download(ex, &x, t.raw(), sizeof(float) < t.nbytes() ? sizeof(float) : 0);
}

Ceilings measure_ceilings(Device device, DType matrix_dtype) {
  Ceilings c;
  const Exec ex = exec_for(device);
  {
    // 1 GiB of f32 each way on a GPU (well past its L2); 64 MiB on the host.
    const int64_t n = device.is_cpu() ? int64_t{16} << 20 : int64_t{256} << 20;
    const Tensor a = Tensor::empty({n}, DType::kF32, device);
    const Tensor b = Tensor::empty({n}, DType::kF32, device);
    b.copy_from(a);  // first touch
    double best = 1e30;
    for (int i = 0; i < 5; ++i) {
      const auto t0 = Clock::now();
      b.copy_from(a);
      sync(ex, b);
      best = std::min(best, seconds_since(t0));
    }
    c.copy_bytes_per_s = 2.0 * static_cast<double>(a.nbytes()) / best;
  }
  {
    const int64_t m = device.is_cpu() ? 1024 : 8192;
    const DType wt = device.is_cpu() ? DType::kF32 : matrix_dtype;
    // Values do not change a GEMM's time; zeros keep the output finite.
    const Tensor x = Tensor::zeros({m, m}, wt).to(device);
    const Tensor w = Tensor::zeros({m, m}, wt).to(device);
    const Tensor out = Tensor::empty({m, m}, wt, device);
    Workspace ws(device);
    Exec wex = exec_for(device, &ws);
    linear_forward(wex, x, w, out);
    sync(ex, out);
    double best = 1e30;
    for (int i = 0; i < 5; ++i) {
      const auto t0 = Clock::now();
      linear_forward(wex, x, w, out);
      sync(ex, out);
      best = std::min(best, seconds_since(t0));
    }
    c.gemm_flops_per_s = 2.0 * m * m * m / best;
  }
  return c;
}

std::vector<int32_t> random_prompt(int64_t n, int64_t vocab, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> d(
      3, static_cast<int32_t>(std::min<int64_t>(vocab, 30000)) - 1);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t& t : p) t = d(rng);
  return p;
}

// One request's token arrival times, from its own consumer thread.
struct Timeline {
  double first = 0;  // seconds from the submission to the first token
  double last = 0;   // to the last token
  int64_t tokens = 0;
  std::vector<double> arrivals;  // each event's time and how many tokens it brought
  std::vector<int64_t> counts;
  bool error = false;
};

// Submits every prompt at once (greedy, exactly max_tokens each) and times each stream.
std::vector<Timeline> run_requests(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                   int32_t max_tokens) {
  std::vector<Timeline> out(prompts.size());
  std::vector<std::shared_ptr<RequestStream>> streams;
  const auto t0 = Clock::now();
  for (const auto& p : prompts) {
    Request r;
    r.prompt = p;
    r.params.temperature = 0;
    r.params.ignore_eos = true;
    r.params.max_tokens = max_tokens;
    auto s = engine.submit(std::move(r));
    if (!s.ok()) {
      std::fprintf(stderr, "loom-bench offline: %s\n", std::string(s.status().message()).c_str());
      out[streams.size()].error = true;
      streams.push_back(nullptr);
      continue;
    }
    streams.push_back(*s);
  }
  std::vector<std::thread> readers;
  for (size_t i = 0; i < streams.size(); ++i) {
    if (!streams[i]) continue;
    readers.emplace_back([&, i] {
      Timeline& t = out[i];
      while (auto ev = streams[i]->next()) {
        if (ev->finish == FinishReason::kError) t.error = true;
        if (ev->token_ids.empty()) continue;
        const double now = seconds_since(t0);
        if (t.tokens == 0) t.first = now;
        t.last = now;
        t.tokens += static_cast<int64_t>(ev->token_ids.size());
        t.arrivals.push_back(now);
        t.counts.push_back(static_cast<int64_t>(ev->token_ids.size()));
      }
    });
  }
  for (std::thread& r : readers) r.join();
  return out;
}

// The engine's device clock over one decode run (EngineStats::device_clock.decode): on a GPU,
// the device time of its decode steps and the GPU's idle time before them. The derived figures
// are computed here once, for the table and the JSON alike.
struct DecodeClock {
  int64_t steps = 0, gaps = 0;
  double busy_ms = 0, gap_ms = 0;
  double max_gap_ms = 0;  // since the engine started (the stats keep no per-run maximum)
  double step_ms() const { return steps > 0 ? busy_ms / static_cast<double>(steps) : 0.0; }
  double mean_gap_ms() const { return gaps > 0 ? gap_ms / static_cast<double>(gaps) : 0.0; }
  // Idle over busy time, as Grafana's rate(idle) / rate(busy).
  double idle_over_busy() const { return busy_ms > 0 ? gap_ms / busy_ms : 0.0; }
  std::string cells() const {
    if (steps == 0) return "- | - | -";  // the host: nothing measured
    return absl::StrFormat("%.3f | %.3f (%.3f) | %.2f%%", step_ms(), mean_gap_ms(), max_gap_ms,
                           100.0 * idle_over_busy());
  }
};

DecodeClock decode_clock(const EngineStats& before, const EngineStats& after) {
  const StepTimes& a = after.device_clock.decode;
  const StepTimes& b = before.device_clock.decode;
  return DecodeClock{.steps = a.steps - b.steps,
                     .gaps = a.gaps - b.gaps,
                     .busy_ms = a.busy_ms - b.busy_ms,
                     .gap_ms = a.gap_ms - b.gap_ms,
                     .max_gap_ms = a.max_gap_ms};
}

// The stats once the loop has published its last step: a stream's last event goes out inside the
// step, before the loop publishes, so the counters are read until they stop moving.
EngineStats settled_stats(const Engine& engine) {
  EngineStats s = engine.stats();
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const EngineStats next = engine.stats();
    if (next.steps == s.steps && next.device_clock.all.steps == s.device_clock.all.steps)
      return next;
    s = next;
  }
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Time per output token of each stream after its first token.
std::vector<double> tpots(const std::vector<Timeline>& ts) {
  std::vector<double> out;
  for (const Timeline& t : ts)
    if (t.tokens > 1) out.push_back((t.last - t.first) / static_cast<double>(t.tokens - 1));
  return out;
}

// Decode time per output token while the whole batch decodes: the window from the last stream's
// first token to the first stream's last one, over the tokens a stream received inside it (the
// mean over the streams: every stream decodes at every step of the window). Before the window
// some prompts are still being prefilled, and a step that carries a prefill chunk takes the
// chunk's time (an 8K-token chunk of the 48B model: ~250 ms), which per-stream timing from each
// stream's own first token counts as decode time. A reader that lags gets several tokens in one
// event; they count where they arrive. Falls back to the per-stream median when the window is
// empty (a batch of one whose tokens all came in one event).
double whole_batch_tpot(const std::vector<Timeline>& ts) {
  double start = 0, end = 1e300;
  for (const Timeline& t : ts) {
    if (t.tokens == 0) return 0;
    start = std::max(start, t.first);
    end = std::min(end, t.last);
  }
  int64_t tokens = 0;
  for (const Timeline& t : ts)
    for (size_t i = 0; i < t.arrivals.size(); ++i)
      if (t.arrivals[i] > start && t.arrivals[i] <= end) tokens += t.counts[i];
  const double per_stream = static_cast<double>(tokens) / static_cast<double>(ts.size());
  if (!(end > start) || per_stream < 1) return median(tpots(ts));
  return (end - start) / per_stream;
}

bool any_error(const std::vector<Timeline>& ts) {
  return std::any_of(ts.begin(), ts.end(), [](const Timeline& t) { return t.error; });
}

// A gnuplot single-quoted string: quotes doubled, control characters (which would end the command)
// made spaces.
std::string gnuplot_quoted(std::string s) {
  for (char& ch : s)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = ' ';
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("''") : std::string(1, ch);
  return out + "'";
}

absl::Status write_plot(const nlohmann::json& decode, const std::string& title,
                        const std::string& png) {
  std::string data;
  for (const auto& row : decode)
    absl::StrAppend(&data, row["batch"].get<int64_t>(), " ",
                    absl::StrFormat("%.6g %.6g\n", row["tokens_per_s"].get<double>(),
                                    row["roofline_tokens_per_s"].get<double>()));
  const std::string script = absl::StrCat(
      "set terminal pngcairo noenhanced size 900,560 font 'sans,10'\nset output ",
      gnuplot_quoted(png), "\n", "$d << EOD\n", data, "EOD\n", "set title ", gnuplot_quoted(title),
      "\n", "set logscale xy 2\nset grid\nset key top left\n",
      "set xlabel 'batch (sequences decoding)'\nset ylabel 'output tokens/s'\n",
      "plot $d using 1:2 with linespoints lw 2 title 'measured', ",
      "$d using 1:3 with linespoints lw 2 dt 2 title 'roofline (bytes / copy bandwidth)'\n");
  FILE* p = popen("gnuplot", "w");
  if (p == nullptr) return absl::UnavailableError("gnuplot could not be started");
  std::fwrite(script.data(), 1, script.size(), p);
  if (pclose(p) != 0) return absl::InternalError("gnuplot failed");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OfflineOptions> offline_options_from_flags() {
  OfflineOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  o.replot = absl::GetFlag(FLAGS_replot);
  o.plot = absl::GetFlag(FLAGS_plot);
  if (!o.replot.empty()) {
    if (o.plot.empty()) return absl::InvalidArgumentError("--replot needs --plot PNG");
    return o;
  }
  if (o.model.empty())
    return absl::InvalidArgumentError(
        "--model: a model directory (or a config with --random_weights)");
  o.random_weights = absl::GetFlag(FLAGS_random_weights);
  o.device = absl::GetFlag(FLAGS_device);
  o.weight_dtype = absl::GetFlag(FLAGS_weight_dtype);
  o.act_dtype = absl::GetFlag(FLAGS_act_dtype);
  o.kv_dtype = absl::GetFlag(FLAGS_kv_dtype);
  auto batches = int_list("batches", absl::GetFlag(FLAGS_batches), 1);
  if (!batches.ok()) return batches.status();
  o.batches = *batches;
  auto prefill = int_list("prefill", absl::GetFlag(FLAGS_prefill), 1);
  if (!prefill.ok()) return prefill.status();
  o.prefill = *prefill;
  auto long_context = int_list("long_context", absl::GetFlag(FLAGS_long_context), 1);
  if (!long_context.ok()) return long_context.status();
  o.long_context = *long_context;
  o.context = absl::GetFlag(FLAGS_context);
  o.decode_steps = absl::GetFlag(FLAGS_decode_steps);
  o.long_decode_steps = absl::GetFlag(FLAGS_long_decode_steps);
  o.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  o.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  o.cache_budget_mb = absl::GetFlag(FLAGS_cache_budget_mb);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.json = absl::GetFlag(FLAGS_json);
  if (o.context < 1 || o.decode_steps < 1 || o.long_decode_steps < 1)
    return absl::InvalidArgumentError("--context, --decode_steps and --long_decode_steps: >= 1");
  if (o.max_num_batched_tokens < 1 || o.cache_budget_mb < 0)
    return absl::InvalidArgumentError(
        "--max_num_batched_tokens >= 1 and --cache_budget_mb >= 0 (0: derived)");
  return o;
}

int run_offline(const OfflineOptions& o) {
  auto fail = [](const absl::Status& st) {
    std::fprintf(stderr, "loom-bench offline: %s\n", std::string(st.message()).c_str());
    return 1;
  };
  if (!o.replot.empty()) {
    std::ifstream in(o.replot);
    const nlohmann::json report = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (report.is_discarded() || !report.is_object() || !report.contains("decode") ||
        !report["decode"].is_array() || report["decode"].empty() || !report.contains("model") ||
        !report["model"].is_string())
      return fail(absl::InvalidArgumentError(
          absl::StrCat("--replot ", o.replot,
                       ": not a report of `loom-bench offline --json` (no decode rows)")));
    for (const auto& row : report["decode"])
      if (!row.is_object() || !row.contains("batch") || !row["batch"].is_number() ||
          !row.contains("tokens_per_s") || !row["tokens_per_s"].is_number() ||
          !row.contains("roofline_tokens_per_s") || !row["roofline_tokens_per_s"].is_number())
        return fail(
            absl::InvalidArgumentError(absl::StrCat("--replot ", o.replot,
                                                    ": a decode row without batch, tokens_per_s "
                                                    "and roofline_tokens_per_s numbers")));
    if (absl::Status st = write_plot(report["decode"], report["model"].get<std::string>(), o.plot);
        !st.ok())
      return fail(st);
    return 0;
  }
  auto device = parse_device(o.device);
  if (!device.ok()) return fail(device.status());
  if (absl::Status st = device_available(*device); !st.ok()) return fail(st);
  auto wdt = parse_weight_dtype(o.weight_dtype);
  if (!wdt.ok()) return fail(wdt.status());
  auto adt = parse_activation_dtype(o.act_dtype);
  if (!adt.ok()) return fail(adt.status());
  auto kvdt = parse_kv_dtype(o.kv_dtype);
  if (!kvdt.ok()) return fail(kvdt.status());
  const Placement placement{.device = *device, .dtype = *wdt, .activations = *adt};
  absl::StatusOr<std::unique_ptr<Model>> model;
  if (o.random_weights.empty()) {
    model = Model::load(o.model, placement);
  } else {
    auto seed = parse_random_weights_seed(o.random_weights);
    if (!seed.ok()) return fail(seed.status());
    model = Model::load_random(o.model, *seed, placement);
  }
  if (!model.ok()) return fail(model.status());
  const ModelConfig cfg = (*model)->config();
  // The pages' dtype as the engine resolves it (EngineOptions::kv_dtype unset: the activations').
  const DType kv_dtype = kvdt->value_or((*model)->act_dtype());
  const ModelFootprint fp = model_footprint(**model, kv_dtype);
  const Ceilings ceil = measure_ceilings(*device, (*model)->placement().matrix_dtype());
  std::printf(
      "loom-bench offline: %s (%s): %.3f GB of parameters; active %.3f B parameters a "
      "token, %.3f GB read a decode step at batch 1 (weights); KV pages %s, %lld bytes a token\n",
      o.model.c_str(), (*model)->placement().describe().c_str(),
      (*model)->parameters().bytes() / 1e9, fp.active_params / 1e9,
      decode_step_bytes(fp, 1, 0) / 1e9, std::string(dtype_name(kv_dtype)).c_str(),
      static_cast<long long>(fp.kv_bytes_per_token));
  std::printf("ceilings measured now: copy %.1f GB/s, GEMM %.1f TFLOP/s\n\n",
              ceil.copy_bytes_per_s / 1e9, ceil.gemm_flops_per_s / 1e12);

  int64_t max_batch = 1;
  for (int64_t b : o.batches) max_batch = std::max(max_batch, b);
  // The first stream of a decode batch decodes through every later prompt's prefill steps (the
  // prompts' tokens over the step budget, plus slack for partly filled steps) and then
  // decode_steps more, so that the window where the whole batch decodes holds about decode_steps
  // steps (whole_batch_tpot).
  const auto prefill_steps = [&](int64_t b) {
    return (b * o.context + o.max_num_batched_tokens - 1) / o.max_num_batched_tokens + 2;
  };
  int64_t longest = o.context + o.decode_steps + prefill_steps(max_batch) + 1;
  for (int64_t p : o.prefill) longest = std::max(longest, p + 1);
  for (int64_t p : o.long_context) longest = std::max(longest, p + o.long_decode_steps + 1);
  EngineOptions eo;
  eo.max_num_seqs = static_cast<int32_t>(max_batch);
  eo.max_num_batched_tokens = static_cast<int32_t>(o.max_num_batched_tokens);
  eo.enable_prefix_cache = false;  // random prompts share nothing; keep the work honest
  eo.cuda_graphs = o.cuda_graphs;
  eo.kv_dtype = kv_dtype;
  eo.max_model_len = static_cast<int32_t>(std::min<int64_t>(longest, INT32_MAX));
  eo.cache_budget_bytes =
      o.cache_budget_mb > 0 ? o.cache_budget_mb << 20 : (device->is_cpu() ? int64_t{1} << 30 : 0);
  auto engine = Engine::create(std::move(*model), nullptr, eo);
  if (!engine.ok()) return fail(engine.status());
  if (const auto& plan = (*engine)->memory_plan()) std::printf("%s\n\n", plan->describe().c_str());
  // What the budget holds: the tokens of every attention page (the --kv_dtype comparison).
  const EngineStats pages = (*engine)->stats();
  const int64_t page_tokens = static_cast<int64_t>(pages.pages_total) * eo.page_size;
  std::printf("KV pages (%s): %d pages of %d tokens = %lld tokens; %d state slots\n\n",
              std::string(dtype_name(kv_dtype)).c_str(), pages.pages_total, eo.page_size,
              static_cast<long long>(page_tokens), pages.slots_total);
  std::mt19937_64 rng(o.seed);
  nlohmann::json report = {{"model", o.model},
                           {"placement", placement.describe()},
                           {"kv_dtype", std::string(dtype_name(kv_dtype))},
                           {"kv_bytes_per_token", fp.kv_bytes_per_token},
                           {"copy_gb_per_s", ceil.copy_bytes_per_s / 1e9},
                           {"gemm_tflop_per_s", ceil.gemm_flops_per_s / 1e12},
                           {"active_params", fp.active_params},
                           {"kv_pages", pages.pages_total},
                           {"kv_page_tokens", page_tokens}};
  int rc = 0;

  // Warm-up: the first steps of each shape allocate and load kernels.
  run_requests(**engine, {random_prompt(std::min<int64_t>(o.context, 256), cfg.vocab_size, rng)},
               4);

  std::printf("Decode, %lld-token contexts, %lld tokens timed per sequence\n\n",
              static_cast<long long>(o.context), static_cast<long long>(o.decode_steps));
  std::printf(
      "| batch | TPOT p50 ms | output tok/s | roofline ms | roofline tok/s | of roofline | "
      "device ms a decode step | GPU idle before a decode step, mean ms (max since start) | "
      "idle / busy |\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  for (int64_t b : o.batches) {
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t i = 0; i < b; ++i)
      prompts.push_back(random_prompt(o.context, cfg.vocab_size, rng));
    const EngineStats before = (*engine)->stats();
    const std::vector<Timeline> ts = run_requests(
        **engine, prompts, static_cast<int32_t>(o.decode_steps + prefill_steps(b) + 1));
    if (any_error(ts)) rc = 1;
    const DecodeClock clock = decode_clock(before, settled_stats(**engine));
    const double tpot = whole_batch_tpot(ts);
    const double roof =
        decode_step_bytes(fp, b, o.context + o.decode_steps / 2) / ceil.copy_bytes_per_s;
    const double tps = tpot > 0 ? b / tpot : 0;
    std::printf("| %lld | %.3f | %.1f | %.3f | %.1f | %.1f%% | %s |\n", static_cast<long long>(b),
                tpot * 1e3, tps, roof * 1e3, b / roof, tpot > 0 ? 100.0 * roof / tpot : 0.0,
                clock.cells().c_str());
    nlohmann::json row = {
        {"batch", b},          {"context", o.context},      {"tpot_ms", tpot * 1e3},
        {"tokens_per_s", tps}, {"roofline_ms", roof * 1e3}, {"roofline_tokens_per_s", b / roof}};
    if (clock.steps > 0) {
      row["device_step_ms"] = clock.step_ms();
      row["decode_steps_timed"] = clock.steps;
      row["idle_gaps"] = clock.gaps;
      row["idle_gap_mean_ms"] = clock.mean_gap_ms();
      row["idle_gap_max_since_start_ms"] = clock.max_gap_ms;
      row["idle_over_busy"] = clock.idle_over_busy();
    }
    report["decode"].push_back(row);
  }

  if (!o.prefill.empty()) {
    std::printf(
        "\nPrefill (time to first token, one prompt, idle engine)\n\n"
        "| prompt | TTFT ms | prompt tok/s | TFLOP/s | of GEMM ceiling |\n"
        "|---|---|---|---|---|\n");
  }
  for (int64_t p : o.prefill) {
    const std::vector<Timeline> ts =
        run_requests(**engine, {random_prompt(p, cfg.vocab_size, rng)}, 1);
    if (any_error(ts)) rc = 1;
    const double ttft = ts[0].first;
    const double flops = prefill_flops(fp, p);
    std::printf("| %lld | %.1f | %.0f | %.1f | %.1f%% |\n", static_cast<long long>(p), ttft * 1e3,
                p / ttft, flops / ttft / 1e12, 100.0 * flops / ttft / ceil.gemm_flops_per_s);
    report["prefill"].push_back({{"prompt", p},
                                 {"ttft_ms", ttft * 1e3},
                                 {"tokens_per_s", p / ttft},
                                 {"tflop_per_s", flops / ttft / 1e12}});
  }

  if (!o.long_context.empty()) {
    std::printf(
        "\nLong context (one request)\n\n"
        "| context | TTFT s | TPOT ms | TPOT roofline ms |\n|---|---|---|---|\n");
  }
  for (int64_t L : o.long_context) {
    const std::vector<Timeline> ts = run_requests(**engine, {random_prompt(L, cfg.vocab_size, rng)},
                                                  static_cast<int32_t>(o.long_decode_steps + 1));
    if (any_error(ts)) rc = 1;
    const double tpot = median(tpots(ts));
    const double roof = decode_step_bytes(fp, 1, L) / ceil.copy_bytes_per_s;
    std::printf("| %lld | %.2f | %.3f | %.3f |\n", static_cast<long long>(L), ts[0].first,
                tpot * 1e3, roof * 1e3);
    report["long_context"].push_back({{"context", L},
                                      {"ttft_s", ts[0].first},
                                      {"tpot_ms", tpot * 1e3},
                                      {"roofline_ms", roof * 1e3}});
  }
  if (!o.json.empty()) std::ofstream(o.json) << report.dump(2) << "\n";
  if (!o.plot.empty() && report.contains("decode")) {
    if (absl::Status st = write_plot(report["decode"], o.model, o.plot); !st.ok()) return fail(st);
  }
  if (rc != 0) std::fprintf(stderr, "loom-bench offline: some requests failed\n");
  return rc;
}

}  // namespace loom::bench
