#include "bench/serve/report_format.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace loom::bench {
namespace {

using json = nlohmann::json;

constexpr const char* kPercentileMethod =
    "linear interpolation between closest ranks (numpy default): rank h = (n - 1) * q / 100";

// Three significant digits or so, whatever the magnitude (sub-millisecond ITL on small models,
// seconds of TTFT under load).
std::string fmt_number(double v) {
  const double a = std::fabs(v);
  if (a >= 100) return absl::StrFormat("%.0f", v);
  if (a >= 10) return absl::StrFormat("%.1f", v);
  if (a >= 1) return absl::StrFormat("%.2f", v);
  return absl::StrFormat("%.3f", v);
}

std::string fmt_opt(const std::optional<LatencySummary>& s, double LatencySummary::*field) {
  return s ? fmt_number((*s).*field) : "-";
}

std::vector<std::string> header() {
  return {"conc",      "ok",       "failed",   "wall s",   "out tok/s", "req/s",   "TTFT mean",
          "TTFT p50",  "TTFT p90", "TTFT p99", "ITL mean", "ITL p50",   "ITL p90", "ITL p99",
          "TPOT mean", "TPOT p50", "TPOT p99", "E2E p50",  "E2E p99"};
}

std::vector<std::string> row(const LevelReport& r) {
  using S = LatencySummary;
  return {absl::StrCat(r.concurrency),     absl::StrCat(r.ok),
          absl::StrCat(r.failed),          fmt_number(r.wall_s),
          fmt_number(r.output_throughput), fmt_number(r.request_throughput),
          fmt_opt(r.ttft_ms, &S::mean),    fmt_opt(r.ttft_ms, &S::p50),
          fmt_opt(r.ttft_ms, &S::p90),     fmt_opt(r.ttft_ms, &S::p99),
          fmt_opt(r.itl_ms, &S::mean),     fmt_opt(r.itl_ms, &S::p50),
          fmt_opt(r.itl_ms, &S::p90),      fmt_opt(r.itl_ms, &S::p99),
          fmt_opt(r.tpot_ms, &S::mean),    fmt_opt(r.tpot_ms, &S::p50),
          fmt_opt(r.tpot_ms, &S::p99),     fmt_opt(r.e2e_ms, &S::p50),
          fmt_opt(r.e2e_ms, &S::p99)};
}

json summary_json(const std::optional<LatencySummary>& s) {
  if (!s) return nullptr;
  return {{"count", s->count}, {"mean", s->mean}, {"min", s->min}, {"max", s->max},
          {"p50", s->p50},     {"p90", s->p90},   {"p99", s->p99}};
}

json request_json(const RequestRecord& r) {
  json j = {{"ok", r.ok}};
  if (!r.ok) {
    j["error"] = r.error;
    return j;
  }
  j["ttft_ms"] = r.has_text ? json(r.ttft_s * 1e3) : json(nullptr);
  j["e2e_ms"] = r.e2e_s * 1e3;
  j["output_tokens"] = r.output_tokens;
  j["text_chunks"] = r.has_text ? r.itl_s.size() + 1 : 0;
  return j;
}

// A line per level whose TTFT/ITL/TPOT leave out requests that streamed no text.
std::string no_text_notes(const std::vector<LevelReport>& levels) {
  std::string out;
  for (const LevelReport& r : levels) {
    if (r.no_text == 0) continue;
    absl::StrAppend(&out, "note: at concurrency ", r.concurrency, ", ", r.no_text, " of ", r.ok,
                    " ok requests streamed no text (their tokens decode to nothing); TTFT, ITL "
                    "and TPOT leave them out\n");
  }
  return out;
}

}  // namespace

