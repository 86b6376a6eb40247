// loom-server: loads a model, starts the engine, the HTTP/OpenAI frontend and (when built with
// gRPC and --grpc_port >= 0) the gRPC frontend; SIGTERM/SIGINT drain and exit 0. Flags:
// server_options.cc; operations: docs/operations.md.
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/expert_parallel_ranks.h"
#include "engine/model/model.h"
#include "engine/model/random_weights.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/cpu/gemm.h"
#include "kernels/exec.h"
#include "server/admission.h"
#include "server/chat_setup.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/readiness.h"
#include "server/response_store.h"
#include "server/server_options.h"
#ifdef LOOM_WITH_GRPC
#include "server/grpc_server.h"
#endif

ABSL_FLAG(std::string, device, "cpu",
          "where the model, its caches and every step run: cpu, cuda (device 0) or cuda:N; a "
          "CUDA device needs a build with the CUDA backend");
ABSL_FLAG(std::string, weight_dtype, "auto",
          "Storage dtype of the weight matrices: auto (the checkpoint's own: bf16 for a bf16 "
          "checkpoint, fp8 for an FP8 one unless --act_dtype f32 on a GPU, f32 otherwise), f32, "
          "bf16 or fp8 (e4m3 with a scale per 128x128 block, quantized at load unless stored "
          "so; CPU and GPU). Compute stays f32 on the CPU.");
ABSL_FLAG(std::string, act_dtype, "auto",
          "dtype of the activations between ops: auto (bf16 on a GPU serving bf16 matrices, f32 "
          "otherwise), f32 or bf16 (a GPU with bf16 matrices). The residual stream, linear "
          "states, router and logits stay f32.");

