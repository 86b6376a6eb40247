#include "server/server_options.h"

#include <algorithm>
#include <filesystem>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "engine/model/cache_store.h"
#include "engine/model/random_weights.h"

ABSL_FLAG(std::string, model, "build/default-model",
          "Model directory: config.json + safetensors, optionally tokenizer.json (else the "
          "byte-level tokenizer) and an UNTRAINED marker file.");
ABSL_FLAG(std::string, random_weights, "",
          "SEED: serve random weights (deterministic in SEED, the same on every device) for the "
          "config.json that --model names (the file, or a directory holding it); no checkpoint "
          "is read. For production-shaped models without a download (bench/configs/); the "
          "model is untrained and its text is noise.");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address to bind the HTTP server to.");
ABSL_FLAG(int, port, 8000, "HTTP port; 0 picks a free one (printed on stdout).");
ABSL_FLAG(int, grpc_port, -1, "gRPC port; -1 disables the gRPC service, 0 picks a free one.");
ABSL_FLAG(std::string, served_model_name, "",
          "Model name clients use and see (default: the model directory's name).");
ABSL_FLAG(std::vector<std::string>, allowed_hosts, {},
          "Comma-separated Host header names accepted besides localhost, 127.0.0.0/8 and [::1] "
          "('*': any). Bound to a loopback address, other Host names get 403 (DNS rebinding).");
ABSL_FLAG(std::string, api_key, "",
          "If set, HTTP routes but /health and /metrics need `Authorization: Bearer KEY` (401), "
          "gRPC methods but health the metadata `authorization: Bearer KEY` (UNAUTHENTICATED).");
ABSL_FLAG(int64_t, cache_budget_mb, 0,
          "Memory for KV pages and linear-state slots (MiB). 0: on a GPU, what is left of this "
          "server's share of its memory (--gpu_memory_utilization) once the weights, a profiled "
          "largest step and the sampler are resident (printed at start-up); 1024 on the CPU.");
ABSL_FLAG(double, gpu_memory_utilization, 0.9,
          "With --cache_budget_mb 0 on a GPU: the fraction of its memory this server may hold "
          "(weights, step memory, sampler and caches), whatever others hold.");
ABSL_FLAG(int, max_num_batched_tokens, -1,
          "Tokens per engine step over all sequences. -1: by device, 2048 on the CPU and 8192 on "
          "a GPU (prefill chunks large enough for tensor-core rates).");
ABSL_FLAG(int, max_num_seqs, 64, "Sequences per engine step (and live state slots).");
ABSL_FLAG(int, max_model_len, -1,
          "Prompt + max_tokens limit; 0: the model's max_position_embeddings. -1: by device, 8192 "
          "on the CPU (bounds one request's prefill, whose cost grows faster than linearly with "
          "the prompt; docs/operations.md) and 0 on a GPU.");
ABSL_FLAG(int, max_n, 4,
          "Most choices (n) per request, up to 16: each choice prefills and decodes on its own.");
ABSL_FLAG(bool, enable_prefix_cache, true, "Reuse cached prompt prefixes across requests.");
ABSL_FLAG(
    int, checkpoint_interval, -1,
    "With the prefix cache, a model with linear-attention layers keeps their state every N "
    "blocks of 64 tokens (a hit resumes from the last one), and a prefill chunk ends at each. "
    "-1: by device, 8 on the CPU and --max_num_batched_tokens / 64 on a GPU, whose prefill "
    "runs at tensor-core rates only in long chunks.");
ABSL_FLAG(uint64_t, seed, 0, "Seed for requests that bring none (0: random).");
ABSL_FLAG(bool, deterministic, false,
          "Batch-invariant numerics: a request's tokens and logprobs are bit-identical alone or "
          "under any load, chunking, prefix-cache hit or preemption (slower; see "
          "docs/operations.md).");
ABSL_FLAG(bool, cuda_graphs, true,
          "On a GPU, run decode steps as CUDA graphs recorded at start-up, one per batch-size "
          "bucket (one launch a step instead of a few hundred); false launches every kernel. "
          "Ignored on the CPU.");
ABSL_FLAG(std::string, kv_dtype, "auto",
          "Storage dtype of the attention KV pages: auto (the activations' dtype: f32, or bf16 "
          "on a GPU serving bf16 matrices), f32, bf16 (half the bytes per cached token, so "
          "twice the pages for the same --cache_budget_mb; on a GPU MLA decode then runs on "
          "tensor cores) or fp8 (e4m3 with one f32 scale per cached vector: about a quarter of "
          "f32's bytes, 1.9x the tokens of bf16; dequantized inside the attention kernels). "
          "Linear-attention states stay f32.");