std::string format_table(const std::vector<LevelReport>& levels) {
  std::vector<std::vector<std::string>> rows = {header()};
  for (const LevelReport& r : levels) rows.push_back(row(r));
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& cells : rows) {
    for (size_t i = 0; i < cells.size(); ++i) width[i] = std::max(width[i], cells[i].size());
  }
  std::string out = "latencies in ms; TPOT = (e2e - ttft) / (output tokens - 1)\n";
  for (const auto& cells : rows) {
    std::string line;
    for (size_t i = 0; i < cells.size(); ++i) {
      absl::StrAppend(&line, i == 0 ? "" : "  ", std::string(width[i] - cells[i].size(), ' '),
                      cells[i]);
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out + no_text_notes(levels);
}

std::string format_markdown(const RunInfo& info, const std::vector<LevelReport>& levels) {
  const ServeOptions& o = info.options;
  std::string out = absl::StrCat("## loom-bench serve: `", info.model, "` at ", o.url, ", ",
                                 info.started_at, "\n\n");
  absl::StrAppend(&out, "- Workload: random token-id prompts of ", o.input_len, " tokens (ids in [",
                  o.vocab_lo, ", ", o.vocab_hi, "), seed ", o.seed, "), ", o.output_len,
                  " output tokens each (ignore_eos, temperature 0",
                  o.logprobs ? ", logprobs 0: every token streams a chunk" : "",
                  "), streamed; closed loop per level; ", o.warmup,
                  " warm-up requests before the first level.\n");
  std::vector<std::string> counts;
  for (const LevelReport& r : levels) counts.push_back(absl::StrCat(r.requests));
  absl::StrAppend(&out, "- Requests per level: ", absl::StrJoin(counts, ", "),
                  ". Latencies in ms; TPOT = (e2e - ttft) / (output tokens - 1); ITL = gaps "
                  "between streamed text chunks; percentiles by ",
                  kPercentileMethod, ".\n\n");
  const std::vector<std::string> head = header();
  absl::StrAppend(&out, "| ", absl::StrJoin(head, " | "), " |\n|");
  for (size_t i = 0; i < head.size(); ++i) absl::StrAppend(&out, "---|");
  absl::StrAppend(&out, "\n");
  for (const LevelReport& r : levels)
    absl::StrAppend(&out, "| ", absl::StrJoin(row(r), " | "), " |\n");
  if (std::string notes = no_text_notes(levels); !notes.empty()) absl::StrAppend(&out, "\n", notes);
  absl::StrAppend(&out, "\n");
  return out;
}

json report_json(const RunInfo& info, const std::vector<LevelReport>& levels) {
  const ServeOptions& o = info.options;
  json settings = {{"url", o.url},
                   {"concurrency", o.concurrency},
                   {"requests", o.requests},
                   {"input_len", o.input_len},
                   {"output_len", o.output_len},
                   {"vocab_lo", o.vocab_lo},
                   {"vocab_hi", o.vocab_hi},
                   {"seed", o.seed},
                   {"warmup", o.warmup},
                   {"timeout_s", o.timeout_s},
                   {"temperature", 0},
                   {"ignore_eos", true},
                   {"logprobs", o.logprobs},
                   {"stream", true}};
  json out_levels = json::array();
  for (const LevelReport& r : levels) {
    json errors = json::array();
    for (const ErrorCount& e : r.errors)
      errors.push_back({{"message", e.message}, {"count", e.count}});
    json requests = json::array();
    for (const RequestRecord& rec : r.records) requests.push_back(request_json(rec));
    out_levels.push_back({{"concurrency", r.concurrency},
                          {"requests", r.requests},
                          {"ok", r.ok},
                          {"failed", r.failed},
                          {"no_text", r.no_text},
                          {"wall_s", r.wall_s},
                          {"output_tokens", r.output_tokens},
                          {"output_throughput_tok_s", r.output_throughput},
                          {"request_throughput_req_s", r.request_throughput},
                          {"ttft_ms", summary_json(r.ttft_ms)},
                          {"itl_ms", summary_json(r.itl_ms)},
                          {"tpot_ms", summary_json(r.tpot_ms)},
                          {"e2e_ms", summary_json(r.e2e_ms)},
                          {"errors", std::move(errors)},
                          {"per_request", std::move(requests)}});
  }
  return {{"tool", "loom-bench serve"},
          {"started_at", info.started_at},
          {"model", info.model},
          {"settings", std::move(settings)},
          {"percentile_method", kPercentileMethod},
          {"levels", std::move(out_levels)}};
}

}  // namespace loom::bench
