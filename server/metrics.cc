#include "server/metrics.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loom {
namespace {

// Bounds in seconds: TTFT spans queueing and prefill; inter-token latency is one decode step.
std::vector<double> ttft_bounds() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}
std::vector<double> itl_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
}
std::vector<double> e2e_bounds() { return {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}; }

void header(std::string* out, std::string_view name, std::string_view type, std::string_view help) {
  absl::StrAppend(out, "# HELP ", absl_sv(name), " ", absl_sv(help), "\n# TYPE ", absl_sv(name),
                  " ", absl_sv(type), "\n");
}

void sample(std::string* out, std::string_view name, double value) {
  absl::StrAppend(out, absl_sv(name), " ", absl::StrFormat("%.17g", value), "\n");
}

}  // namespace

LatencyHistogram::LatencyHistogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void LatencyHistogram::observe(double seconds) {
  size_t i = 0;
  while (i < bounds_.size() && seconds > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += seconds;
  ++count_;
}

void LatencyHistogram::render(std::string_view name, std::string* out) const {
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    absl::StrAppend(out, absl_sv(name), "_bucket{le=\"", absl::StrFormat("%g", bounds_[i]), "\"} ",
                    cumulative, "\n");
  }
  cumulative += counts_.back();
  absl::StrAppend(out, absl_sv(name), "_bucket{le=\"+Inf\"} ", cumulative, "\n");
  absl::StrAppend(out, absl_sv(name), "_sum ", absl::StrFormat("%.17g", sum_), "\n");
  absl::StrAppend(out, absl_sv(name), "_count ", count_, "\n");
}

Metrics::Metrics() : ttft_(ttft_bounds()), itl_(itl_bounds()), e2e_(e2e_bounds()) {}

void Metrics::on_request_finished(std::string_view reason, int prompt_tokens,
                                  int completion_tokens) {
  absl::MutexLock lock(&mu_);
  ++finished_[std::string(reason)];
  prompt_tokens_ += prompt_tokens;
  completion_tokens_ += completion_tokens;
}

void Metrics::on_request_rejected(std::string_view status) {
  absl::MutexLock lock(&mu_);
  ++rejected_[std::string(status)];
}

void Metrics::observe_ttft(double seconds) {
  absl::MutexLock lock(&mu_);
  ttft_.observe(seconds);
}

void Metrics::observe_itl(double seconds) {
  absl::MutexLock lock(&mu_);
  itl_.observe(seconds);
}

void Metrics::observe_e2e(double seconds) {
  absl::MutexLock lock(&mu_);
  e2e_.observe(seconds);
}

void Metrics::add_connections(int delta) {
  absl::MutexLock lock(&mu_);
  connections_ += delta;
}

void Metrics::on_slow_client_disconnect() {
  absl::MutexLock lock(&mu_);
  ++slow_client_disconnects_;
}