namespace {

int fail(std::string_view what, const absl::Status& status) {
  std::fprintf(stderr, "loom-server: %.*s: %s\n", static_cast<int>(what.size()), what.data(),
               std::string(status.message()).c_str());
  return 1;
}

// Thousands of connections need thousands of descriptors: lift the soft limit to the hard one.
void raise_fd_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "loom-server --model DIR [--random_weights SEED] [--host 127.0.0.1] [--port 8000] "
      "[--grpc_port -1] ...\n"
      "Serves an OpenAI-compatible HTTP API (and optionally gRPC). See docs/operations.md.");
  absl::ParseCommandLine(argc, argv);
  auto options = loom::server_options_from_flags();
  if (!options.ok()) return fail("bad flags", options.status());
  raise_fd_limit();

  // Signals are taken by sigwait() in this thread only: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  const std::string& dir = options->model_dir;
  auto weight_dtype = loom::parse_weight_dtype(absl::GetFlag(FLAGS_weight_dtype));
  if (!weight_dtype.ok()) return fail("bad flags", weight_dtype.status());
  auto act_dtype = loom::parse_activation_dtype(absl::GetFlag(FLAGS_act_dtype));
  if (!act_dtype.ok()) return fail("bad flags", act_dtype.status());
  auto device = loom::parse_device(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return fail("bad flags", device.status());
  loom::apply_device_defaults(*device, options->engine);
  const loom::ExpertParallelOptions& ep = options->expert_parallel;
  if (absl::Status st = loom::check_expert_parallel_device(*device, ep.ranks); !st.ok())
    return fail("bad flags", st);
  if (absl::Status st = loom::device_available(*device); !st.ok()) return fail("--device", st);
  const loom::Placement placement{
      .device = *device, .dtype = *weight_dtype, .activations = *act_dtype};
  const absl::Time load_start = absl::Now();
  // One model, or with --expert_parallel N one per rank, each holding its share of the experts.
  absl::StatusOr<std::unique_ptr<loom::Model>> model;
  std::unique_ptr<loom::ExpertParallelRanks> ranks;
  if (ep.nodes.multi()) {
    // What every node must run alike besides the expert-parallel flags (the rendezvous compares
    // them): the model's config, where its weights come from, and the numerics.
    std::filesystem::path config = options->random_weights ? options->model_path : dir;
    std::error_code ec;
    if (std::filesystem::is_directory(config, ec)) config /= "config.json";
    std::ifstream in(config, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    options->expert_parallel.settings = {
        {"config.json", loom::content_fingerprint(bytes)},
        {"random_weights",
         options->random_weights ? absl::StrCat(*options->random_weights) : std::string("none")},
        {"act_dtype", absl::GetFlag(FLAGS_act_dtype)},
        {"deterministic", options->engine.deterministic ? "true" : "false"}};
  }
  if (ep.ranks > 1) {
    auto cfg = options->random_weights ? loom::load_random_weights_config(options->model_path)
                                       : loom::load_model_config(dir);
    if (!cfg.ok()) return fail(absl::StrCat("loading ", options->model_path), cfg.status());
    if (absl::Status st = loom::check_expert_parallel(*cfg, *device, ep); !st.ok())
      return fail("bad flags", st);
    auto loaded = loom::ExpertParallelRanks::load(
        *cfg, placement, ep,
        [&](const loom::Placement& p) -> absl::StatusOr<std::unique_ptr<loom::Model>> {
          if (options->random_weights)
            return loom::Model::load_random(options->model_path, *options->random_weights, p);
          return loom::Model::load(dir, *cfg, p);
        });
    if (!loaded.ok()) return fail(absl::StrCat("loading ", options->model_path), loaded.status());
    ranks = std::move(loaded).value();
  } else {
    model = options->random_weights
                ? loom::Model::load_random(options->model_path, *options->random_weights, placement)
                : loom::Model::load(dir, placement);
    if (!model.ok()) return fail(absl::StrCat("loading ", options->model_path), model.status());
  }
  const loom::Model& first = ranks ? *ranks->model(0) : **model;
  double parameter_gb = 0;
  for (int r = 0; r < (ranks ? ranks->size() : 1); ++r)
    parameter_gb += (ranks ? *ranks->model(r) : **model).parameters().bytes() / 1e9;
  const std::string rank_note =
      !ranks ? std::string()
      : ep.nodes.multi()
          ? absl::StrFormat(" over expert-parallel ranks %d..%d of %d (%s), node %d of %d",
                            ranks->first_rank(), ranks->first_rank() + ranks->size() - 1,
                            ranks->world_size(), loom::expert_exchange_name(ep.exchange),
                            ep.nodes.node_rank, ep.nodes.nnodes)
          : absl::StrFormat(" over %d expert-parallel ranks (%s)", ranks->size(),
                            loom::expert_exchange_name(ep.exchange));
  // GET /ready and gRPC health report these start-up checks (server/readiness.h).
  loom::Readiness readiness;
  readiness.pass(
      loom::Readiness::Check::kModel,
      absl::StrFormat("%s: %.3f GB of parameters on %s%s, loaded in %.2f s",
                      first.config().model_type, parameter_gb, first.placement().describe(),
                      rank_note, absl::ToDoubleSeconds(absl::Now() - load_start)));
  if (options->random_weights) {
    std::printf(
        "loom-server: random weights (seed %llu) for %s: %.3f GB of parameters on %s%s, filled "
        "in %.2f s\n",
        static_cast<unsigned long long>(*options->random_weights), options->model_path.c_str(),
        parameter_gb, first.placement().describe().c_str(), rank_note.c_str(),
        absl::ToDoubleSeconds(absl::Now() - load_start));
  }
  const std::string model_type = first.config().model_type;
  std::shared_ptr<const loom::Tokenizer> tokenizer;
  // tokenizer.json, or a TikToken folder (tiktoken.model + tokenizer_config.json, Kimi's).
  const std::string tokenizer_format = loom::Tokenizer::format_in_dir(dir);
  if (!tokenizer_format.empty()) {
    auto t = loom::Tokenizer::from_dir(dir);
    if (!t.ok()) return fail(absl::StrCat("loading the tokenizer of ", dir), t.status());
    tokenizer = std::move(t).value();
  } else {
    tokenizer = loom::Tokenizer::byte_level();
  }
  // The checkpoint's own Jinja chat template when its folder has one, and the tool-call syntax
  // and reasoning it writes; else the family's built-in template and syntax (docs/chat.md).
  auto chat = loom::load_chat_setup(dir, model_type, options->reasoning_parser, tokenizer.get());
  if (!chat.ok()) return fail(absl::StrCat("loading the chat template of ", dir), chat.status());
  const std::string chat_template = loom::describe_chat_template(*chat);
  const std::string chat_output = loom::describe_chat_output(*chat);
  // A derived cache budget measures a device's free memory; the host's is not budgeted so.
  if (options->engine.cache_budget_bytes == 0 && device->is_cpu())
    options->engine.cache_budget_bytes = int64_t{1024} << 20;
  auto engine =
      ranks ? loom::Engine::create_expert_parallel(std::move(ranks), tokenizer, options->engine)
            : loom::Engine::create(std::move(model).value(), tokenizer, options->engine);
  if (!engine.ok()) return fail("starting the engine", engine.status());
  if (const auto& plan = (*engine)->memory_plan()) {
    std::printf("loom-server: %s\n", plan->describe().c_str());
  }
  if (const auto& graphs = (*engine)->graph_capture()) {
    std::printf("loom-server: %s\n", graphs->describe().c_str());
  }
  readiness.pass(
      loom::Readiness::Check::kWorkspace,
      (*engine)->memory_plan()
          ? (*engine)->memory_plan()->describe()
          : absl::StrCat("cache budget given: ", options->engine.cache_budget_bytes >> 20, " MiB"));
  readiness.pass(loom::Readiness::Check::kCudaGraphs,
                 (*engine)->graph_capture() ? (*engine)->graph_capture()->describe()
                 : !options->engine.cuda_graphs
                     ? std::string("off (--cuda_graphs=false)")
                     : absl::StrCat("none on ", loom::device_name(*device)));
  {
    const loom::EngineStats st = (*engine)->stats();
    std::printf(
        "loom-server: caches: %d KV pages of %d tokens (%lld tokens), %d linear-state slots, "
        "%lld MiB\n",
        st.pages_total, options->engine.page_size,
        static_cast<long long>(st.pages_total) * options->engine.page_size, st.slots_total,
        static_cast<long long>((options->engine.cache_budget_bytes > 0
                                    ? options->engine.cache_budget_bytes >> 20
                                    : (*engine)->memory_plan()->cache_budget_bytes >> 20) *
                               (*engine)->num_ranks()));
    // A prefill chunk ends at every linear-state checkpoint: the interval trades prefix-hit
    // granularity for chunk length (docs/operations.md, --checkpoint_interval).
    if (!options->engine.enable_prefix_cache) {
      std::printf("loom-server: prefix cache off\n");
    } else {
      std::printf(
          "loom-server: prefix cache on; linear-state checkpoints (models with linear-attention "
          "layers) every %d tokens, at each prompt's last full block and where prompts diverge\n",
          options->engine.checkpoint_interval * options->engine.page_size);
    }
  }

  loom::Metrics metrics;
  // One admission and drain gate for both frontends (server/admission.h).
  // Each rank runs --max_num_seqs sequences.
  loom::AdmissionGate admission(options->engine.max_num_seqs * (*engine)->num_ranks(),
                                options->http.max_queue);
  options->http.readiness = &readiness;
  auto http =
      loom::HttpServer::start(**engine, tokenizer, *chat, &metrics, options->http, admission);
  if (!http.ok()) return fail("starting HTTP", http.status());

#ifdef LOOM_WITH_GRPC
  std::unique_ptr<loom::GrpcServer> grpc;
  if (options->grpc_port >= 0) {
    loom::GrpcServerOptions g;
    g.host = options->http.host;
    g.port = options->grpc_port;
    g.api_key = options->http.api_key;
    g.admission = &admission;
    g.pump = &(*http)->pump();  // one set of --pump_threads for both frontends; HTTP stops it last
    g.chat = *chat;             // Chat renders and reads replies as HTTP does
    g.readiness = &readiness;
    // Session conversations bounded as HTTP's stored responses (server/chat_session.h).
    g.sessions = std::make_shared<loom::ResponseStore>(
        options->http.max_stored_responses, absl::Seconds(options->http.stored_response_ttl_s));
    auto started =
        loom::GrpcServer::start(**engine, tokenizer, options->http.served_model_name, &metrics, g);
    if (!started.ok()) return fail("starting gRPC", started.status());
    grpc = std::move(started).value();
  }
#endif

  // Before the "listening" lines: whoever waits for them finds the server ready.
  std::string listening = absl::StrCat("http ", options->http.host, ":", (*http)->port());
#ifdef LOOM_WITH_GRPC
  if (grpc) absl::StrAppend(&listening, ", grpc ", options->http.host, ":", grpc->port());
#endif
  readiness.pass(loom::Readiness::Check::kFrontends, listening);

  std::printf("loom-server: cpu blas %s\n", loom::cpu::blas_description().c_str());
  if (loom::cpu::blas_uses_own_thread_pool() && std::getenv("OMP_WAIT_POLICY") == nullptr) {
    std::fprintf(stderr,
                 "loom-server: warning: OpenBLAS runs its own pthreads pool beside OpenMP's; "
                 "build with libopenblas-openmp-dev or set OMP_WAIT_POLICY=PASSIVE "
                 "(docs/operations.md)\n");
  }
  const std::string url = absl::StrCat("http://", options->http.host, ":", (*http)->port());
  std::printf("loom-server: model %s (%s, chat template %s, tokenizer %s, max_model_len %d)\n",
              options->http.served_model_name.c_str(), model_type.c_str(), chat_template.c_str(),
              tokenizer_format.empty() ? "byte-level" : tokenizer_format.c_str(),
              (*engine)->max_model_len());
  std::printf("loom-server: chat replies: %s\n", chat_output.c_str());
  if (options->engine.deterministic) {
    std::printf(
        "loom-server: deterministic: batch-invariant numerics (bit-identical outputs under any "
        "load; slower, docs/operations.md)\n");
  }
  if (options->http.untrained) {
    std::printf(
        "loom-server: NOTE: this model is UNTRAINED (random weights): it produces "
        "meaningless text; use it to exercise the API only\n");
  }
  std::printf("loom-server: http listening on %s (port %d)\n", url.c_str(), (*http)->port());
#ifdef LOOM_WITH_GRPC
  if (grpc)
    std::printf("loom-server: grpc listening on %s:%d\n", options->http.host.c_str(), grpc->port());
#endif
  std::printf(
      "loom-server: try: curl -s %s/v1/completions -H 'Content-Type: application/json' "
      "-d '{\"prompt\": \"Hello\", \"max_tokens\": 16}'\n",
      url.c_str());
  std::fflush(stdout);

  // Until a signal, or (--expert_parallel) until the rank group fails: its live requests have
  // ended with the error and new ones are refused, so the process exits (status 1) for its
  // supervisor to restart it, rather than serve nothing.
  int sig = 0;
  absl::Status group;
  while (true) {
    const timespec poll{0, 100 * 1000 * 1000};
    sig = sigtimedwait(&signals, nullptr, &poll);
    if (sig > 0) break;
    group = (*engine)->rank_group_status();
    if (!group.ok()) {
      std::fprintf(stderr, "loom-server: expert-parallel ranks failed: %s; exiting\n",
                   std::string(group.message()).c_str());
      break;
    }
  }
  // The drain (docs/operations.md): admissions stop and both frontends' health turns unhealthy at
  // once; in-flight generations on either frontend get --drain_timeout_s, counted from the
  // signal; then whatever is left is ended with an error and the process exits.
  const absl::Time deadline = absl::Now() + absl::Seconds(options->drain_timeout_s);
  std::fprintf(stderr, "loom-server: %s: draining (up to %g s, %lld requests in flight)\n",
               !group.ok()      ? "rank failure"
               : sig == SIGTERM ? "SIGTERM"
                                : "SIGINT",
               options->drain_timeout_s, static_cast<long long>(admission.in_use()));
  readiness.begin_drain();
  admission.begin_drain();
  (*http)->begin_drain();
#ifdef LOOM_WITH_GRPC
  if (grpc) grpc->begin_drain();
#endif
  // A second signal ends the wait.
  while (true) {
    const double left = absl::ToDoubleSeconds(deadline - absl::Now());
    if (left <= 0 || admission.wait_idle(std::min(left, 0.05))) break;
    const timespec now{0, 0};
    if (sigtimedwait(&signals, nullptr, &now) > 0) break;
  }
  if (admission.in_use() > 0) {
    std::fprintf(stderr, "loom-server: drain timeout: ending %lld requests still in flight\n",
                 static_cast<long long>(admission.in_use()));
  }
#ifdef LOOM_WITH_GRPC
  if (grpc) grpc->shutdown();  // remaining streams end with UNAVAILABLE
#endif
  // Cancels whatever is still running: HTTP generations get their final events (finish_reason
  // "abort") and their sessions write them; give that a moment before closing the connections.
  (*engine)->shutdown();
  for (int i = 0; i < 50 && (*http)->in_flight() > 0; ++i) {
    const timespec wait{0, 10 * 1000 * 1000};
    nanosleep(&wait, nullptr);
  }
  (*http)->stop();
  std::fprintf(stderr, "loom-server: stopped\n");
  return group.ok() ? 0 : 1;
}