ABSL_FLAG(int64_t, max_body_bytes, 4 << 20, "Largest request body accepted (413 beyond).");
ABSL_FLAG(int64_t, max_header_bytes, 16 << 10, "Largest request header block (431 beyond).");
ABSL_FLAG(int, max_queue, 256,
          "Generation requests admitted beyond --max_num_seqs, over HTTP and gRPC together; more "
          "get 429 (Retry-After) / RESOURCE_EXHAUSTED.");
ABSL_FLAG(int, io_threads, 2, "Threads serving HTTP connections (asynchronous I/O).");
ABSL_FLAG(int, pump_threads, 1,
          "Threads moving engine outputs to clients, HTTP and gRPC together.");
ABSL_FLAG(double, header_timeout_s, 30, "Seconds a client has to send a whole request.");
ABSL_FLAG(double, idle_timeout_s, 300, "Seconds an idle keep-alive connection is kept.");
ABSL_FLAG(double, write_timeout_s, 60,
          "Seconds a write to a client may stall (it stopped reading) before the request is "
          "cancelled and the connection closed.");
ABSL_FLAG(int64_t, max_pending_write_bytes, 16 << 20,
          "Reply bytes queued for a client that reads too slowly, beyond which its request is "
          "cancelled and the connection closed.");
ABSL_FLAG(std::string, reasoning_parser, "auto",
          "auto: when the model's chat template writes </think>, chat replies carry the leading "
          "<think>...</think> block as reasoning_content, apart from content and tool calls; "
          "none: the block stays in content (docs/chat.md).");
ABSL_FLAG(double, drain_timeout_s, 30,
          "On SIGTERM/SIGINT, seconds in-flight requests (HTTP and gRPC) get to finish before "
          "they are ended with an error and the process exits.");
ABSL_FLAG(int, max_sessions, 1024,
          "Conversations kept between turns (/v1/responses with store, gRPC session); a new one "
          "past this is refused with 429.");
ABSL_FLAG(double, session_ttl_s, 3600,
          "Seconds an idle session (and a stored /v1/responses response) is kept.");
ABSL_FLAG(int64_t, session_max_mb, 0,
          "Cache (KV pages + state slot) one session may keep between turns, MiB; 0: no limit but "
          "the cache. Over it, the session keeps its tokens and its next turn is recomputed.");
ABSL_FLAG(int64_t, sessions_max_mb, 0,
          "Cache all sessions together may keep between turns, MiB; 0: no limit but the cache. "
          "Past it the least recently used session's cache moves to --session_offload_mb (or is "
          "evicted without it).");
ABSL_FLAG(int64_t, session_offload_mb, 4096,
          "Host memory idle sessions' caches move to (instead of being evicted) when the device "
          "pools need room or --sessions_max_mb is reached, copied back for the next turn, MiB; "
          "0: off. Past it the least recently offloaded go to --session_offload_dir, or are "
          "evicted (their next turn recomputes).");
ABSL_FLAG(std::string, session_offload_dir, "",
          "A directory (created if needed) for offloaded session caches that host memory "
          "(--session_offload_mb) does not hold; empty: none. Files are checked when read back; "
          "a bad one recomputes.");
ABSL_FLAG(int64_t, session_offload_disk_mb, 0,
          "Bytes --session_offload_dir may hold, MiB; 0: no limit but the disk.");
ABSL_FLAG(int64_t, prefix_offload_mb, 1024,
          "Host memory the prefix cache's evicted blocks (KV pages, linear-state checkpoints) "
          "move to, copied back when a later request shares the prefix instead of recomputed, "
          "MiB; 0: off (dropped). Past it the least recently evicted are dropped. Its own "
          "budget, beside --session_offload_mb.");
ABSL_FLAG(int64_t, max_stored_responses, 10000,
          "Responses POST /v1/responses stores (store: true), and, apart, gRPC Chat session "
          "conversations kept; the oldest are dropped first.");
ABSL_FLAG(int, expert_parallel, 1,
          "N >= 2: N engine ranks in this process (issue 16), attention data-parallel (each rank "
          "its own requests, caches, scheduler and sessions; --max_num_seqs, --cache_budget_mb "
          "and the other engine limits apply per rank), the routed experts split over them and "
          "exchanged per MoE layer; new requests go to the rank with the fewest tokens queued "
          "plus running. The ranks are threads on the CPU; on CUDA the flag is refused (NCCL "
          "ranks are not built yet). At most one rank per expert. With --nnodes K, the ranks of "
          "the whole group, N / K on each node.");