std::string Metrics::render(const EngineStats& s) const {
  std::string out;
  {
    absl::MutexLock lock(&mu_);
    header(&out, "loom_requests_finished_total", "counter", "Requests finished, by reason.");
    for (const char* r : {"stop", "length", "tool_calls", "cancelled", "abort", "error"}) {
      auto it = finished_.find(std::string_view(r));
      absl::StrAppend(&out, "loom_requests_finished_total{reason=\"", r, "\"} ",
                      it == finished_.end() ? 0 : it->second, "\n");
    }
    header(&out, "loom_requests_rejected_total", "counter",
           "Requests rejected before reaching the engine, by HTTP status.");
    for (const auto& [status, n] : rejected_) {
      absl::StrAppend(&out, "loom_requests_rejected_total{status=\"", status, "\"} ", n, "\n");
    }
    header(&out, "loom_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
    sample(&out, "loom_prompt_tokens_total", static_cast<double>(prompt_tokens_));
    header(&out, "loom_generation_tokens_total", "counter",
           "Generated tokens of finished requests.");
    sample(&out, "loom_generation_tokens_total", static_cast<double>(completion_tokens_));
    header(&out, "loom_open_connections", "gauge", "Open HTTP client connections.");
    sample(&out, "loom_open_connections", static_cast<double>(connections_));
    header(&out, "loom_slow_client_disconnects_total", "counter",
           "Clients disconnected for not reading their reply (write timeout or pending bytes).");
    sample(&out, "loom_slow_client_disconnects_total",
           static_cast<double>(slow_client_disconnects_));
    header(&out, "loom_time_to_first_token_seconds", "histogram",
           "Time from request receipt to its first generated token.");
    ttft_.render("loom_time_to_first_token_seconds", &out);
    header(&out, "loom_inter_token_latency_seconds", "histogram",
           "Time between consecutive generated tokens of one choice.");
    itl_.render("loom_inter_token_latency_seconds", &out);
    header(&out, "loom_request_latency_seconds", "histogram",
           "Time from request receipt to its last byte.");
    e2e_.render("loom_request_latency_seconds", &out);
  }
  auto gauge = [&](std::string_view name, std::string_view help, double v) {
    header(&out, name, "gauge", help);
    sample(&out, name, v);
  };
  auto counter = [&](std::string_view name, std::string_view help, double v) {
    header(&out, name, "counter", help);
    sample(&out, name, v);
  };
  gauge("loom_num_requests_waiting", "Requests queued in the engine, not yet running.", s.waiting);
  gauge("loom_num_requests_running", "Requests (choices) the engine is running.", s.running);
  gauge("loom_kv_pages_total", "KV cache pages in the pool.", s.pages_total);
  gauge("loom_kv_pages_free", "Free KV cache pages.", s.pages_free);
  gauge("loom_kv_pages_usage_ratio", "Fraction of KV cache pages in use.",
        s.pages_total > 0 ? 1.0 - static_cast<double>(s.pages_free) / s.pages_total : 0.0);
  gauge("loom_state_slots_total", "Linear-attention state slots in the pool.", s.slots_total);
  gauge("loom_state_slots_free", "Free linear-attention state slots.", s.slots_free);
  gauge("loom_state_slots_usage_ratio", "Fraction of state slots in use.",
        s.slots_total > 0 ? 1.0 - static_cast<double>(s.slots_free) / s.slots_total : 0.0);
  counter("loom_engine_steps_total", "Engine steps run.", static_cast<double>(s.steps));
  counter("loom_engine_prompt_tokens_total", "Prompt tokens the engine prefilled.",
          static_cast<double>(s.prompt_tokens));
  counter("loom_engine_generated_tokens_total", "Tokens the engine sampled.",
          static_cast<double>(s.generated_tokens));
  counter("loom_preemptions_total", "Requests preempted (recomputed later).",
          static_cast<double>(s.preemptions));
  // The device's own clock (engine/step_clock.h; zero on the host): the idle time between steps
  // run back to back is the host's overhead, which overlapping scheduling would hide.
  const StepClockTotals& dc = s.device_clock;
  counter("loom_engine_device_busy_seconds_total",
          "GPU time engine steps kept the device busy (device events).", dc.all.busy_ms / 1e3);
  counter("loom_engine_device_idle_seconds_total",
          "GPU idle time between engine steps run back to back: host work between them.",
          dc.all.gap_ms / 1e3);
  counter("loom_engine_device_idle_gaps_total",
          "Gaps measured between engine steps run back to back.", static_cast<double>(dc.all.gaps));
  counter("loom_engine_decode_device_busy_seconds_total",
          "GPU busy time of decode steps (every sequence one token).", dc.decode.busy_ms / 1e3);
  counter("loom_engine_decode_device_idle_seconds_total",
          "GPU idle time before decode steps that followed the previous step at once.",
          dc.decode.gap_ms / 1e3);
  counter("loom_engine_decode_device_idle_gaps_total",
          "Gaps measured before decode steps that followed the previous step at once.",
          static_cast<double>(dc.decode.gaps));
  gauge("loom_engine_device_idle_max_seconds",
        "The longest GPU idle gap between back-to-back engine steps since start.",
        dc.all.max_gap_ms / 1e3);
  counter("loom_prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache.",
          static_cast<double>(s.prefix_hit_tokens));
  counter("loom_prefix_cache_query_tokens_total", "Prompt tokens looked up in the prefix cache.",
          static_cast<double>(s.prefix_query_tokens));
  gauge("loom_prefix_cache_hit_rate", "Prefix-cache hit tokens over query tokens, since start.",
        s.prefix_query_tokens > 0 ? static_cast<double>(s.prefix_hit_tokens) / s.prefix_query_tokens
                                  : 0.0);
  // The prefix cache's offload tier (--prefix_offload_mb): evicted blocks kept in host memory.
  gauge("loom_prefix_offload_bytes", "Host memory held by evicted prefix-cache blocks.",
        static_cast<double>(s.prefix_offload_bytes));
  counter("loom_prefix_offloads_total",
          "Prefix-cache KV pages and state checkpoints moved to host memory when evicted.",
          static_cast<double>(s.prefix_offloads));
  counter("loom_prefix_offload_hits_total",
          "Admissions whose prefix hit copied blocks back from host memory.",
          static_cast<double>(s.prefix_offload_hits));
  counter("loom_prefix_offload_restored_pages_total",
          "Prefix-cache KV pages copied back from host memory (blocks not recomputed).",
          static_cast<double>(s.prefix_restored_pages));
  counter("loom_prefix_offload_restored_checkpoints_total",
          "Prefix-cache state checkpoints copied back from host memory.",
          static_cast<double>(s.prefix_restored_checkpoints));
  counter("loom_prefix_offload_lost_total",
          "Evicted prefix-cache blocks dropped by the host budget (recomputed if needed again).",
          static_cast<double>(s.prefix_offload_lost));
  // Sessions (Request::session): what conversations kept between turns hold.
  gauge("loom_sessions", "Live sessions (conversations kept between turns).", s.sessions);
  gauge("loom_sessions_resident", "Sessions whose cache (KV pages, state slot) is kept.",
        s.sessions_resident);
  gauge("loom_session_history_tokens", "Tokens in all sessions' histories.",
        static_cast<double>(s.session_history_tokens));
  gauge("loom_session_kv_pages", "KV pages kept by sessions between turns.", s.session_pages);
  gauge("loom_session_state_slots", "State slots kept by sessions between turns.", s.session_slots);
  gauge("loom_session_cache_bytes", "Cache bytes kept by sessions between turns.",
        static_cast<double>(s.session_bytes));
  counter("loom_session_evictions_total",
          "Session caches lost (evicted by a budget or memory pressure without offload, dropped "
          "by the offload budgets, or a bad offload file); their next turn recomputes.",
          static_cast<double>(s.session_evictions));
  gauge("loom_sessions_offloaded", "Sessions whose cache is offloaded to host memory.",
        s.sessions_offloaded);
  gauge("loom_sessions_offloaded_disk", "Sessions whose cache is offloaded to disk.",
        s.sessions_on_disk);
  gauge("loom_session_offload_bytes", "Host memory held by offloaded session caches.",
        static_cast<double>(s.session_offload_bytes));
  gauge("loom_session_offload_disk_bytes", "Disk bytes held by offloaded session caches.",
        static_cast<double>(s.session_offload_disk_bytes));
  counter("loom_session_offloads_total", "Session caches moved to the offload tier.",
          static_cast<double>(s.session_offloads));
  counter("loom_session_restores_total",
          "Session caches copied back from the offload tier for a turn (no recompute).",
          static_cast<double>(s.session_restores));
  counter("loom_session_offload_lost_total",
          "Offloaded session caches dropped by the offload budgets or found missing or corrupt.",
          static_cast<double>(s.session_offload_lost));
  counter("loom_sessions_expired_total", "Sessions dropped by the time-to-live.",
          static_cast<double>(s.sessions_expired));
  header(&out, "loom_engine_choices_finished_total", "counter",
         "Choices the engine finished, by reason.");
  absl::StrAppend(&out, "loom_engine_choices_finished_total{reason=\"stop\"} ", s.finished_stop,
                  "\n", "loom_engine_choices_finished_total{reason=\"length\"} ", s.finished_length,
                  "\n", "loom_engine_choices_finished_total{reason=\"cancelled\"} ",
                  s.finished_cancelled, "\n",
                  "loom_engine_choices_finished_total{reason=\"error\"} ", s.finished_error, "\n");
  return out;
}

std::string Metrics::render(const Engine& engine) const {
  std::string out = render(engine.stats());
  const std::vector<EngineStats> ranks = engine.rank_stats();
  header(&out, "loom_expert_parallel_ranks", "gauge",
         "Engine ranks in this process (--expert_parallel; with --nnodes this node's): attention "
         "data-parallel, experts split over every rank of the group.");
  sample(&out, "loom_expert_parallel_ranks", static_cast<double>(ranks.size()));
  auto per_rank = [&](std::string_view name, std::string_view help, auto value) {
    header(&out, name, "gauge", help);
    for (size_t r = 0; r < ranks.size(); ++r)
      absl::StrAppend(&out, absl_sv(name), "{rank=\"", engine.first_rank() + static_cast<int>(r),
                      "\"} ", value(static_cast<int>(r)), "\n");
  };
  per_rank("loom_rank_requests_waiting", "Requests queued on each engine rank, not yet running.",
           [&](int r) { return ranks[r].waiting; });
  per_rank("loom_rank_requests_running", "Requests (choices) each engine rank is running.",
           [&](int r) { return ranks[r].running; });
  per_rank("loom_rank_load_tokens",
           "Tokens queued plus running on each engine rank (prompts and generated tokens of its "
           "live requests): new requests go to the rank with the fewest.",
           [&](int r) { return engine.rank_load_tokens(r); });
  // One rank carries every expert's load: balance 1. Over several, only what the balancer
  // measured (its re-placements) is exported.
  const std::optional<double> balance =
      ranks.size() == 1 ? std::optional<double>(1.0) : engine.expert_load_balance();
  if (balance) {
    header(&out, "loom_expert_load_balance", "gauge",
           "Routed expert slots per rank, mean over max (1: even), averaged over the MoE layers, "
           "over the load balancer's last window (at its last re-placement).");
    sample(&out, "loom_expert_load_balance", *balance);
  }
  header(&out, "loom_expert_replacements_total", "counter",
         "Expert placements the load balancer recomputed (--eplb_interval_steps).");
  sample(&out, "loom_expert_replacements_total", static_cast<double>(engine.expert_replacements()));
  return out;
}

}  // namespace loom