ABSL_FLAG(std::string, expert_dispatch, "all_gather",
          "With --expert_parallel: all_gather (hidden states and routing gathered, each rank's "
          "experts over every token, a reduce-scatter back) or all_to_all (only the rows each "
          "rank needs).");
ABSL_FLAG(int64_t, redundant_experts, 0,
          "With --expert_parallel: K extra physical expert slots per MoE layer, given to copies of "
          "the hottest experts by the load balancer (docs/expert-parallel.md).");
ABSL_FLAG(int, eplb_interval_steps, 0,
          "With --expert_parallel: recompute the expert placement from the load of the last "
          "--eplb_window_steps steps every this many steps, moving expert weights between ranks "
          "(0: never; the load balance gauge needs it).");
ABSL_FLAG(int, eplb_window_steps, 0,
          "With --eplb_interval_steps: steps of expert load counted (0: the interval).");
ABSL_FLAG(double, expert_parallel_timeout_s, 300,
          "With --expert_parallel: a rank waiting longer than this at a collective fails every "
          "rank (live requests end with the error, new ones are refused).");
ABSL_FLAG(int, nnodes, 1,
          "With --expert_parallel N: the ranks run in K processes (one per node), N / K each, "
          "joined over TCP; each node serves its own ranks' requests on its own frontends "
          "(docs/expert-parallel.md).");
ABSL_FLAG(int, node_rank, 0, "With --nnodes: this node, 0..K-1 (node 0 coordinates).");
ABSL_FLAG(std::string, coordinator, "",
          "With --nnodes: HOST:PORT of node 0, which listens on PORT for the other nodes.");

namespace loom {

void apply_device_defaults(Device device, EngineOptions& engine) {
  const bool gpu = !device.is_cpu();
  if (engine.max_num_batched_tokens == kByDevice) engine.max_num_batched_tokens = gpu ? 8192 : 2048;
  if (engine.max_model_len == kByDevice) engine.max_model_len = gpu ? 0 : 8192;
  if (engine.checkpoint_interval == kByDevice) {
    engine.checkpoint_interval =
        gpu ? std::max(1, engine.max_num_batched_tokens / engine.page_size) : 8;
  }
}

absl::StatusOr<ServerOptions> server_options_from_flags() {
  ServerOptions o;
  o.model_dir = absl::GetFlag(FLAGS_model);
  o.model_path = o.model_dir;
  o.http.host = absl::GetFlag(FLAGS_host);
  o.http.port = absl::GetFlag(FLAGS_port);
  o.grpc_port = absl::GetFlag(FLAGS_grpc_port);
  o.http.api_key = absl::GetFlag(FLAGS_api_key);
  o.http.allowed_hosts = absl::GetFlag(FLAGS_allowed_hosts);
  o.http.max_body_bytes = absl::GetFlag(FLAGS_max_body_bytes);
  o.http.max_header_bytes = absl::GetFlag(FLAGS_max_header_bytes);
  o.http.max_queue = absl::GetFlag(FLAGS_max_queue);
  o.http.io_threads = absl::GetFlag(FLAGS_io_threads);
  o.http.pump_threads = absl::GetFlag(FLAGS_pump_threads);
  o.http.header_timeout_s = absl::GetFlag(FLAGS_header_timeout_s);
  o.http.idle_timeout_s = absl::GetFlag(FLAGS_idle_timeout_s);
  o.http.write_timeout_s = absl::GetFlag(FLAGS_write_timeout_s);
  o.http.max_pending_write_bytes = absl::GetFlag(FLAGS_max_pending_write_bytes);
  o.drain_timeout_s = absl::GetFlag(FLAGS_drain_timeout_s);
  const std::string reasoning_parser = absl::GetFlag(FLAGS_reasoning_parser);
  o.engine.cache_budget_bytes = absl::GetFlag(FLAGS_cache_budget_mb) << 20;
  o.engine.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  o.engine.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  o.engine.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  o.engine.max_n = absl::GetFlag(FLAGS_max_n);
  o.engine.seed = absl::GetFlag(FLAGS_seed);
  o.engine.deterministic = absl::GetFlag(FLAGS_deterministic);
  o.engine.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  o.engine.enable_prefix_cache = absl::GetFlag(FLAGS_enable_prefix_cache);
  o.engine.checkpoint_interval = absl::GetFlag(FLAGS_checkpoint_interval);
  o.engine.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  o.engine.session_ttl_s = absl::GetFlag(FLAGS_session_ttl_s);
  o.engine.session_max_bytes = absl::GetFlag(FLAGS_session_max_mb) << 20;
  o.engine.sessions_max_bytes = absl::GetFlag(FLAGS_sessions_max_mb) << 20;
  o.engine.session_offload_bytes = absl::GetFlag(FLAGS_session_offload_mb) << 20;
  o.engine.session_offload_dir = absl::GetFlag(FLAGS_session_offload_dir);
  o.engine.session_offload_disk_bytes = absl::GetFlag(FLAGS_session_offload_disk_mb) << 20;
  o.engine.prefix_offload_bytes = absl::GetFlag(FLAGS_prefix_offload_mb) << 20;
  o.http.max_stored_responses = absl::GetFlag(FLAGS_max_stored_responses);
  o.http.stored_response_ttl_s = o.engine.session_ttl_s;

  auto bad = [](std::string_view flag, std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("--", absl_sv(flag), ": ", absl_sv(why)));
  };
  if (o.http.port < 0 || o.http.port > 65535) return bad("port", "must be in [0, 65535]");
  if (o.grpc_port > 65535) return bad("grpc_port", "must be at most 65535");
  if (o.http.max_body_bytes < 1024) return bad("max_body_bytes", "must be at least 1024");
  if (o.http.max_header_bytes < 1024) return bad("max_header_bytes", "must be at least 1024");
  if (o.http.max_queue < 1) return bad("max_queue", "must be at least 1");
  if (o.http.io_threads < 1 || o.http.io_threads > 256) return bad("io_threads", "1..256");
  if (o.http.pump_threads < 1 || o.http.pump_threads > 64) return bad("pump_threads", "1..64");
  if (!(o.http.header_timeout_s > 0)) return bad("header_timeout_s", "must be positive");
  if (!(o.http.idle_timeout_s > 0)) return bad("idle_timeout_s", "must be positive");
  if (!(o.http.write_timeout_s > 0)) return bad("write_timeout_s", "must be positive");
  if (o.http.max_pending_write_bytes < 65536) {
    return bad("max_pending_write_bytes", "must be at least 65536");
  }
  if (!(o.drain_timeout_s >= 0)) return bad("drain_timeout_s", "must be >= 0");
  if (o.engine.max_sessions < 0) return bad("max_sessions", "must be >= 0");
  if (!(o.engine.session_ttl_s > 0)) return bad("session_ttl_s", "must be positive");
  if (absl::GetFlag(FLAGS_session_max_mb) < 0) return bad("session_max_mb", "must be >= 0");
  if (absl::GetFlag(FLAGS_sessions_max_mb) < 0) return bad("sessions_max_mb", "must be >= 0");
  if (absl::GetFlag(FLAGS_session_offload_mb) < 0) return bad("session_offload_mb", "must be >= 0");
  if (absl::GetFlag(FLAGS_session_offload_disk_mb) < 0)
    return bad("session_offload_disk_mb", "must be >= 0");
  if (absl::GetFlag(FLAGS_prefix_offload_mb) < 0) return bad("prefix_offload_mb", "must be >= 0");
  if (!o.engine.session_offload_dir.empty() && o.engine.session_offload_bytes == 0)
    return bad("session_offload_dir", "needs --session_offload_mb > 0 (the tier above it)");
  if (o.http.max_stored_responses < 1) return bad("max_stored_responses", "must be >= 1");
  if (reasoning_parser == "auto") {
    o.reasoning_parser = ReasoningParser::kAuto;
  } else if (reasoning_parser == "none") {
    o.reasoning_parser = ReasoningParser::kNone;
  } else {
    return bad("reasoning_parser", "must be auto or none");
  }
  if (absl::GetFlag(FLAGS_cache_budget_mb) < 0)
    return bad("cache_budget_mb", "must be 0 (derived) or positive");
  o.engine.gpu_memory_utilization = absl::GetFlag(FLAGS_gpu_memory_utilization);
  if (!(o.engine.gpu_memory_utilization > 0 && o.engine.gpu_memory_utilization <= 1))
    return bad("gpu_memory_utilization", "must be in (0, 1]");
  const absl::StatusOr<std::optional<DType>> kv_dtype =
      parse_kv_dtype(absl::GetFlag(FLAGS_kv_dtype));
  if (!kv_dtype.ok()) return bad("kv_dtype", "must be auto, f32, bf16 or fp8");
  o.engine.kv_dtype = *kv_dtype;
  if (o.engine.max_num_batched_tokens < 1 && o.engine.max_num_batched_tokens != kByDevice)
    return bad("max_num_batched_tokens", "must be >= 1 (or -1: by device)");
  if (o.engine.max_num_seqs < 1) return bad("max_num_seqs", "must be >= 1");
  if (o.engine.checkpoint_interval < 1 && o.engine.checkpoint_interval != kByDevice)
    return bad("checkpoint_interval", "must be >= 1 (or -1: by device)");
  if (o.engine.max_model_len < 0 && o.engine.max_model_len != kByDevice)
    return bad("max_model_len", "must be >= 0 (or -1: by device)");
  if (o.engine.max_n < 1 || o.engine.max_n > kMaxN) {
    return bad("max_n", absl::StrCat("must be in [1, ", kMaxN, "]"));
  }
  // The model's expert count and the device are checked once they are known
  // (check_expert_parallel).
  ExpertParallelOptions& ep = o.expert_parallel;
  ep.ranks = absl::GetFlag(FLAGS_expert_parallel);
  if (ep.ranks < 1)
    return bad("expert_parallel", absl::StrCat(ep.ranks, ": must be a number of ranks >= 1"));
  const absl::StatusOr<ExpertExchange> exchange =
      parse_expert_exchange(absl::GetFlag(FLAGS_expert_dispatch));
  if (!exchange.ok()) return bad("expert_dispatch", std::string(exchange.status().message()));
  ep.exchange = *exchange;
  ep.balance = {.redundant_experts = absl::GetFlag(FLAGS_redundant_experts),
                .interval_steps = absl::GetFlag(FLAGS_eplb_interval_steps),
                .window_steps = absl::GetFlag(FLAGS_eplb_window_steps)};
  if (ep.ranks == 1 && ep.balance.enabled())
    return bad(ep.balance.redundant_experts != 0 ? "redundant_experts" : "eplb_interval_steps",
               "balances experts over ranks: needs --expert_parallel N >= 2");
  const double timeout_s = absl::GetFlag(FLAGS_expert_parallel_timeout_s);
  if (!(timeout_s > 0)) return bad("expert_parallel_timeout_s", "must be positive");
  ep.timeout = absl::Seconds(timeout_s);
  ep.nodes = {.nnodes = absl::GetFlag(FLAGS_nnodes),
              .node_rank = absl::GetFlag(FLAGS_node_rank),
              .coordinator = absl::GetFlag(FLAGS_coordinator)};
  if (ep.ranks == 1 &&
      (ep.nodes.nnodes != 1 || ep.nodes.node_rank != 0 || !ep.nodes.coordinator.empty()))
    return bad("nnodes",
               "with --node_rank and --coordinator spreads the ranks of "
               "--expert_parallel N over nodes: needs N >= 2");
  if (absl::Status st = check_expert_parallel_nodes(ep.nodes, ep.ranks); !st.ok())
    return absl::InvalidArgumentError(st.message());

  std::error_code ec;
  if (const std::string seed = absl::GetFlag(FLAGS_random_weights); !seed.empty()) {
    LOOM_ASSIGN_OR_RETURN(o.random_weights, parse_random_weights_seed(seed));
    if (!std::filesystem::exists(o.model_path, ec)) {
      return absl::NotFoundError(absl::StrCat("--model: ", o.model_path,
                                              " does not exist (with --random_weights: a "
                                              "config.json or a directory holding one)"));
    }
    o.model_dir = random_weights_model_dir(o.model_path);
  }
  if (!std::filesystem::is_directory(o.model_dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("--model: ", o.model_dir, " is not a directory (see docs/operations.md)"));
  }
  o.http.untrained = o.random_weights.has_value() ||
                     std::filesystem::exists(std::filesystem::path(o.model_dir) / "UNTRAINED", ec);
  o.http.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  if (o.http.served_model_name.empty()) {
    std::filesystem::path p = std::filesystem::weakly_canonical(o.model_dir, ec);
    if (ec) p = o.model_dir;
    o.http.served_model_name = p.filename().string();
    if (o.http.served_model_name.empty()) o.http.served_model_name = "loom";
  }
  return o;
}

}  // namespace loom
